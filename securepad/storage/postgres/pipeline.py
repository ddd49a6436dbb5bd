"""PostgreSQL connections in use: one transaction's statements in few round
trips, and the watchdog that cuts a call past its deadline.

A transaction sends nothing until it must: BEGIN, its settings and locks, and
the writes whose row count nobody reads (``defer``) go with the next query, or
with COMMIT, as one message: one libpq pipeline of the extended protocol ended
by one Sync (``send``), ``bytea`` parameters and all rows in binary. A put
costs two round trips; a transaction that only writes, one. The pipeline is
driven at libpq's level (``psycopg.pq``), cheaper for client and server than
psycopg's cursors (docs/decisions/0006-libpq-pipeline.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.abc import PQGen
from psycopg.abc import Transformer as Loader
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ConnStatus, ExecStatus, Format, PipelineStatus
from psycopg.pq.abc import PGconn, PGresult
from psycopg.waiting import Ready, Wait

from ...errors import StoreBusyError, StoreUnavailableError
from ..base import DuplicateKeyError, Params, Rows
from .prepared import EXECUTE, PREPARE, Command, Statements

__all__ = ["BUSY", "Transaction", "Watch", "Watchdog", "cut", "end", "rowcount", "rows_of", "send", "translate"]

# A prefetched read: its SQL (as the store wrote it) and parameters.
_Key = tuple[str, tuple[Any, ...]]
_TEXT, _BINARY = Format.TEXT, Format.BINARY
# Every statement's rows come in binary: no hex text of a ``bytea`` to write and parse.
_RESULTS = _BINARY
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


def rows_of(call: Watch, result: PGresult) -> Rows:
    """A statement's rows as dicts (none for a statement that returns no rows),
    loaded as psycopg's binary cursors load them, by the call's one
    ``Transformer`` (each column type's loader looked up once per call). A type
    psycopg has no binary loader for (``void``, ``regclass``) loads as ``bytes``."""
    if result.status != ExecStatus.TUPLES_OK:
        return []
    loader = call.loader
    if loader is None:
        loader = call.loader = Transformer(call.conn)
    loader.set_pgresult(result)
    names = _names(tuple([result.fname(i) for i in range(result.nfields)]), call.encoding)
    return [dict(zip(names, row, strict=True)) for row in loader.load_rows(0, result.ntuples, tuple)]


@functools.lru_cache(maxsize=256)
def _names(raw: tuple[bytes | None, ...], encoding: str) -> tuple[str, ...]:
    """A result's column names as ``str`` (the same few shapes, every call)."""
    return tuple((name or b"").decode(encoding) for name in raw)


def rowcount(result: PGresult) -> int:
    """The rows a statement changed (-1 when the server does not say)."""
    count = result.command_tuples
    return -1 if count is None else count


def send(call: Watch, statements: Statements, batch: Sequence[tuple[str, Params]], *, first: bool) -> list[PGresult]:
    """Send ``batch`` as one message, its statements prepared where
    ``statements`` allows: each statement's result.

    ``first``: the first message of a call. If the server session lacks the
    connection's statements (a transaction pooler), the store prepares no more
    and sends a first message again, unprepared; a later one fails.

    Raises:
        psycopg.Error: the first statement that failed (the later ones did not run).
    """
    conn = call.conn
    message = statements.message(conn, batch, first=first)
    try:
        results = _exchange(call, message.commands)
    except pg_errors.InvalidSqlStatementName:
        statements.missing()
        if not first:
            raise StoreUnavailableError(
                "PostgreSQL lost the connection's prepared statements (a transaction pooler?); try again"
            ) from None
        end(conn)
        message = statements.message(conn, batch, first=first)
        results = _exchange(call, message.commands)
    statements.sent(message)
    return [results[index] for index in message.results]


def _exchange(call: Watch, commands: list[Command]) -> list[PGresult]:
    """Run ``commands`` as one pipeline ended by one Sync (one round trip:
    one ``Connection.wait``); each command's result, in order.

    Raises:
        psycopg.Error: the first command that failed (the server skipped the
            rest up to the Sync; an explicit transaction is left failed).
    """
    conn = call.conn
    pgconn = call.pgconn
    encoding = call.encoding
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            for kind, what, values in commands:
                if kind == PREPARE:
                    pgconn.send_prepare(_encoded(what, encoding), _encoded(values[0], encoding))
                    continue
                params, formats = _bind(conn, values, encoding) if values else _NO_PARAMS
                run = pgconn.send_query_prepared if kind == EXECUTE else pgconn.send_query_params
                run(_encoded(what, encoding), params, param_formats=formats, result_format=_RESULTS)
            pgconn.pipeline_sync()
            results = conn.wait(_round_trip(pgconn))
        finally:
            _leave_pipeline(conn)
    for result in results:
        if result.status == _FATAL:
            raise pg_errors.error_from_result(result, encoding=encoding)
    return results


@functools.lru_cache(maxsize=1024)
def _encoded(text: str, encoding: str) -> bytes:
    """A statement's text or name as the server reads it (the same few, every call)."""
    return text.encode(encoding)


_NO_PARAMS: tuple[None, None] = (None, None)
_FATAL = ExecStatus.FATAL_ERROR
# The Python types bound in binary (``_bind``).
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _bind(
    conn: psycopg.Connection[Any], values: Params, encoding: str
) -> tuple[list[bytes | None], list[Format] | None]:
    """A statement's parameters: ``bytes`` in binary, the rest as text, typed
    by the server; the formats None (all text) unless a value is binary."""
    params: list[bytes | None] = []
    binary = False
    for value in values:
        kind = type(value)
        if kind is str:
            params.append(value.encode(encoding))
        elif kind is bytes:
            params.append(value)
            binary = True
        elif kind is int or kind is float:
            params.append(repr(value).encode())
        elif value is None:
            params.append(None)
        elif kind is bool:
            params.append(b"t" if value else b"f")
        elif isinstance(value, _BYTES_LIKE):
            params.append(bytes(value))
            binary = True
        else:
            dumped = Transformer(conn).get_dumper(value, PyFormat.TEXT).dump(value)
            params.append(None if dumped is None else bytes(dumped))
    if not binary:
        return params, None
    return params, [_BINARY if isinstance(value, _BYTES_LIKE) else _TEXT for value in values]


def _round_trip(pgconn: PGconn) -> PQGen[list[PGresult]]:
    """Flush the pipeline, then read every command's result up to the Sync's."""
    while pgconn.flush() != 0:
        while not (ready := (yield Wait.RW)):
            continue
        if ready & Ready.R:
            pgconn.consume_input()
    results: list[PGresult] = []
    while True:
        while pgconn.is_busy():
            while not (yield Wait.R):
                continue
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            continue  # the end of one command's results
        if result.status == ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)


def _leave_pipeline(conn: psycopg.Connection[Any]) -> None:
    """Back to libpq's normal mode. A dead connection is left broken; one that
    cannot leave (its results were not all read) is closed: the pool drops either."""
    pgconn = conn.pgconn
    if pgconn.pipeline_status == PipelineStatus.OFF or pgconn.status == ConnStatus.BAD:
        return
    try:
        pgconn.exit_pipeline_mode()
    except psycopg.Error:
        conn.close()


def end(conn: psycopg.Connection[Any]) -> None:
    """Roll back whatever the connection has open (a failed or abandoned transaction)."""
    if not conn.broken:
        with contextlib.suppress(psycopg.Error):
            # Never prepared (psycopg prepares a statement's 6th run): behind a transaction
            # pooler the name would reach another server session, and the rollback fail.
            conn.execute("ROLLBACK", prepare=False)


_COMMIT: tuple[str, Params] = ("COMMIT", ())


def _check_alive(conn: psycopg.Connection[Any]) -> None:
    """Read what the server sent while the connection was idle: a session the
    server ended fails here, before a message with COMMIT goes out on it.

    Raises:
        psycopg.OperationalError: the connection is closed.
    """
    with conn.lock:
        conn.pgconn.consume_input()


class Transaction:
    """One write transaction as the store's ``Conn`` protocol, in as few round
    trips as the caller's reads allow.

    ``opening`` (the settings and locks) follows BEGIN; with ``try_lock`` its
    column ``locked`` False is StoreBusyError. The connection is taken at the
    first message (``connect``), and one found dead there is replaced while
    ``retry(call, attempt)`` allows.
    """

    def __init__(
        self,
        connect: Callable[[], Watch],
        release: Callable[[Watch], None],
        retry: Callable[[Watch, int], bool],
        opening: tuple[str, Params],
        statements: Statements,
        *,
        try_lock: bool,
    ) -> None:
        self._connect = connect
        self._release = release
        self._statements = statements
        self._retry = retry
        # Statements not sent yet, each with the key of a prefetched read (or None).
        self._pending: list[tuple[str, Params, _Key | None]] = [("BEGIN", (), None), (*opening, None)]
        self._fetched: dict[_Key, Rows] = {}
        self._try_lock = try_lock
        self.call: Watch | None = None
        self.commit_unknown = False  # ``Conn.commit_unknown``
        self._commit_sent = False  # the COMMIT's message went out (``commit_unknown`` needs it)

    def query(self, sql: str, params: Params = ()) -> Rows:
        key = (sql, tuple(params))
        if key not in self._fetched and any(pending == key for _, _, pending in self._pending):
            self._send(None)  # the read was prefetched: it goes now, with what else waits
        fetched = self._fetched.pop(key, None)
        if fetched is not None:
            return fetched
        result = self._send((translate(sql), params))
        return rows_of(self._call(), result)

    def prefetch(self, sql: str, params: Params = ()) -> None:
        """Run the read ``sql`` with the next message and keep its rows: the
        same ``query`` later in the transaction gets them without a round trip."""
        self._pending.append((translate(sql), tuple(params), (sql, tuple(params))))

    def execute(self, sql: str, params: Params = ()) -> int:
        return rowcount(self._send((translate(sql), params)))

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
        try:
            self._send(_COMMIT)
        except psycopg.OperationalError:
            call = self.call
            # A server's error on a live connection (a cancelled statement) rolled it back.
            self.commit_unknown = self._commit_sent and call is not None and (call.cut or call.conn.broken)
            raise

    def close(self, committed: bool) -> None:
        """Give the connection back, rolled back first unless ``committed``."""
        call = self.call
        if call is None:
            return
        self.call = None
        try:
            if not committed:
                end(call.conn)
        finally:
            self._release(call)

    def _call(self) -> Watch:
        assert self.call is not None, "a message was sent"
        return self.call

    def _send(self, last: tuple[str, Params] | None) -> PGresult:
        """Send what is pending, and ``last``, as one message: the last statement's result."""
        batch, self._pending = [*self._pending, *([(*last, None)] if last is not None else [])], []
        committing = last is _COMMIT
        if self.call is not None:
            self._commit_sent = committing
            return self._run(self.call, batch, first=False)
        for attempt in itertools.count():
            self.call = call = self._connect()
            sent = False
            try:
                if committing:
                    _check_alive(call.conn)
                sent = self._commit_sent = committing
                return self._run(call, batch, first=True)
            except psycopg.OperationalError as exc:
                # A message with COMMIT that was sent is never sent again: it may have been applied.
                if self._retry(call, attempt) and not isinstance(exc, BUSY) and not sent:
                    self.call = None
                    self._release(call)
                    continue  # a connection that died while idle: nothing was done on it
                raise
        raise AssertionError("unreachable: itertools.count never ends")

    def _run(self, call: Watch, batch: list[tuple[str, Params, _Key | None]], *, first: bool) -> PGresult:
        """Send ``batch`` as one message on the call's connection; its last statement's result."""
        try:
            results = send(call, self._statements, [(text, params) for text, params, _ in batch], first=first)
        except pg_errors.UniqueViolation:
            raise DuplicateKeyError from None
        if first and self._try_lock:  # the settings and the lock's answer
            answer = rows_of(call, results[1])
            if answer and answer[0].get("locked") is False:
                raise StoreBusyError("the store is busy; try again")
        for (_, _, key), result in zip(batch, results, strict=True):
            if key is not None:
                self._fetched[key] = rows_of(call, result)
        return results[-1]


class Watch:
    """One call in flight: its connection, its lender, its deadline, and whether the watchdog cut it."""

    __slots__ = ("conn", "cut", "deadline", "encoding", "loader", "pgconn", "pool", "since")

    def __init__(self, conn: psycopg.Connection[Any], deadline: float, pool: Any = None) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        # Read once per call: ``conn.info.encoding`` asks libpq at every use.
        self.encoding = conn.info.encoding
        self.deadline = deadline
        self.pool = pool
        self.since = 0.0
        self.cut = False
        # The call's rows' loader (``rows_of``), made at the first rows.
        self.loader: Loader | None = None


class Watchdog:
    """Cuts the connection of a call that runs past its deadline.

    The statement timeout cannot help when the server does not answer at all,
    nor keepalives while something on the path still acknowledges packets:
    shutting the socket down makes the blocked call fail at once. One thread
    per store, running only while calls are in flight.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, Watch] = {}
        self._running = False
        self._pid = os.getpid()

    def start(self, conn: psycopg.Connection[Any], deadline: float, pool: Any = None) -> Watch:
        """Watch a call on ``conn`` until ``stop``: cut it at ``deadline``."""
        call = Watch(conn, deadline, pool)
        pid = os.getpid()
        with self._lock:
            self._calls[id(call)] = call
            if not self._running or self._pid != pid:
                self._running, self._pid = True, pid
                threading.Thread(target=self._run, name="securepad-pg-watchdog", daemon=True).start()
        return call

    def stop(self, call: Watch) -> None:
        """The call is over: no longer watched."""
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
