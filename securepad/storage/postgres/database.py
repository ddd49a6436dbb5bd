"""PostgreSQL through psycopg 3: roles, row-level security settings, transactions.

The store's portable SQL is translated here (``?`` to ``%s``, ``BLOB`` casts),
and the server adds a second line of defence:

* two roles: ``securepad_app`` for what a principal does (no BYPASSRLS), and
  ``securepad_admin``, the tables' owner, for housekeeping and migrations;
* every transaction sets ``securepad.owner``: the policies show the
  application role that owner's rows only, and none without an owner;
* writes are serialized per owner by advisory locks, housekeeping by the
  store-wide lock, so the check-then-write steps hold as on SQLite;
* every call has a deadline (``connections.py``); an unreachable server is
  ``StoreUnavailableError`` (retryable).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ...errors import InvalidArgumentError, SecurepadError, StoreBusyError, StoreUnavailableError
from ..base import DuplicateKeyError, OutcomeUnknown, Params, Rows
from .connections import Connections, unavailable
from .log import relay_pool_warnings
from .migrate import ADMIN_ROLE, APP_ROLE, SCHEMA_VERSION, migrate, reason
from .pipeline import BUSY, Transaction, Watch, end, rowcount, rows_of, send, translate
from .pool import CONNECT_TIMEOUT_S, describe_source
from .prepared import Statements
from .session import SYNCHRONOUS_COMMIT, Session

__all__ = ["ADMIN_ROLE", "APP_ROLE", "SCHEMA_VERSION", "PostgresDatabase"]

# The time limits of every call (docs/reliability.md), each above the one
# before, so a healthy server always answers first; a shorter call deadline
# cuts each to fit under it in the same order.
# A lock wait (an owner's, or the store's) before StoreBusyError.
LOCK_TIMEOUT_MS = 30_000
# One statement on the server, lock waits included.
STATEMENT_TIMEOUT_MS = 45_000
# Waiting for a free pooled connection.
POOL_TIMEOUT_S = 10.0
# A whole call (one query, or BEGIN to COMMIT): the watchdog cuts it past this.
CALL_TIMEOUT_S = 60.0
# Connections per pool that Scratchpad.open creates from a DSN.
DEFAULT_POOL_SIZE = 8


Limit = TypeVar("Limit", int, float)
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# A read snapshot's first statement (``PostgresDatabase.snapshot``).
_BEGIN_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


class PostgresDatabase:
    """A store in one schema of a PostgreSQL database, reached through connection pools.

    ``app`` (a DSN or a ``psycopg_pool.ConnectionPool``) serves principals;
    ``admin`` (default: the same) serves housekeeping and migrations. Pools
    made here from a DSN are closed by ``close``; pools passed in are not.
    ``durability`` (the policy's) sets every transaction's ``synchronous_commit``.
    """

    dialect = "postgresql"
    # The server's WAL has no bound a transaction's size must respect (``Backend``).
    write_limit_bytes: int | None = None

    def __init__(
        self,
        app: str | ConnectionPool[Any],
        *,
        admin: str | ConnectionPool[Any] | None = None,
        schema: str = "securepad",
        pool_size: int = DEFAULT_POOL_SIZE,
        call_timeout_s: float = CALL_TIMEOUT_S,
        lock_timeout_ms: int | None = None,
        statement_timeout_ms: int | None = None,
        pool_timeout_s: float | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        durability: str = "normal",
    ) -> None:
        number = isinstance(call_timeout_s, int | float) and not isinstance(call_timeout_s, bool)
        if not number or not math.isfinite(call_timeout_s) or not call_timeout_s > 0:  # the limits are cut from it
            raise InvalidArgumentError(
                f"the call deadline must be a positive number of seconds, not {call_timeout_s!r}"
            )
        if not _SCHEMA_RE.fullmatch(schema):
            raise SecurepadError(f"schema must be a lowercase SQL identifier, not {schema!r}")
        if durability not in SYNCHRONOUS_COMMIT:
            raise SecurepadError(f"durability must be one of {', '.join(SYNCHRONOUS_COMMIT)}, not {durability!r}")
        self.durability = durability
        self.schema = schema
        relay_pool_warnings()
        self.session = Session(
            schema,
            lock_timeout_ms=_fit(lock_timeout_ms, LOCK_TIMEOUT_MS, int(call_timeout_s * 500)),
            statement_timeout_ms=_fit(statement_timeout_ms, STATEMENT_TIMEOUT_MS, int(call_timeout_s * 750)),
            durability=durability,
        )
        self._statements = Statements(schema)
        # The call of this thread's read snapshot (``snapshot``), while one is open.
        self._pinned = threading.local()
        self.connections = Connections(
            app,
            app if admin is None else admin,
            schema=schema,
            pool_size=pool_size,
            connect_timeout_s=connect_timeout_s,
            pool_timeout_s=_fit(pool_timeout_s, POOL_TIMEOUT_S, call_timeout_s / 2),
            call_timeout_s=float(call_timeout_s),
        )
        self.location = describe_source(app, schema)
        try:
            self.upgraded: tuple[int, int] | None = migrate(
                schema, self._app_version, lambda: self.connections.lender(admin=True).drain()
            )
        except BaseException:
            self.close()
            raise

    @contextmanager
    def transaction(
        self, owner: str | None = None, *, admin: bool = False, wait: bool = True, turn: str | None = None
    ) -> Iterator[Transaction]:
        """A write transaction (``Backend.transaction``), rolled back on any exception.

        Raises:
            StoreBusyError: a lock was not obtained within the lock timeout (at
                once with ``wait=False``), or the pool had no free connection.
            StoreUnavailableError: the server cannot be reached or did not
                answer in time (if that happened at COMMIT, the write may or
                may not have been applied).
        """
        opening = self.session.opening(owner, admin=admin, wait=wait, turn=turn)
        tx = Transaction(
            lambda: self.connections.checkout(admin),
            self.connections.checkin,
            self.connections.retry,
            opening,
            self._statements,
            try_lock=owner is None and not wait,
        )
        committed = False
        try:
            yield tx
            tx.commit()
            committed = True
        except pg_errors.InsufficientPrivilege as exc:
            if admin and not wait:  # optional housekeeping this connection may not do: skipped
                raise StoreBusyError(f"housekeeping skipped: {reason(exc)}") from None
            raise _failure(exc, tx.call) from None
        except psycopg.OperationalError as exc:
            if tx.commit_unknown and not isinstance(exc, BUSY):
                raise StoreUnavailableError(
                    f"{unavailable(exc, tx.call)}".removesuffix("; try again")
                    + " after the write's COMMIT was sent: it may or may not have been applied"
                ) from None
            raise _failure(exc, tx.call) from None
        finally:
            tx.close(committed)

    def write_once(self, owner: str, turn_id: str, sql: str, params: Params) -> int | None:
        """``OnceWriter.write_once``: the settings and locks, then ``sql``, as one
        implicit transaction (no BEGIN, no COMMIT); the rows it changed, or None
        when the connection broke once the message was sent (it is not sent again).

        Raises:
            DuplicateKeyError: the statement hit a unique key; nothing was written.
            OutcomeUnknown: the call was cut at its deadline: the message was
                sent, and the server may apply it even later (it waits for its locks).
            StoreBusyError: a lock was not obtained in time, or the pool had no free connection.
            StoreUnavailableError: no connection could be had, or the server
                reported an error of its own on a live connection (a cancelled
                statement): the implicit transaction was rolled back.
        """
        batch = [
            self.session.opening(owner, admin=False, wait=True, turn=turn_id),
            (translate(sql), params),
        ]
        call = self.connections.checkout(False)
        try:
            return rowcount(send(call, self._statements, batch, first=True)[-1])
        except pg_errors.UniqueViolation:
            raise DuplicateKeyError from None
        except (psycopg.OperationalError, pg_errors.InsufficientPrivilege) as exc:
            if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, BUSY):
                if call.cut:  # past the call's deadline: no fallback with a deadline of its own
                    raise OutcomeUnknown(str(unavailable(exc, call))) from None
                if call.conn.broken:  # else the server's own error: the implicit transaction rolled back
                    return None
            raise _failure(exc, call) from None
        finally:
            self.connections.checkin(call)

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts: the settings and the query as one message, one implicit transaction.

        Raises:
            StoreBusyError: a lock wait timed out, or the pool had no free connection.
            StoreUnavailableError: the server cannot be reached or did not answer in time.
        """
        return self.queries((sql, params), owner=owner, admin=admin)[0]

    def queries(self, *statements: tuple[str, Params], owner: str | None = None, admin: bool = False) -> list[Rows]:
        """The rows of each query, in order: the settings and the queries go as
        one message (one round trip, one implicit transaction).

        Raises:
            StoreBusyError: a lock wait timed out, or the pool had no free connection.
            StoreUnavailableError: the server cannot be reached or did not answer in time.
        """
        pinned: Watch | None = getattr(self._pinned, "call", None)
        # Inside this thread's ``snapshot``: on its connection (never sent again), as housekeeping with ``owner`` set.
        settings = self.session.settings(owner, admin or pinned is not None)
        batch = [settings, *((translate(sql), params) for sql, params in statements)]
        call = pinned
        try:
            if pinned is not None:
                pinned.deadline = time.monotonic() + self.connections.call_timeout(True)
                return [rows_of(pinned, result) for result in send(pinned, self._statements, batch, first=False)[1:]]
            for attempt in range(self.connections.pool_size + 1):
                call = self.connections.checkout(admin)
                try:
                    results = send(call, self._statements, batch, first=True)
                    return [rows_of(call, result) for result in results[1:]]
                except psycopg.OperationalError as exc:
                    if self.connections.retry(call, attempt) and not isinstance(exc, BUSY):
                        continue  # a connection that died while idle: reads are safe to run again
                    raise
                finally:
                    self.connections.checkin(call)
            raise AssertionError("unreachable: the last attempt returns or raises")
        except (psycopg.OperationalError, pg_errors.InsufficientPrivilege) as exc:
            raise _failure(exc, call) from None

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """``Backend.snapshot``, as housekeeping (the admin role sees every
        owner's rows); each statement gets the call's deadline anew. Nested, it
        is the outer one.

        Raises:
            StoreBusyError: the pool had no free connection.
            StoreUnavailableError: the server cannot be reached, or the
                snapshot's connection was lost.
        """
        if getattr(self._pinned, "call", None) is not None:
            yield
            return
        call = self.connections.checkout(True)
        try:
            try:
                self._begin_snapshot(call)
            except psycopg.OperationalError as exc:
                raise unavailable(exc, call) from None
            self._pinned.call = call
            try:
                yield
            finally:
                self._pinned.call = None
        finally:
            try:
                end(call.conn)  # read only: nothing to commit
            finally:
                self.connections.checkin(call)

    def _begin_snapshot(self, call: Watch) -> None:
        """BEGIN alone (the isolation level comes before any statement, the
        prepared statements' anchor included), then the settings as the call's
        first message; behind a transaction pooler ``send`` rolls back and
        sends them unprepared, and the snapshot begins again.

        Raises:
            psycopg.OperationalError: the connection failed.
        """
        for _ in range(2):
            send(call, self._statements, [(_BEGIN_SNAPSHOT, ())], first=False)
            send(call, self._statements, [self.session.settings(None, True)], first=True)
            if call.pgconn.transaction_status == TransactionStatus.INTRANS:
                return
        raise StoreUnavailableError("PostgreSQL did not keep the read snapshot's transaction open; try again")

    def read_scope(self) -> object:
        """None: a cached read's token (``tables.heads.reading``) is the server's snapshot and digest,
        on any connection."""
        return None

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Nothing to do: the server manages its own files (when VACUUM reclaims dead rows:
        docs/how-to/postgresql.md, "Deletion, distribution and what is not tested")."""
        return True

    def scrub(self) -> bool:
        """Nothing to do here: dead rows go with the server's VACUUM (see SECURITY.md)."""
        return True

    def scrub_after_deletes(self) -> bool:
        """Nothing to do here, as for ``scrub``."""
        return False

    def _app_version(self) -> int | None:
        """The schema version as the application role sees it; None when it cannot tell."""
        try:
            rows = self.query("SELECT MAX(version) AS v FROM schema_version")
        except (psycopg.Error, SecurepadError):
            return None
        return None if rows[0]["v"] is None else int(rows[0]["v"])

    def close(self) -> None:
        """Close the pools this object made (never one that was passed in)."""
        self.connections.close()


def _fit(given: Limit | None, default: Limit, cap: Limit) -> Limit:
    """A time limit: the one ``given``, else the default cut to ``cap`` (its share of the call's deadline)."""
    return min(default, cap) if given is None else given


def _failure(exc: psycopg.Error, call: Watch | None) -> SecurepadError:
    """What a failed call tells its caller: busy (a lock or serialization
    conflict), the store's role refused, or the server unavailable."""
    if isinstance(exc, BUSY):
        return StoreBusyError("the store is busy; try again")
    if isinstance(exc, psycopg.OperationalError):
        return unavailable(exc, call)
    return SecurepadError(f"PostgreSQL refused the store's role: {reason(exc)}")
