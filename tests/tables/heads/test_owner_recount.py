"""The owner heads sealed anew by ``recount_turns``: what a process knew of them before
(a verified owner head, a turn it found removed) gives way to the heads recounted, in
this process and in another one; head rows that are not the owner's are not counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD
from securepad.tables.heads.members import HeadsNotCounted, owner_body
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import on_sqlite, owner_head_body, raw_edit, remove_turn


def test_a_turn_this_process_found_removed_reads_empty_once_recounted(pad: Scratchpad, store_location: Any) -> None:
    for turn in ("a", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        with pytest.raises(IntegrityError, match="lost its head"):
            fresh.turn(ALICE, "gone", now=NOW).history(now=NOW)
        assert ("gone", "turn head") in {(p["turn_id"], p["what"]) for p in fresh.verify(now=NOW)["problems"]}
        fresh.recount_turns("alice")
        assert fresh.turn(ALICE, "gone", now=NOW).history(now=NOW) == []
        fresh.put(ALICE, "gone", 1, "tool", "a new turn of that name", now=NOW)
        assert fresh.verify(now=NOW)["ok"]


def test_another_process_writes_new_turns_after_a_recount(pad: Scratchpad, store_location: Any) -> None:
    """A process whose verified owner head is stale (sealed before the recount) reads the ids again."""
    for turn in ("a", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as other:
        other.recount_turns("alice")
    pad.put(ALICE, "b", 1, "tool", "a new turn", now=NOW)  # this process knew the owner head of three turns
    assert (owner_head_body(pad)["n"], owner_head_body(pad)["c"]) == (2, 3)
    assert pad.verify(now=NOW)["ok"]


def test_heads_that_do_not_add_up_refuse_with_their_own_kind_of_error(pad: Scratchpad, store_location: Any) -> None:
    """``verify`` tells them from an owner head that fails authentication by their error's kind."""
    for turn in ("a", "gone", "b"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh, pytest.raises(HeadsNotCounted):
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)


def test_an_owner_head_of_format_1_is_recounted_as_format_2(pad: Scratchpad, store_location: Any) -> None:
    for turn in ("a", "b", "gone"):
        pad.put(ALICE, turn, 1, "tool", "x", now=NOW)
    with parts(pad).db.transaction(admin=True) as conn:  # as a store of format 1 holds it
        parts(pad).heads.write_body(conn, "alice", OWNER_HEAD, owner_body({"a", "b", "gone"}, 3))
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "gone")
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh:
        found = fresh.recount_turns("alice")
        assert (found["turns_before"], found["turns_after"], found["resealed"]) == (3, 2, True)
        body = owner_head_body(fresh)
        assert (body["f"], body["n"], body["c"]) == (2, 2, 3)
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
        assert fresh.verify(now=NOW)["ok"]


@pytest.mark.sqlite_only
def test_a_head_row_whose_id_is_a_blob_is_deleted_not_counted(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
        pad.put(ALICE, "gone", 1, "tool", "x", now=NOW)
    with on_sqlite(db_path) as raw:
        remove_turn(raw, "gone")
        raw.execute(
            "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) SELECT owner_user_id,"
            " CAST('gone' AS BLOB), key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'a'"
        )
    with Scratchpad.open(db_path, keyring=keyring) as fresh:
        found = fresh.recount_turns("alice")
        assert (found["turns_after"], found["heads_deleted"]) == (1, ["b'gone'"])
        fresh.put(ALICE, "new", 1, "tool", "a new turn", now=NOW)
        assert fresh.verify(now=NOW)["ok"]
