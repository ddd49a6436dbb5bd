"""A write into a turn found tampered is refused, as its reads are.

The edits are ``tests/support/tamper_edits.py``'s, made outside securepad (the SQLite
file, or PostgreSQL as ``securepad_admin``). Once a read of the turn (on a
consistent pair), ``verify`` or gc has found the turn's rows differ from its
head, every write into that turn in the process checks the turn again inside
its transaction and raises the same ``IntegrityError`` while it fails: a put,
a batch, a checkpoint, a deletion. Other turns take writes as before, and a
turn put back as it was (a backup restored) takes them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from securepad import IntegrityError, InvalidArgumentError, Keyring, Scratchpad
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import (
    Edit,
    Raw,
    as_admin,
    head_deleted,
    head_swapped,
    on_sqlite,
    record_turn,
    restore,
    snapshot,
    tail_truncation,
)

LATER = NOW + 100

WRITES: dict[str, Callable[[Scratchpad, dict[str, Any]], Any]] = {
    "put": lambda pad, s: pad.put(ALICE, "t1", 9, "fetch", "after the edit", now=LATER),
    "record": lambda pad, s: pad.turn(ALICE, "t1", now=LATER).record(9, "fetch", "after", now=LATER),
    "put_many": lambda pad, s: pad.put_many(ALICE, "t1", [(9, "fetch", "a"), (10, "fetch", "b")], now=LATER),
    "checkpoint": lambda pad, s: pad.turn(ALICE, "t1", now=LATER).checkpoint(facts=["later"], now=LATER),
    "delete": lambda pad, s: pad.delete(ALICE, s["ids"][0], now=LATER),
}


@pytest.fixture
def store(new_store_location: Any, keyring: Keyring, backend: str) -> Iterator[dict[str, Any]]:
    with Scratchpad.open(new_store_location, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, "t1", 5)
        record_turn(pad, ALICE, "t2", 2)
    yield {"where": new_store_location, "keyring": keyring, "ids": ids, "backend": backend}


def _raw(s: dict[str, Any]) -> AbstractContextManager[Raw]:
    return on_sqlite(s["where"]) if s["backend"] == "sqlite" else as_admin(s["where"])


def _open(s: dict[str, Any]) -> Scratchpad:
    return Scratchpad.open(s["where"], keyring=s["keyring"])


def _entries(s: dict[str, Any]) -> int:
    with _raw(s) as raw:
        return int(raw.execute("SELECT COUNT(*) FROM entries WHERE turn_id = 't1'")[0][0])


@pytest.mark.parametrize("write", WRITES)
def test_a_write_into_a_turn_a_read_found_tampered_is_refused(store: dict[str, Any], write: str) -> None:
    with _raw(store) as raw:
        tail_truncation(raw, store)
    count = _entries(store)
    with _open(store) as pad:
        with pytest.raises(IntegrityError) as read:
            pad.turn(ALICE, "t1", now=LATER).history(now=LATER)
        with pytest.raises(IntegrityError) as written:
            WRITES[write](pad, store)
        assert str(written.value) == str(read.value)
        assert len(pad.turn(ALICE, "t2", now=LATER).history(now=LATER)) == 2  # other turns take writes
        pad.put(ALICE, "t2", 3, "fetch", "another turn", now=LATER)
    assert _entries(store) == count  # nothing went in


def test_a_write_into_a_turn_verify_named_is_refused(store: dict[str, Any]) -> None:
    with _raw(store) as raw:
        tail_truncation(raw, store)
    with _open(store) as pad:
        assert "t1" in {p["turn_id"] for p in pad.verify(now=LATER)["problems"]}
        with pytest.raises(IntegrityError, match="rows were removed"):
            WRITES["put"](pad, store)


def test_a_write_into_a_turn_gc_left_uncollected_is_refused(store: dict[str, Any]) -> None:
    with _raw(store) as raw:
        tail_truncation(raw, store)
    with _open(store) as pad:
        pad.gc(now=NOW + 7200)  # everything expired: the tampered turn is left as it is
        with pytest.raises(IntegrityError, match="rows were removed"):
            pad.put(ALICE, "t1", 9, "fetch", "after", now=NOW + 7200)


def test_a_turn_put_back_as_it_was_takes_writes_again(store: dict[str, Any]) -> None:
    with _raw(store) as raw:
        taken = snapshot(raw)
        tail_truncation(raw, store)
    with _open(store) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t1", now=LATER).history(now=LATER)
        with pytest.raises(IntegrityError):
            WRITES["put"](pad, store)
        with _raw(store) as raw:  # the backup restored while the store is open
            restore(raw, taken)
        WRITES["put"](pad, store)
        assert len(pad.turn(ALICE, "t1", now=LATER).history(now=LATER)) == 6
        assert pad.verify(now=LATER)["ok"]


@pytest.mark.parametrize("edit", [tail_truncation, head_deleted, head_swapped], ids=lambda e: e.__name__)
def test_a_turn_no_backup_restores_is_dropped_explicitly(store: dict[str, Any], edit: Edit) -> None:
    with _raw(store) as raw:
        edit(raw, store)
    with _open(store) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t1", now=LATER).history(now=LATER)
        with pytest.raises(IntegrityError):
            WRITES["put"](pad, store)
        removed = pad.drop_turn("alice", "t1")
        assert removed["entries"] == _entries(store) + len(store["ids"]) - (2 if edit is tail_truncation else 0)
        assert (removed["checkpoints"], removed["compaction_marks"]) == (2, 1)
        assert _entries(store) == 0
        assert pad.turn(ALICE, "t1", now=LATER).history(now=LATER) == []  # its rows are lost, the turn reads empty
        WRITES["put"](pad, store)  # and takes writes again
        assert len(pad.turn(ALICE, "t2", now=LATER).history(now=LATER)) == 2
        report = pad.verify(now=LATER)
        assert report["ok"], report["problems"]


def test_dropping_a_turn_checks_its_identifiers(store: dict[str, Any]) -> None:
    with _open(store) as pad:
        with pytest.raises(InvalidArgumentError):
            pad.drop_turn("alice", "")
        with pytest.raises(InvalidArgumentError):
            pad.drop_turn("", "t1")
        assert pad.drop_turn("alice", "never-written")["turn_heads"] == 0
        assert pad.verify(now=LATER)["ok"]


def test_a_turn_this_process_wrote_last_and_found_tampered_takes_no_write(pad: Scratchpad, store_location: Any) -> None:
    """On PostgreSQL the process that sealed a turn's head last puts into it in
    one statement that checks only that the head is still the one it sealed:
    rows deleted beside an untouched head would pass that check."""
    ids = record_turn(pad, ALICE, "t1", 5)
    pad.put(ALICE, "t1", 6, "fetch", "sealed here last", now=NOW)
    with _raw({"where": store_location, "backend": pad.backend}) as raw:
        tail_truncation(raw, {"ids": ids})
    with pytest.raises(IntegrityError):
        pad.turn(ALICE, "t1", now=LATER).history(now=LATER)
    with pytest.raises(IntegrityError, match="rows were removed"):
        pad.put(ALICE, "t1", 7, "fetch", "after the edit", now=LATER)
