"""SQLite through apsw: connections, pragmas, migrations, the one transaction helper.

One connection per thread (concurrency comes from several connections, never
from sharing one), re-opened after fork, all configured here.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from ._backend import DuplicateKeyError, Params, Rows
from ._files import STORE_OVERRIDE, check_directory, check_private_file
from .errors import SecurepadError, StoreBusyError

__all__ = ["SCHEMA_VERSION", "Database"]

# How long a writer waits for the lock before StoreBusyError.
BUSY_TIMEOUT_MS = 30_000

SCHEMA_VERSION = 5

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE store_meta(
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE owner_keys(
        owner_user_id TEXT NOT NULL,
        version       INTEGER NOT NULL,
        wrapped       BLOB NOT NULL,
        created_at    REAL NOT NULL,
        PRIMARY KEY (owner_user_id, version)
    ) WITHOUT ROWID;
    CREATE TABLE entries(
        id             TEXT PRIMARY KEY,
        owner_user_id  TEXT NOT NULL,
        actor          TEXT NOT NULL,
        channel        TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        step_num       INTEGER NOT NULL,
        executor_name  TEXT NOT NULL,
        content_kind   TEXT NOT NULL,
        size_bytes     INTEGER NOT NULL,
        size_chars     INTEGER NOT NULL,
        segment_count  INTEGER NOT NULL,
        key_version    INTEGER NOT NULL,
        created_at     REAL NOT NULL,
        expires_at     REAL NOT NULL,
        wrapped_key    BLOB NOT NULL,
        nonce_prefix   BLOB NOT NULL,
        commitment     BLOB NOT NULL,
        sealed_meta    BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    CREATE INDEX entries_expires ON entries(expires_at);
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, size_bytes);
    CREATE TABLE segments(
        entry_id TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        data     BLOB NOT NULL,
        PRIMARY KEY (entry_id, seq)
    ) WITHOUT ROWID;
    """,
    # Count the random-nonce AES-GCM encryptions under each owner key (item-key
    # wraps) so that rotation is advised long before the 2^32 limit.
    2: """
    ALTER TABLE owner_keys ADD COLUMN wrap_count INTEGER NOT NULL DEFAULT 0;
    INSERT OR IGNORE INTO store_meta(key, value)
        SELECT 'master_wrap_count', CAST(COUNT(*) AS TEXT) FROM owner_keys;
    """,
    # Turn records (see _records.py): compaction checkpoints and compaction
    # marks. Sealed like entries; only ids, owner, scope, turn, order, key
    # version and times are in clear.
    3: """
    CREATE TABLE checkpoints(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    REAL NOT NULL,
        expires_at    REAL NOT NULL,
        wrapped_key   BLOB NOT NULL,
        sealed        BLOB NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX checkpoints_expires ON checkpoints(expires_at);
    CREATE TABLE compaction_marks(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    REAL NOT NULL,
        expires_at    REAL NOT NULL,
        wrapped_key   BLOB NOT NULL,
        sealed        BLOB NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX compaction_marks_expires ON compaction_marks(expires_at);
    """,
    # What an entry stores in all (content and its other fields), for the
    # size limit and the owner quota; the usage index covers the quota sum.
    4: """
    ALTER TABLE entries ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE entries SET stored_bytes = size_bytes;
    DROP INDEX entries_owner_usage;
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, stored_bytes);
    """,
    # Bytes stored per owner, kept by triggers whatever inserts, deletes or
    # changes an entry. Expired entries count until gc removes them, so this is
    # an upper bound of the owner's live bytes: a put that fits under it needs
    # no sum over the owner's live entries, which cost O(entries) inside the
    # write lock (about 0.2 ms per 3,000 entries). A row that drops to zero
    # goes, so a forgotten owner leaves no id behind.
    5: """
    CREATE TABLE owner_usage(
        owner_user_id TEXT PRIMARY KEY,
        stored_bytes  INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO owner_usage(owner_user_id, stored_bytes)
        SELECT owner_user_id, SUM(stored_bytes) FROM entries GROUP BY owner_user_id;
    CREATE TRIGGER owner_usage_insert AFTER INSERT ON entries BEGIN
        INSERT INTO owner_usage(owner_user_id, stored_bytes) VALUES (NEW.owner_user_id, NEW.stored_bytes)
            ON CONFLICT(owner_user_id) DO UPDATE SET stored_bytes = stored_bytes + excluded.stored_bytes;
    END;
    CREATE TRIGGER owner_usage_delete AFTER DELETE ON entries BEGIN
        UPDATE owner_usage SET stored_bytes = stored_bytes - OLD.stored_bytes WHERE owner_user_id = OLD.owner_user_id;
        DELETE FROM owner_usage WHERE owner_user_id = OLD.owner_user_id AND stored_bytes <= 0;
    END;
    CREATE TRIGGER owner_usage_update AFTER UPDATE OF owner_user_id, stored_bytes ON entries BEGIN
        UPDATE owner_usage SET stored_bytes = stored_bytes - OLD.stored_bytes WHERE owner_user_id = OLD.owner_user_id;
        DELETE FROM owner_usage WHERE owner_user_id = OLD.owner_user_id AND stored_bytes <= 0;
        INSERT INTO owner_usage(owner_user_id, stored_bytes) VALUES (NEW.owner_user_id, NEW.stored_bytes)
            ON CONFLICT(owner_user_id) DO UPDATE SET stored_bytes = stored_bytes + excluded.stored_bytes;
    END;
    """,
}


class _Conn:
    """An apsw connection inside a transaction, as the store's ``Conn`` protocol."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.raw = conn

    def query(self, sql: str, params: Params = ()) -> Rows:
        return _rows(self.raw.execute(sql, params))

    def execute(self, sql: str, params: Params = ()) -> int:
        try:
            self.raw.execute(sql, params)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        return int(self.raw.changes())

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        try:
            self.raw.executemany(sql, rows)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None


def _rows(cursor: apsw.Cursor) -> Rows:
    try:
        names = [d[0] for d in cursor.getdescription()]
    except apsw.ExecutionCompleteError:  # no rows at all
        return []
    return [dict(zip(names, row, strict=True)) for row in cursor]


class Database:
    """A store file and the per-thread apsw connections to it (the SQLite backend).

    Owners and the admin flag change nothing here: the file's permissions are
    the boundary, and every write transaction is serialized.
    """

    dialect = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, allow_shared: bool = False) -> None:
        self.path = path
        self.location = str(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[apsw.Connection] = []
        self._closed = False
        _create_private_file(path, allow_shared)
        with self.transaction() as conn:
            self._migrate(conn.raw)

    @property
    def conn(self) -> apsw.Connection:
        """This thread's connection, opened on first use and again after fork."""
        if self._closed:
            raise SecurepadError("the store is closed")
        pid = os.getpid()
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != pid:
            conn = self._open()
            self._local.conn, self._local.pid = conn, pid
            with self._lock:
                self._all.append(conn)
        return conn

    def _open(self) -> apsw.Connection:
        try:
            conn = apsw.Connection(str(self.path))
        except apsw.Error as exc:
            raise SecurepadError(f"cannot open store {self.path}: {exc}") from None
        conn.setbusyhandler(_BusyHandler(self._busy_timeout_ms / 1000))
        # Double-quoted strings are identifiers only, never string literals.
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        # Deleted content is overwritten with zeros, in the file and the WAL.
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def transaction(self, owner: str | None = None, *, admin: bool = False, wait: bool = True) -> Iterator[_Conn]:
        """A write transaction (BEGIN IMMEDIATE), rolled back on any exception.

        Raises:
            StoreBusyError: the write lock was not obtained within the busy timeout.
        """
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except apsw.BusyError:
            raise StoreBusyError("the store is busy; try again") from None
        try:
            yield _Conn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except apsw.BusyError:
            conn.execute("ROLLBACK")
            raise StoreBusyError("the store is busy; try again") from None

    @contextmanager
    def snapshot(self) -> Iterator[apsw.Connection]:
        """A read transaction: every query inside sees the same state."""
        conn = self.conn
        conn.execute("BEGIN DEFERRED")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts, on this thread's connection."""
        return _rows(self.conn.execute(sql, params))

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Move the WAL into the database and truncate it to zero bytes.

        Returns False when a reader kept part of the WAL alive past the busy
        timeout (the WAL then still holds frames; a later checkpoint clears them).
        With ``wait=False`` the busy timeout is zero: what can be moved without
        waiting is moved, and the call never blocks on readers.
        """
        conn = self.conn
        if not wait:
            conn.setbusytimeout(0)
        try:
            log, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        except apsw.BusyError:
            return False
        finally:
            if not wait:
                conn.setbusyhandler(_BusyHandler(self._busy_timeout_ms / 1000))
        return bool(log == done)

    def scrub(self) -> bool:
        """Rebuild the file (VACUUM), then checkpoint and truncate the WAL.

        ``secure_delete`` zeroes a deleted row's cell, but when SQLite
        rebalances a b-tree it rebuilds pages without zeroing their unused
        space, so a copy of a row that moved to another page can stay in the
        old page's gap after the row itself is deleted (issue 11: about one
        audit in 40 found a deleted wrapped item key that way). VACUUM writes
        every page afresh, so only live rows remain anywhere in the file. It
        costs a pass over the whole store and holds the write lock meanwhile.

        Returns False when a reader kept part of the WAL alive (see ``checkpoint``).
        """
        conn = self.conn
        conn.execute("PRAGMA temp_store = MEMORY")  # the rebuild's copy never reaches a temp file
        try:
            conn.execute("VACUUM")
        except apsw.BusyError:
            raise StoreBusyError("the store is busy; try again") from None
        return self.checkpoint()

    def copy_to(self, dest: Path) -> None:
        """Write a consistent copy of the store to ``dest`` (which must not exist)."""
        _create_private_file(dest, companions=False)
        self.conn.execute("VACUUM INTO ?", (str(dest),))

    def _migrate(self, conn: apsw.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
        if version > SCHEMA_VERSION:
            raise SecurepadError(
                f"store schema version {version} is newer than this securepad understands ({SCHEMA_VERSION})"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute(_MIGRATIONS[target])
            conn.execute(f"PRAGMA user_version = {target}")

    def close(self) -> None:
        """Close every connection this object opened, in any thread."""
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


class _BusyHandler:
    """Waits for a lock held by another connection, for at most ``timeout_s``.

    SQLite's own busy timeout sleeps 1, 2, 5, 10 ... up to 100 ms between
    tries: a writer that just missed a lock held for a tenth of a millisecond
    waits milliseconds, and one that keeps missing waits 100 ms a try. Under
    the benchmark's 2x4 load that made put p99 109 ms and max 736 ms. This
    handler retries after 50 µs, doubling to at most 2 ms, jittered so that
    waiting connections do not retry in step.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._since = 0.0

    def __call__(self, tries: int) -> bool:
        now = time.monotonic()
        if tries == 0:
            self._since = now
        elif now - self._since >= self._timeout_s:
            return False  # SQLite returns SQLITE_BUSY: StoreBusyError
        # Not a secret: jitter only.
        time.sleep(min(0.002, 0.00005 * 2 ** min(tries, 6)) * random.uniform(0.5, 1.5))  # noqa: S311
        return True


def _create_private_file(path: Path, allow_shared: bool = False, *, companions: bool = True) -> None:
    """Create the database, -wal and -shm files 0600 in a 0700 directory before
    SQLite does (SQLite gives the -wal and -shm files the database file's mode),
    and refuse existing ones others may read or write, or a directory others
    may write to (unless ``allow_shared``: a deliberate shared setup)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SecurepadError(f"cannot create store {path}: {exc.strerror}") from None
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
            raise SecurepadError(f"cannot create store {path}: {exc.strerror}") from None
        os.close(fd)
