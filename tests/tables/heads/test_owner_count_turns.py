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

from typing import Any

import pytest

from securepad import IntegrityError, Scratchpad
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import owner_heads, put_back, raw_edit, remove_turn


def _owner_problems(pad: Scratchpad) -> list[str]:
    return [p["problem"] for p in pad.verify(now=NOW)["problems"] if p["what"] == "owner head"]


@pytest.mark.parametrize("which", [(OWNER_HEAD, USAGE_HEAD), (OWNER_HEAD,)], ids=["both", "owner-head-only"])
def test_owner_heads_put_back_after_a_turn_was_removed_are_refused(
    pad: Scratchpad, store_location: Any, which: tuple[str, ...]
) -> None:
    pad.put(ALICE, "a", 1, "tool", "x" * 3000, now=NOW)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, which)
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.turn(ALICE, "a", now=NOW).checkpoint(facts=["written after"], now=NOW)  # the owner's exclusive lock
    assert pad.verify(now=NOW)["ok"]
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "new")
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        assert _owner_problems(again)  # verify names the owner
        with pytest.raises(IntegrityError, match="older copy"):
            if which == (OWNER_HEAD, USAGE_HEAD):  # a write under the exclusive lock into a turn written since
                again.put_many(ALICE, "a", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)
            else:  # a turn's creation, which reads both heads
                again.put(ALICE, "other", 1, "tool", "w", now=NOW)


def test_a_turn_created_after_the_removed_one_shows_it_too(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.put(ALICE, "later", 1, "tool", "created after it", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "new")
        put_back(raw, old)
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
