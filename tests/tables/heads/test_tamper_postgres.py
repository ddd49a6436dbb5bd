"""On PostgreSQL: rows edited by the admin role, refused on every read of the turn.

``tests/tables/heads/test_heads.py`` makes its edits on the SQLite file; here the same
turn (five recorded steps, two compaction checkpoints, a compaction mark; a
second turn of the same owner, a turn of another owner) is stored on
PostgreSQL and edited in place by ``securepad_admin``, the role that owns the
tables and may touch every row (a DBA, or whoever holds the housekeeping
login, without the master key). Each edit must end in ``IntegrityError`` on
every read of the turn it touched (``history``, ``steps``, ``list_for_turn``,
``resume``, ``reread_report``; ``get``/``read`` of the edited entry;
``latest_checkpoint``), and be named by ``pad.verify()``. A genuine store
raises nothing: expiry and gc, deletion, rotation, forgetting an owner,
concurrent writers.

The admin may also delete rows and every head and mark the heads ``pending``
(the state of a store migrated from before heads). PostgreSQL has no anchor
counter to show that the store had heads; its owner keys do: every key is
wrapped in the heads era once a store has heads, so the next open refuses the
flag. Deleting every owner key as well is crypto-shredding: the open builds
heads, but nothing of the old rows is served.

A rollback of a whole owner (every row and head put back as they were) is not
among the edits: on PostgreSQL that is a restore of the server's history,
outside the threat model (SECURITY.md, "Snapshot rollback: no anchor file").
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.errors import IntegrityError, NotFoundError
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import (
    Edit,
    Raw,
    as_admin,
    content_tamper,
    cross_owner_replay,
    cross_turn_replay,
    entry_meta,
    entry_meta_before_resume,
    expiry_moved_earlier,
    forged_insertion,
    head_deleted,
    head_of_another_owner,
    head_swapped,
    mark_deleted,
    middle_deletion,
    newest_checkpoint_deleted,
    owner_relabelled,
    record_turn,
    reordering,
    stored_bytes_changed,
    tail_truncation,
    turn_relabelled,
    whole_turn_removed,
)

LATER = NOW + 100
TURN = "t1"


@pytest.fixture
def store(pg_store_dsn: str, keyring: Keyring) -> dict[str, Any]:
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, TURN, 5)
        other = record_turn(pad, ALICE, "t2", 2)
        bob = record_turn(pad, BOB, TURN, 2)
    return {"dsn": pg_store_dsn, "keyring": keyring, "ids": ids, "other": other, "bob": bob}


def _open(s: dict[str, Any]) -> Scratchpad:
    return Scratchpad.open(s["dsn"], keyring=s["keyring"])


def _edit(s: dict[str, Any], edit: Edit) -> None:
    with as_admin(s["dsn"]) as conn:
        edit(conn, s)


# -- the edits (tests/support/tamper_edits.py), as the admin role ----------------------------------

# Edits of the turn's entries or head: every read of the turn refuses them.
TURN_EDITS: list[Edit] = [
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
    head_deleted,
    head_swapped,
    head_of_another_owner,
]

TURN_READS: dict[str, Callable[[Scratchpad], Any]] = {
    "history": lambda pad: pad.turn(ALICE, TURN, now=LATER).history(now=LATER),
    "steps": lambda pad: pad.turn(ALICE, TURN, now=LATER).steps(now=LATER),
    "list_for_turn": lambda pad: pad.list_for_turn(ALICE, TURN, now=LATER),
    "resume": lambda pad: pad.turn(ALICE, TURN, now=LATER).resume(now=LATER),
    "resume_extend": lambda pad: pad.turn(ALICE, TURN, now=LATER).resume(extend_ttl=7200, now=LATER),
    "reread_report": lambda pad: pad.turn(ALICE, TURN, now=LATER).reread_report(now=LATER),
}


def _served(pad: Scratchpad, reads: dict[str, Callable[[Scratchpad], Any]]) -> list[str]:
    """The reads that did not raise IntegrityError (each read on its own)."""
    served = []
    for name, read in reads.items():
        try:
            read(pad)
        except IntegrityError:
            continue
        served.append(name)
    return served


def _alice_problems(pad: Scratchpad) -> list[dict[str, Any]]:
    report = pad.verify(now=LATER)
    assert not report["ok"]
    return [p for p in report["problems"] if p["owner_user_id"] == "alice"]


def test_a_genuine_store_reads_and_verifies(store: dict[str, Any]) -> None:
    with _open(store) as pad:
        assert _served(pad, TURN_READS) == list(TURN_READS)
        assert len(pad.turn(ALICE, TURN, now=LATER).history(now=LATER)) == 5
        assert pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=LATER)["facts"] == ["second"]  # type: ignore[index]
        for entry_id in store["ids"]:
            assert pad.read(ALICE, entry_id, mode="full", now=LATER)["content"].startswith("observation")
        report = pad.verify(now=LATER)
    assert report["ok"], report["problems"]
    assert (report["owners"], report["turns"], report["entries"], report["checkpoints"]) == (2, 3, 9, 6)


@pytest.mark.parametrize("edit", TURN_EDITS, ids=lambda edit: edit.__name__)
def test_each_edit_is_refused_on_every_read_of_the_turn_and_named_by_verify(store: dict[str, Any], edit: Edit) -> None:
    _edit(store, edit)
    with _open(store) as pad:
        assert _served(pad, TURN_READS) == []
        assert {p["turn_id"] for p in _alice_problems(pad)} & {TURN, ""}, pad.verify(now=LATER)["problems"]
        # Alice's other turn and Bob's turn still read.
        if edit not in (cross_turn_replay, head_swapped):
            assert len(pad.turn(ALICE, "t2", now=NOW).history(now=LATER)) == 2
        assert len(pad.turn(BOB, TURN, now=NOW).history(now=LATER)) == 2


@pytest.mark.parametrize(
    "edit, target",
    [
        (content_tamper, 2),
        (middle_deletion, 2),
        (reordering, 1),
        (expiry_moved_earlier, 4),
        (owner_relabelled, 1),
        (turn_relabelled, 1),
        (stored_bytes_changed, 0),
        (head_deleted, 0),
        (head_swapped, 0),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_get_and_read_of_an_edited_entry_are_refused(store: dict[str, Any], edit: Edit, target: int) -> None:
    _edit(store, edit)
    entry_id = store["ids"][target]
    gone = edit in (middle_deletion, owner_relabelled)  # no row of alice's under that id any more
    with _open(store) as pad:
        for read in (
            lambda: pad.get(ALICE, entry_id, now=LATER),
            lambda: pad.read(ALICE, entry_id, mode="full", now=LATER),
            lambda: pad.read(ALICE, entry_id, mode="range", start=0, end=3000, now=LATER),
        ):
            with pytest.raises(NotFoundError if gone else IntegrityError):
                read()
        assert _alice_problems(pad)


@pytest.mark.parametrize("edit", [content_tamper, newest_checkpoint_deleted, mark_deleted], ids=lambda e: e.__name__)
def test_record_and_content_edits_are_named_by_verify(store: dict[str, Any], edit: Edit) -> None:
    _edit(store, edit)
    with _open(store) as pad:
        assert {p["turn_id"] for p in _alice_problems(pad)} == {TURN}


@pytest.mark.parametrize(
    "edit",
    [
        newest_checkpoint_deleted,
        whole_turn_removed,
        head_deleted,
        head_swapped,
        head_of_another_owner,
        tail_truncation,
        middle_deletion,
    ],
    ids=lambda e: e.__name__,
)
def test_latest_checkpoint_is_refused(store: dict[str, Any], edit: Edit) -> None:
    _edit(store, edit)
    with _open(store) as pad:
        assert (
            _served(pad, {"latest_checkpoint": lambda p: p.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=LATER)})
            == []
        )


def test_a_deleted_mark_is_refused_by_reread_report(store: dict[str, Any]) -> None:
    _edit(store, mark_deleted)
    with _open(store) as pad, pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=NOW).reread_report(now=LATER)


def test_a_deleted_record_is_not_laundered_by_resume_extend(store: dict[str, Any]) -> None:
    """resume(extend_ttl=...) rewrites the turn's expiries (and its head): the
    checkpoint the admin deleted must stay missing, not become forgotten (the
    extension may refuse the turn outright, or go on and leave the gap seen)."""
    _edit(store, newest_checkpoint_deleted)
    with _open(store) as pad:
        with suppress(IntegrityError):
            pad.turn(ALICE, TURN, now=LATER).resume(extend_ttl=7200, now=LATER)
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=LATER)
        assert _alice_problems(pad)


def turn_and_owner_head_removed(conn: Raw, s: dict[str, Any]) -> None:
    whole_turn_removed(conn, s)
    conn.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ''")


def heads_rebuilt_after_truncation(conn: Raw, s: dict[str, Any]) -> None:
    """The heads deleted and the store marked as one from before heads (store_meta
    'turn_heads' = 'pending', a clear value), for the next open to build them again."""
    tail_truncation(conn, s)
    conn.execute("DELETE FROM turn_heads")
    conn.execute("UPDATE store_meta SET value = 'pending' WHERE key = 'turn_heads'")


def test_a_turn_removed_with_the_owner_head_is_refused_on_read(store: dict[str, Any]) -> None:
    _edit(store, turn_and_owner_head_removed)
    with _open(store) as pad:
        assert _alice_problems(pad)  # holds today
        assert _served(pad, TURN_READS) == []


def test_heads_rebuilt_over_a_truncated_turn_are_refused(store: dict[str, Any]) -> None:
    """No anchor counter on PostgreSQL: the owner keys, wrapped in the heads era, say the store had heads."""
    _edit(store, heads_rebuilt_after_truncation)
    for _ in range(2):  # the refused open wrote nothing: refused again
        with pytest.raises(IntegrityError, match="pending"):
            _open(store)


def test_heads_rebuilt_after_every_owner_key_was_deleted_serve_nothing(store: dict[str, Any]) -> None:
    """The keys deleted too (so none says the store had heads): crypto-shredding, not a wrong answer."""

    def and_every_key(conn: Raw, s: dict[str, Any]) -> None:
        heads_rebuilt_after_truncation(conn, s)
        conn.execute("DELETE FROM owner_keys")

    _edit(store, and_every_key)
    with _open(store) as pad:
        assert _served(pad, TURN_READS) == []
        with pytest.raises(IntegrityError):
            pad.get(ALICE, store["ids"][0], now=LATER)
        assert not pad.verify(now=LATER)["ok"]


def test_a_head_put_back_to_its_older_genuine_version_is_refused(store: dict[str, Any]) -> None:
    """The admin keeps the turn's sealed head, the turn records step 6, the old head goes back."""
    with as_admin(store["dsn"]) as conn:
        (before,) = conn.execute(
            "SELECT key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,)
        )
    with _open(store) as pad:
        step6 = pad.put(ALICE, TURN, 6, "fetch", "step six", ttl_seconds=3600, now=NOW + 50)["scratchpad_id"]
    with as_admin(store["dsn"]) as conn:
        conn.execute(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = 'alice' AND turn_id = ?",
            (*before, TURN),
        )
    with _open(store) as pad:
        assert _served(pad, TURN_READS) == []
        with pytest.raises(IntegrityError):
            pad.get(ALICE, step6, now=LATER)
        assert _alice_problems(pad)


def test_metadata_rolled_back_to_before_resume_is_refused(store: dict[str, Any]) -> None:
    with as_admin(store["dsn"]) as conn:
        before = entry_meta(conn, store["ids"][0])
    with _open(store) as pad:
        assert pad.turn(ALICE, TURN, now=NOW).resume(extend_ttl=7200, now=LATER)["extended"] >= 5
    with as_admin(store["dsn"]) as conn:
        entry_meta_before_resume(conn, {**store, "before_resume": before})
    with _open(store) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, store["ids"][0], now=NOW + 200)
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=NOW).history(now=NOW + 200)
        assert not pad.verify(now=NOW + 200)["ok"]


def test_verify_recomputes_the_quota_totals(store: dict[str, Any]) -> None:
    usage = "FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = chr(1) || 'usage'"
    with as_admin(store["dsn"]) as conn:
        older = conn.execute(f"SELECT sealed {usage}")[0][0]
    with _open(store) as pad:
        pad.put(ALICE, "t-usage", 50, "tool", "one more entry", now=NOW)
    with as_admin(store["dsn"]) as conn:  # the usage head rolled back to its genuine value before the put
        conn.execute(f"UPDATE turn_heads SET sealed = ? WHERE {usage.removeprefix('FROM turn_heads WHERE ')}", (older,))
    with _open(store) as pad:
        problems = pad.verify(now=LATER)["problems"]
    # The sum of the reservations differs, and the usage head counts fewer turns than the owner head and
    # the new turn saw (the owner's turn counter).
    assert sorted((p["owner_user_id"], p["what"]) for p in problems) == [
        ("alice", "owner head"),
        ("alice", "owner head"),
        ("alice", "owner usage"),
    ]


# No false alarm on a genuine store (expiry, gc, delete, rotation, forget, concurrent
# writers): tests/tables/heads/test_genuine.py, on both backends.
