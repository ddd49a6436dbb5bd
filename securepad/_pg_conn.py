"""PostgreSQL connections in use: one transaction's statements in few round
trips, and the watchdog that cuts a call past its deadline (see ``_pg``).

A transaction (``Transaction``) sends nothing until it must: BEGIN, the
transaction's settings and locks, and the writes whose row count nobody reads
(``defer``) wait for the next query, or for COMMIT, and go with it as one
simple-protocol message (psycopg binds the parameters on the client). A put
(owner-key check, quota, INSERTs, COMMIT) costs three round trips instead of
thirteen; a transaction that only writes costs one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus
from psycopg.rows import DictRow, dict_row

from ._backend import DuplicateKeyError, Params, Rows
from ._pg_prepare import Statements
from .errors import StoreBusyError, StoreUnavailableError

__all__ = ["BUSY", "Transaction", "Watch", "Watchdog", "cursor", "cut", "end", "rows_of", "seek", "send", "translate"]

# A prefetched read: its SQL (as the store wrote it) and parameters.
_Key = tuple[str, tuple[Any, ...]]
# How often the watchdog looks at the calls in flight.
_WATCH_TICK_S = 0.1

BUSY = (
    pg_errors.LockNotAvailable,
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
)


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """The store's portable SQL in psycopg's dialect: ``%s`` placeholders, BYTEA casts."""
    return sql.replace("%", "%%").replace("?", "%s").replace(" AS BLOB)", " AS BYTEA)")


def cursor(conn: psycopg.Connection[Any]) -> psycopg.ClientCursor[DictRow]:
    """A cursor that binds parameters on the client (one simple-protocol
    message may carry several statements) and makes each row a dict, its
    names read from the result itself: ``cursor.description`` would build a
    ``Column`` object per column of every result set, a fifth of the
    client's CPU per call (cProfile of ``securepad.bench.pg_costs``)."""
    return psycopg.ClientCursor(conn, row_factory=dict_row)


def rows_of(cursor: psycopg.ClientCursor[DictRow]) -> Rows:
    """The current result set's rows (none for a statement that returns no rows)."""
    result = cursor.pgresult
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return []
    return cursor.fetchall()


def send(
    conn: psycopg.Connection[Any], statements: Statements, batch: Sequence[tuple[str, Params]], *, first: bool
) -> tuple[psycopg.ClientCursor[DictRow], list[int]]:
    """Send ``batch`` as one message, its statements prepared where
    ``statements`` allows (see ``_pg_prepare``): the cursor on the message's
    first result, and the index of each statement's result among them.

    ``first``: the first message of a call. If the server session does not
    have the connection's statements (a transaction pooler), the store
    prepares no more and sends a first message again, unprepared; a later one
    (its transaction's earlier messages ran) is ``StoreUnavailableError``.
    """
    message = statements.message(conn, batch, first=first)
    sent = cursor(conn)
    try:
        sent.execute(message.text, message.params)
    except pg_errors.InvalidSqlStatementName:
        statements.missing()
        if not first:
            raise StoreUnavailableError(
                "PostgreSQL lost the connection's prepared statements (a transaction pooler?); try again"
            ) from None
        end(conn)
        message = statements.message(conn, batch, first=first)
        sent = cursor(conn)
        sent.execute(message.text, message.params)
    statements.sent(message)
    return sent, message.results


def seek(sent: psycopg.ClientCursor[DictRow], position: int, target: int) -> int:
    """Move the cursor from result ``position`` on to result ``target``."""
    while position < target:
        sent.nextset()
        position += 1
    return position


def end(conn: psycopg.Connection[Any]) -> None:
    """Roll back whatever the connection has open (a failed or abandoned transaction)."""
    if not conn.broken:
        with contextlib.suppress(psycopg.Error):
            # Never prepared (psycopg prepares a statement's 6th run): behind a transaction
            # pooler the name would reach another server session, and the rollback fail.
            conn.execute("ROLLBACK", prepare=False)


class Transaction:
    """One write transaction as the store's ``Conn`` protocol, its statements
    sent in as few round trips as the caller's reads allow.

    ``opening`` (the settings and locks statement, already in psycopg's
    dialect) follows BEGIN; with ``try_lock`` its column ``locked`` is
    ``pg_try_advisory_xact_lock``'s answer (False: StoreBusyError). The
    connection is taken at the first message: ``connect()`` gives a watched
    connection, and one found dead at that message (a server restart ends
    every pooled session) is replaced while ``retry(call, attempt)`` allows.
    """

    def __init__(
        self,
        connect: Callable[[], AbstractContextManager[Watch]],
        retry: Callable[[Watch, int], bool],
        opening: tuple[str, Params],
        statements: Statements,
        *,
        try_lock: bool,
    ) -> None:
        self._connect = connect
        self._statements = statements
        self._retry = retry
        # Statements not sent yet, each with the key of a prefetched read (or None).
        self._pending: list[tuple[str, Params, _Key | None]] = [("BEGIN", (), None), (*opening, None)]
        self._fetched: dict[_Key, Rows] = {}
        self._try_lock = try_lock
        self._stack: ExitStack | None = None
        self.call: Watch | None = None

    def query(self, sql: str, params: Params = ()) -> Rows:
        key = (sql, tuple(params))
        if key not in self._fetched and any(pending == key for _, _, pending in self._pending):
            self._send(None)  # the read was prefetched: it goes now, with what else waits
        fetched = self._fetched.pop(key, None)
        if fetched is not None:
            return fetched
        return rows_of(self._send((translate(sql), params)))

    def prefetch(self, sql: str, params: Params = ()) -> None:
        """Run the read ``sql`` with the next message and keep its rows: the
        same ``query`` later in the transaction gets them without a round trip."""
        self._pending.append((translate(sql), tuple(params), (sql, tuple(params))))

    def execute(self, sql: str, params: Params = ()) -> int:
        return self._send((translate(sql), params)).rowcount

    def defer(self, sql: str, params: Params = ()) -> None:
        """Run ``sql`` with the next message (its row count is not wanted)."""
        self._pending.append((translate(sql), tuple(params), None))

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        text = translate(sql)
        self._pending.extend((text, tuple(row), None) for row in rows)

    def commit(self) -> None:
        """COMMIT, with whatever is still pending; no round trip for an empty transaction."""
        if self.call is None and len(self._pending) == 2:
            return
        self._send(("COMMIT", ()))

    def close(self, committed: bool) -> None:
        """Give the connection back, rolled back first unless ``committed``."""
        if self._stack is None:
            return
        try:
            if not committed and self.call is not None:
                end(self.call.conn)
        finally:
            self._stack.close()
            self._stack = None

    def _send(self, last: tuple[str, Params] | None) -> psycopg.ClientCursor[DictRow]:
        """Send what is pending, and ``last``, as one message."""
        batch, self._pending = [*self._pending, *([(*last, None)] if last is not None else [])], []
        if self.call is not None:
            return self._run(self.call.conn, batch, first=False)
        for attempt in itertools.count():
            stack = ExitStack()
            self.call = call = stack.enter_context(self._connect())
            self._stack = stack
            try:
                return self._run(call.conn, batch, first=True)
            except psycopg.OperationalError as exc:
                if self._retry(call, attempt) and not isinstance(exc, BUSY):
                    self.call, self._stack = None, None
                    stack.close()
                    continue  # a connection that died while idle: nothing was done on it
                raise
        raise AssertionError("unreachable: itertools.count never ends")

    def _run(
        self, conn: psycopg.Connection[Any], batch: list[tuple[str, Params, _Key | None]], *, first: bool
    ) -> psycopg.ClientCursor[DictRow]:
        """Send ``batch`` as one message; the cursor on its last result."""
        try:
            sent, results = send(conn, self._statements, [(text, params) for text, params, _ in batch], first=first)
        except pg_errors.UniqueViolation:
            raise DuplicateKeyError from None
        position = 0
        for index, (_, _, key) in enumerate(batch):
            position = seek(sent, position, results[index])
            if first and index == 1 and self._try_lock:  # the settings and the lock's answer
                row = sent.fetchone()
                if row is not None and row.get("locked") is False:
                    raise StoreBusyError("the store is busy; try again")
            if key is not None:
                self._fetched[key] = rows_of(sent)
        return sent


class Watch:
    """One call in flight: its connection, its deadline, and whether the watchdog cut it."""

    __slots__ = ("conn", "cut", "deadline")

    def __init__(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline
        self.cut = False


class Watchdog:
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
        self._calls: dict[int, Watch] = {}
        self._running = False
        self._pid = os.getpid()

    @contextmanager
    def watch(self, conn: psycopg.Connection[Any], deadline: float) -> Iterator[Watch]:
        call = Watch(conn, deadline)
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
                        cut(call.conn)


def cut(conn: psycopg.Connection[Any]) -> None:
    """Shut a connection's socket down under libpq's feet: its blocked call fails now."""
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return  # already closed
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)
