"""``verify`` and the owner heads of both formats.

Format 1 lists the owner's turns: verify names a turn removed whole, whatever
process runs it. Format 2 counts them with a keyed digest: verify names the owner
(its turn heads do not add up), the turn too once a read of it was refused in the
same process, and one head the owner head does not count. The counters' checks
(heads put back from an older copy) are the same for both formats.
"""

from __future__ import annotations

from typing import Any

import pytest

from securepad import IntegrityError, Scratchpad
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from securepad.tables.heads.members import owner_body
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import owner_heads, put_back, raw_edit, remove_turn


def _problems(pad: Scratchpad) -> set[tuple[str | None, str]]:
    return {(p["turn_id"], p["what"]) for p in pad.verify(now=NOW)["problems"]}


def _format_1(pad: Scratchpad, turns: set[str], created: int) -> None:
    with parts(pad).db.transaction(admin=True) as conn:
        parts(pad).heads.write_body(conn, "alice", OWNER_HEAD, owner_body(turns, created))


def test_format_1_names_a_turn_removed_whole_in_any_process(pad: Scratchpad, store_location: Any) -> None:
    for turn in ("a", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    _format_1(pad, {"a", "gone"}, 2)
    assert pad.verify(now=NOW)["ok"]
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        assert ("gone", "turn head") in _problems(fresh)


def test_format_2_names_the_owner_then_the_turn_its_reads_found_removed(pad: Scratchpad, store_location: Any) -> None:
    for turn in ("a", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        assert (None, "owner head") in _problems(fresh)
        assert ("gone", "turn head") not in _problems(fresh)
        with pytest.raises(IntegrityError, match="lost its head"):
            fresh.turn(ALICE, "gone", now=NOW).history(now=NOW)
        found = _problems(fresh)
        assert ("gone", "turn head") in found and (None, "owner head") not in found


@pytest.mark.parametrize("older_format", [False, True], ids=["format-2", "format-1"])
def test_heads_put_back_from_an_older_copy_are_named_by_the_counters_in_both_formats(
    pad: Scratchpad, store_location: Any, older_format: bool
) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    if older_format:
        _format_1(pad, {"a"}, 1)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.turn(ALICE, "a", now=NOW).checkpoint(facts=["written after"], now=NOW)  # the owner's exclusive lock
    assert pad.verify(now=NOW)["ok"]
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "new")
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        problems = [p for p in fresh.verify(now=NOW)["problems"] if p["what"] == "owner head"]
        assert [p["turn_id"] for p in problems] == ["a"]
        assert "put back from an older copy" in problems[0]["problem"]
