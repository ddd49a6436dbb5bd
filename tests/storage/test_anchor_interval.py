"""With ``anchor_sync = "interval"`` the write transaction that crosses the
interval advances the store's counter itself, as every one does with
``commit``; the background thread only makes the commits durable and raises
the anchor to that counter, with no transaction of its own. So the sync moves
no other connection's data version, and a read after it recounts nothing; the
window is the same: every write up to the crossing one is anchored once the
anchor holds its counter, later ones at the next crossing or at close."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import apsw
import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError, SecurepadError
from securepad.store import sqlite_of
from tests.support.anchors import (
    anchor_of_pad,
    await_anchored,
    copy_store,
    cross_interval,
    file_counter,
    put_back,
    store_counter,
)
from tests.support.meters import ReadMeter
from tests.support.principals import ALICE
from tests.support.store_costs import turn_put_costs

# An interval no test waits for: ``cross_interval`` makes a write the crossing one.
INTERVAL = Policy.from_dict({"storage": {"anchor_sync": "interval", "anchor_interval_seconds": 3600}})
NOW = 1_000_000.0


def _put(pad: Scratchpad, step: int, turn: str = "t") -> str:
    return str(pad.put(ALICE, turn, step, "tool", f"step {step}", now=NOW)["scratchpad_id"])


def _steps(pad: Scratchpad, turn: str = "t") -> list[int]:
    return [e["step_num"] for e in pad.list_for_turn(ALICE, turn, now=NOW)]


def test_the_crossing_write_carries_the_advance_and_the_sync_runs_no_transaction(
    db_path: Path, keyring: Keyring
) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        quiet = turn_put_costs(pad, ALICE, "t", 2)  # inside the interval
        counter = store_counter(db_path)
        cross_interval(pad)
        crossing = turn_put_costs(pad, ALICE, "t", 3)
        assert crossing["statements"] == quiet["statements"] + 1  # the counter's UPDATE, in its transaction
        assert store_counter(db_path) == counter + 1
        await_anchored(pad, counter + 1)
        assert file_counter(pad) == counter + 1  # the anchor holds the crossing write's counter
        assert store_counter(db_path) == counter + 1  # and the sync wrote nothing to the store
        after = turn_put_costs(pad, ALICE, "t", 4)  # the next interval has begun: a quiet put again
        assert after["statements"] == quiet["statements"]
        assert store_counter(db_path) == counter + 1


def test_a_read_after_the_crossing_write_and_its_sync_recounts_nothing(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        meter = ReadMeter(pad)
        _put(pad, 1)
        quiet_id = _put(pad, 2)
        quiet = meter.counts(lambda: pad.read(ALICE, quiet_id, "tail", 2, now=NOW))
        cross_interval(pad)
        crossing_id = _put(pad, 3)
        await_anchored(pad, store_counter(db_path))
        after = meter.counts(lambda: pad.read(ALICE, crossing_id, "tail", 2, now=NOW))
        # No commit of another connection since this thread's write: the turn's inventory is
        # not counted again (a recount is a third statement and a row per entry of the turn).
        assert after["statements"] == quiet["statements"] == 2
        assert after["rows"] == quiet["rows"]


def test_copies_from_before_the_crossing_write_are_refused_and_from_after_accepted(
    db_path: Path, keyring: Keyring, tmp_path: Path
) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        copy_store(db_path, tmp_path / "before")
        cross_interval(pad)
        _put(pad, 2)  # the crossing write
        crossing = store_counter(db_path)
        await_anchored(pad, crossing)
        copy_store(db_path, tmp_path / "after")
        anchor = anchor_of_pad(pad).path
        shutil.copy2(anchor, tmp_path / "anchor-then")  # what a kill here would leave
        _put(pad, 3)  # inside the interval: anchored at the next crossing or at close
    assert store_counter(db_path) > crossing  # close anchored step 3
    shutil.copy2(tmp_path / "anchor-then", anchor)  # the writers were killed instead of closing
    put_back(tmp_path / "before", db_path)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL)
    put_back(tmp_path / "after", db_path)  # the window: the writes after the crossing one
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        assert _steps(pad) == [1, 2]


def test_a_counter_rolled_back_while_the_store_is_open_stops_the_crossing_write(
    db_path: Path, keyring: Keyring
) -> None:
    pad = Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL)
    _put(pad, 1)
    conn = apsw.Connection(str(db_path))
    ((older,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    cross_interval(pad)
    _put(pad, 2)
    await_anchored(pad, store_counter(db_path))
    conn.execute("UPDATE store_meta SET value = ? WHERE key = 'write_counter'", (older,))
    conn.close()
    _put(pad, 3)  # inside the interval: it does not read the counter
    cross_interval(pad)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        _put(pad, 4)  # the crossing write finds the counter below the anchor, and is rolled back
    assert _steps(pad) == [1, 2, 3]
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        pad.close()  # close advances the counter too, and refuses it


def test_a_crossing_transaction_that_rolls_back_leaves_the_counter_and_the_anchor(
    db_path: Path, keyring: Keyring
) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        cross_interval(pad)
        _put(pad, 2)
        counter = store_counter(db_path)
        await_anchored(pad, counter)
        conn = sqlite_of(pad).conn  # this thread's connection: the counter's UPDATE fails in it
        conn.execute(
            "CREATE TEMP TRIGGER refuse_counter BEFORE UPDATE ON main.store_meta"
            " WHEN NEW.key = 'write_counter' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        cross_interval(pad)
        with pytest.raises(SecurepadError):
            _put(pad, 3)  # rolled back after its counter's advance was made
        assert _steps(pad) == [1, 2]
        assert store_counter(db_path) == counter
        assert file_counter(pad) == counter
        assert pad.stats()["anchor"]["committed"] == counter  # the advance was not recorded
        conn.execute("DROP TRIGGER temp.refuse_counter")
        _put(pad, 3)  # still due: this write carries the advance
        assert store_counter(db_path) == counter + 1
        await_anchored(pad, counter + 1)
        assert file_counter(pad) == counter + 1


def test_a_transaction_without_the_hooks_carries_no_advance(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        counter = store_counter(db_path)
        cross_interval(pad)
        with sqlite_of(pad).transaction(admin=True, hooks=False) as conn:
            conn.execute("INSERT OR REPLACE INTO store_meta(key, value) VALUES ('unrelated', 'x')")
        assert store_counter(db_path) == counter
        _put(pad, 2)  # the next hooked write carries it
        assert store_counter(db_path) == counter + 1


def test_close_anchors_the_writes_after_the_crossing_one(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        cross_interval(pad)
        _put(pad, 2)
        crossing = store_counter(db_path)
        await_anchored(pad, crossing)
        _put(pad, 3)
        _put(pad, 4)
        anchor = anchor_of_pad(pad)
    assert store_counter(db_path) == crossing + 1  # close's own transaction
    assert anchor.floor == crossing + 1
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        assert _steps(pad) == [1, 2, 3, 4]
        assert file_counter(pad) == crossing + 1


def test_an_idle_store_writes_nothing_and_starts_no_thread(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
    counter = store_counter(db_path)
    before = set(threading.enumerate())
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        cross_interval(pad)
        assert _steps(pad) == [1]  # reads only
        assert file_counter(pad) == counter
    assert store_counter(db_path) == counter
    assert not [t for t in set(threading.enumerate()) - before if t.name == "securepad-anchor"]


def test_threads_writing_across_the_interval_leave_the_anchor_at_the_store(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 0, turn="warm")
        cross_interval(pad)
        ready = threading.Barrier(4)
        errors: list[BaseException] = []

        def write(turn: str) -> None:
            try:
                ready.wait()
                for step in range(1, 11):
                    _put(pad, step, turn=turn)
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(f"t{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        counter = store_counter(db_path)
        await_anchored(pad, counter)  # one write or more carried the advance; the anchor follows
        assert file_counter(pad) == counter
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        assert [len(_steps(pad, f"t{i}")) for i in range(4)] == [10] * 4


def test_a_quiet_write_marks_the_store_written_without_a_call_and_a_failure_still_reaches_the_next(
    db_path: Path, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write inside the interval does all ``after_commit`` would (the mark that ``close``
    anchors) without calling it; a failure the sync found still stops the next write."""
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        _put(pad, 1)
        anchor = anchor_of_pad(pad)
        calls: list[bool] = []
        after_commit = type(anchor).after_commit
        monkeypatch.setattr(
            type(anchor), "after_commit", lambda self, advanced: calls.append(advanced) or after_commit(self, advanced)
        )
        anchor.advance()  # anchored: nothing written since
        assert not anchor.written
        _put(pad, 2)
        assert anchor.written and calls == []
        anchor.failed = IntegrityError("the anchor was altered")
        with pytest.raises(IntegrityError, match="altered"):
            _put(pad, 3)  # committed, then told
        assert calls == [False] and anchor.failed is None
        anchor.advance()  # the marked writes anchored, as ``close`` anchors them
        assert not anchor.written
        assert file_counter(pad) == store_counter(db_path)
