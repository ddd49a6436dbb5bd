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
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from ._backend import DuplicateKeyError, Params, Rows
from .errors import SecurepadError, StoreBusyError

__all__ = ["ADMIN_ROLE", "APP_ROLE", "SCHEMA_VERSION", "PostgresDatabase"]

APP_ROLE = "securepad_app"
ADMIN_ROLE = "securepad_admin"
# How long a transaction waits for a lock (an owner's, or the store's) before StoreBusyError.
LOCK_TIMEOUT_MS = 30_000
# Connections per pool that Scratchpad.open creates from a DSN.
DEFAULT_POOL_SIZE = 8
SCHEMA_VERSION = 1

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
}

# The role, schema, owner and lock timeout of one transaction (``true``: local to it).
_SETTINGS = (
    "SELECT set_config('role', %s, true), set_config('search_path', %s, true),"
    " set_config('securepad.owner', %s, true), set_config('lock_timeout', %s, true)"
)

_BUSY = (
    pg_errors.LockNotAvailable,
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    PoolTimeout,
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


class PostgresDatabase:
    """A store in one schema of a PostgreSQL database, reached through connection pools.

    ``app`` (a DSN or a ``psycopg_pool.ConnectionPool``) serves principals;
    ``admin`` (default: the same) serves housekeeping and migrations. Pools
    made here from a DSN are closed by ``close``; pools passed in are not.
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
    ) -> None:
        if not _SCHEMA_RE.fullmatch(schema):
            raise SecurepadError(f"schema must be a lowercase SQL identifier, not {schema!r}")
        self.schema = schema
        self._sources = (app, app if admin is None else admin)
        self._pool_size = pool_size
        self._lock_timeout = f"{int(lock_timeout_ms)}ms"
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
                try:
                    # One plain connection first: a refused or failed connection is
                    # reported at once, with the server's reason (a pool would retry).
                    psycopg.connect(source).close()
                    made[source] = ConnectionPool(
                        source,
                        min_size=1,
                        max_size=self._pool_size,
                        kwargs={"autocommit": True},
                        name=f"securepad-{self.schema}",
                        open=True,
                    )
                    made[source].wait(timeout=30)
                except (psycopg.Error, PoolTimeout) as exc:
                    for opened in made.values():
                        opened.close()
                    raise SecurepadError(
                        f"cannot connect to PostgreSQL at {_describe(source, self.schema)}: {exc}"
                    ) from None
                self._owned.append(made[source])
            return made[source]

        return pool(self._sources[0]), pool(self._sources[1])

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
    def _session(
        self, owner: str | None, admin: bool, locks: str, lock_params: Params, *, optional: bool = False
    ) -> Iterator[_Conn]:
        """A transaction with the role, schema, owner and lock timeout set locally,
        and ``locks`` taken, all in one statement (the settings come first: a
        target list is evaluated left to right). ``optional`` housekeeping that
        this connection may not do (no admin role) is StoreBusyError: skipped."""
        try:
            with self._pool(admin).connection() as conn, conn.transaction():
                taken = conn.execute(
                    _SETTINGS + locks,
                    (ADMIN_ROLE if admin else APP_ROLE, self.schema, owner or "", self._lock_timeout, *lock_params),
                ).fetchone()
                if taken is not None and taken[-1] is False:  # pg_try_advisory_xact_lock
                    raise StoreBusyError("the store is busy; try again")
                yield _Conn(conn)
        except _BUSY:
            raise StoreBusyError("the store is busy; try again") from None
        except pg_errors.InsufficientPrivilege as exc:
            if optional:
                raise StoreBusyError(f"housekeeping skipped: {exc}") from None
            raise SecurepadError(f"PostgreSQL refused the store's role: {exc}") from None
        except psycopg.OperationalError as exc:
            raise SecurepadError(f"PostgreSQL connection failed: {exc}") from None

    @contextmanager
    def transaction(self, owner: str | None = None, *, admin: bool = False, wait: bool = True) -> Iterator[_Conn]:
        """A write transaction, serialized with the owner's other writes (or,
        for store-wide housekeeping, with every write); rolled back on any exception.

        Raises:
            StoreBusyError: a lock was not obtained within the lock timeout (at
                once with ``wait=False``), or the pool had no free connection.
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
        """
        settings = (ADMIN_ROLE if admin else APP_ROLE, self.schema, owner or "", self._lock_timeout)
        try:
            with self._pool(admin).connection() as conn, psycopg.ClientCursor(conn) as cursor:
                cursor.execute(_SETTINGS + "; " + translate(sql), (*settings, *params))
                cursor.nextset()
                if cursor.description is None:
                    return []
                names = [d.name for d in cursor.description]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except _BUSY:
            raise StoreBusyError("the store is busy; try again") from None
        except pg_errors.InsufficientPrivilege as exc:
            raise SecurepadError(f"PostgreSQL refused the store's role: {exc}") from None
        except psycopg.OperationalError as exc:
            raise SecurepadError(f"PostgreSQL connection failed: {exc}") from None

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
                f"cannot set up the store in schema {self.schema}: {exc}"
                " (see the README's PostgreSQL section for the roles and grants it needs)"
            ) from None
        except psycopg.Error as exc:
            raise SecurepadError(f"cannot set up the store in schema {self.schema}: {exc}") from None

    def close(self) -> None:
        """Close the pools this object made (never one that was passed in)."""
        with self._lock:
            self._closed = True
            pools, self._owned = self._owned, []
        if os.getpid() != self._pid:
            return  # the parent's pools: their sockets are not ours to close
        for pool in pools:
            pool.close()


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
