"""An owner head and usage head put back from an older copy do not hide a turn removed since.

The attack: an owner's owner head and usage head are copied (they list the
turns of then), a turn is created and written, other turns are written, then
the new turn's rows and head are deleted and the old owner head and usage
head put back: the removed turn reads as never existing. The owner's turn
counter (sealed in its owner head and usage head, grown by each turn
created) and each turn head's record of it (raised by every write under the
owner's exclusive lock) show the heads are older than a turn written since:
the next such write refuses, and ``verify`` names the owner. What stays
unseen is stated in SECURITY.md: when no turn of the owner was written under
the exclusive lock after the removed one was created, the state put back is
one the owner really had.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import pytest

from securepad import IntegrityError, Principal, Scratchpad
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from tests.support.tamper_edits import Raw, as_admin, on_sqlite

ALICE = Principal("alice", "planner", "web")
NOW = 1_000_000.0


def _raw(pad: Scratchpad, where: Any) -> AbstractContextManager[Raw]:
    return on_sqlite(where) if pad.backend == "sqlite" else as_admin(where)


def _owner_heads(raw: Raw, which: tuple[str, ...]) -> list[tuple[Any, ...]]:
    marks = ", ".join("?" * len(which))
    return raw.execute(
        f"SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        f" AND turn_id IN ({marks})",
        which,
    )


def _put_back(raw: Raw, rows: list[tuple[Any, ...]]) -> None:
    for owner, turn_id, version, sealed in rows:
        raw.execute(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?",
            (version, sealed, owner, turn_id),
        )


def _remove_turn(raw: Raw, turn_id: str) -> None:
    raw.execute(
        "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = 'alice' AND turn_id = ?)",
        (turn_id,),
    )
    for table in ("entries", "checkpoints", "compaction_marks", "turn_heads"):
        raw.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice' AND turn_id = ?", (turn_id,))


def _owner_problems(pad: Scratchpad) -> list[str]:
    return [p["problem"] for p in pad.verify(now=NOW)["problems"] if p["what"] == "owner head"]


@pytest.mark.parametrize("which", [(OWNER_HEAD, USAGE_HEAD), (OWNER_HEAD,)], ids=["both", "owner-head-only"])
def test_owner_heads_put_back_after_a_turn_was_removed_are_refused(
    pad: Scratchpad, store_location: Any, which: tuple[str, ...]
) -> None:
    pad.put(ALICE, "a", 1, "tool", "x" * 3000, now=NOW)
    with _raw(pad, store_location) as raw:
        old = _owner_heads(raw, which)
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.turn(ALICE, "a", now=NOW).checkpoint(facts=["written after"], now=NOW)  # the owner's exclusive lock
    assert pad.verify(now=NOW)["ok"]
    with _raw(pad, store_location) as raw:
        _remove_turn(raw, "new")
        _put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        assert _owner_problems(again)  # verify names the owner
        with pytest.raises(IntegrityError, match="older copy"):
            if which == (OWNER_HEAD, USAGE_HEAD):  # a write under the exclusive lock into a turn written since
                again.put_many(ALICE, "a", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)
            else:  # a turn's creation, which reads both heads
                again.put(ALICE, "other", 1, "tool", "w", now=NOW)


def test_a_turn_created_after_the_removed_one_shows_it_too(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    with _raw(pad, store_location) as raw:
        old = _owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.put(ALICE, "later", 1, "tool", "created after it", now=NOW)
    with _raw(pad, store_location) as raw:
        _remove_turn(raw, "new")
        _put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        problems = [p for p in again.verify(now=NOW)["problems"] if p["what"] == "owner head"]
        assert [p["turn_id"] for p in problems] == ["later"]
        with pytest.raises(IntegrityError, match="older copy"):
            again.turn(ALICE, "later", now=NOW).checkpoint(facts=["f"], now=NOW)


def test_a_genuine_owner_counts_its_turns_through_drops_and_rotations(pad: Scratchpad) -> None:
    for turn in ("a", "b", "c"):
        pad.put(ALICE, turn, 1, "tool", turn, now=NOW)
    entry = pad.list_for_turn(ALICE, "b", now=NOW)[0]["scratchpad_id"]
    pad.delete(ALICE, entry, now=NOW)  # b emptied: dropped, the counter stays
    pad.put(ALICE, "b", 1, "tool", "again", now=NOW)  # created again: counted again
    pad.put_many(ALICE, "a", [(2, "tool", "y")], now=NOW)
    pad.rotate_owner_key("alice")
    pad.put_many(ALICE, "c", [(2, "tool", "y")], now=NOW)
    report = pad.verify(now=NOW)
    assert report["ok"], report["problems"]
