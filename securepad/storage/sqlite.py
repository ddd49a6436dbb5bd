"""SQLite through apsw: connections, pragmas, migrations, the one transaction helper.

One connection per thread (concurrency comes from several connections, never
from sharing one), closed when its thread ends and re-opened after fork, all
configured here. Every apsw error leaves this module as a ``SecurepadError``
that names its cause (see ``_storage_error``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import apsw

from ..errors import SecurepadError, StorageFullError, StoreBusyError, StoreCorruptError
from . import schema
from .base import Conn, DuplicateKeyError, Params, Rows
from .files import STORE_OVERRIDE, check_directory, check_private_file
from .schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "WAL_LIMIT_BYTES", "CommitHooks", "Database"]

# How long a writer waits for the lock before StoreBusyError.
BUSY_TIMEOUT_MS = 30_000

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
# gc rebuilds the file (``Database.scrub``) only when its deletes left at least
# this share of the file's pages free: the rebuild writes every live page, so
# through the WAL (and into a temporary file) it writes at most 3 times the
# pages the deletes freed. Below it, the deletes' own ``secure_delete`` zeroes
# the deleted cells and freed pages, and the WAL is truncated.
SCRUB_FREE_SHARE = 0.25
# One write transaction stores at most 1/this of the WAL limit, counted as the
# entries' ``cost_bound`` (their WAL frames take at most ~1.05 times it,
# ``docs/reliability.md``): a batch alone can never fill the WAL, and a larger
# one is refused before it is written (QuotaExceededError). Half the default
# limit (128 MiB) still holds one entry of the default ``max_entry_bytes``.
WRITE_SHARE_OF_WAL = 2

# The policy's durability -> SQLite's synchronous setting, set on every connection.
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}


# How long a checkpoint that finds another connection's under way pauses before it tries again.
_CHECKPOINT_RETRY_S = 0.005
# ``_WalWatch``'s names of SQLite's checkpoint modes.
_CHECKPOINT_MODES = {
    "passive": apsw.SQLITE_CHECKPOINT_PASSIVE,
    "restart": apsw.SQLITE_CHECKPOINT_RESTART,
    "truncate": apsw.SQLITE_CHECKPOINT_TRUNCATE,
}


class CommitHooks(Protocol):
    """What runs around every write transaction's COMMIT (the anchor, ``anchor.Anchor``)."""

    def before_commit(self, conn: Conn) -> None:
        """Inside the transaction, last: an exception rolls it back."""

    def after_commit(self) -> None:
        """After a successful COMMIT."""


ErrorMap = Callable[[apsw.Error | UnicodeDecodeError, apsw.Connection], SecurepadError]


class _Conn:
    """An apsw connection inside a transaction, as the store's ``Conn`` protocol."""

    # A local COMMIT is applied or fails rolled back: its outcome is always known.
    commit_unknown = False

    def __init__(self, conn: apsw.Connection, error: ErrorMap) -> None:
        self.raw = conn
        self._error = error
        # Prefetched reads' rows, by (SQL, parameters), until the same query takes them.
        self._fetched: dict[tuple[str, Params], Rows] = {}

    def query(self, sql: str, params: Params = ()) -> Rows:
        fetched = self._fetched.pop((sql, tuple(params)), None)
        if fetched is not None:
            return fetched
        try:
            return _rows(self.raw.execute(sql, params))
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise self._error(exc, self.raw) from None

    def execute(self, sql: str, params: Params = ()) -> int:
        try:
            self.raw.execute(sql, params)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        except apsw.Error as exc:
            raise self._error(exc, self.raw) from None
        return int(self.raw.changes())

    def defer(self, sql: str, params: Params = ()) -> None:
        self.execute(sql, params)

    def prefetch(self, sql: str, params: Params = ()) -> None:
        """Run the read now and keep its rows for the same ``query`` later: the
        rows are as of this point of the transaction, as on PostgreSQL (where
        the read goes with the next message); no extra statement when that
        query comes."""
        key = (sql, tuple(params))
        if key not in self._fetched:
            self._fetched[key] = self.query(sql, params)

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        try:
            self.raw.executemany(sql, rows)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        except apsw.Error as exc:
            raise self._error(exc, self.raw) from None


def _rows(cursor: apsw.Cursor) -> Rows:
    try:
        names = [d[0] for d in cursor.getdescription()]
    except apsw.ExecutionCompleteError:  # no rows at all
        return []
    return [dict(zip(names, row, strict=True)) for row in cursor]


class _Connections:
    """The open connections of one Database, closed as their threads end.

    Each thread's connection hangs off a holder in that thread's
    ``threading.local``; when the thread ends its locals go, and the holder's
    finalizer closes the connection. A process with many short-lived threads
    therefore holds one connection (2 file descriptors, ~180 KB) per *live*
    thread, not per thread that ever used the store (2,000 threads
    left 2,001 connections and 4,000 descriptors open).

    A connection inherited through fork is never closed by the child: that
    would disturb the parent's locks on the shared file. It is kept (not
    collected) and left alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, tuple[apsw.Connection, int]] = {}
        self._inherited: list[apsw.Connection] = []
        self.closed = False

    def add(self, conn: apsw.Connection) -> None:
        with self._lock:
            self._open[id(conn)] = (conn, os.getpid())

    def release(self, conn: apsw.Connection, pid: int) -> None:
        """Close ``conn`` (opened in process ``pid``): its thread ended, or it failed."""
        with self._lock:
            self._open.pop(id(conn), None)
            if pid != os.getpid():
                self._inherited.append(conn)
                return
        conn.close()

    def close_all(self) -> None:
        """Close every connection this process opened (a forked child leaves its parent's alone)."""
        with self._lock:
            self.closed = True
            conns, self._open = list(self._open.values()), {}
            pid = os.getpid()
            self._inherited.extend(conn for conn, opened_in in conns if opened_in != pid)
        for conn, opened_in in conns:
            if opened_in == pid:
                conn.close()


class _WalWatch:
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
        if self.pending() >= AUTOCHECKPOINT_PAGES:
            try:
                self.counts["passive"] += 1
                frames, moved = conn.wal_checkpoint(dbname, apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.Error:
                return apsw.SQLITE_OK  # the commit stands; a later one checkpoints
            self.saw("passive", frames, moved)
        return apsw.SQLITE_OK


class _Holder:
    """One thread's connection; its finalizer closes the connection when the thread's locals go."""

    def __init__(self, conn: apsw.Connection, connections: _Connections) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.finalizer = weakref.finalize(self, connections.release, conn, self.pid)


class Database:
    """A store file and the per-thread apsw connections to it (the SQLite backend).

    Owners and the admin flag change nothing here: the file's permissions are
    the boundary, and every write transaction is serialized.

    ``wal_limit_bytes`` bounds the write-ahead log (see ``WAL_LIMIT_BYTES``), and
    ``wal_wait_ms`` is how long a write waits for it (``WAL_WAIT_MS``).
    ``incremental_vacuum`` makes the file give freed pages back to the file
    system at each ``checkpoint`` (gc, forget-owner); an existing store is
    converted once, at open, by a full VACUUM. ``durability`` ("normal" or
    "full") is the ``synchronous`` setting of every connection.
    """

    dialect = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
        wal_wait_ms: int = WAL_WAIT_MS,
        incremental_vacuum: bool = False,
        allow_shared: bool = False,
        durability: str = "normal",
    ) -> None:
        self.path = path
        self.location = str(path)
        self._busy_timeout_ms = busy_timeout_ms
        if durability not in _SYNCHRONOUS:
            raise SecurepadError(f"durability must be one of {', '.join(_SYNCHRONOUS)}, not {durability!r}")
        self.durability = durability
        self.wal_limit_bytes = wal_limit_bytes
        self._wal_wait_s = wal_wait_ms / 1000
        self._local = threading.local()
        self._connections = _Connections()
        self._wal = _WalWatch(limit_bytes=wal_limit_bytes)
        self.incremental_vacuum = False
        # Set once by the anchor after its open check; the one hook into every write.
        self.hooks: CommitHooks | None = None
        self.upgraded: tuple[int, int] | None = None
        _create_private_file(path, allow_shared)
        conn = self.conn
        try:
            page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])  # type: ignore[arg-type]
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        self._wal.page_size = page_size  # the hook of the connection just opened holds this watch
        self._wal.started()
        with self.transaction() as tx:
            self._migrate(tx.raw)
        self.incremental_vacuum = incremental_vacuum and self._enable_incremental_vacuum(conn)

    @property
    def conn(self) -> apsw.Connection:
        """This thread's connection, opened on first use and again after fork.

        Raises:
            SecurepadError: the store is closed, or its file cannot be opened.
            StoreCorruptError: the file is not a SQLite database.
        """
        if self._connections.closed:
            raise SecurepadError("the store is closed")
        holder: _Holder | None = getattr(self._local, "holder", None)
        if holder is None or holder.pid != os.getpid():
            holder = _Holder(self._open(), self._connections)
            self._local.holder = holder
            self._connections.add(holder.conn)
        return holder.conn

    def _open(self) -> apsw.Connection:
        try:
            conn = apsw.Connection(str(self.path))
        except apsw.Error as exc:
            raise SecurepadError(f"cannot open store {self.path}: {exc}") from None
        try:
            conn.setbusyhandler(_BusyHandler(self._busy_timeout_ms / 1000))
            # Double-quoted strings are identifiers only, never string literals.
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
            conn.execute("PRAGMA journal_mode = WAL")
            # The policy's durability (docs/reliability.md). NORMAL: a commit is
            # durable once the WAL is synced at checkpoint; a power cut (not a
            # process crash) can lose the last commits. FULL: the WAL is synced
            # at every commit.
            conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
            conn.execute(f"PRAGMA journal_size_limit = {min(WAL_KEEP_BYTES, self.wal_limit_bytes // 4)}")
            # Deleted content is overwritten with zeros, in the file and the WAL.
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.setwalhook(self._wal.hook)
        except apsw.Error as exc:
            error = self._error(exc, conn)
            conn.close()
            raise error from None
        return conn

    def _error(self, exc: apsw.Error | UnicodeDecodeError, conn: apsw.Connection) -> SecurepadError:
        return _storage_error(exc, self.path, conn)

    @property
    def write_limit_bytes(self) -> int:
        """The most one write transaction may store (``WRITE_SHARE_OF_WAL``)."""
        return self.wal_limit_bytes // WRITE_SHARE_OF_WAL

    def _check_wal(self, conn: apsw.Connection, wait_s: float) -> None:
        """Before a write: when the frames not yet copied into the database may
        be over the limit, checkpoint (PASSIVE) to know; while they are, wait
        for the readers that pin them (a RESTART checkpoint, ``wait_s`` in
        all), then refuse.

        Raises:
            StoreBusyError: a reader's snapshot still pins more than the limit.
            StorageFullError: the disk has no room to copy them into the database.
        """
        wal = self._wal
        if wal.pending() <= wal.limit_pages():
            return
        deadline = time.monotonic() + wait_s
        while True:
            copied = self._wal_checkpoint(conn, "passive", 0)
            if wal.pending() <= wal.limit_pages() or copied in ("full", "own"):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._wal_checkpoint(conn, "restart", left) == "done":
                return
        if wal.pending() <= wal.limit_pages() or copied == "own":
            return  # "own": BEGIN refuses a transaction inside this connection's own
        over = (
            f"the store's write-ahead log holds {wal.pending() * wal.page_size / 2**20:.0f} MiB of writes not yet"
            f" copied into the database, over its {self.wal_limit_bytes / 2**20:g} MiB limit"
        )
        if copied == "full":
            raise StorageFullError(
                f"{over}, and the disk holding {self.path} has no room to copy them into it; nothing was written"
            )
        waited = f"throughout the {wait_s:g} s this write waited" if wait_s > 0 else "now"
        if copied == "checkpoint":
            raise StoreBusyError(
                f"{over}: another connection's checkpoint held the log {waited} (copying it, or waiting for a"
                " reader whose snapshot is older than those writes); try again"
            )
        held = f"has held a snapshot older than them {waited}" if wait_s > 0 else "holds a snapshot older than them"
        raise StoreBusyError(f"{over}: a reader {held}; writes resume when it ends")

    def _wal_checkpoint(self, conn: apsw.Connection, mode: str, wait_s: float) -> str:
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
        self._wal.counts[mode] += 1
        deadline = time.monotonic() + wait_s
        try:
            while True:
                left = deadline - time.monotonic()
                conn.setbusyhandler(_BusyHandler(left) if left > 0 else None)
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
                            self._wal.restart_failed()
                        return "held"
                    time.sleep(_CHECKPOINT_RETRY_S)
        except apsw.Error as exc:
            error = self._error(exc, conn)
            if isinstance(error, StorageFullError):
                # The write before it (a delete, a gc) stands; its frames stay
                # in the WAL until a checkpoint finds room.
                return "full"
            raise error from None
        finally:
            conn.setbusyhandler(_BusyHandler(self._busy_timeout_ms / 1000))
        self._wal.saw(mode, frames, moved)
        return "done" if frames == moved else "held"

    def wal_status(self) -> dict[str, object]:
        """The WAL's size and what it holds not yet copied, against its limit,
        with a warning past half of it (for ``stats``), and what this store
        object did to it: checkpoints tried by mode, frames its commits
        appended, rebuilds (``scrub``)."""
        wal = self._wal
        pending = wal.pending() * wal.page_size
        status: dict[str, object] = {
            "wal_bytes": wal.bytes(),
            "wal_pending_bytes": pending,
            "wal_limit_bytes": self.wal_limit_bytes,
            "checkpoints": dict(wal.counts),
            "frames_written": wal.written,
            "rebuilds": wal.rebuilds,
            "incremental_vacuum": self.incremental_vacuum,
            "warnings": [],
        }
        if pending > self.wal_limit_bytes // 2:
            status["warnings"] = [
                f"the write-ahead log holds {pending} bytes not yet copied into the database, of its"
                f" {self.wal_limit_bytes}-byte limit: a long-lived reader keeps them from being checkpointed;"
                " writes fail (StoreBusyError) at the limit until that reader ends"
            ]
        return status

    @contextmanager
    def transaction(
        self, owner: str | None = None, *, admin: bool = False, wait: bool = True, turn: str | None = None
    ) -> Iterator[_Conn]:
        """A write transaction (BEGIN IMMEDIATE), rolled back on any exception;
        ``owner`` and ``turn`` change nothing here: SQLite has one writer.
        ``wait=False``: a WAL over its limit is refused without waiting.

        Raises:
            StoreBusyError: the write lock was not obtained within the busy
                timeout, or a reader's snapshot pins more than the WAL's limit
                of frames not yet copied, past ``wal_wait_ms`` (``_check_wal``).
            StorageFullError: the disk is full; nothing was written.
            StoreCorruptError: the file is damaged.
        """
        conn = self.conn
        self._check_wal(conn, self._wal_wait_s if wait else 0)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        hooks = self.hooks
        try:
            tx = _Conn(conn, self._error)
            yield tx
            if hooks is not None:
                hooks.before_commit(tx)
        except apsw.Error as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None
        if hooks is not None:
            hooks.after_commit()
        if self._wal.restart_due():
            restart_s = RESTART_WAIT_MS / 1000
            if wait and self._wal.long_due():
                restart_s = max(restart_s, self._wal_wait_s)
            # The commit stands whatever this does; a failure leaves the restart for later.
            with contextlib.suppress(SecurepadError):
                self._wal_checkpoint(conn, "restart", restart_s)

    def _rollback(self, conn: apsw.Connection) -> None:
        """End the failed transaction, unless SQLite already did (it rolls back by
        itself on SQLITE_FULL and I/O errors: a second ROLLBACK would fail with
        "no transaction is active" and hide the real cause)."""
        if conn.getautocommit():
            return
        try:
            conn.execute("ROLLBACK")
        except apsw.Error:
            # The connection is in an unknown state: drop it; the next call opens another.
            holder: _Holder | None = getattr(self._local, "holder", None)
            if holder is not None and holder.conn is conn:
                del self._local.holder
                with contextlib.suppress(apsw.Error):
                    holder.finalizer()

    @contextmanager
    def snapshot(self) -> Iterator[apsw.Connection]:
        """A read transaction: every query inside sees the same state.

        Raises:
            StoreCorruptError: the file is damaged.
            SecurepadError: another storage error.
        """
        conn = self.conn
        try:
            conn.execute("BEGIN DEFERRED")
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        try:
            yield conn
        except (apsw.Error, UnicodeDecodeError) as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts, on this thread's connection.

        Raises:
            StoreCorruptError: the file is damaged.
            SecurepadError: another storage error.
        """
        conn = self.conn
        try:
            return _rows(conn.execute(sql, params))
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise self._error(exc, conn) from None

    def queries(self, *statements: tuple[str, Params], owner: str | None = None, admin: bool = False) -> list[Rows]:
        """The rows of each query, in order, one after another on this thread's
        connection (a local file: no round trip to save).

        Raises:
            StoreCorruptError: the file is damaged.
            SecurepadError: another storage error.
        """
        return [self.query(sql, params, owner=owner, admin=admin) for sql, params in statements]

    def read_scope(self) -> object:
        """This thread's connection: what ``PRAGMA data_version`` (a cached read's
        token, ``heads``) belongs to; it compares only with its own connection's.

        Raises:
            SecurepadError: the store is closed.
        """
        return self.conn

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Move the WAL into the database and truncate it to zero bytes (after
        giving the file's free pages back, with ``incremental_vacuum``).

        Returns False when a reader kept part of the WAL alive past the busy
        timeout, or the disk had no room to move it (the WAL then still holds
        frames; a later checkpoint clears them).
        With ``wait=False`` the busy timeout is zero: what can be moved without
        waiting is moved, and the call never blocks on readers.

        Raises:
            StoreCorruptError: the file is damaged.
        """
        conn = self.conn
        if self.incremental_vacuum:
            try:
                conn.execute("PRAGMA incremental_vacuum").fetchall()
            except (apsw.BusyError, apsw.LockedError):
                return False
            except apsw.Error as exc:
                error = self._error(exc, conn)
                if isinstance(error, StorageFullError):
                    return False
                raise error from None
        return self._wal_checkpoint(conn, "truncate", self._busy_timeout_ms / 1000 if wait else 0) == "done"

    def scrub(self) -> bool:
        """Rebuild the file (VACUUM), then checkpoint and truncate the WAL.

        ``secure_delete`` zeroes a deleted row's cell, but when SQLite
        rebalances a b-tree it rebuilds pages without zeroing their unused
        space, so a copy of a row that moved to another page can stay in the
        old page's gap after the row itself is deleted (about one audit in 40
        found a deleted wrapped item key that way). VACUUM writes every page
        afresh, so only live rows remain anywhere in the file. It costs a pass
        over the whole store and holds the write lock meanwhile; the copy it
        builds goes to a temporary file (``temp_store = FILE``: SQLite's
        temporary directory, ``SQLITE_TMPDIR``), never to memory, and then
        through the WAL into the file.

        Returns False when a reader kept part of the WAL alive (see ``checkpoint``).

        Raises:
            StorageFullError: no room for the copy or the WAL; the file is as it was.
            StoreBusyError: the write lock was not obtained in time.
        """
        conn = self.conn
        try:
            conn.execute("PRAGMA temp_store = FILE")
            conn.execute("VACUUM")
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        self._wal.rebuilds += 1
        return self.checkpoint()

    def scrub_after_deletes(self) -> bool:
        """After a gc's deletes: ``scrub`` when at least ``SCRUB_FREE_SHARE`` of
        the file's pages are free, else a checkpoint that truncates the WAL.
        Returns whether the file was rebuilt.

        Raises:
            StorageFullError: no room for the rebuild; the deletes stand.
            StoreBusyError: the write lock was not obtained in time.
        """
        conn = self.conn
        try:  # before the checkpoint: with ``incremental_vacuum`` it gives the free pages back
            free = int(conn.execute("PRAGMA freelist_count").fetchall()[0][0])  # type: ignore[arg-type]
            pages = int(conn.execute("PRAGMA page_count").fetchall()[0][0])  # type: ignore[arg-type]
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        # The deletes' frames into the file first: the rebuild's WAL does not add to them on the disk.
        self.checkpoint()
        if pages and free >= pages * SCRUB_FREE_SHARE:
            self.scrub()
            return True
        return False

    def copy_to(self, dest: Path) -> None:
        """Write a consistent copy of the store to ``dest`` (which must not exist).

        Raises:
            StorageFullError: the disk is full.
            SecurepadError: ``dest`` cannot be written.
        """
        _create_private_file(dest, companions=False)
        conn = self.conn
        try:
            conn.execute("VACUUM INTO ?", (str(dest),))
        except apsw.Error as exc:
            raise self._error(exc, conn) from None

    def restore_from(self, src: Path, aside: Path | None = None) -> None:
        """Replace the whole content of this store with the SQLite file ``src``,
        through SQLite's backup API: page by page into this store's own WAL,
        so that a connection open elsewhere sees the old store or the new one,
        never a mix, and no stale WAL frame is left for the new file. With
        ``aside`` (which must not exist), the store as it was is first copied
        there, under the same write lock: no write can commit between that
        copy and the replacement, so none is lost from both.

        Raises:
            StorageFullError: the disk is full.
            StoreBusyError: another connection holds the write lock.
            SecurepadError: ``src`` cannot be read, or ``aside`` written.
        """
        conn = self.conn
        try:
            source = apsw.Connection(str(src), flags=apsw.SQLITE_OPEN_READONLY)
        except apsw.Error as exc:
            raise SecurepadError(f"cannot open {src}: {exc}") from None
        try:
            with conn.backup("main", source, "main") as copy:
                # A step of no pages takes this store's write lock, held to the end.
                copy.step(0)
                if aside is not None:
                    self._copy_as_read(aside)
                copy.step(-1)
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        finally:
            source.close()
        self.checkpoint()

    def _copy_as_read(self, dest: Path) -> None:
        """``copy_to`` through a read-only connection of its own (this thread's
        connection may be holding the write lock)."""
        _create_private_file(dest, companions=False)
        reader = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            reader.execute("VACUUM INTO ?", (str(dest),))
        except apsw.Error as exc:
            raise self._error(exc, reader) from None
        finally:
            reader.close()

    def _enable_incremental_vacuum(self, conn: apsw.Connection) -> bool:
        """Switch the file to auto_vacuum=INCREMENTAL (a full VACUUM, once, for
        a store made without it); True once it is on."""
        try:
            mode = int(conn.execute("PRAGMA auto_vacuum").fetchall()[0][0])  # type: ignore[arg-type]
            if mode != 2:  # 0 none, 1 full, 2 incremental
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("VACUUM")
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        return True

    def _migrate(self, conn: apsw.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
        if version < 0:
            raise StoreCorruptError(f"the store {self.path} is damaged: schema version {version}")
        if version == SCHEMA_VERSION:
            return
        if version == 0 and conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall():
            raise StoreCorruptError(f"{self.path} is a SQLite database but not a securepad store; nothing was changed")
        marked = version > 0 and bool(conn.execute(schema.NUMBERING_SQL).fetchall())
        version = schema.version_of(schema.SQLITE, version, marked)
        for _, sql in schema.steps(schema.SQLITE, version, SCHEMA_VERSION):
            conn.execute(sql)
        conn.execute(schema.MARK_SQL)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if 0 < version < SCHEMA_VERSION:
            self.upgraded = (version, SCHEMA_VERSION)

    def sync(self) -> None:
        """Make every commit so far durable: fsync the file and its WAL.

        With ``synchronous = NORMAL`` a commit is in the WAL, not yet synced;
        the anchor calls this before it records a counter, so that the anchor
        is never ahead of what a power cut leaves on disk.

        Raises:
            SecurepadError: a file cannot be synced.
        """
        for name in (str(self.path), f"{self.path}-wal"):
            try:
                fd = os.open(name, os.O_RDONLY)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise SecurepadError(f"cannot open {name} to sync it: {exc.strerror}") from None
            try:
                os.fsync(fd)
            except OSError as exc:
                raise SecurepadError(f"cannot sync {name}: {exc.strerror}") from None
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close every connection this object opened, in any thread."""
        self._connections.close_all()


def _storage_error(exc: apsw.Error | UnicodeDecodeError, path: Path, conn: apsw.Connection) -> SecurepadError:
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


class _BusyHandler:
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


def _create_private_file(path: Path, allow_shared: bool = False, *, companions: bool = True) -> None:
    """Create the database, -wal and -shm files 0600 in a 0700 directory before
    SQLite does (SQLite gives the -wal and -shm files the database file's mode),
    and refuse existing ones others may read or write, or a directory others
    may write to (unless ``allow_shared``: a deliberate shared setup)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SecurepadError(f"cannot create store {path}: {exc.strerror or exc}") from None
    if companions:  # what is at the path is named before anything about its directory
        _check_is_database(path)
    if not allow_shared:
        check_directory(path.parent, "store", STORE_OVERRIDE)
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if companions else (path,):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not allow_shared:
                try:
                    info = name.stat()
                except FileNotFoundError:  # SQLite removed it meanwhile
                    continue
                check_private_file(name, info, "store file", STORE_OVERRIDE)
            continue
        except OSError as exc:
            raise SecurepadError(f"cannot create store {path}: {exc.strerror or exc}") from None
        os.close(fd)


_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_is_database(path: Path) -> None:
    """Refuse an existing file that is not a SQLite database, before anything
    judges its mode or SQLite (which takes a file shorter than its header for
    an empty database) writes a store over it. An empty file is the one this
    module creates before SQLite first writes to it.

    Raises:
        StoreCorruptError: the file is not a SQLite database.
        SecurepadError: it cannot be read, or is not a regular file.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(100)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SecurepadError(f"cannot open store {path}: {exc.strerror or exc}") from None
    if head and not head.startswith(_SQLITE_HEADER):
        raise StoreCorruptError(
            f"the store {path} is damaged or is not a securepad store (not a SQLite database); nothing was"
            " changed: check the path, or give a path that does not exist to `securepad init`"
        )
    # The schema cookie (offset 40) moves with every schema change; the store
    # sets its schema version (user_version, offset 60) in the transaction that
    # creates its tables. Tables without a version: another program's database.
    if len(head) == 100 and head[60:64] == bytes(4) and head[40:44] != bytes(4):
        raise StoreCorruptError(
            f"{path} is a SQLite database but not a securepad store; nothing was changed: check the path"
        )
