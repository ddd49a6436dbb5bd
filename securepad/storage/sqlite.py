"""SQLite through apsw: connections, pragmas, migrations, the one transaction helper.

One connection per thread (concurrency comes from several connections, never
from sharing one), kept for the next thread or closed when its thread ends
(``sqlite_threads``) and re-opened after fork, all
configured here. Every apsw error leaves this module as a ``SecurepadError``
that names its cause (see ``wal.storage_error``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import monotonic
from types import TracebackType

import apsw

from ..errors import SecurepadError, StorageFullError, StoreCorruptError
from . import process, schema
from .base import CommitHooks, DuplicateKeyError, Params, Rows, statements
from .files import create_private_file
from .schema import SCHEMA_VERSION
from .sqlite_rows import row_maker
from .sqlite_threads import Connections, Holder
from .wal import WAL_KEEP_BYTES, WAL_LIMIT_BYTES, WAL_WAIT_MS, BusyHandler, ErrorMap, WalWatch, storage_error

__all__ = ["SCHEMA_VERSION", "WAL_LIMIT_BYTES", "CommitHooks", "Database"]

# How long a writer waits for the lock before StoreBusyError.
BUSY_TIMEOUT_MS = 30_000

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
# apsw's statement cache is a ring of this many slots that every execution takes
# one of: a statement not run for that many executions is compiled again. A
# turn's read statement (with its inventory, a few KiB of SQL) then costs a
# read after a few dozen puts more than the rest of the read; the store runs
# about a hundred statements in all (512 slots: the most apsw keeps).
STATEMENT_CACHE_SIZE = 512


class _NothingWritten(Exception):
    """``Database.write_once``'s statements changed nothing: its transaction is rolled back."""


class _Conn:
    """An apsw connection inside a transaction, as the store's ``Conn`` protocol."""

    # A local COMMIT is applied or fails rolled back: its outcome is always known.
    commit_unknown = False

    def __init__(self, held: Holder, error: ErrorMap) -> None:
        self.raw = held.conn
        self._held = held  # its cursor runs the statements
        self._error = error
        # Prefetched reads' rows, by (SQL, parameters), until the same query takes them.
        self._fetched: dict[tuple[str, Params], Rows] = {}

    def query(self, sql: str, params: Params = ()) -> Rows:
        fetched = self._fetched.pop((sql, tuple(params)), None)
        if fetched is not None:
            return fetched
        try:
            cursor = self._held.cursor.execute(sql, params)
            return list(map(row_maker(cursor.getdescription()), cursor))
        except apsw.ExecutionCompleteError:  # no rows at all
            return []
        except (apsw.Error, UnicodeDecodeError) as exc:
            self._held.renew()
            raise self._error(exc, self.raw) from None

    def execute(self, sql: str, params: Params = ()) -> int:
        try:
            self._held.cursor.execute(sql, params)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        except apsw.Error as exc:
            raise self._error(exc, self.raw) from None
        return int(self.raw.changes())

    def defer(self, sql: str, params: Params = ()) -> None:
        self.execute(sql, params)

    def fewest(self, sql: str, params: Params) -> int:
        """``sql``'s statements (``"; "`` between them, each taking its share of ``params``)
        run in order: the fewest rows one changed (``execute``'s errors)."""
        cursor, raw = self._held.cursor, self.raw
        fewest, start = -1, 0
        try:
            for statement, count in _statements(sql):
                cursor.execute(statement, params[start : start + count])
                start += count
                changed = raw.changes()
                if fewest < 0 or changed < fewest:
                    fewest = changed
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        except apsw.Error as exc:
            raise self._error(exc, raw) from None
        return fewest

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
            self._held.cursor.executemany(sql, rows)
        except apsw.ConstraintError:
            raise DuplicateKeyError from None
        except apsw.Error as exc:
            raise self._error(exc, self.raw) from None


class _Transaction:
    """``Database.transaction``: BEGIN IMMEDIATE, then the commit hooks and COMMIT, or ROLLBACK on
    any exception (an apsw error raised as its typed error). A class, not a generator: every write
    enters one, and ``contextmanager``'s generator protocol costs more than the statements' calls."""

    __slots__ = ("_conn", "_db", "_held", "_hooked", "_tx", "_wait")

    def __init__(self, db: Database, wait: bool, hooked: bool) -> None:
        self._db, self._wait, self._hooked = db, wait, hooked

    def __enter__(self) -> _Conn:
        db = self._db
        held = self._held = db.held()
        conn = self._conn = held.conn
        wal = db._wal
        # ``check``'s own first test (``pending() > limit_pages()``), without its calls when under.
        if wal.pages - wal.moved > wal.limit_bytes // wal.page_size:
            db._check_wal(conn, db._wal_wait_s if self._wait else 0)
        try:
            held.cursor.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            raise db._error(exc, conn) from None
        self._tx = _Conn(held, db._error)
        return self._tx

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        db, conn = self._db, self._conn
        hooks = db.hooks if self._hooked else None
        advanced = False
        if exc is None and hooks is not None and (hooks.every_commit or monotonic() >= hooks.advance_at):
            advanced = True
            try:
                hooks.before_commit(self._tx)
            except BaseException as failed:
                self._roll_back(failed)
                raise
        if exc is not None:
            self._roll_back(exc)
            return  # the body's exception goes on as it is
        try:
            self._held.cursor.execute("COMMIT")
        except apsw.Error as failed:
            db._rollback(conn)
            raise db._error(failed, conn) from None
        if hooks is not None:
            if advanced or hooks.failed is not None:
                hooks.after_commit(advanced)
            else:
                hooks.written = True  # ``after_commit``'s whole work when it did not advance, without its call
        if db._wal.pages >= db._wal.restart_at:  # ``restart_due``, without its call
            db._wal.restart_if_due(conn, db._wal_wait_s if self._wait else None, db._error, db._busy_timeout_ms / 1000)

    def _roll_back(self, exc: BaseException) -> None:
        """ROLLBACK after ``exc``; an apsw error is raised as its typed error."""
        db, conn = self._db, self._conn
        db._rollback(conn)
        if isinstance(exc, apsw.Error):
            raise db._error(exc, conn) from None


class Database:
    """A store file and its per-thread apsw connections (the SQLite backend);
    owners and the admin flag change nothing here (the file's permissions are
    the boundary). ``wal_limit_bytes`` and ``wal_wait_ms``: ``storage.wal``;
    ``incremental_vacuum``: freed pages go back to the file system at each
    ``checkpoint`` (an existing store is converted once, at open);
    ``durability``: every connection's ``synchronous`` setting."""

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
        # How long a write waits for SQLite's write lock before StoreBusyError.
        self.busy_timeout_s = busy_timeout_ms / 1000
        if durability not in _SYNCHRONOUS:
            raise SecurepadError(f"durability must be one of {', '.join(_SYNCHRONOUS)}, not {durability!r}")
        self.durability = durability
        self.wal_limit_bytes = wal_limit_bytes
        self._wal_wait_s = wal_wait_ms / 1000
        self._local = threading.local()
        self._connections = Connections()
        self._wal = WalWatch(limit_bytes=wal_limit_bytes)
        self.incremental_vacuum = False
        # Set once by the anchor after its open check; the one hook into every write.
        self.hooks: CommitHooks | None = None
        self.upgraded: tuple[int, int] | None = None
        create_private_file(path, allow_shared)
        conn = self.conn
        try:
            page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])  # type: ignore[arg-type]
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        self._wal.page_size = page_size  # the hook of the connection just opened holds this watch
        self._wal.started()
        with self.transaction() as tx:
            self.upgraded = _migrate(tx.raw, path)
        self.incremental_vacuum = incremental_vacuum and _enable_incremental_vacuum(conn, self._error)

    @property
    def conn(self) -> apsw.Connection:
        """This thread's connection, opened on first use and after fork (SecurepadError, StoreCorruptError)."""
        return self.held().conn

    def held(self) -> Holder:
        """This thread's connection with its cursor (``conn``)."""
        if self._connections.closed:
            raise SecurepadError("the store is closed")
        holder: Holder | None = getattr(self._local, "holder", None)
        if holder is None or holder.pid != process.pid:
            holder = Holder(self._connections.take_idle() or self._open(), self._connections)
            self._local.holder = holder
            self._connections.add(holder.conn)
        return holder

    def _open(self) -> apsw.Connection:
        try:
            conn = apsw.Connection(str(self.path), statementcachesize=STATEMENT_CACHE_SIZE)
        except apsw.Error as exc:
            raise SecurepadError(f"cannot open store {self.path}: {exc}") from None
        try:
            conn.setbusyhandler(BusyHandler(self._busy_timeout_ms / 1000))
            # Double-quoted strings are identifiers only, never string literals.
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
            # A statement's plan never depends on the values bound to it (the query planner
            # stability guarantee): without it, SQLite compiles a statement again at each
            # execution whose plan a bound value could change (an equality on an index
            # prefix beside an ORDER BY or MIN/MAX), which every write's reads would pay.
            conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
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
        return storage_error(exc, self.path, conn)

    @property
    def write_limit_bytes(self) -> int:
        """The most one write transaction may store (``WRITE_SHARE_OF_WAL``)."""
        return self.wal_limit_bytes // WRITE_SHARE_OF_WAL

    def _check_wal(self, conn: apsw.Connection, wait_s: float) -> None:
        self._wal.check(conn, wait_s, self._error, self._busy_timeout_ms / 1000, self.path)

    def _wal_checkpoint(self, conn: apsw.Connection, mode: str, wait_s: float) -> str:
        return self._wal.checkpoint(conn, mode, wait_s, self._error, self._busy_timeout_ms / 1000)

    def wal_status(self) -> dict[str, object]:
        """The WAL's size and pending bytes against its limit, with a warning past half of it (``stats``)."""
        return self._wal.status(self.incremental_vacuum)

    def transaction(
        self,
        owner: str | None = None,
        *,
        admin: bool = False,
        wait: bool = True,
        turn: str | None = None,
        hooks: bool = True,
    ) -> _Transaction:
        """A write transaction (BEGIN IMMEDIATE; ``owner`` and ``turn`` change nothing: one writer),
        rolled back on any exception. ``wait=False``: a WAL over its limit is refused at once.
        ``hooks=False``: without the commit hooks (the anchor's own transaction, ``Anchor.advance``).
        Raises StoreBusyError (lock, or the WAL pinned past ``wal_wait_ms``), StorageFullError, StoreCorruptError."""
        return _Transaction(self, wait, hooks)

    def write_once(self, owner: str, turn_id: str, sql: str, params: Params) -> int | None:
        """``OnceWriter.write_once`` here: ``sql``'s statements (``"; "`` between them, each taking
        its share of ``params``), in order, in one write transaction (its outcome always known);
        the fewest rows one changed. When one changed nothing it is rolled back: no commit, so no
        commit hook (the anchor's counter) runs. Raises DuplicateKeyError (nothing written), and as ``transaction``."""
        try:
            with _Transaction(self, True, True) as tx:  # ``transaction()``'s
                fewest = tx.fewest(sql, params)
                if fewest <= 0:
                    raise _NothingWritten
                return fewest
        except _NothingWritten:
            return 0

    @contextmanager
    def _begun(self, conn: apsw.Connection, begin: str, mapped: tuple[type[Exception], ...]) -> Iterator[None]:
        """``begin``, then COMMIT; ROLLBACK on any exception (``mapped`` ones as typed errors)."""
        try:
            conn.execute(begin)
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        try:
            yield
        except mapped as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None  # type: ignore[arg-type]
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            self._rollback(conn)
            raise self._error(exc, conn) from None

    @contextmanager
    def snapshot(self) -> Iterator[apsw.Connection]:
        """A read transaction: every query inside sees one state (StoreCorruptError, SecurepadError)."""
        conn = self.conn
        with self._begun(conn, "BEGIN DEFERRED", (apsw.Error, UnicodeDecodeError)):
            yield conn

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts, on this thread's connection (StoreCorruptError, SecurepadError)."""
        held = self.held()
        conn = held.conn
        try:
            cursor = held.cursor.execute(sql, params)
            return list(map(row_maker(cursor.getdescription()), cursor))
        except apsw.ExecutionCompleteError:  # no rows at all
            return []
        except (apsw.Error, UnicodeDecodeError) as exc:
            held.renew()
            raise self._error(exc, conn) from None

    def queries(self, *statements: tuple[str, Params], owner: str | None = None, admin: bool = False) -> list[Rows]:
        """The rows of each query, in order, on this thread's connection (no round trip to save)."""
        return [self.query(sql, params, owner=owner, admin=admin) for sql, params in statements]

    def read_scope(self) -> object:
        """This thread's connection: the one ``PRAGMA data_version`` (a read's token) belongs to."""
        holder = getattr(self._local, "holder", None)  # ``conn``'s fast path, without its call
        if holder is not None and holder.pid == process.pid and not self._connections.closed:
            return holder.conn
        return self.conn

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Move the WAL into the database and truncate it (free pages given back with
        ``incremental_vacuum``); False when a reader kept part of it past the busy timeout
        (``wait=False``: none) or the disk had no room (StoreCorruptError)."""
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
        """Rebuild the file (VACUUM) and truncate the WAL: a b-tree rebalance can leave a copy of a
        deleted row in a page's unused space, which ``secure_delete`` does not reach; the copy
        goes to a temporary file, never memory. False when a reader kept part of the WAL alive.
        Raises StorageFullError (the file as it was) or StoreBusyError."""
        conn = self.conn
        try:
            conn.execute("PRAGMA temp_store = FILE")
            conn.execute("VACUUM")
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        self._wal.rebuilds += 1
        return self.checkpoint()

    def scrub_after_deletes(self) -> bool:
        """After gc's deletes: ``scrub`` when ``SCRUB_FREE_SHARE`` of the pages are free, else a
        truncating checkpoint; whether it rebuilt (StorageFullError: the deletes stand; StoreBusyError)."""
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
        """A consistent copy of the store at ``dest``, which must not exist (StorageFullError, SecurepadError)."""
        create_private_file(dest, companions=False)
        conn = self.conn
        try:
            conn.execute("VACUUM INTO ?", (str(dest),))
        except apsw.Error as exc:
            raise self._error(exc, conn) from None

    def restore_from(self, src: Path, aside: Path | None = None) -> None:
        """Replace this store's content with the SQLite file ``src`` through the backup API, into
        this store's WAL (others see the old store or the new one); with ``aside`` (must not
        exist) the store as it was is copied there first under the same write lock.
        Raises StorageFullError, StoreBusyError, SecurepadError (``src`` or ``aside``)."""
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
                    _copy_as_read(self.path, aside, self._error)
                copy.step(-1)
        except apsw.Error as exc:
            raise self._error(exc, conn) from None
        finally:
            source.close()
        self.checkpoint()

    def sync(self) -> None:
        """Fsync the file and its WAL, so the anchor is never ahead of the disk (SecurepadError)."""
        _fsync(self.path)

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
            holder: Holder | None = getattr(self._local, "holder", None)
            if holder is not None and holder.conn is conn:
                del self._local.holder
                holder.finalizer.detach()
                with contextlib.suppress(apsw.Error):
                    self._connections.release(conn, holder.pid, keep=False)

    def close(self) -> None:
        """Close every connection this object opened, in any thread."""
        self._connections.close_all()


def _migrate(conn: apsw.Connection, path: Path) -> tuple[int, int] | None:
    """Bring the store to ``SCHEMA_VERSION``; (old, new) when it upgraded an existing store."""
    version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
    if version < 0:
        raise StoreCorruptError(f"the store {path} is damaged: schema version {version}")
    if version == SCHEMA_VERSION:
        return None
    if version == 0 and conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall():
        raise StoreCorruptError(f"{path} is a SQLite database but not a securepad store; nothing was changed")
    marked = version > 0 and bool(conn.execute(schema.NUMBERING_SQL).fetchall())
    version = schema.version_of(schema.SQLITE, version, marked)
    for _, sql in schema.steps(schema.SQLITE, version, SCHEMA_VERSION):
        conn.execute(sql)
    conn.execute(schema.MARK_SQL)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return (version, SCHEMA_VERSION) if 0 < version < SCHEMA_VERSION else None


def _enable_incremental_vacuum(conn: apsw.Connection, error: ErrorMap) -> bool:
    """Switch the file to auto_vacuum=INCREMENTAL (a full VACUUM, once, for
    a store made without it); True once it is on."""
    try:
        mode = int(conn.execute("PRAGMA auto_vacuum").fetchall()[0][0])  # type: ignore[arg-type]
        if mode != 2:  # 0 none, 1 full, 2 incremental
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
    except apsw.Error as exc:
        raise error(exc, conn) from None
    return True


def _copy_as_read(path: Path, dest: Path, error: ErrorMap) -> None:
    """``copy_to`` through a read-only connection of its own (this thread's
    connection may be holding the write lock)."""
    create_private_file(dest, companions=False)
    reader = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        reader.execute("VACUUM INTO ?", (str(dest),))
    except apsw.Error as exc:
        raise error(exc, reader) from None
    finally:
        reader.close()


def _fsync(path: Path) -> None:
    for name in (str(path), f"{path}-wal"):
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


# ``write_once``'s statements: the same text put after put into a turn, split once.
_statements = functools.lru_cache(maxsize=64)(statements)
