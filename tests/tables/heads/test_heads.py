"""Sealed turn heads refuse whole-turn tampering on every read path.

A turn of five recorded steps, two compaction checkpoints and a compaction
mark is edited on the real file (a raw apsw connection, as an attacker with
write access to the file would) and read back through the public API. Each
edit must end in IntegrityError (or, for an id that no longer exists under its
owner, NotFoundError) on every read of the turn it touched, and be named by
``pad.verify()``. A genuine store never raises it: expiry and gc, deletion,
resume, rotation, forgetting an owner and concurrent writers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError, InvalidArgumentError, NotFoundError
from securepad.turn import record_next
from tests.support.paths import FIXTURES
from tests.support.principals import ALICE, BOB, NOW
from tests.support.store_costs import turn_put_costs
from tests.support.tamper_edits import (
    Edit,
    Raw,
    content_tamper,
    cross_owner_replay,
    cross_turn_replay,
    entry_meta,
    entry_meta_before_resume,
    expiry_moved_earlier,
    forged_insertion,
    head_swapped,
    mark_deleted,
    middle_deletion,
    newest_checkpoint_deleted,
    on_sqlite,
    owner_relabelled,
    raw_file,
    record_turn,
    reordering,
    stored_bytes_changed,
    tail_truncation,
    turn_relabelled,
    whole_turn_removed,
)

TURN = "t1"


@pytest.fixture
def store(db_path: Path, keyring: Keyring) -> dict[str, Any]:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, TURN, 5)
        other = record_turn(pad, ALICE, "t2", 2)
        bob = record_turn(pad, BOB, TURN, 2)
    return {"path": db_path, "keyring": keyring, "ids": ids, "other": other, "bob": bob}


# -- the edits (tests/support/tamper_edits.py): of the turn's entries or its head ---------------------

ENTRY_EDITS: list[Edit] = [
    tail_truncation,
    middle_deletion,
    reordering,
    forged_insertion,
    cross_turn_replay,
    cross_owner_replay,
    expiry_moved_earlier,
    owner_relabelled,
    turn_relabelled,
    stored_bytes_changed,
    whole_turn_removed,
    head_swapped,
]

TURN_READS: dict[str, Callable[[Scratchpad], Any]] = {
    "history": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).history(now=NOW + 100),
    "steps": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).steps(now=NOW + 100),
    "list_for_turn": lambda pad: pad.list_for_turn(ALICE, TURN, now=NOW + 100),
    "resume": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).resume(now=NOW + 100),
    "resume_extend": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).resume(extend_ttl=7200, now=NOW + 100),
    "reread_report": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).reread_report(now=NOW + 100),
    "tools": lambda pad: pad.turn(ALICE, TURN, now=NOW + 100).tools(now=NOW + 100),
}


def _open(s: dict[str, Any]) -> Scratchpad:
    return Scratchpad.open(s["path"], keyring=s["keyring"])


def _edit(s: dict[str, Any], edit: Edit) -> None:
    with on_sqlite(s["path"]) as conn:
        edit(conn, s)


def test_a_genuine_store_reads_and_verifies(store: dict[str, Any]) -> None:
    with _open(store) as pad:
        for read in TURN_READS.values():
            read(pad)
        assert len(pad.turn(ALICE, TURN, now=NOW + 100).history(now=NOW + 100)) == 5
        assert pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=NOW + 100)["facts"] == ["second"]  # type: ignore[index]
        report = pad.verify(now=NOW + 100)
    assert report["ok"], report["problems"]
    assert (report["owners"], report["turns"], report["entries"], report["checkpoints"]) == (2, 3, 9, 6)


@pytest.mark.parametrize("edit", ENTRY_EDITS, ids=lambda edit: edit.__name__)
@pytest.mark.parametrize("read", list(TURN_READS), ids=str)
def test_each_edit_is_refused_on_every_turn_read(store: dict[str, Any], edit: Any, read: str) -> None:
    _edit(store, edit)
    with _open(store) as pad, pytest.raises(IntegrityError):
        TURN_READS[read](pad)


@pytest.mark.parametrize("edit", [*ENTRY_EDITS, content_tamper, newest_checkpoint_deleted, mark_deleted])
def test_verify_names_each_edit(store: dict[str, Any], edit: Any) -> None:
    _edit(store, edit)
    with _open(store) as pad:
        report = pad.verify(now=NOW + 100)
    assert not report["ok"]
    assert any(p["owner_user_id"] == "alice" for p in report["problems"]), report["problems"]


@pytest.mark.parametrize(
    "edit", [middle_deletion, reordering, expiry_moved_earlier, turn_relabelled, stored_bytes_changed, head_swapped]
)
def test_get_and_read_of_an_edited_entry_are_refused(store: dict[str, Any], edit: Any) -> None:
    target = {
        middle_deletion: 2,
        reordering: 1,
        expiry_moved_earlier: 4,
        turn_relabelled: 1,
        stored_bytes_changed: 0,
        head_swapped: 0,
    }[edit]
    _edit(store, edit)
    entry_id = store["ids"][target]
    with _open(store) as pad:
        with pytest.raises((IntegrityError, NotFoundError)):  # NotFound only for an id it deleted
            pad.get(ALICE, entry_id, now=NOW + 100)
        with pytest.raises((IntegrityError, NotFoundError)):
            pad.read(ALICE, entry_id, now=NOW + 100)
        if edit is not middle_deletion:
            with pytest.raises(IntegrityError):
                pad.get(ALICE, entry_id, now=NOW + 100)


def test_verify_recomputes_the_quota_totals(store: dict[str, Any]) -> None:
    usage = "SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = char(1) || 'usage'"
    with raw_file(store["path"]) as conn:
        older = conn.execute(usage).fetchall()[0][0]
    with _open(store) as pad:
        pad.put(ALICE, "t-new", 50, "tool", "one more entry", now=NOW)  # a new turn's grant
    with raw_file(store["path"]) as conn:  # the usage head rolled back to its genuine value before the put
        conn.execute(usage.replace("SELECT sealed FROM", "UPDATE").replace("WHERE", "SET sealed = ? WHERE"), (older,))
    with _open(store) as pad:
        problems = pad.verify(now=NOW + 100)["problems"]
    # The sum of the reservations differs, and the usage head counts fewer turns than the owner head and
    # the new turn saw (the owner's turn counter).
    assert sorted((p["owner_user_id"], p["what"]) for p in problems) == [
        ("alice", "owner head"),
        ("alice", "owner head"),
        ("alice", "owner usage"),
    ]


def test_content_tamper_is_refused_on_read(store: dict[str, Any]) -> None:
    _edit(store, content_tamper)
    with _open(store) as pad, pytest.raises(IntegrityError):
        pad.read(ALICE, store["ids"][2], mode="range", start=0, end=3000, now=NOW + 100)


@pytest.mark.parametrize("edit", [newest_checkpoint_deleted, whole_turn_removed, head_swapped])
def test_an_older_checkpoint_is_not_served_as_the_latest(store: dict[str, Any], edit: Any) -> None:
    _edit(store, edit)
    with _open(store) as pad, pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=NOW + 100)


def test_a_deleted_mark_is_refused_by_reread_report(store: dict[str, Any]) -> None:
    _edit(store, mark_deleted)
    with _open(store) as pad, pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=NOW).reread_report(now=NOW + 100)


def test_metadata_rolled_back_to_before_resume_is_refused(store: dict[str, Any]) -> None:
    with on_sqlite(store["path"]) as conn:
        before = entry_meta(conn, store["ids"][0])
    with _open(store) as pad:
        assert pad.turn(ALICE, TURN, now=NOW).resume(extend_ttl=7200, now=NOW + 100)["extended"] >= 5
    with on_sqlite(store["path"]) as conn:
        entry_meta_before_resume(conn, {**store, "before_resume": before})
    with _open(store) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, store["ids"][0], now=NOW + 200)
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=NOW).history(now=NOW + 200)
        assert not pad.verify(now=NOW + 200)["ok"]


@pytest.mark.parametrize("edit", [tail_truncation, expiry_moved_earlier, owner_relabelled, forged_insertion])
def test_the_next_step_is_checked_against_the_head(store: dict[str, Any], edit: Any) -> None:
    """``last_step`` (the next step of ``record_next`` and the integrations) is the head's newest:
    a truncated, hidden or forged newest step is refused, not recorded over."""
    if edit is owner_relabelled:
        edit = _relabel_newest
    _edit(store, edit)
    with _open(store) as pad, pytest.raises(IntegrityError):
        record_next(pad.turn(ALICE, TURN, now=NOW + 100), "tool", "next", now=NOW + 100)


def _relabel_newest(conn: Raw, s: dict[str, Any]) -> None:
    conn.execute("UPDATE entries SET owner_user_id = 'mallory' WHERE id = ?", (s["ids"][4],))


def test_the_next_step_follows_the_head_after_deletes_and_gc(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, TURN, 3)
        pad.delete(ALICE, ids[2])  # the newest leaves: the head no longer knows the newest, the inventory answers
        turn = pad.turn(ALICE, TURN, now=NOW)
        assert record_next(turn, "tool", "four", now=NOW)[0] == 3
        pad.put(ALICE, TURN, 9, "tool", "short-lived", ttl_seconds=10, now=NOW)
        assert record_next(turn, "tool", "after expiry", now=NOW + 20)[0] == 4
        assert pad.gc(now=NOW + 20) == 1
        assert record_next(turn, "tool", "after gc", now=NOW + 20)[0] == 5
        assert pad.verify(now=NOW + 20)["ok"]


def _remove_owner_but_its_key(conn: Raw, s: dict[str, Any]) -> None:
    conn.execute("DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = 'alice')")
    for table in ("entries", "checkpoints", "compaction_marks", "turn_heads"):
        conn.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice'")


def test_an_owner_whose_turns_and_heads_were_all_removed_is_refused(store: dict[str, Any]) -> None:
    """Every owner with a key has an owner head (made with its first key): an
    owner emptied of all its rows and heads while its key stays is refused on
    every read and write of its turns, and named by verify."""
    _edit(store, _remove_owner_but_its_key)
    with _open(store) as pad:
        for read in TURN_READS.values():
            with pytest.raises(IntegrityError, match="no owner head"):
                read(pad)
        with pytest.raises(IntegrityError, match="no owner head"):
            pad.put(ALICE, "t-new", 1, "tool", "a write does not paper over it", now=NOW)
        problems = pad.verify(now=NOW)["problems"]
    assert [(p["owner_user_id"], p["what"]) for p in problems] == [("alice", "owner head")]


def test_an_owner_whose_first_put_failed_reads_empty(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(BOB, TURN, 1, "tool", "x", now=NOW)
        with pytest.raises(InvalidArgumentError):
            pad.put(ALICE, TURN, 1, "tool", float("nan"), now=NOW)  # after the key, before any head
        assert pad.list_for_turn(ALICE, TURN, now=NOW) == []
        assert pad.verify(now=NOW)["ok"]


def test_other_turns_and_owners_still_read(store: dict[str, Any]) -> None:
    _edit(store, middle_deletion)
    with _open(store) as pad:
        assert len(pad.turn(ALICE, "t2", now=NOW).history(now=NOW + 100)) == 2
        assert len(pad.turn(BOB, TURN, now=NOW).history(now=NOW + 100)) == 2


# -- no false alarm (a genuine store, on both backends: tests/tables/heads/test_genuine.py) -------------


def test_a_store_without_heads_gets_them_on_open(tmp_path: Path) -> None:
    """A store written before heads (tests/fixtures/store_v1.db, flag 'pending') builds them."""
    fixtures = FIXTURES
    shutil.copy(fixtures / "store_v1.db", tmp_path / "store.db")
    (tmp_path / "store.db").chmod(0o600)
    key = tmp_path / "key"
    key.write_bytes((fixtures / "store_v1.key").read_bytes())
    key.chmod(0o600)
    now = json.loads((fixtures / "store_v1.json").read_text())["now"]
    with Scratchpad.open(tmp_path / "store.db", keyring=Keyring.from_key_file(key)) as pad:
        report = pad.verify(now=now)
    assert report["ok"] and report["turns"] >= 1, report
    with raw_file(tmp_path / "store.db") as conn:
        flag = conn.execute("SELECT value FROM store_meta WHERE key = 'turn_heads'").fetchall()[0][0]
    assert flag.startswith("3:")  # sealed: not a clear word an edit could set back


@pytest.mark.parametrize("heads", ["kept", "deleted"])
def test_resetting_the_heads_flag_is_refused(db_path: Path, keyring: Keyring, heads: str) -> None:
    """Setting store_meta.turn_heads back to 'pending' (so that an open would
    rebuild the heads from the edited file) is refused: the store has heads, or
    (heads deleted too) its authenticated write counter shows it was written since."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        record_turn(pad, ALICE, TURN, 3)
    with raw_file(db_path) as conn:
        conn.execute("DELETE FROM entries WHERE step_num = 3")
        if heads == "deleted":
            conn.execute("DELETE FROM turn_heads")
        conn.execute("UPDATE store_meta SET value = 'pending' WHERE key = 'turn_heads'")
    with pytest.raises(IntegrityError, match="pending"):
        Scratchpad.open(db_path, keyring=keyring)


@pytest.mark.parametrize("value", ["built-forged", "2:" + "0" * 64, ""])
def test_a_forged_heads_flag_is_refused(db_path: Path, keyring: Keyring, value: str) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        record_turn(pad, ALICE, TURN, 1)
    with raw_file(db_path) as conn:
        conn.execute("UPDATE store_meta SET value = ? WHERE key = 'turn_heads'", (value,))
    with pytest.raises(IntegrityError, match="turn_heads"):
        Scratchpad.open(db_path, keyring=keyring)


# -- constant-size heads -----------------------------------------------------------------------


def test_a_put_costs_the_same_whatever_the_turn_length(db_path: Path, keyring: Keyring) -> None:
    """A head is a constant-size tally: a put into a 500-step turn runs the same
    statements and appends the same WAL frames as one into a 5-step turn (one
    store holds both, so the B-trees are the same). The fewest frames of eight
    puts each: an entry's random id lands it on a random leaf, which a split
    can cost a few frames more; the anchor syncs at close, so its background
    sync appends no frame to a put's count."""
    policy = Policy.from_dict({"storage": {"anchor_sync": "close"}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        for turn, steps in (("short", 5), ("long", 500)):
            pad.put_many(ALICE, turn, [(s, "tool", "x" * 512) for s in range(1, steps + 1)], now=NOW)
        short = [turn_put_costs(pad, ALICE, "short", step) for step in range(6, 14)]
        long = [turn_put_costs(pad, ALICE, "long", step) for step in range(501, 509)]
        assert pad.verify(now=NOW)["ok"]
    assert [c["statements"] for c in short] == [c["statements"] for c in long]
    # A B-tree page split can cost a frame either way; a listing head cost 15 frames more at 500 steps.
    assert min(c["wal_frames"] for c in long) <= min(c["wal_frames"] for c in short) + 1


def test_a_head_is_small_whatever_the_turn_length(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put_many(ALICE, "long", [(s, "tool", "x") for s in range(1, 501)], now=NOW)
        pad.put(ALICE, "short", 1, "tool", "x", now=NOW)
    with raw_file(db_path) as conn:
        sizes = dict(conn.execute("SELECT turn_id, length(sealed) FROM turn_heads WHERE turn_id != ''").fetchall())
    # only the digits of the counts and of the bytes and reservation differ
    assert sizes["long"] - sizes["short"] <= 24 and sizes["long"] < 480
