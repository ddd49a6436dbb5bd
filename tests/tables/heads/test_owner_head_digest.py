"""Owner head format 2: the number of turns, a keyed multiset digest of their ids and the
turn counter. A new turn seals the same bytes whatever the owner's turns; which turns the
owner has is answered by its head rows' ids adding up to the digest. Edits of the file
(without the keys) that remove, add or move heads are refused or named, as with the
sealed list of format 1, which stores written before keep opening with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from securepad.bench.costs import measure
from securepad.crypto.primitives import CounterSeal, Wrapper
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from securepad.tables.heads.members import owner_body
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import on_sqlite as raw_edit_sqlite
from tests.support.tamper_edits import owner_head_body, owner_heads, put_back, raw_edit, remove_turn


def _sealed_per_new_turn(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch, turn: str) -> int:
    """The bytes one new-turn put seals (bodies and observation alike)."""
    sealed: list[int] = []
    real = Wrapper.seal

    def counted(wrapper: Wrapper, data: bytes, aad: bytes) -> bytes:
        sealed.append(len(data))
        return real(wrapper, data, aad)

    with monkeypatch.context() as patch:
        patch.setattr(Wrapper, "seal", counted)
        pad.put(ALICE, turn, 1, "tool", "a new turn", now=NOW)
    return sum(sealed)


def _owner_head_size(pad: Scratchpad) -> int:
    rows = parts(pad).db.query(
        "SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (OWNER_HEAD,), admin=True
    )
    return len(bytes(rows[0]["sealed"]))


def test_a_new_turn_seals_as_much_at_500_turns_as_at_100(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner head's size is the same (counts of as many digits); what one new-turn put
    seals differs only by the digits of its numbers (a list of the turns would add ~10 bytes a turn)."""
    for i in range(100):
        pad.put(ALICE, f"t{i:04d}", 1, "tool", "x", now=NOW)
    at_100 = _sealed_per_new_turn(pad, monkeypatch, "new-0100")
    head_at_100 = _owner_head_size(pad)
    for i in range(100, 500):
        pad.put(ALICE, f"t{i:04d}", 1, "tool", "x", now=NOW)
    assert abs(_sealed_per_new_turn(pad, monkeypatch, "new-0500") - at_100) < 8
    assert _owner_head_size(pad) == head_at_100
    body = owner_head_body(pad)
    assert (body["f"], body["n"], body["c"]) == (2, 502, 502)
    assert pad.verify(now=NOW)["ok"]


@pytest.mark.sqlite_only
def test_a_new_turn_put_runs_as_many_statements_at_500_turns_as_at_10(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        found = []
        for start, end in ((0, 10), (10, 500)):
            for i in range(start, end):
                pad.put(ALICE, f"t{i:04d}", 1, "tool", "x", now=NOW)
            turn = f"new-{end}"
            found.append(measure(pad, lambda turn=turn: pad.put(ALICE, turn, 1, "tool", "a new turn", now=NOW)))
        assert found[0]["statements"] == found[1]["statements"], found


def test_a_process_writing_new_turns_reads_no_head_ids(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner head this process sealed is known verified: no scan of the owner's heads."""
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    pad.put(ALICE, "b", 1, "tool", "x", now=NOW)
    scans: list[str] = []
    owners = parts(pad).heads.owners
    real = type(owners).scan

    def counted(self: Any, conn: Any, owner: str, asked: frozenset[str]) -> Any:
        scans.append(owner)
        return real(self, conn, owner, asked)

    monkeypatch.setattr(type(owners), "scan", counted)
    for turn in ("c", "d", "e"):
        pad.put(ALICE, turn, 1, "tool", "a new turn", now=NOW)
        assert pad.list_for_turn(ALICE, f"absent {turn}", now=NOW) == []
    assert scans == []


def test_a_turn_removed_whole_is_refused_and_blocks_new_turns_until_dropped(
    pad: Scratchpad, store_location: Any
) -> None:
    for turn in ("a", "gone", "b"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        # Another turn cannot be told from the removed one: refused, and verify names the owner.
        with pytest.raises(IntegrityError, match="not the ones it counts"):
            fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        problems = fresh.verify(now=NOW)["problems"]
        assert {p["turn_id"] for p in problems} == {None}  # the owner named: which turn cannot be told
        assert any(p["what"] == "owner head" and "were removed" in p["problem"] for p in problems)
        # The removed turn itself is told: its id adds up.
        with pytest.raises(IntegrityError, match="lost its head"):
            fresh.turn(ALICE, "gone", now=NOW).history(now=NOW)
        assert ("gone", "turn head") in {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        fresh.drop_turn("alice", "gone")  # the way out, by its name
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert fresh.verify(now=NOW)["ok"]
        assert owner_head_body(fresh)["n"] == 3


def test_a_head_deleted_with_its_rows_kept_is_named(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    pad.put(ALICE, "headless", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'headless'")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="lost its head"):
            fresh.put(ALICE, "headless", 2, "tool", "y", now=NOW)
        problems = {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        assert ("headless", "entry") in problems and ("headless", "turn head") in problems


def test_a_garbage_head_under_another_id_is_named_and_two_are_refused(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    copy = (
        "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) SELECT owner_user_id, ?, key_version,"
        " sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'a'"
    )
    with raw_edit(pad, store_location) as raw:
        raw.execute(copy, ("forged",))
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        fresh.put(ALICE, "b", 1, "tool", "a new turn", now=NOW)  # the one head it does not count is told
        with pytest.raises(IntegrityError):
            fresh.turn(ALICE, "forged", now=NOW).history(now=NOW)  # fails authentication
        problems = {(p["turn_id"], p["problem"]) for p in fresh.verify(now=NOW)["problems"]}
        assert ("forged", "a turn head the owner head does not list") in problems
    with raw_edit(pad, store_location) as raw:
        raw.execute(copy, ("forged-2",))
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="not the ones it counts"):
            fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert not fresh.verify(now=NOW)["ok"]


def test_heads_copied_to_another_owner_are_refused(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    pad.put(BOB, "b", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:  # Alice's owner head over Bob's: sealed for Alice
        (row,) = owner_heads(raw, (OWNER_HEAD,))
        raw.execute(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = 'bob' AND turn_id = ?",
            (row[2], row[3], OWNER_HEAD),
        )
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh, pytest.raises(IntegrityError):
        fresh.put(BOB, "c", 1, "tool", "a new turn", now=NOW)


def test_a_turn_head_and_its_rows_moved_to_another_owner_are_told(pad: Scratchpad, store_location: Any) -> None:
    """The terms bind the owner: Alice's turn moved under Bob adds up for neither."""
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    pad.put(ALICE, "moved", 1, "tool", "x", now=NOW)
    pad.put(BOB, "b", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        for table in ("entries", "turn_heads"):
            raw.execute(f"UPDATE {table} SET owner_user_id = 'bob' WHERE owner_user_id = 'alice' AND turn_id = 'moved'")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="lost its head"):
            fresh.turn(ALICE, "moved", now=NOW).history(now=NOW)
        with pytest.raises(IntegrityError):
            fresh.turn(BOB, "moved", now=NOW).history(now=NOW)
        problems = {(p["owner_user_id"], p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        assert ("bob", "moved", "turn head") in problems and ("alice", "moved", "turn head") in problems


def test_older_owner_heads_put_back_over_a_newer_turn_are_named_by_the_counters(
    pad: Scratchpad, store_location: Any
) -> None:
    """The newer turn's head stays: the older owner head does not count it (a head it does
    not count is told), and the turn head saw more turns created than the usage head."""
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "written after", now=NOW)
    with raw_edit(pad, store_location) as raw:
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        problems = {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        assert ("new", "turn head") in problems and ("new", "owner head") in problems
        with pytest.raises(IntegrityError, match="older copy"):
            fresh.put_many(ALICE, "new", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)


def test_an_emptied_turn_put_back_with_an_older_owner_head_is_named_by_the_counters(
    pad: Scratchpad, store_location: Any
) -> None:
    """A turn head restored with the owner head that counted it: its digest adds up without
    the turn created since, whose head is named, and saw more turns than the heads put back count."""
    entry = pad.put(ALICE, "t", 1, "tool", "x", now=NOW)["scratchpad_id"]
    with raw_edit(pad, store_location) as raw:
        taken = {
            table: raw.execute(f"SELECT * FROM {table} WHERE owner_user_id = 'alice' AND turn_id = 't'")
            for table in ("entries", "turn_heads")
        }
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "later", 1, "tool", "created since", now=NOW)
    pad.delete(ALICE, entry, now=NOW)  # "t" emptied: dropped from the owner head
    with raw_edit(pad, store_location) as raw:
        for table, rows in taken.items():
            for row in rows:
                raw.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        problems = {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        assert ("later", "turn head") in problems and ("later", "owner head") in problems
        with pytest.raises(IntegrityError, match="older copy"):
            fresh.put_many(ALICE, "later", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)


def test_an_owner_head_of_format_1_opens_and_the_next_new_turn_writes_format_2(
    pad: Scratchpad, store_location: Any
) -> None:
    for turn in ("a", "b", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    heads = parts(pad).heads
    with parts(pad).db.transaction(admin=True) as conn:  # as a store of format 1 holds it
        heads.write_body(conn, "alice", OWNER_HEAD, owner_body({"a", "b", "gone"}, 3))
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="lost its head"):  # the sealed list decides
            fresh.turn(ALICE, "gone", now=NOW).history(now=NOW)
        assert fresh.list_for_turn(ALICE, "never", now=NOW) == []
        fresh.drop_turn("alice", "gone")
        assert owner_head_body(fresh) == {"c": 3, "f": 2, "n": 2, "s": owner_head_body(fresh)["s"]}
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert (owner_head_body(fresh)["n"], owner_head_body(fresh)["c"]) == (3, 4)
        assert fresh.verify(now=NOW)["ok"]


def test_an_owner_head_of_format_1_without_the_counter_converts(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    heads = parts(pad).heads
    with parts(pad).db.transaction(admin=True) as conn:
        heads.write_body(conn, "alice", OWNER_HEAD, owner_body({"a"}, None))
        heads.write_body(conn, "alice", USAGE_HEAD, json.dumps(json.loads(heads_usage(pad))[0]).encode())
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        fresh.put(ALICE, "b", 1, "tool", "a new turn", now=NOW)
        body = owner_head_body(fresh)
        assert (body["f"], body["n"], body["c"]) == (2, 2, 2)
        assert fresh.verify(now=NOW)["ok"]


def heads_usage(pad: Scratchpad) -> bytes:
    row = parts(pad).db.query(
        "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        " AND turn_id = ?",
        (USAGE_HEAD,),
        admin=True,
    )[0]
    return parts(pad).heads.open_body(row, "alice", USAGE_HEAD)


def test_a_process_after_another_ones_new_turn_sums_only_the_turns_that_differ(
    store_location: Any, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner head is stale: it reads the owner's head ids again (one statement), and sums
    the terms of the turns it did not know, not the owner's every turn."""
    terms: list[str] = []
    real = CounterSeal.owner_term

    def counted(seal: CounterSeal, owner: str, turn: str) -> int:
        terms.append(turn)
        return real(seal, owner, turn)

    monkeypatch.setattr(CounterSeal, "owner_term", counted)
    with (
        Scratchpad.open(store_location, keyring=keyring) as one,
        Scratchpad.open(store_location, keyring=keyring) as two,
    ):
        for i in range(50):
            one.put(ALICE, f"t{i:02d}", 1, "tool", "x", now=NOW)
        two.put(ALICE, "from-two", 1, "tool", "a new turn", now=NOW)  # its first scan sums every turn
        terms.clear()
        one.put(ALICE, "from-one", 1, "tool", "a new turn", now=NOW)
        assert sorted(terms) == ["from-one", "from-two"]
        terms.clear()
        two.put(ALICE, "again", 1, "tool", "a new turn", now=NOW)
        assert sorted(terms) == ["again", "from-one"]
        assert one.verify(now=NOW)["ok"]


@pytest.mark.sqlite_only
def test_a_head_row_whose_id_is_a_blob_does_not_stand_for_the_turn(db_path: Path, keyring: Keyring) -> None:
    """SQLite keeps a blob in a text column: its bytes are not the turn's id."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
        pad.put(ALICE, "gone", 1, "tool", "x", now=NOW)
    with raw_edit_sqlite(db_path) as raw:
        remove_turn(raw, "gone")
        raw.execute(
            "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) SELECT owner_user_id,"
            " CAST('gone' AS BLOB), key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'a'"
        )
    with Scratchpad.open(db_path, keyring=keyring) as fresh:
        with pytest.raises(IntegrityError):
            fresh.turn(ALICE, "gone", now=NOW).history(now=NOW)
        with pytest.raises(IntegrityError):
            fresh.put(ALICE, "new", 1, "tool", "a new turn", now=NOW)
        problems = {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        assert (None, "owner head") in problems and ("b'gone'", "turn head") in problems
