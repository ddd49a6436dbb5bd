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
    "describe_source",
    "handing_over",
    "parse_dsn",
    "store_present",
]

CONNECT_TIMEOUT_S = 5
# How long a connection may stay out of its pool between calls (``Lender``):
# the pool applies its lifetime and idle rules when it comes back.
KEEP_S = 60.0


class Lender:
    """Lends a pool's connections to calls, one call at a time each.

    From a pool the store made (``keep``), the connection a call gives back
    healthy and idle is kept for the next call, with its rows' loader:
    psycopg_pool's ``getconn`` and ``putconn`` cost more client CPU than a
    call's messages. What the pool decides still holds:

    * its size: a kept connection counts as in use;
    * one kept at most, and never while a call waits for the pool
      (``_waiting``: the waiter looks at the kept one again after saying it
      waits, the giver looks for waiters after keeping it);
    * a connection that is not idle goes back to the pool, which drops or
      resets it; one that died while kept fails at its next call's first
      message, which runs again on another (``Connections.retry``);
    * its lifetime rules: a connection goes back ``KEEP_S`` after it left,
      and at ``drain``.

    A pool passed in (``keep`` False) may be shared: every connection goes back at once.
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
    returns the connection the store opened to check the server (``spare``),
    so opening a store connects once, not twice."""

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


def describe_source(source: str | ConnectionPool[Any], schema: str = "securepad") -> str:
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


def parse_dsn(dsn: str) -> dict[str, Any]:
    """The settings a connection string names.

    Raises:
        SecurepadError: libpq cannot parse it (the message leaves the string
            out: it may hold a password).
    """
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise SecurepadError(f"not a PostgreSQL connection string: {reason(exc).replace(dsn, '(the DSN)')}") from None


def store_present(dsn: str, schema: str = "securepad") -> bool:
    """Whether a store (its schema_version table) exists at ``dsn``, before opening it.

    Raises:
        SecurepadError: ``dsn`` is not a connection string.
        StoreUnavailableError: the server cannot be reached.
    """
    parse_dsn(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_version",)).fetchone()
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(
            f"cannot connect to PostgreSQL at {describe_source(dsn, schema)}: {reason(exc)}"
        ) from None
    return bool(row and row[0])
