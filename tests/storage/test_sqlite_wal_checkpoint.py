"""The SQLite write-ahead log under readers: what a commit checkpoints, when a
write is refused, what the refusal says, and how big one transaction may be.

A passive checkpoint copies frames into the database but never starts the WAL
again: with several readers one of them always holds some snapshot, so the
WAL only grows. Past a threshold the writer that committed runs a RESTART
checkpoint that waits briefly for those readers; a write is refused only
when the frames not yet copied pass the limit, after waiting for them.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from securepad import Keyring, Policy, QuotaExceededError, Scratchpad, SecurepadError, StorageFullError, StoreBusyError
from securepad.storage.wal import WalWatch
from securepad.store import sqlite_of
from tests.support.principals import ALICE, BOB

pytestmark = pytest.mark.sqlite_only

MIB = 1024 * 1024


def _open(db_path: Path, keyring: Keyring, limit: int) -> Scratchpad:
    # No anchor: its background sync writes (and checkpoints) on a thread of its own.
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit}})
    return Scratchpad.open(db_path, keyring=keyring, policy=policy, anchor=False)


def _wal(pad: Scratchpad) -> dict[str, object]:
    return sqlite_of(pad).wal_status()


# How long a write over the limit (and the restart at the limit) waits for
# readers: the store's 2 s, or a shorter wait for a test in which a reader
# holds its snapshot throughout (the outcome is the same, sooner).
WAL_WAIT_S = 2.0
SHORT_WAIT_S = 0.25


def _wait(pad: Scratchpad, seconds: float) -> None:
    db = sqlite_of(pad)
    assert db._wal_wait_s in (WAL_WAIT_S, SHORT_WAIT_S)  # the store's own wait, or this test's
    db._wal_wait_s = seconds


class _Reader:
    """Another connection that holds one read snapshot from ``begin`` to ``end``."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path
        self.conn: apsw.Connection | None = None

    def begin(self) -> _Reader:
        if self.conn is None:
            self.conn = apsw.Connection(str(self.path))
        self.conn.execute("BEGIN")
        self.conn.execute("SELECT COUNT(*) FROM entries").fetchall()
        return self

    def end(self) -> None:
        assert self.conn is not None
        self.conn.execute("COMMIT")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


@pytest.fixture
def reader(db_path: Path) -> Iterator[_Reader]:
    holder = _Reader(db_path)
    yield holder
    holder.close()


def test_a_commit_past_the_restart_threshold_restarts_the_wal(db_path: Path, keyring: Keyring) -> None:
    # A 4 MiB limit: the WAL restarts past 1 MiB (a quarter of it), 256 frames.
    with _open(db_path, keyring, 4 * MIB) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        before = _wal(pad)["checkpoints"]
        for step in range(1, 6):  # a few frames each: under the threshold, nothing to do
            pad.put(ALICE, "t", step, "tool", "small")
        assert _wal(pad)["checkpoints"] == before
        for step in range(6, 200):
            pad.put(ALICE, "t", step, "tool", random.randbytes(8 * 1024))
            assert int(_wal(pad)["wal_bytes"]) <= MIB + 64 * 1024  # the frames of the commit that crossed it
        counts = _wal(pad)["checkpoints"]
        assert isinstance(counts, dict)
        assert counts["restart"] >= 2
        assert counts["passive"] == 0  # never 1,000 frames waiting
        assert counts["truncate"] == 0  # a write never needs the WAL cut to zero
        assert Path(f"{db_path}-wal").stat().st_size <= MIB + 64 * 1024


def test_another_owners_put_goes_through_after_big_batches_and_a_read(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    """The WAL holds more frames than its limit, all of them copied into the
    database; a read that began after the last commit pins none of them."""
    limit = 2 * MIB
    with _open(db_path, keyring, limit) as pad:
        _wait(pad, SHORT_WAIT_S)  # the restarts the held reader fails end sooner
        pad.put(BOB, "b", 0, "tool", "bob's first")
        held = _Reader(db_path).begin()  # a reader over each batch keeps the WAL from restarting
        for batch in range(3):
            pad.put_many(ALICE, f"big{batch}", [(i, "tool", random.randbytes(60_000)) for i in range(12)])
            held.end()
            held.begin()
        held.end()
        held.close()
        _wait(pad, WAL_WAIT_S)
        assert int(_wal(pad)["wal_bytes"]) > limit
        reader.begin()  # after every commit: it pins nothing
        pad.put(BOB, "b", 1, "tool", "bob's second")  # refused before: the WAL's total was over the limit
        assert [e["step_num"] for e in pad.list_for_turn(BOB, "b")] == [0, 1]
        assert int(_wal(pad)["wal_pending_bytes"]) < limit
        reader.end()


def test_the_wal_restarts_while_readers_hold_short_snapshots(db_path: Path, keyring: Keyring) -> None:
    """Three threads read in a loop, each holding its snapshot ~2 ms, so that
    some reader holds one almost always: a passive checkpoint never restarts
    the WAL then, and every write was refused once it reached its limit."""
    limit = 4 * MIB
    stop = threading.Event()
    overlapped = [0]

    def read_in_a_loop() -> None:
        conn = apsw.Connection(str(db_path))
        try:
            while not stop.is_set():
                conn.execute("BEGIN")
                conn.execute("SELECT COUNT(*) FROM entries").fetchall()
                overlapped[0] += 1
                time.sleep(0.002)
                conn.execute("COMMIT")
        finally:
            conn.close()

    with _open(db_path, keyring, limit) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        readers = [threading.Thread(target=read_in_a_loop) for _ in range(3)]
        for thread in readers:
            thread.start()
        try:
            largest = 0
            for step in range(1, 1000):  # ~3 times the limit through the WAL
                pad.put(ALICE, f"t{step // 100}", step, "tool", random.randbytes(4096))
                largest = max(largest, int(_wal(pad)["wal_bytes"]))
        finally:
            stop.set()
            for thread in readers:
                thread.join()
        counts = _wal(pad)["checkpoints"]
        assert isinstance(counts, dict)
        assert overlapped[0] > 0
        assert counts["restart"] >= 1
        assert largest < limit
        assert Path(f"{db_path}-wal").stat().st_size < limit


def test_a_reader_that_holds_one_snapshot_is_named_truly_when_writes_are_refused(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    with _open(db_path, keyring, 2 * MIB) as pad:
        _wait(pad, SHORT_WAIT_S)
        pad.put(ALICE, "t", 0, "tool", "first")
        reader.begin()  # holds one snapshot from here on: every frame after it stays
        refused = None
        for step in range(1, 200):
            try:
                pad.put(ALICE, "t", step, "tool", random.randbytes(32 * 1024))
            except StoreBusyError as exc:
                refused = str(exc)
                break
        assert refused is not None
        assert "not yet copied into the database, over its 2 MiB limit" in refused
        held = f"a reader has held a snapshot older than them throughout the {SHORT_WAIT_S:g} s this write waited"
        assert held in refused
        assert int(_wal(pad)["wal_pending_bytes"]) > 2 * MIB
        # A write that may not wait (a turn's quick gc) is refused at once, and says so.
        with pytest.raises(StoreBusyError) as at_once, sqlite_of(pad).transaction(wait=False):
            pass
        assert "over its 2 MiB limit: a reader holds a snapshot older than them;" in str(at_once.value)
        pad.turn(ALICE, "t")  # its quick gc gives up, the turn starts
        reader.end()
        pad.put(ALICE, "t", 500, "tool", "after the reader")
        assert int(_wal(pad)["wal_pending_bytes"]) < 2 * MIB


def test_a_write_over_the_limit_waits_for_a_reader_that_ends_within_the_wait(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    with _open(db_path, keyring, 2 * MIB) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        assert sqlite_of(pad).checkpoint()  # every frame in the WAL from here on is newer than the reader
        reader.begin()
        _wait(pad, SHORT_WAIT_S)  # the restart at the limit fails sooner: the reader holds on
        step = 1
        while int(_wal(pad)["wal_pending_bytes"]) <= 2 * MIB:
            pad.put(ALICE, "t", step, "tool", random.randbytes(32 * 1024))
            step += 1
        _wait(pad, WAL_WAIT_S)
        # The reader ends well within the write's 2 s wait: the write waits, then goes through.
        ender = threading.Timer(0.2, reader.end)
        ender.start()
        pad.put(ALICE, "t", step, "tool", "waited")
        ender.join()
        counts = _wal(pad)["checkpoints"]
        assert isinstance(counts, dict) and counts["restart"] >= 1
        assert pad.get(ALICE, pad.list_for_turn(ALICE, "t")[-1]["scratchpad_id"]).observation == "waited"


def test_a_batch_bigger_than_one_transaction_may_write_is_refused_up_front(db_path: Path, keyring: Keyring) -> None:
    """With a 2 MiB WAL limit a transaction writes at most 1 MiB."""
    with _open(db_path, keyring, 2 * MIB) as pad:
        pad.put(ALICE, "a", 0, "tool", "alice's")
        changes = sqlite_of(pad).conn.total_changes()
        items = [(i, "tool", random.randbytes(300_000)) for i in range(4)]
        with pytest.raises(QuotaExceededError, match=r"at most 1048576 in one .*nothing was stored; split the batch"):
            pad.put_many(ALICE, "big", items)
        with pytest.raises(QuotaExceededError, match="at most 1048576 in one"):
            pad.turn(ALICE, "chosen").record_many([("tool", obs) for _, _, obs in items])
        with pytest.raises(QuotaExceededError, match="the entry would write"):
            pad.put(ALICE, "one", 0, "tool", random.randbytes(1_100_000))
        assert sqlite_of(pad).conn.total_changes() == changes  # not a row written
        assert pad.list_for_turn(ALICE, "big") == []
        pad.put_many(ALICE, "big", items[:2])  # under the bound: stored
        assert len(pad.list_for_turn(ALICE, "big")) == 2


def test_a_checkpoint_waits_out_another_connections_checkpoint(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    """SQLite does not wait for another connection's checkpoint (it returns
    busy at once): the store's checkpoint tries again within its own wait."""
    with _open(db_path, keyring, 64 * MIB) as pad:
        for step in range(20):
            pad.put(ALICE, "t", step, "tool", random.randbytes(8192))
        reader.begin()
        pad.put(ALICE, "t", 100, "tool", "after the reader")  # frames the reader's snapshot does not hold
        other = apsw.Connection(str(db_path))
        other.execute("SELECT COUNT(*) FROM entries").fetchall()  # the connection has the WAL open
        other.set_busy_timeout(5000)
        started = threading.Event()

        def restart() -> None:
            started.set()
            other.wal_checkpoint(
                mode=apsw.SQLITE_CHECKPOINT_RESTART
            )  # holds the checkpoint lock, waiting for the reader

        thread = threading.Thread(target=restart)
        thread.start()
        started.wait()
        time.sleep(0.1)
        ender = threading.Timer(0.3, reader.end)
        ender.start()
        try:
            assert sqlite_of(pad).checkpoint() is True
        finally:
            ender.join()
            thread.join()
            other.close()
        assert int(_wal(pad)["wal_pending_bytes"]) == 0


def test_a_refusal_while_another_connections_checkpoint_holds_the_log_says_so(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    with _open(db_path, keyring, 2 * MIB) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        assert sqlite_of(pad).checkpoint()
        reader.begin()
        _wait(pad, SHORT_WAIT_S)
        step = 1
        while int(_wal(pad)["wal_pending_bytes"]) <= 2 * MIB:
            pad.put(ALICE, "t", step, "tool", random.randbytes(32 * 1024))
            step += 1
        other = apsw.Connection(str(db_path))
        other.execute("SELECT COUNT(*) FROM entries").fetchall()
        other.set_busy_timeout(4000)  # longer than the write's wait: it holds the checkpoint lock throughout
        thread = threading.Thread(target=lambda: other.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_RESTART))
        thread.start()
        time.sleep(0.1)
        try:
            with pytest.raises(StoreBusyError) as refused:
                pad.put(ALICE, "t", step, "tool", "refused")
        finally:
            reader.end()
            thread.join()
            other.close()
        held = f"another connection's checkpoint held the log throughout the {SHORT_WAIT_S:g} s this write waited"
        assert held in str(refused.value)


def test_a_restart_that_readers_keep_failing_is_tried_at_the_limit_with_the_long_wait() -> None:
    """Readers that each hold a snapshot a little longer than a restart's
    250 ms, one after another, fail every short restart although nothing is
    pending: the restart at the limit waits as long as a write over it does,
    once per limit's worth of frames, so the file does not grow with every
    write (before, the next try was always as many frames again, short)."""
    watch = WalWatch(limit_bytes=4 * MIB)  # restarts every 1 MiB (256 frames), the limit at 1,024
    assert (watch.restart_pages(), watch.limit_pages()) == (256, 1024)
    watch.pages = 900
    watch.restart_failed()  # a short restart failed below the limit: the next one is at the limit
    assert watch.restart_at == 1024 and not watch.long_due()
    watch.pages = 1030
    assert watch.restart_due() and watch.long_due()
    watch.restart_failed()  # the long one failed too: short ones again, the next long one a limit later
    assert watch.restart_at == 1030 + 256 and watch.long_at == 1030 + 1024
    watch.pages = 1030 + 256
    assert watch.restart_due() and not watch.long_due()
    watch.saw("restart", 1290, 1290)  # a restart finished: the WAL starts again
    assert (watch.pages, watch.restart_at, watch.long_at) == (0, 256, 1024)


def _over_the_limit(pad: Scratchpad, reader: _Reader, limit: int) -> int:
    """Writes while ``reader`` holds its snapshot until the frames not yet
    copied pass ``limit``; returns the next free step."""
    pad.put(ALICE, "t", 0, "tool", "first")
    assert sqlite_of(pad).checkpoint()
    reader.begin()
    _wait(pad, SHORT_WAIT_S)  # the restart at the limit fails sooner: the reader holds on
    step = 1
    while int(_wal(pad)["wal_pending_bytes"]) <= limit:
        pad.put(ALICE, "t", step, "tool", random.randbytes(32 * 1024))
        step += 1
    _wait(pad, WAL_WAIT_S)
    return step


def test_a_write_whose_wal_cannot_be_copied_for_lack_of_room_says_the_disk_is_full(
    small_disk: Path, keyring: Keyring
) -> None:
    """The reader has ended, but the database file cannot grow to take the
    frames: the write is refused at once as a full disk, not as a reader."""
    db = small_disk / "store.db"
    reader = _Reader(db)
    with _open(db, keyring, 1 * MIB) as pad:
        step = _over_the_limit(pad, reader, 1 * MIB)
        reader.end()
        reader.close()
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, bytes(4096)):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        before = dict(_wal(pad)["checkpoints"])  # type: ignore[call-overload]
        with pytest.raises(StorageFullError) as refused:
            pad.put(ALICE, "t", step, "tool", "no room")
        message = str(refused.value)
        assert "not yet copied into the database, over its 1 MiB limit" in message
        assert "no room to copy them" in message and "nothing was written" in message
        assert "reader" not in message
        after = _wal(pad)["checkpoints"]
        assert isinstance(after, dict)
        # One try: the write does not spin on a disk that stays full for its whole wait.
        assert after["passive"] - before["passive"] == 1 and after["restart"] == before["restart"]
        assert len(pad.list_for_turn(ALICE, "t")) == step
        (small_disk / "filler").unlink()
        pad.put(ALICE, "t", step, "tool", "room again")
        assert len(pad.list_for_turn(ALICE, "t")) == step + 1


def test_a_checkpoint_inside_the_connections_own_transaction_fails_at_once_and_says_nothing_false(
    db_path: Path, keyring: Keyring, reader: _Reader
) -> None:
    """SQLite refuses a checkpoint on a connection inside a transaction
    (SQLITE_LOCKED): waiting cannot change that, so nothing waits for it,
    and no refusal blames another connection."""
    with _open(db_path, keyring, 1 * MIB) as pad:
        db = sqlite_of(pad)
        _over_the_limit(pad, reader, 1 * MIB)
        with db.snapshot() as conn:
            conn.execute("SELECT COUNT(*) FROM entries").fetchall()
            assert db.checkpoint() is False
            with pytest.raises(SecurepadError) as refused, db.transaction():
                pass
        assert not isinstance(refused.value, StoreBusyError)
        assert "within a transaction" in str(refused.value)
        reader.end()


def test_a_turn_record_bigger_than_one_transaction_may_write_is_refused_up_front(
    db_path: Path, keyring: Keyring
) -> None:
    """Turn checkpoints are bounded like entries: with a 1 MiB WAL limit one
    transaction writes at most 512 KiB, whatever ``max_entry_bytes`` allows."""
    with _open(db_path, keyring, 1 * MIB) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")  # the owner's key exists
        turn = pad.turn(ALICE, "t")
        changes = sqlite_of(pad).conn.total_changes()
        with pytest.raises(QuotaExceededError, match=r"the turn record would write .* at most 524288 in one"):
            turn.checkpoint(facts=["x" * 600_000])
        assert sqlite_of(pad).conn.total_changes() == changes
        assert turn.latest_checkpoint() is None
        turn.checkpoint(facts=["x" * 400_000])  # under the bound: stored
        saved = turn.latest_checkpoint()
        assert saved is not None and saved["facts"] == ["x" * 400_000]
