"""The connections of a PostgreSQL store: the one kept between calls, the
first one reused by the pool, and what a DSN names."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar, Self, cast

import psycopg
from psycopg.abc import Transformer as Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ...errors import SecurepadError, StoreUnavailableError
from .migrate import reason

__all__ = [
    "CONNECT_TIMEOUT_S",
    "KEEP_S",
    "HandOver",
    "Lender",
    "bad_dsn",
    "describe",
    "describe_source",
    "handing_over",
    "store_present",
]

CONNECT_TIMEOUT_S = 5
# How long a connection may stay out of its pool between calls (``Lender``):
# the pool applies its lifetime and idle rules when it comes back.
KEEP_S = 60.0


class Lender:
    """Lends a pool's connections to calls, one call at a time each.

    From a pool the store made (``keep``: nothing else takes connections from
    it), the connection a call gives back healthy and idle is kept for the next
    call instead of going back to the pool: psycopg_pool's ``getconn`` and
    ``putconn`` (its lock, deque, statistics, log calls and return checks) cost
    the client more CPU per call than a put's or a read's messages take to
    build. What the pool decides still holds:

    * its size: a kept connection is one the pool lent and counts as in use;
    * one kept at most, and never while a call of this store waits for the
      pool (``_waiting``: such a call looks at the kept one again after saying
      it waits, and a call giving one back looks for waiting calls after
      keeping it, so one of them always sees the other);
    * dead and broken connections: one that is not idle (failed, closed, cut
      by the watchdog, in a transaction) goes back to the pool, which drops or
      resets it; one that died while kept fails at its next call's first
      message, which runs again on another connection, as one that died in
      the pool does (``Connections.retry``);
    * its lifetime and idle rules: a connection goes back to the pool once
      ``KEEP_S`` after it left it, and at ``drain`` (closing the store,
      migrations that take connections from the pool directly).

    The kept connection's rows' loader (``Watch.loader``) is kept with it: its
    loaders per column type are made once, not at each call's first rows.

    A pool passed in (``keep`` False) may be shared with other code: every
    connection goes back to it at once.
    """

    __slots__ = ("_kept", "_lock", "_waiting", "keep", "pool")

    def __init__(self, pool: ConnectionPool[Any], *, keep: bool) -> None:
        self.pool = pool
        self.keep = keep
        self._kept: list[tuple[psycopg.Connection[Any], float, Loader | None]] = []
        self._waiting = 0
        self._lock = threading.Lock()

    def lend(self, timeout: float) -> tuple[psycopg.Connection[Any], float, Loader | None]:
        """A connection, when it left the pool, and its rows' loader if it has one yet.

        Raises:
            PoolTimeout: the pool had none within ``timeout`` seconds.
        """
        if not self.keep:
            return self.pool.getconn(timeout=timeout), 0.0, None
        try:
            return self._kept.pop()  # list.pop is atomic: one call gets it
        except IndexError:
            pass
        with self._lock:
            self._waiting += 1
        try:
            try:
                return self._kept.pop()  # given back meanwhile, before it saw this call waiting
            except IndexError:
                return self.pool.getconn(timeout=timeout), time.monotonic(), None
        finally:
            with self._lock:
                self._waiting -= 1

    def take_back(self, conn: psycopg.Connection[Any], since: float, loader: Loader | None) -> None:
        """A call is over with ``conn`` (lent at ``since``; its rows' ``loader``)."""
        if (
            self.keep
            and not self._kept
            and conn.pgconn.transaction_status == TransactionStatus.IDLE
            and time.monotonic() - since < KEEP_S
        ):
            self._kept.append((conn, since, loader))
            if not self._waiting:
                return
            try:  # a call waits for the pool: it gets a connection from there
                conn, since, loader = self._kept.pop()
            except IndexError:
                return  # the waiting call took it
        self.pool.putconn(conn)

    def drain(self, *, closing: bool = False) -> ConnectionPool[Any]:
        """Give the kept connection back to the pool (``closing``: and keep
        none from now on); the pool."""
        if closing:
            self.keep = False
        while True:
            try:
                conn, _, _ = self._kept.pop()
            except IndexError:
                return self.pool
            self.pool.putconn(conn)


class HandOver(psycopg.Connection[Any]):
    """The connection class of a pool made from a DSN: its first ``connect``
    returns the connection the store opened to check the server (``spare``)
    instead of opening another, so a fresh process connects once to open a
    store, not twice (a connection is a TCP and authentication exchange and a
    server process forked for it)."""

    spare: ClassVar[list[HandOver]]

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        try:
            return cast(Self, cls.spare.pop())
        except IndexError:
            return super().connect(conninfo, **kwargs)

    @classmethod
    def close_spare(cls) -> None:
        """Close a connection the pool did not take (its opening failed)."""
        while cls.spare:
            cls.spare.pop().close()


def handing_over() -> type[HandOver]:
    """A connection class of its own for one pool (its own ``spare``)."""
    return type("HandOver", (HandOver,), {"spare": []})


def describe_source(source: str | ConnectionPool[Any], schema: str) -> str:
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


def bad_dsn(dsn: str, exc: psycopg.ProgrammingError) -> SecurepadError:
    """A connection string libpq cannot parse; its message may quote the whole
    string, password included: the string is left out."""
    return SecurepadError(f"not a PostgreSQL connection string: {reason(exc).replace(dsn, '(the DSN)')}")


def store_present(dsn: str, schema: str = "securepad") -> bool:
    """Whether a store (its schema_version table) exists at ``dsn``, before opening it.

    Raises:
        SecurepadError: ``dsn`` is not a connection string.
        StoreUnavailableError: the server cannot be reached.
    """
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise bad_dsn(dsn, exc) from None
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_version",)).fetchone()
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(
            f"cannot connect to PostgreSQL at {describe_source(dsn, schema)}: {reason(exc)}"
        ) from None
    return bool(row and row[0])


def describe(dsn: str, schema: str = "securepad") -> str:
    """Where a store is, without a password (for messages)."""
    return describe_source(dsn, schema)
