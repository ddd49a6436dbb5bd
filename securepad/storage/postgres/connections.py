"""The connections of a PostgreSQL store: its pools, a connection per call, and the call's deadline.

* a pool made here from a DSN connects with ``connect_timeout``, TCP
  keepalives and ``tcp_user_timeout`` (unless the DSN sets them), makes its
  first connection at once (a refusal is reported with the server's reason)
  and retries a lost one about every second; a pool passed in keeps its own
  settings and is never closed here;
* every call waits at most ``pool_timeout_s`` for a connection and is cut at
  its deadline (``call_timeout_s``, housekeeping ten times as long);
* a forked child opens pools of its own and leaves its parent's sockets alone;
* a call whose connection died idle in the pool may run again on another,
  never past its deadline.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import SecurepadError, StoreBusyError, StoreUnavailableError
from .migrate import reason
from .pipeline import Watch, Watchdog
from .pool import CONNECT_TIMEOUT_S, Lender, describe_source, handing_over, parse_dsn

__all__ = ["HOUSEKEEPING_FACTOR", "Connections", "unavailable"]

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
# How long a pool retries a lost connection before it gives the slot up (a
# caller that then needs one makes it try at once): psycopg_pool's default
# notices a server's return late.
RECONNECT_TIMEOUT_S = 2.0
# Housekeeping (the admin role) works store-wide and may run long: its
# statement and call limits are this many times a principal's.
HOUSEKEEPING_FACTOR = 10


class Connections:
    """The application's and the admin's pools of one store (one pool when
    they are the same source), and the connection of each call."""

    def __init__(
        self,
        app: str | ConnectionPool[Any],
        admin: str | ConnectionPool[Any],
        *,
        schema: str,
        pool_size: int,
        connect_timeout_s: float,
        pool_timeout_s: float,
        call_timeout_s: float,
    ) -> None:
        self._sources = (app, admin)
        self._schema = schema
        self.pool_size = pool_size
        self._network = {**_NETWORK_LIMITS, "connect_timeout": max(1, round(connect_timeout_s))}
        self._pool_timeout_s = pool_timeout_s
        self._call_timeout_s = call_timeout_s
        self._watchdog = Watchdog()
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._owned: list[ConnectionPool[Any]] = []
        self._inherited: list[object] = []
        self._open_pools()

    def _open_pools(self) -> None:
        """The application's and the admin's pools (one per DSN, made here; a
        pool passed in as it is) and their lenders (one when they share a pool)."""
        made: dict[str, ConnectionPool[Any]] = {}
        for source in self._sources:
            if isinstance(source, str) and source not in made:
                self._owned.append(self._open_pool(source, made))
        self.app, self.admin = (made[source] if isinstance(source, str) else source for source in self._sources)
        lent = Lender(self.app, keep=self.app in self._owned)
        self.lenders = lent, lent if self.admin is self.app else Lender(self.admin, keep=self.admin in self._owned)

    def _open_pool(self, source: str, made: dict[str, ConnectionPool[Any]]) -> ConnectionPool[Any]:
        """A pool for the DSN ``source``; on failure, the pools in ``made`` are closed too.

        Raises:
            StoreUnavailableError: the server refused or could not be reached.
        """
        given = parse_dsn(source)  # the network limits the DSN does not set itself
        kwargs = {"autocommit": True, **{key: value for key, value in self._network.items() if key not in given}}
        connection_class = handing_over()
        try:
            # A refusal is reported at once with the server's reason (a pool
            # would retry); the connection is then the pool's first.
            connection_class.spare.append(connection_class.connect(source, **kwargs))
            opened = ConnectionPool(
                source,
                min_size=1,
                max_size=self.pool_size,
                kwargs=kwargs,
                connection_class=connection_class,
                name=f"securepad-{self._schema}",
                timeout=self._pool_timeout_s,
                reconnect_timeout=RECONNECT_TIMEOUT_S,
                open=True,
            )
            made[source] = opened
            opened.wait(timeout=self._pool_timeout_s)
        except (psycopg.Error, PoolTimeout) as exc:
            for each in made.values():
                each.close()
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {describe_source(source, self._schema)}: {reason(exc)}"
            ) from None
        finally:
            connection_class.close_spare()
        return opened

    def lender(self, admin: bool) -> Lender:
        """The lender of the admin's or the application's pool, in this process.

        Raises:
            SecurepadError: the store is closed, or was opened on a pool passed
                in and is used after a fork.
        """
        if self._closed:
            raise SecurepadError("the store is closed")
        if os.getpid() != self._pid:
            # A forked child must not share its parent's sockets: open its own pools.
            if any(not isinstance(source, str) for source in self._sources):
                raise SecurepadError("a store opened on a connection pool cannot be used after fork; open it again")
            with self._lock:
                if os.getpid() != self._pid:
                    # Never closed nor collected: that would end the parent's sessions.
                    self._inherited.extend([*self._owned, *self.lenders])
                    self._owned = []
                    self._open_pools()
                    self._pid = os.getpid()
        return self.lenders[admin]

    def call_timeout(self, admin: bool) -> float:
        """How long one call may run (housekeeping's is longer)."""
        return self._call_timeout_s * (HOUSEKEEPING_FACTOR if admin else 1)

    def checkout(self, admin: bool) -> Watch:
        """A pooled connection for one call, watched until its deadline; ``checkin`` gives it back.

        Raises:
            StoreUnavailableError: no connection within the pool timeout, and
                the server cannot be reached.
            StoreBusyError: no connection within the pool timeout, all in use.
        """
        lender = self.lender(admin)
        deadline = time.monotonic() + self.call_timeout(admin)
        try:
            conn, since, loader = lender.lend(self._pool_timeout_s)
        except PoolTimeout:
            raise self._no_connection(lender.pool) from None
        try:
            call = self._watchdog.start(conn, deadline, lender)
        except BaseException:
            lender.take_back(conn, since, loader)
            raise
        call.since, call.loader = since, loader
        return call

    def checkin(self, call: Watch) -> None:
        """The call is over: its connection goes back to its lender."""
        try:
            self._watchdog.stop(call)
        finally:
            call.pool.take_back(call.conn, call.since, call.loader)

    def _no_connection(self, pool: ConnectionPool[Any]) -> SecurepadError:
        """Why the pool had no connection: the server is unreachable, or every
        connection is in use (asked directly, once, within the connect timeout)."""
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        kwargs = (pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {}
        limit = {"connect_timeout": self._network["connect_timeout"], **kwargs, "autocommit": True}
        try:
            psycopg.connect(conninfo, **limit).close()
        except psycopg.Error as exc:
            return StoreUnavailableError(f"PostgreSQL is unavailable ({reason(exc)}); try again")
        return StoreBusyError("the store is busy (no free connection in the pool); try again")

    def retry(self, call: Watch, attempt: int) -> bool:
        """Whether a call whose first statement failed may run again on another
        connection: its connection had died idle (a server restart), not at the deadline."""
        return call.conn.broken and not call.cut and attempt < self.pool_size and time.monotonic() < call.deadline

    def close(self) -> None:
        """Close the pools this object made (never one that was passed in)."""
        with self._lock:
            self._closed = True
            pools, self._owned = self._owned, []
        if os.getpid() != self._pid:
            return  # the parent's pools: their sockets are not ours to close
        for lender in self.lenders:
            lender.drain(closing=True)
        for pool in pools:
            pool.close()


def unavailable(exc: psycopg.OperationalError, call: Watch | None) -> SecurepadError:
    """What a failed call tells its caller: cut at its deadline, cancelled by
    the server, or a lost connection; each retryable."""
    if call is not None and call.cut:
        return StoreUnavailableError(
            "PostgreSQL did not answer before the call's deadline; the call was cut; try again"
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return StoreUnavailableError(f"PostgreSQL cancelled the statement: {reason(exc)}; try again")
    return StoreUnavailableError(f"PostgreSQL connection failed ({reason(exc)}); try again")
