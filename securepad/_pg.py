"""PostgreSQL through psycopg 3: the pool, roles, row-level security, migrations.

The store above speaks the same SQL to both backends; this module translates
placeholders (``?`` to ``%s``) and ``BLOB`` casts, and adds what PostgreSQL
can do that a file cannot: a second line of defence in the server.

* Two roles (created by the first migration when missing): ``securepad_app``
  for everything a principal does, without BYPASSRLS, and ``securepad_admin``,
  which owns the tables (so row-level security does not apply to it) and runs
  the housekeeping: gc, rotations, forgetting an owner, store-wide stats and
  migrations. The login role of each DSN must be a member of the role it
  plays; every transaction takes the role with ``SET LOCAL ROLE``.
* Every transaction sets ``securepad.owner`` (``set_config(..., true)``, so it
  ends with the transaction and a pooled connection carries nothing over).
  Policies on every owner-scoped table show ``securepad_app`` the rows of that
  owner only: a query that forgot its owner condition still returns nothing
  of anyone else's, and one run without an owner returns no rows at all.
* Writes are serialized as SQLite serializes them, but per owner: an owner's
  write transactions take that owner's advisory lock (and a shared store-wide
  one), store-wide housekeeping takes the store-wide lock exclusively. The
  store's check-then-write steps (quota, owner-key version, sequence numbers)
  therefore hold exactly as on SQLite, while different owners write in parallel.
* Every call has a deadline (issue 18: a 65 s network black hole blocked a
  call 65 s): libpq's connect timeout, TCP keepalives and user timeout for a
  dead network, the server's lock and statement timeouts, the pool's wait,
  and a watchdog that cuts the connection of a call still running at its
  deadline (a proxy or a hung server that keeps TCP alive). A server that
  cannot be reached is ``StoreUnavailableError`` (retryable), distinct from
  ``StoreBusyError``; connections that died while idle (a server restart) are
  replaced within the same call, and the pool retries connecting every ~1 s,
  so the store works again within a second or two of the server's return.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from ._backend import DuplicateKeyError, Params, Rows
from .errors import SecurepadError, StoreBusyError, StoreUnavailableError

__all__ = ["ADMIN_ROLE", "APP_ROLE", "SCHEMA_VERSION", "PostgresDatabase"]

APP_ROLE = "securepad_app"
ADMIN_ROLE = "securepad_admin"
# How long a transaction waits for a lock (an owner's, or the store's) before StoreBusyError.
LOCK_TIMEOUT_MS = 30_000
# Connections per pool that Scratchpad.open creates from a DSN.
DEFAULT_POOL_SIZE = 8
# The time limits of every call (see the module docstring and docs/reliability.md).
# Connecting (TCP, TLS, authentication): libpq's connect_timeout.
CONNECT_TIMEOUT_S = 5
# One statement on the server, lock waits included (so above LOCK_TIMEOUT_MS).
STATEMENT_TIMEOUT_MS = 45_000
# Waiting for a free pooled connection.
POOL_TIMEOUT_S = 10.0
# A whole call (one query, or one transaction from BEGIN to COMMIT): the
# watchdog cuts its connection past this. Above the statement timeout, so a
# healthy server always answers first.
CALL_TIMEOUT_S = 60.0
# A dead network: keepalive probes after 5 s idle, every 2 s, 3 lost = dead;
# unacknowledged data for 10 s = dead (Linux's tcp_user_timeout).
_NETWORK_LIMITS = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
# How long a pool keeps retrying a lost connection before it gives the slot up
# (a caller that then needs one makes it try at once). psycopg_pool waits 1 s,
# then doubles the wait: with its default (300 s) the first success after a
# 15 s outage came 19 s late; capped here, tries are ~1 s apart.
RECONNECT_TIMEOUT_S = 2.0
# Housekeeping (gc, rotations, forgetting an owner: the admin role) works
# store-wide and may run long on a large store: its statement and call limits
# are this many times a principal's.
_HOUSEKEEPING_FACTOR = 10
# How often the watchdog looks at the calls in flight.
_WATCH_TICK_S = 0.1
SCHEMA_VERSION = 2

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_OWNER = "current_setting('securepad.owner', true)"
_OWNER_TABLES = ("owner_keys", "entries", "checkpoints", "compaction_marks", "owner_usage")

# The SQLite schema at version 5, in PostgreSQL's types. Segments also carry
# their entry's owner (filled from the transaction's owner setting), so that
# row-level security can hold them even after their entry row is deleted.
_MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE store_meta(
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    INSERT INTO store_meta(key, value) VALUES ('master_wrap_count', '0');
    CREATE TABLE owner_keys(
        owner_user_id TEXT NOT NULL,
        version       INTEGER NOT NULL,
        wrapped       BYTEA NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        wrap_count    BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (owner_user_id, version)
    );
    CREATE TABLE entries(
        id             TEXT PRIMARY KEY,
        owner_user_id  TEXT NOT NULL,
        actor          TEXT NOT NULL,
        channel        TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        step_num       INTEGER NOT NULL,
        executor_name  TEXT NOT NULL,
        content_kind   TEXT NOT NULL,
        size_bytes     BIGINT NOT NULL,
        size_chars     BIGINT NOT NULL,
        segment_count  INTEGER NOT NULL,
        key_version    INTEGER NOT NULL,
        created_at     DOUBLE PRECISION NOT NULL,
        expires_at     DOUBLE PRECISION NOT NULL,
        wrapped_key    BYTEA NOT NULL,
        nonce_prefix   BYTEA NOT NULL,
        commitment     BYTEA NOT NULL,
        sealed_meta    BYTEA NOT NULL,
        stored_bytes   BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    CREATE INDEX entries_expires ON entries(expires_at);
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, stored_bytes);
    CREATE TABLE segments(
        entry_id      TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        data          BYTEA NOT NULL,
        owner_user_id TEXT NOT NULL DEFAULT {_OWNER},
        PRIMARY KEY (entry_id, seq)
    );
    CREATE TABLE checkpoints(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        expires_at    DOUBLE PRECISION NOT NULL,
        wrapped_key   BYTEA NOT NULL,
        sealed        BYTEA NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    );
    CREATE INDEX checkpoints_expires ON checkpoints(expires_at);
    CREATE TABLE compaction_marks(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        expires_at    DOUBLE PRECISION NOT NULL,
        wrapped_key   BYTEA NOT NULL,
        sealed        BYTEA NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    );
    CREATE INDEX compaction_marks_expires ON compaction_marks(expires_at);
    CREATE TABLE owner_usage(
        owner_user_id TEXT PRIMARY KEY,
        stored_bytes  BIGINT NOT NULL
    );
    -- Bytes stored per owner, as SQLite's triggers keep them (schema 5 there).
    CREATE FUNCTION owner_usage_track() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP IN ('DELETE', 'UPDATE') THEN
            UPDATE owner_usage SET stored_bytes = stored_bytes - OLD.stored_bytes
                WHERE owner_user_id = OLD.owner_user_id;
            DELETE FROM owner_usage WHERE owner_user_id = OLD.owner_user_id AND stored_bytes <= 0;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO owner_usage(owner_user_id, stored_bytes) VALUES (NEW.owner_user_id, NEW.stored_bytes)
                ON CONFLICT (owner_user_id)
                DO UPDATE SET stored_bytes = owner_usage.stored_bytes + excluded.stored_bytes;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER owner_usage_track AFTER INSERT OR DELETE OR UPDATE OF owner_user_id, stored_bytes
        ON entries FOR EACH ROW EXECUTE FUNCTION owner_usage_track();

    -- Row-level security: the application role sees one owner's rows, the
    -- one named by the transaction's securepad.owner setting.
    {
        "".join(
            f'''
    ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON {table} TO {APP_ROLE}
        USING (owner_user_id = {_OWNER}) WITH CHECK (owner_user_id = {_OWNER});'''
            for table in _OWNER_TABLES
        )
    }
    ALTER TABLE segments ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON segments TO {APP_ROLE}
        USING (owner_user_id = {_OWNER})
        WITH CHECK (owner_user_id = {_OWNER}
                    AND EXISTS (SELECT 1 FROM entries e WHERE e.id = segments.entry_id));
    -- Everyone's store metadata is readable (the key check, the format); the
    -- application may only count the master key's wraps.
    ALTER TABLE store_meta ENABLE ROW LEVEL SECURITY;
    CREATE POLICY read_meta ON store_meta FOR SELECT TO {APP_ROLE} USING (true);
    CREATE POLICY count_wraps ON store_meta FOR UPDATE TO {APP_ROLE}
        USING (key = 'master_wrap_count') WITH CHECK (key = 'master_wrap_count');

    GRANT SELECT ON store_meta TO {APP_ROLE};
    GRANT UPDATE (value) ON store_meta TO {APP_ROLE};
    GRANT SELECT, INSERT ON owner_keys TO {APP_ROLE};
    GRANT UPDATE (wrap_count) ON owner_keys TO {APP_ROLE};
    GRANT SELECT, INSERT, DELETE ON entries, segments, checkpoints, compaction_marks TO {APP_ROLE};
    GRANT UPDATE (expires_at, sealed_meta) ON entries TO {APP_ROLE};
    GRANT UPDATE (expires_at, sealed) ON checkpoints, compaction_marks TO {APP_ROLE};
    GRANT SELECT, INSERT, UPDATE, DELETE ON owner_usage TO {APP_ROLE};
    """,
    # Sealed turn heads (heads.py), as SQLite's schema 6.
    2: f"""
    CREATE TABLE turn_heads(
        owner_user_id TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        key_version   INTEGER NOT NULL,
        sealed        BYTEA NOT NULL,
        PRIMARY KEY (owner_user_id, turn_id)
    );
    ALTER TABLE turn_heads ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON turn_heads TO {APP_ROLE}
        USING (owner_user_id = {_OWNER}) WITH CHECK (owner_user_id = {_OWNER});
    GRANT SELECT, INSERT, UPDATE, DELETE ON turn_heads TO {APP_ROLE};
    INSERT INTO store_meta(key, value) VALUES ('turn_heads', 'pending')
        ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    """,
}

# The role, schema, owner, lock and statement timeouts of one transaction (``true``: local to it).
_SETTINGS = (
    "SELECT set_config('role', %s, true), set_config('search_path', %s, true),"
    " set_config('securepad.owner', %s, true), set_config('lock_timeout', %s, true),"
    " set_config('statement_timeout', %s, true)"
)

_BUSY = (
    pg_errors.LockNotAvailable,
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
)


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """The store's portable SQL in psycopg's dialect: ``%s`` placeholders, BYTEA casts."""
    return sql.replace("%", "%%").replace("?", "%s").replace(" AS BLOB)", " AS BYTEA)")


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Conn:
    """A psycopg connection inside a transaction, as the store's ``Conn`` protocol."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def query(self, sql: str, params: Params = ()) -> Rows:
        cursor = self._run(sql, params)
        if cursor.description is None:
            return []
        names = [d.name for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._run(sql, params).rowcount

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        try:
            with self.raw.cursor() as cursor:
                cursor.executemany(translate(sql), list(rows))
        except pg_errors.UniqueViolation:
            raise DuplicateKeyError from None

    def _run(self, sql: str, params: Params) -> psycopg.Cursor[Any]:
        try:
            return self.raw.execute(translate(sql), params)
        except pg_errors.UniqueViolation:
            raise DuplicateKeyError from None


class _Watch:
    """One call in flight: its connection, its deadline, and whether the watchdog cut it."""

    __slots__ = ("conn", "cut", "deadline")

    def __init__(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline
        self.cut = False


class _Watchdog:
    """Cuts the connection of a call that runs past its deadline.

    The server's statement timeout cannot help when the server (or the
    network in between) does not answer at all, and TCP keepalives do not
    fire while something on the path still acknowledges packets. Shutting the
    socket down makes the blocked call fail at once (libpq sees the connection
    closed); the pool then drops the connection. One thread per store, running
    only while calls are in flight.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, _Watch] = {}
        self._running = False
        self._pid = os.getpid()

    @contextmanager
    def watch(self, conn: psycopg.Connection[Any], deadline: float) -> Iterator[_Watch]:
        call = _Watch(conn, deadline)
        with self._lock:
            self._calls[id(call)] = call
            if not self._running or self._pid != os.getpid():
                self._running, self._pid = True, os.getpid()
                threading.Thread(target=self._run, name="securepad-pg-watchdog", daemon=True).start()
        try:
            yield call
        finally:
            with self._lock:
                del self._calls[id(call)]

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(_WATCH_TICK_S)
            now = time.monotonic()
            with self._lock:
                if self._calls:
                    idle_since = now
                elif now - idle_since > 1.0:
                    self._running = False
                    return
                for call in self._calls.values():
                    if not call.cut and now >= call.deadline:
                        call.cut = True
                        _cut(call.conn)


def _cut(conn: psycopg.Connection[Any]) -> None:
    """Shut a connection's socket down under libpq's feet: its blocked call fails now."""
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return  # already closed
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class PostgresDatabase:
    """A store in one schema of a PostgreSQL database, reached through connection pools.

    ``app`` (a DSN or a ``psycopg_pool.ConnectionPool``) serves principals;
    ``admin`` (default: the same) serves housekeeping and migrations. Pools
    made here from a DSN are closed by ``close``; pools passed in are not.

    Pools made here connect with ``connect_timeout``, TCP keepalives and
    ``tcp_user_timeout`` (unless the DSN sets them) and retry a lost
    connection every ~1 s; a pool passed in keeps its own settings. Every call
    gets ``statement_timeout_ms`` on the server, waits at most
    ``pool_timeout_s`` for a connection, and is cut at ``call_timeout_s``
    (housekeeping: ten times the statement and call limits).
    """

    dialect = "postgresql"

    def __init__(
        self,
        app: str | ConnectionPool[Any],
        *,
        admin: str | ConnectionPool[Any] | None = None,
        schema: str = "securepad",
        pool_size: int = DEFAULT_POOL_SIZE,
        lock_timeout_ms: int = LOCK_TIMEOUT_MS,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if not _SCHEMA_RE.fullmatch(schema):
            raise SecurepadError(f"schema must be a lowercase SQL identifier, not {schema!r}")
        self.schema = schema
        self._sources = (app, app if admin is None else admin)
        self._pool_size = pool_size
        self._lock_timeout = f"{int(lock_timeout_ms)}ms"
        self._statement_ms = int(statement_timeout_ms)
        self._network = {**_NETWORK_LIMITS, "connect_timeout": max(1, round(connect_timeout_s))}
        self._pool_timeout_s = pool_timeout_s
        self._call_timeout_s = call_timeout_s
        self._watchdog = _Watchdog()
        self._store_lock = _lock_key("securepad-store", schema)
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._owned: list[ConnectionPool[Any]] = []
        self._inherited: list[ConnectionPool[Any]] = []
        self._app, self._admin = self._pools()
        self.location = _describe(app, schema)
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    def _pools(self) -> tuple[ConnectionPool[Any], ConnectionPool[Any]]:
        made: dict[str, ConnectionPool[Any]] = {}

        def pool(source: str | ConnectionPool[Any]) -> ConnectionPool[Any]:
            if not isinstance(source, str):
                return source
            if source not in made:
                limits = self._limits_for(source)
                try:
                    # One plain connection first: a refused or failed connection is
                    # reported at once, with the server's reason (a pool would retry).
                    psycopg.connect(source, **limits).close()
                    made[source] = ConnectionPool(
                        source,
                        min_size=1,
                        max_size=self._pool_size,
                        kwargs={"autocommit": True, **limits},
                        name=f"securepad-{self.schema}",
                        timeout=self._pool_timeout_s,
                        reconnect_timeout=RECONNECT_TIMEOUT_S,
                        open=True,
                    )
                    made[source].wait(timeout=self._pool_timeout_s)
                except (psycopg.Error, PoolTimeout) as exc:
                    for opened in made.values():
                        opened.close()
                    raise StoreUnavailableError(
                        f"cannot connect to PostgreSQL at {_describe(source, self.schema)}: {_reason(exc)}"
                    ) from None
                self._owned.append(made[source])
            return made[source]

        return pool(self._sources[0]), pool(self._sources[1])

    def _limits_for(self, dsn: str) -> dict[str, Any]:
        """The network limits the DSN does not set itself."""
        try:
            given = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise SecurepadError(f"not a PostgreSQL connection string: {_reason(exc)}") from None
        return {key: value for key, value in self._network.items() if key not in given}

    def _pool(self, admin: bool) -> ConnectionPool[Any]:
        if self._closed:
            raise SecurepadError("the store is closed")
        if os.getpid() != self._pid:
            # A forked child must not share its parent's sockets: open its own pools.
            if any(not isinstance(source, str) for source in self._sources):
                raise SecurepadError("a store opened on a connection pool cannot be used after fork; open it again")
            with self._lock:
                if os.getpid() != self._pid:
                    # Never closed nor collected here: closing would end the
                    # parent's sessions on the sockets both processes hold.
                    self._inherited.extend(self._owned)
                    self._owned = []
                    self._app, self._admin = self._pools()
                    self._pid = os.getpid()
        return self._admin if admin else self._app

    @contextmanager
    def _connection(self, admin: bool) -> Iterator[_Watch]:
        """A pooled connection for one call, watched until the call's deadline.

        Raises:
            StoreUnavailableError: no connection within the pool timeout, and
                the server cannot be reached.
            StoreBusyError: no connection within the pool timeout, all in use.
        """
        pool = self._pool(admin)
        deadline = time.monotonic() + self._call_timeout(admin)
        try:
            conn = pool.getconn(timeout=self._pool_timeout_s)
        except PoolTimeout:
            raise self._no_connection(pool) from None
        try:
            with self._watchdog.watch(conn, deadline) as call:
                yield call
        finally:
            pool.putconn(conn)

    def _no_connection(self, pool: ConnectionPool[Any]) -> SecurepadError:
        """Why the pool had no connection: the server is unreachable, or every
        connection is in use (asked directly, once, within the connect timeout)."""
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        kwargs = (pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {}
        limit = {"connect_timeout": self._network["connect_timeout"], **kwargs, "autocommit": True}
        try:
            psycopg.connect(conninfo, **limit).close()
        except psycopg.Error as exc:
            return StoreUnavailableError(f"PostgreSQL is unavailable ({_reason(exc)}); try again")
        return StoreBusyError("the store is busy (no free connection in the pool); try again")

    def _retry(self, call: _Watch, attempt: int) -> bool:
        """Whether a call whose first statement failed may run again on another
        connection: the connection had died while idle in the pool (a server
        restart ends every pooled session), not at the deadline."""
        return call.conn.broken and not call.cut and attempt < self._pool_size and time.monotonic() < call.deadline

    def _unavailable(self, exc: psycopg.OperationalError, call: _Watch | None) -> SecurepadError:
        if call is not None and call.cut:
            return StoreUnavailableError(
                "PostgreSQL did not answer before the call's deadline; the call was cut; try again"
            )
        if isinstance(exc, pg_errors.QueryCanceled):
            return StoreUnavailableError(f"PostgreSQL cancelled the statement: {_reason(exc)}; try again")
        return StoreUnavailableError(f"PostgreSQL connection failed ({_reason(exc)}); try again")

    def _settings(self, owner: str | None, admin: bool) -> Params:
        role = ADMIN_ROLE if admin else APP_ROLE
        statement_ms = self._statement_ms * (_HOUSEKEEPING_FACTOR if admin else 1)
        return (role, self.schema, owner or "", self._lock_timeout, f"{statement_ms}ms")

    def _call_timeout(self, admin: bool) -> float:
        return self._call_timeout_s * (_HOUSEKEEPING_FACTOR if admin else 1)

    @contextmanager
    def _begin(self, admin: bool, sql: str, params: Params) -> Iterator[tuple[_Watch, Any]]:
        """BEGIN and the first statement (settings and locks) on a live connection;
        COMMIT when the caller's block ends, ROLLBACK when it raises. Connections
        found dead at BEGIN are dropped and the next one is tried."""
        for attempt in range(self._pool_size + 1):
            with self._connection(admin) as call:
                conn = call.conn
                try:
                    conn.execute("BEGIN")
                    row = conn.execute(sql, params).fetchone()
                except psycopg.OperationalError as exc:
                    if self._retry(call, attempt) and not isinstance(exc, _BUSY):
                        continue
                    self._end(conn)
                    raise
                except BaseException:
                    self._end(conn)
                    raise
                try:
                    yield call, row
                except BaseException:
                    self._end(conn)
                    raise
                conn.execute("COMMIT")
                return

    @staticmethod
    def _end(conn: psycopg.Connection[Any]) -> None:
        if not conn.broken:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    @contextmanager
    def _session(
        self, owner: str | None, admin: bool, locks: str, lock_params: Params, *, optional: bool = False
    ) -> Iterator[_Conn]:
        """A transaction with the role, schema, owner, lock and statement timeouts
        set locally, and ``locks`` taken, all in one statement (the settings
        come first: a target list is evaluated left to right). ``optional``
        housekeeping that this connection may not do (no admin role) is
        StoreBusyError: skipped."""
        call: _Watch | None = None
        try:
            with self._begin(admin, _SETTINGS + locks, (*self._settings(owner, admin), *lock_params)) as (call, row):
                if row is not None and row[-1] is False:  # pg_try_advisory_xact_lock
                    raise StoreBusyError("the store is busy; try again")
                yield _Conn(call.conn)
        except _BUSY:
            raise StoreBusyError("the store is busy; try again") from None
        except pg_errors.InsufficientPrivilege as exc:
            if optional:
                raise StoreBusyError(f"housekeeping skipped: {_reason(exc)}") from None
            raise SecurepadError(f"PostgreSQL refused the store's role: {_reason(exc)}") from None
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc, call) from None

    @contextmanager
    def transaction(self, owner: str | None = None, *, admin: bool = False, wait: bool = True) -> Iterator[_Conn]:
        """A write transaction, serialized with the owner's other writes (or,
        for store-wide housekeeping, with every write); rolled back on any exception.

        Raises:
            StoreBusyError: a lock was not obtained within the lock timeout (at
                once with ``wait=False``), or the pool had no free connection.
            StoreUnavailableError: the server cannot be reached or did not
                answer in time (if that happened at COMMIT, the write may or
                may not have been applied).
        """
        if owner is not None:
            locks = ", pg_advisory_xact_lock_shared(%s), pg_advisory_xact_lock(%s)"
            params: Params = (self._store_lock, _lock_key("securepad-owner", self.schema, owner))
        elif wait:
            locks, params = ", pg_advisory_xact_lock(%s)", (self._store_lock,)
        else:
            locks, params = ", pg_try_advisory_xact_lock(%s)", (self._store_lock,)
        with self._session(owner, admin, locks, params, optional=admin and not wait) as conn:
            yield conn

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts, in a transaction of their own.

        One round trip: the settings and the query go as one simple-protocol
        message, which PostgreSQL runs as one implicit transaction (so the
        local settings hold for the query and end with it). The parameters are
        bound by psycopg's client-side quoting.

        Raises:
            StoreBusyError: a lock wait timed out, or the pool had no free connection.
            StoreUnavailableError: the server cannot be reached or did not answer in time.
        """
        text = _SETTINGS + "; " + translate(sql)
        values = (*self._settings(owner, admin), *params)
        call: _Watch | None = None
        try:
            for attempt in range(self._pool_size + 1):
                with self._connection(admin) as call, psycopg.ClientCursor(call.conn) as cursor:
                    try:
                        cursor.execute(text, values)
                    except psycopg.OperationalError as exc:
                        if self._retry(call, attempt) and not isinstance(exc, _BUSY):
                            continue  # a connection that died while idle: reads are safe to run again
                        raise
                    cursor.nextset()
                    if cursor.description is None:
                        return []
                    names = [d.name for d in cursor.description]
                    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            raise AssertionError("unreachable: the last attempt returns or raises")
        except _BUSY:
            raise StoreBusyError("the store is busy; try again") from None
        except pg_errors.InsufficientPrivilege as exc:
            raise SecurepadError(f"PostgreSQL refused the store's role: {_reason(exc)}") from None
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc, call) from None

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Nothing to do: the server manages its own files (see the README's PostgreSQL section on VACUUM)."""
        return True

    def scrub(self) -> bool:
        """Nothing to do here: dead rows go with the server's VACUUM (see SECURITY.md)."""
        return True

    def _app_version(self) -> int | None:
        """The schema version as the application role sees it; None when it cannot tell."""
        try:
            rows = self.query("SELECT MAX(version) AS v FROM schema_version")
        except (psycopg.Error, SecurepadError):
            return None
        return None if rows[0]["v"] is None else int(rows[0]["v"])

    def _migrate(self) -> None:
        """Create the roles and schema when missing, then bring the tables to SCHEMA_VERSION.

        A store already at SCHEMA_VERSION opens with the application role
        alone: a process that serves principals needs no admin login.
        """
        version = self._app_version()
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise SecurepadError(
                f"store schema version {version} is newer than this securepad understands ({SCHEMA_VERSION})"
            )
        pool = self._pool(admin=True)
        try:
            with pool.connection() as conn, conn.transaction():
                # One migration at a time per database (roles are cluster-wide: a
                # racing creation in another database is tolerated below).
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("securepad-migrate"),))
                existing = {
                    r[0]
                    for r in conn.execute(
                        "SELECT rolname FROM pg_roles WHERE rolname IN (%s, %s)", (APP_ROLE, ADMIN_ROLE)
                    )
                }
                for role in (APP_ROLE, ADMIN_ROLE):
                    if role not in existing:
                        conn.execute(
                            f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN NOBYPASSRLS;"
                            " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
                        )
                has_schema = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone()
                if has_schema is None:
                    conn.execute(f"CREATE SCHEMA {self.schema} AUTHORIZATION {ADMIN_ROLE}")
                    conn.execute(f"GRANT USAGE ON SCHEMA {self.schema} TO {APP_ROLE}")
                conn.execute(
                    "SELECT set_config('role', %s, true), set_config('search_path', %s, true)",
                    (ADMIN_ROLE, self.schema),
                )
                conn.execute("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)")
                conn.execute(f"GRANT SELECT ON schema_version TO {APP_ROLE}")
                row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
                version = int(row[0]) if row is not None and row[0] is not None else 0
                if version > SCHEMA_VERSION:
                    raise SecurepadError(
                        f"store schema version {version} is newer than this securepad understands ({SCHEMA_VERSION})"
                    )
                for target in range(version + 1, SCHEMA_VERSION + 1):
                    conn.execute(_MIGRATIONS[target])
                    conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (target,))
        except pg_errors.InsufficientPrivilege as exc:
            raise SecurepadError(
                f"cannot set up the store in schema {self.schema}: {_reason(exc)}"
                " (see the README's PostgreSQL section for the roles and grants it needs)"
            ) from None
        except psycopg.Error as exc:
            raise SecurepadError(f"cannot set up the store in schema {self.schema}: {_reason(exc)}") from None

    def close(self) -> None:
        """Close the pools this object made (never one that was passed in)."""
        with self._lock:
            self._closed = True
            pools, self._owned = self._owned, []
        if os.getpid() != self._pid:
            return  # the parent's pools: their sockets are not ours to close
        for pool in pools:
            pool.close()


def _reason(exc: BaseException) -> str:
    """The exception's message on one line (psycopg's span several: the command
    line prints an error as one line), or its class name when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _describe(source: str | ConnectionPool[Any], schema: str) -> str:
    """Where the store is, without a password."""
    conninfo = source if isinstance(source, str) else source.conninfo
    if not isinstance(conninfo, str):
        return f"postgresql (schema {schema})"
    try:
        info = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return f"postgresql (schema {schema})"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"postgresql://{info.get('user') or ''}@{host}:{port}/{info.get('dbname') or ''} (schema {schema})"
