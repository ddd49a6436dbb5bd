"""What one gc pass may read: the quick gc a turn starts with recounts a
bounded number of rows, whatever another tenant's turn holds.

gc checks each turn it collects from against its head, whole (its inventory
recounted), under the store-wide write lock. One tenant's long turn with one
expiring entry made every tenant's ``turn()`` recount it; the quick gc now
leaves a turn longer than its budget to a full ``gc``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import ExpiredError, Keyring, NotFoundError, Scratchpad
from securepad._assembly import QUICK_GC_RECOUNT_ROWS
from securepad.store import sqlite_of
from tests.support.principals import ALICE, BOB

LONG = QUICK_GC_RECOUNT_ROWS + 100


def _long_turn_with_one_expiring_entry(pad: Scratchpad) -> None:
    for first in range(0, LONG, 500):
        pad.put_many(ALICE, "long", [(i, "tool", f"row {i}") for i in range(first, min(first + 500, LONG))])
    pad.put(ALICE, "long", LONG, "tool", "expires", ttl_seconds=60, now=time.time() - 120)


@contextmanager
def _rows_read(pad: Scratchpad) -> Iterator[list[int]]:
    """The rows every statement on this thread's connection returns meanwhile."""
    conn = sqlite_of(pad).conn
    count = [0]

    def tracer(cursor: apsw.Cursor, row: Any) -> Any:
        count[0] += 1
        return row

    conn.row_trace = tracer
    try:
        yield count
    finally:
        conn.row_trace = None


def test_a_turn_start_does_not_recount_another_tenants_long_turn(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        _long_turn_with_one_expiring_entry(pad)
        pad.put(BOB, "short", 0, "tool", "bob's", ttl_seconds=60, now=time.time() - 120)
        pad.put(BOB, "short", 1, "tool", "bob's live one")
        with _rows_read(pad) as read:
            pad.turn(BOB, "b")
        # The expired rows, the heads of their turns, bob's short turn recounted: not alice's long one.
        assert read[0] < 40
        assert len(pad.list_for_turn(BOB, "short")) == 1  # bob's expired entry was collected
        assert sqlite_of(pad).query("SELECT COUNT(*) AS n FROM entries WHERE turn_id = 'long'")[0]["n"] == LONG + 1
        with _rows_read(pad) as read:
            assert pad.gc() == 1  # a full gc recounts the long turn and collects its entry
        assert read[0] > LONG


def test_the_quick_gc_leaves_a_long_turn_to_the_full_gc(pad: Scratchpad) -> None:
    _long_turn_with_one_expiring_entry(pad)
    pad.turn(BOB, "b")
    assert pad.stats(now=0)["entries"] == LONG + 1  # still there: past the quick gc's budget
    assert pad.gc() == 1
    assert pad.stats(now=0)["entries"] == LONG
    assert len(pad.list_for_turn(ALICE, "long")) == LONG


def test_the_quick_gc_collects_from_short_turns(pad: Scratchpad) -> None:
    for step in range(5):
        pad.put(ALICE, "short", step, "tool", f"s{step}", ttl_seconds=60, now=time.time() - 120 if step < 3 else None)
    pad.turn(BOB, "b")
    assert pad.stats(now=0)["entries"] == 2
    assert [e["step_num"] for e in pad.list_for_turn(ALICE, "short")] == [3, 4]


def test_an_expired_entry_the_quick_gc_leaves_is_never_served(pad: Scratchpad) -> None:
    """Past the quick gc's budget an expired entry stays in the store until a
    full gc; every read refuses it meanwhile, as after its collection."""
    _long_turn_with_one_expiring_entry(pad)
    expired = pad.put(ALICE, "long", LONG + 1, "tool", "expires too", ttl_seconds=60, now=time.time() - 120)
    pad.turn(BOB, "b")
    assert pad.stats(now=0)["entries"] == LONG + 2  # left for a full gc
    steps = pad.turn(ALICE, "long").steps()
    assert len(steps) == LONG and all(step["step_num"] < LONG for step in steps)
    with pytest.raises(ExpiredError):
        pad.get(ALICE, expired["scratchpad_id"])
    with pytest.raises(ExpiredError):
        pad.read(ALICE, expired["scratchpad_id"], mode="grep", pattern="expires")
    listed = pad.list_for_turn(ALICE, "long")
    assert len(listed) == LONG and expired["scratchpad_id"] not in {e["scratchpad_id"] for e in listed}
    assert pad.gc() == 2
    with pytest.raises(NotFoundError):
        pad.get(ALICE, expired["scratchpad_id"])


def test_a_turn_start_does_not_read_the_expired_rows_of_a_turn_past_the_budget(db_path: Path, keyring: Keyring) -> None:
    """Every entry of another tenant's long turn has expired: the quick gc
    leaves the turn to a full gc from its head alone, without reading its
    expired rows at each turn's start."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        past = time.time() - 120
        for first in range(0, LONG, 500):
            items = [(i, "tool", f"row {i}") for i in range(first, min(first + 500, LONG))]
            pad.put_many(ALICE, "long", items, 60, now=past)
        with _rows_read(pad) as read:
            pad.turn(BOB, "b")
        assert read[0] < 40  # before: every expired row of the long turn, at every turn's start
        assert pad.stats(now=0)["entries"] == LONG
        assert pad.gc() == LONG
        assert pad.list_for_turn(ALICE, "long") == []


def test_the_quick_gc_collects_short_turns_beside_a_long_expired_one(pad: Scratchpad) -> None:
    past = time.time() - 120
    for first in range(0, LONG, 500):
        pad.put_many(
            ALICE, "long", [(i, "tool", f"row {i}") for i in range(first, min(first + 500, LONG))], 60, now=past
        )
    pad.put(BOB, "short", 0, "tool", "bob's", ttl_seconds=60, now=past)
    pad.put(BOB, "short", 1, "tool", "bob's live one")
    pad.turn(BOB, "b")
    assert pad.stats(now=0)["entries"] == LONG + 1  # bob's expired one collected, the long turn left
    assert [e["step_num"] for e in pad.list_for_turn(BOB, "short")] == [1]
    assert pad.verify()["ok"]  # every head still matches its turn
    assert pad.gc() == LONG
    assert pad.list_for_turn(ALICE, "long") == []
    assert pad.verify()["ok"]
