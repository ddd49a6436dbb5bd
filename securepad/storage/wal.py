"""SQLite's write-ahead log: its bound, the checkpoints that keep it there
(our replacement for SQLite's auto-checkpoint), and the busy handler."""

from __future__ import annotations

import contextlib
import errno
import random
import time
from collections.abc import Callable
from pathlib import Path

import apsw

from ..errors import SecurepadError, StorageFullError, StoreBusyError, StoreCorruptError

__all__ = ["WAL_LIMIT_BYTES", "BusyHandler", "ErrorMap", "WalWatch", "storage_error"]

# The write-ahead log's bound, on the frames a checkpoint has not yet copied
# into the database (a passive checkpoint copies every frame older than the
# oldest reader's snapshot): those are what a reader that holds one snapshot
# keeps growing, 652 MB in 60 s at 200 puts/s under one long reader. Past it a
# write waits (``WAL_WAIT_MS``) for a checkpoint, then fails with StoreBusyError
# until the reader ends: the file stays bounded and writers see a retryable error.
WAL_LIMIT_BYTES = 256 * 1024 * 1024
# Checkpoint (PASSIVE, never waiting) once this many frames wait to be copied,
# as SQLite's own auto-checkpoint does; our WAL hook replaces SQLite's.
AUTOCHECKPOINT_PAGES = 1000
# A passive checkpoint copies frames but never restarts the WAL: with several
# readers one of them always holds some snapshot, so the file grows with every
# write. Once the WAL holds this much (or a quarter of its limit, if less), the
# writer that committed runs a RESTART checkpoint after its commit: it holds
# the write lock and waits at most ``RESTART_WAIT_MS`` for the readers of
# older snapshots to end (new ones read the database file), so the next write
# starts the WAL again from its beginning. A reader that outlasts the wait
# leaves it for as many frames again; once the WAL's file has reached the
# limit, the restart waits as long as a write over the limit (``WAL_WAIT_MS``),
# once per limit's worth of frames: readers that each hold a snapshot longer
# than 250 ms, one after another, otherwise keep every restart from finishing
# and the file grows without end although every frame in it is copied.
RESTART_BYTES = 16 * 1024 * 1024
RESTART_WAIT_MS = 250
# How long a write that finds the WAL over its limit waits for the readers
# that pin it before StoreBusyError (within the busy timeout's 30 s).
WAL_WAIT_MS = 2_000
# When the WAL restarts its file is cut back to this size, or a quarter of its
# limit if less (SQLite otherwise keeps the largest size it ever reached until
# a TRUNCATE checkpoint).
WAL_KEEP_BYTES = 16 * 1024 * 1024
# How long a checkpoint that finds another connection's under way pauses before it tries again.
_CHECKPOINT_RETRY_S = 0.005
# ``WalWatch``'s names of SQLite's checkpoint modes.
_CHECKPOINT_MODES = {
    "passive": apsw.SQLITE_CHECKPOINT_PASSIVE,
    "restart": apsw.SQLITE_CHECKPOINT_RESTART,
    "truncate": apsw.SQLITE_CHECKPOINT_TRUNCATE,
}

ErrorMap = Callable[[apsw.Error | UnicodeDecodeError, apsw.Connection], SecurepadError]


class WalWatch:
    """The WAL as the store's connections last saw it, and our replacement for
    SQLite's auto-checkpoint. It holds no reference to the Database, so a store
    dropped without ``close`` is still collected.

    ``pages`` is the WAL's frame count after each commit of any of our
    connections (SQLite gives it to the hook: no extra system call), ``moved``
    how many of them the last checkpoint we ran had copied into the database;
    other processes' checkpoints move more, so ``pending`` is an upper bound,
    and a decision that refuses a write checkpoints first to know."""

    def __init__(self, limit_bytes: int) -> None:
        self.page_size = 4096
        self.limit_bytes = limit_bytes
        self.pages = 0
        self.moved = 0
        self.restart_at = self.long_at = 0
        self.started()
        # Frames our commits appended to the WAL, and checkpoints tried by
        # mode (``wal_status``): what a test can count.
        self.written = 0
        self.rebuilds = 0  # VACUUMs (``Database.scrub``)
        self.counts = {"passive": 0, "restart": 0, "truncate": 0}

    def started(self) -> None:
        """The WAL started again from its beginning (or the watch was set up):
        the next restart is due after ``restart_pages`` frames, and waits
        long (``Database.transaction``) from the limit on."""
        self.restart_at = self.restart_pages()
        self.long_at = self.limit_pages()

    def restart_pages(self) -> int:
        """The WAL's frame count past which a commit restarts it (``RESTART_BYTES``)."""
        return max(min(RESTART_BYTES, self.limit_bytes // 4) // self.page_size, 1)

    def limit_pages(self) -> int:
        return self.limit_bytes // self.page_size

    def pending(self) -> int:
        """Frames not yet copied into the database, as far as we know (at most)."""
        return max(self.pages - self.moved, 0)

    def bytes(self) -> int:
        return self.pages * self.page_size

    def saw(self, mode: str, frames: int, moved: int) -> None:
        """A checkpoint of ``mode`` returned: the WAL's frames and those copied."""
        if mode != "passive":  # everything copied and no reader in the WAL: the next write restarts it
            frames = moved = 0
        self.pages, self.moved = max(frames, 0), max(moved, 0)
        if mode != "passive":
            self.started()

    def restart_failed(self) -> None:
        """A reader outlasted the restart's wait: try again once as many frames
        again are written, or at ``long_at``, whichever comes first; a long
        wait that failed too waits long again only a limit's worth of frames
        later, so that a reader that holds one snapshot for minutes costs the
        writers one long wait per limit written, not per restart."""
        if self.long_due():
            self.long_at = self.pages + self.limit_pages()
        self.restart_at = min(self.pages + self.restart_pages(), self.long_at)

    def restart_due(self) -> bool:
        return self.pages >= self.restart_at

    def long_due(self) -> bool:
        """The WAL's file has reached ``long_at``: its restart waits as long as a write over the limit."""
        return self.pages >= self.long_at

    def hook(self, conn: apsw.Connection, dbname: str, pages: int) -> int:
        """After each commit: checkpoint as SQLite's auto-checkpoint would
        (PASSIVE: moves what readers allow, never waits); the restart, when
        due, runs after the commit returns (``Database.transaction``)."""
        if pages < self.pages:  # the WAL started again from its beginning
            self.moved = 0
            self.started()
            self.written += pages
        else:
            self.written += pages - self.pages
        self.pages = pages
        if self.pages - self.moved >= AUTOCHECKPOINT_PAGES:  # ``pending()``, without its call
            try:
                self.counts["passive"] += 1
                frames, moved = conn.wal_checkpoint(dbname, apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.Error:
                return apsw.SQLITE_OK  # the commit stands; a later one checkpoints
            self.saw("passive", frames, moved)
        return apsw.SQLITE_OK

    def check(self, conn: apsw.Connection, wait_s: float, error: ErrorMap, busy_s: float, path: Path) -> None:
        """Before a write: when the frames not yet copied into the database may
        be over the limit, checkpoint (PASSIVE) to know; while they are, wait
        for the readers that pin them (a RESTART checkpoint, ``wait_s`` in
        all), then refuse.

        Raises:
            StoreBusyError: a reader's snapshot still pins more than the limit.
            StorageFullError: the disk has no room to copy them into the database.
        """
        wal = self
        if wal.pending() <= wal.limit_pages():
            return
        deadline = time.monotonic() + wait_s
        while True:
            copied = self.checkpoint(conn, "passive", 0, error, busy_s)
            if wal.pending() <= wal.limit_pages() or copied in ("full", "own"):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self.checkpoint(conn, "restart", left, error, busy_s) == "done":
                return
        if wal.pending() <= wal.limit_pages() or copied == "own":
            return  # "own": BEGIN refuses a transaction inside this connection's own
        over = (
            f"the store's write-ahead log holds {wal.pending() * wal.page_size / 2**20:.0f} MiB of writes not yet"
            f" copied into the database, over its {self.limit_bytes / 2**20:g} MiB limit"
        )
        if copied == "full":
            raise StorageFullError(
                f"{over}, and the disk holding {path} has no room to copy them into it; nothing was written"
            )
        waited = f"throughout the {wait_s:g} s this write waited" if wait_s > 0 else "now"
        if copied == "checkpoint":
            raise StoreBusyError(
                f"{over}: another connection's checkpoint held the log {waited} (copying it, or waiting for a"
                " reader whose snapshot is older than those writes); try again"
            )
        held = f"has held a snapshot older than them {waited}" if wait_s > 0 else "holds a snapshot older than them"
        raise StoreBusyError(f"{over}: a reader {held}; writes resume when it ends")

    def checkpoint(self, conn: apsw.Connection, mode: str, wait_s: float, error: ErrorMap, busy_s: float) -> str:
        """One checkpoint of ``mode`` ("passive", "restart", "truncate") that
        waits at most ``wait_s`` for the write lock, for readers and for
        another connection's checkpoint (SQLite does not wait for that one: it
        is tried again). Returns "done", or why it could not finish: "held"
        (readers, or the write lock, past the wait), "checkpoint" (a passive
        one found another connection's under way), "full" (no room on the
        disk), "own" (this connection is inside a transaction: no wait helps).

        Raises:
            StoreCorruptError: the file is damaged.
        """
        self.counts[mode] += 1
        deadline = time.monotonic() + wait_s
        try:
            while True:
                left = deadline - time.monotonic()
                conn.setbusyhandler(BusyHandler(left) if left > 0 else None)
                try:
                    frames, moved = conn.wal_checkpoint(mode=_CHECKPOINT_MODES[mode])
                    break
                except apsw.LockedError:
                    return "own"
                except apsw.BusyError:
                    # A passive checkpoint waits for nothing: busy means another one is under way.
                    if mode == "passive":
                        return "checkpoint"
                    if deadline - time.monotonic() <= _CHECKPOINT_RETRY_S:
                        if mode == "restart":
                            self.restart_failed()
                        return "held"
                    time.sleep(_CHECKPOINT_RETRY_S)
        except apsw.Error as exc:
            failure = error(exc, conn)
            if isinstance(failure, StorageFullError):
                # The write before it (a delete, a gc) stands; its frames stay
                # in the WAL until a checkpoint finds room.
                return "full"
            raise failure from None
        finally:
            conn.setbusyhandler(BusyHandler(busy_s))
        self.saw(mode, frames, moved)
        return "done" if frames == moved else "held"

    def restart_if_due(self, conn: apsw.Connection, long_s: float | None, error: ErrorMap, busy_s: float) -> None:
        """After a commit: the RESTART checkpoint when due, waiting ``RESTART_WAIT_MS``
        (or ``long_s`` once ``long_due``); the commit stands whatever it does."""
        if not self.restart_due():
            return
        wait_s = RESTART_WAIT_MS / 1000
        if long_s is not None and self.long_due():
            wait_s = max(wait_s, long_s)
        with contextlib.suppress(SecurepadError):  # a failure leaves the restart for later
            self.checkpoint(conn, "restart", wait_s, error, busy_s)

    def status(self, incremental_vacuum: bool) -> dict[str, object]:
        """The WAL's size and what it holds not yet copied, against its limit,
        with a warning past half of it (for ``stats``), and what this store
        object did to it: checkpoints tried by mode, frames its commits
        appended, rebuilds (``scrub``)."""
        wal = self
        pending = wal.pending() * wal.page_size
        status: dict[str, object] = {
            "wal_bytes": wal.bytes(),
            "wal_pending_bytes": pending,
            "wal_limit_bytes": self.limit_bytes,
            "checkpoints": dict(wal.counts),
            "frames_written": wal.written,
            "rebuilds": wal.rebuilds,
            "incremental_vacuum": incremental_vacuum,
            "warnings": [],
        }
        if pending > self.limit_bytes // 2:
            status["warnings"] = [
                f"the write-ahead log holds {pending} bytes not yet copied into the database, of its"
                f" {self.limit_bytes}-byte limit: a long-lived reader keeps them from being checkpointed;"
                " writes fail (StoreBusyError) at the limit until that reader ends"
            ]
        return status


class BusyHandler:
    """Waits for a lock held by another connection, for at most ``timeout_s``.

    SQLite's own busy timeout sleeps 1, 2, 5, 10 ... up to 100 ms between
    tries: a writer that just missed a lock held for a tenth of a millisecond
    waits milliseconds, and one that keeps missing waits 100 ms a try. Under
    the benchmark's 2x4 load that made put p99 109 ms and max 736 ms. This
    handler retries after 50 µs, doubling to at most 2 ms, jittered so that
    waiting connections do not retry in step.

    The time counted is the time spent waiting here, not since the first
    wait: one call of SQLite can wait more than once (a checkpoint waits for
    the write lock, copies the WAL, then waits for readers), and the copy of a
    large WAL must not use up the wait of the readers after it.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._waited = 0.0

    def __call__(self, tries: int) -> bool:
        if tries == 0:
            self._waited = 0.0
        elif self._waited >= self._timeout_s:
            return False  # SQLite returns SQLITE_BUSY: StoreBusyError
        started = time.monotonic()
        # Not a secret: jitter only.
        time.sleep(min(0.002, 0.00005 * 2 ** min(tries, 6)) * random.uniform(0.5, 1.5))  # noqa: S311
        self._waited += time.monotonic() - started
        return True


def storage_error(exc: apsw.Error | UnicodeDecodeError, path: Path, conn: apsw.Connection) -> SecurepadError:
    """The typed error for an apsw error: what the caller can act on, and the file.

    A TEXT column that is not UTF-8 (apsw raises UnicodeDecodeError) is damage
    too: the store only ever writes valid text.
    """
    if isinstance(exc, UnicodeDecodeError):
        return StoreCorruptError(f"the store {path} is damaged: a text field is not UTF-8")
    if isinstance(exc, apsw.IOError) and _system_errno(conn) in (errno.ENOSPC, errno.EDQUOT):
        exc = apsw.FullError(str(exc))
    if isinstance(exc, apsw.FullError):
        return StorageFullError(
            f"the disk holding {path} is full (or the store reached its size limit); nothing was written"
        )
    if isinstance(exc, apsw.CorruptError | apsw.NotADBError):
        return StoreCorruptError(f"the store {path} is damaged or is not a securepad store ({exc})")
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return StoreBusyError("the store is busy; try again")
    if isinstance(exc, apsw.IOError):
        return SecurepadError(f"disk I/O error on the store {path} ({exc})")
    if isinstance(exc, apsw.ReadOnlyError):
        return SecurepadError(f"the store {path} is read-only ({exc})")
    if isinstance(exc, apsw.CantOpenError):
        return SecurepadError(f"cannot open store {path} ({exc})")
    return SecurepadError(f"store error on {path}: {exc}")


def _system_errno(conn: apsw.Connection) -> int:
    try:
        return int(conn.system_errno)
    except apsw.Error:
        return 0
