"""A write edits the tally of the turn head this process sealed last, without
opening the stored head, only when the stored head is that one: another
writer's head, a head put back, or a write that failed is opened as before."""

from __future__ import annotations

from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Policy, QuotaExceededError, Scratchpad
from securepad.crypto.primitives import WORK
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.tamper_edits import raw_edit

TEXT = "an observation of a few words\n" * 40


def _head_opens(call: Any) -> int:
    before = WORK.head_opens
    call()
    return WORK.head_opens - before


def test_a_put_into_the_turn_this_process_wrote_last_opens_no_head(pad: Scratchpad) -> None:
    pad.put(ALICE, "t", 1, "tool", TEXT)
    pad.put(ALICE, "t", 2, "tool", TEXT)
    assert [_head_opens(lambda step=step: pad.put(ALICE, "t", step, "tool", TEXT)) for step in range(3, 8)] == [0] * 5
    assert pad.put_many(ALICE, "t", [(8, "tool", TEXT), (9, "tool", TEXT)])
    assert _head_opens(lambda: pad.put(ALICE, "t", 10, "tool", TEXT)) == 0
    assert [entry["step_num"] for entry in pad.list_for_turn(ALICE, "t")] == list(range(1, 11))
    assert pad.verify()["ok"]


def test_a_head_another_writer_sealed_is_opened(pad: Scratchpad, store_location: Any, keyring: Keyring) -> None:
    pad.put(ALICE, "t", 1, "tool", TEXT)
    pad.put(ALICE, "t", 2, "tool", TEXT)
    with Scratchpad.open(store_location, keyring=keyring) as other:
        other.put(ALICE, "t", 3, "tool", TEXT)
    assert _head_opens(lambda: pad.put(ALICE, "t", 4, "tool", TEXT)) >= 1
    assert [entry["step_num"] for entry in pad.list_for_turn(ALICE, "t")] == [1, 2, 3, 4]
    assert pad.verify()["ok"]


def test_a_turn_head_put_back_between_two_puts_is_not_taken_for_the_one_sealed_here(
    pad: Scratchpad, store_location: Any
) -> None:
    """The head put back is opened, as any head not sealed here last: the entry
    the older head does not count is found on the next read of the turn."""
    pad.put(ALICE, "t", 1, "tool", TEXT)
    select = "SELECT key_version, sealed FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?"
    with raw_edit(pad, store_location) as raw:
        older = raw.execute(select, (ALICE.owner_user_id, "t"))[0]
    pad.put(ALICE, "t", 2, "tool", TEXT)
    with raw_edit(pad, store_location) as raw:
        raw.execute(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?",
            (*older, ALICE.owner_user_id, "t"),
        )
    with pytest.raises(IntegrityError):
        pad.put(ALICE, "t", 3, "tool", TEXT)
        pad.list_for_turn(ALICE, "t")
    assert not pad.verify()["ok"]


def test_a_refused_write_leaves_the_next_one_to_open_the_head(store_location: Any, keyring: Keyring) -> None:
    limits = {"owner_quota_bytes": 32 * 1024, "max_entry_bytes": 16 * 1024}
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": limits})
    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        pad.put(ALICE, "t", 1, "tool", "x" * 15_000)
        with pytest.raises(QuotaExceededError):
            pad.put(ALICE, "t", 2, "tool", "y" * 15_000)  # refused once the turn's tally was edited
        assert _head_opens(lambda: pad.put(ALICE, "t", 2, "tool", "small")) >= 1
        pad.put(ALICE, "t", 3, "tool", "small")
        assert [entry["step_num"] for entry in pad.list_for_turn(ALICE, "t")] == [1, 2, 3]
        assert pad.verify()["ok"]
