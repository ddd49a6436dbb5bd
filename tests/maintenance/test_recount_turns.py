"""``recount_turns``: the operator's way out of a turn removed whole whose id is not known.
The owner's turns become those whose heads are present and open; the removed turn is
given up, every other turn keeps reading, new turns are accepted again and ``verify``
is clean. Heads that do not open under the owner's key are never counted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from securepad import AsyncScratchpad, IntegrityError, InvalidArgumentError, Keyring, NotFoundError, Scratchpad
from securepad.bench.costs import measure
from securepad.crypto.primitives import CounterSeal
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import (
    forge_head,
    on_sqlite,
    owner_head_body,
    owner_heads,
    put_back,
    raw_edit,
    remove_turn,
)


def _heads(pad: Scratchpad, owner: str = "alice") -> dict[str, bytes]:
    """The owner's head rows as stored: turn id -> sealed bytes."""
    rows = parts(pad).db.query(
        "SELECT turn_id, sealed FROM turn_heads WHERE owner_user_id = ?", (owner,), admin=True, owner=owner
    )
    return {str(row["turn_id"]): bytes(row["sealed"]) for row in rows}


def _three_turns_one_removed(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "first of a", now=NOW)
    pad.put(ALICE, "a", 2, "tool", "second of a", now=NOW)
    pad.put(ALICE, "gone", 1, "tool", "removed", now=NOW)
    pad.put(ALICE, "b", 1, "tool", "of b", now=NOW)
    pad.put(BOB, "a", 1, "tool", "bob's", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")


def test_a_turn_removed_whole_is_given_up_and_the_owner_goes_on(pad: Scratchpad, store_location: Any) -> None:
    _three_turns_one_removed(pad, store_location)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="not the ones it counts"):
            fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        problems = fresh.verify(now=NOW)["problems"]
        named = [p["problem"] for p in problems if p["what"] == "owner head"]
        assert len(named) == 1 and "recount_turns" in named[0] and "securepad turn recount" in named[0]
        recounted = fresh.recount_turns("alice")
        assert recounted == {
            "owner_user_id": "alice",
            "turns_before": 3,
            "turns_after": 2,
            "turns_created": 3,
            "reserved_bytes_before": recounted["reserved_bytes_before"],
            "reserved_bytes_after": recounted["reserved_bytes_after"],
            "heads_deleted": [],
            "resealed": True,
        }
        assert recounted["reserved_bytes_after"] < recounted["reserved_bytes_before"]  # the removed turn's share
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert [e["summary"] for e in fresh.list_for_turn(ALICE, "a", now=NOW)] == ["first of a", "second of a"]
        assert [e["summary"] for e in fresh.list_for_turn(ALICE, "b", now=NOW)] == ["of b"]
        assert fresh.list_for_turn(ALICE, "gone", now=NOW) == []  # given up: it reads empty, and takes writes
        fresh.put(ALICE, "gone", 1, "tool", "a new turn of that name", now=NOW)
        report = fresh.verify(now=NOW)
        assert report["ok"], report["problems"]
        assert (owner_head_body(fresh)["n"], owner_head_body(fresh)["c"]) == (4, 5)  # the counter never went back
    with Scratchpad.open(store_location, keyring=pad.keyring) as later:  # a process that knew nothing before
        assert later.verify(now=NOW)["ok"]
        assert [e["summary"] for e in later.list_for_turn(BOB, "a", now=NOW)] == ["bob's"]


def test_a_recount_of_heads_that_add_up_changes_nothing(pad: Scratchpad, store_location: Any) -> None:
    for turn in ("x", "y"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    before = _heads(pad)
    found = pad.recount_turns("alice")
    assert (found["turns_before"], found["turns_after"], found["resealed"]) == (2, 2, False)
    assert found["reserved_bytes_before"] == found["reserved_bytes_after"]
    assert _heads(pad) == before  # not even sealed again
    _three_turns_one_removed(pad, store_location)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        assert fresh.recount_turns("alice")["resealed"]
        after_one = _heads(fresh)
        again = fresh.recount_turns("alice")
        assert (again["turns_before"], again["turns_after"], again["resealed"]) == (4, 4, False)
        assert _heads(fresh) == after_one
        assert fresh.verify(now=NOW)["ok"]


def test_forged_heads_are_not_counted_and_are_deleted(pad: Scratchpad, store_location: Any) -> None:
    """Genuine head bytes under other ids fail authentication: never counted. Two of them
    would keep the owner's heads from adding up, and ``drop_turn`` cannot remove one then."""
    _three_turns_one_removed(pad, store_location)
    with raw_edit(pad, store_location) as raw:
        forge_head(raw, "forged-1", "a")
        forge_head(raw, "forged-2", "b")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError):
            fresh.drop_turn("alice", "forged-1")  # the heads do not add up without the removed turn
        recounted = fresh.recount_turns("alice")
        assert (recounted["turns_before"], recounted["turns_after"]) == (3, 2)
        assert recounted["heads_deleted"] == ["forged-1", "forged-2"]
        assert set(_heads(fresh)) == {OWNER_HEAD, USAGE_HEAD, "a", "b"}
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert fresh.list_for_turn(ALICE, "forged-1", now=NOW) == []
        assert fresh.verify(now=NOW)["ok"]


def test_a_turn_whose_head_was_replaced_keeps_its_rows_for_drop_turn(pad: Scratchpad, store_location: Any) -> None:
    """A genuine turn whose head no longer opens is not counted; its rows stay (evidence),
    refused and named, until the operator drops the turn by name."""
    _three_turns_one_removed(pad, store_location)
    with raw_edit(pad, store_location) as raw:
        raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'b'")
        forge_head(raw, "b", "a")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        recounted = fresh.recount_turns("alice")
        assert (recounted["turns_after"], recounted["heads_deleted"]) == (1, ["b"])
        with pytest.raises(IntegrityError):
            fresh.turn(ALICE, "b", now=NOW).history(now=NOW)
        assert {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]} >= {("b", "entry")}
        assert fresh.drop_turn("alice", "b")["entries"] == 1
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert fresh.verify(now=NOW)["ok"]


def test_heads_put_back_from_an_older_copy_are_recounted_with_counters_that_hold(
    pad: Scratchpad, store_location: Any
) -> None:
    """Older owner and usage heads over a newer turn's head: the recount counts the newer
    turn, and its counter is no lower than any head saw, so the counters' checks pass."""
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "written after", now=NOW)
    with raw_edit(pad, store_location) as raw:
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        assert not fresh.verify(now=NOW)["ok"]
        recounted = fresh.recount_turns("alice")
        assert (recounted["turns_before"], recounted["turns_after"], recounted["turns_created"]) == (1, 2, 2)
        fresh.put_many(ALICE, "new", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)
        fresh.put(ALICE, "third", 1, "tool", "a new turn", now=NOW)
        assert fresh.verify(now=NOW)["ok"]
        assert owner_head_body(fresh)["c"] == 3


def test_a_recount_is_refused_when_the_owner_head_fails_authentication(pad: Scratchpad, store_location: Any) -> None:
    _three_turns_one_removed(pad, store_location)
    with raw_edit(pad, store_location) as raw:
        raw.execute(
            "UPDATE turn_heads SET sealed = (SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice'"
            " AND turn_id = 'a') WHERE owner_user_id = 'alice' AND turn_id = ?",
            (OWNER_HEAD,),
        )
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        before = _heads(fresh)
        with pytest.raises(IntegrityError):
            fresh.recount_turns("alice")
        assert _heads(fresh) == before


def test_a_recount_names_a_bad_or_unknown_owner(pad: Scratchpad) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.recount_turns("")
    with pytest.raises(NotFoundError):
        pad.recount_turns("never-wrote")


def test_the_async_face_recounts(pad: Scratchpad, store_location: Any) -> None:
    _three_turns_one_removed(pad, store_location)

    async def run() -> dict[str, Any]:
        async with await AsyncScratchpad.open(store_location, keyring=pad.keyring) as apad:
            found: dict[str, Any] = await apad.recount_turns("alice")
            await apad.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
            return found

    assert asyncio.run(run())["turns_after"] == 2
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        assert fresh.verify(now=NOW)["ok"]


@pytest.mark.sqlite_only
def test_a_recount_opens_each_head_once_and_sums_one_term_per_turn(
    db_path: Path, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for i in range(50):
            pad.put(ALICE, f"t{i:02d}", 1, "tool", "x", now=NOW)
    with on_sqlite(db_path) as raw:
        remove_turn(raw, "t07")
    terms: list[str] = []
    real = CounterSeal.owner_term

    def counted(seal: CounterSeal, owner: str, turn: str) -> int:
        terms.append(turn)
        return real(seal, owner, turn)

    monkeypatch.setattr(CounterSeal, "owner_term", counted)
    with Scratchpad.open(db_path, keyring=keyring) as fresh:
        costs = measure(fresh, lambda: fresh.recount_turns("alice"))
        assert costs["head_opens"] == 49 + 2  # the turn heads, the owner head and the usage head
        assert sorted(terms) == sorted(f"t{i:02d}" for i in range(50) if i != 7)
