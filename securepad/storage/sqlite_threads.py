"""The connections of one SQLite store, a connection per thread: each hangs off
a holder in its thread's ``threading.local`` and goes back to the store when the
thread ends, to wait for the next thread or be closed."""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

import apsw

from . import process

__all__ = ["IDLE_CONNECTIONS", "Connections", "Holder"]

# Connections of ended threads kept for the next threads (``Connections``).
IDLE_CONNECTIONS = 8


class Connections:
    """The open connections of one Database, given back as their threads end.

    Each thread's connection hangs off a holder in that thread's
    ``threading.local``; when the thread ends its locals go, and the holder's
    finalizer gives the connection back. A process with many short-lived
    threads therefore holds one connection (2 file descriptors, ~180 KB) per
    *live* thread, and at most ``IDLE_CONNECTIONS`` more, not one per thread
    that ever used the store.

    Up to ``IDLE_CONNECTIONS`` connections of ended threads, outside any
    transaction, wait for the next threads instead: a thread pool's workers
    come and go (LangGraph makes a pool per ``invoke``), and a connection
    opened again pays its set-up, its statements prepared again and its page
    cache read again.

    A connection inherited through fork is never closed by the child: that
    would disturb the parent's locks on the shared file. It is kept (not
    collected) and left alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, tuple[apsw.Connection, int]] = {}
        self._idle: list[tuple[apsw.Connection, int]] = []
        self._inherited: list[apsw.Connection] = []
        self.closed = False

    def take_idle(self) -> apsw.Connection | None:
        """A connection an ended thread of this process left, or None."""
        pid = os.getpid()
        with self._lock:
            while self._idle:
                conn, opened_in = self._idle.pop()
                if opened_in == pid:
                    return conn
                self._inherited.append(conn)  # the parent's, after fork: left alone
        return None

    def add(self, conn: apsw.Connection) -> None:
        with self._lock:
            self._open[id(conn)] = (conn, process.pid)

    def release(self, conn: apsw.Connection, pid: int, *, keep: bool = True) -> None:
        """Keep ``conn`` (opened in process ``pid``) for the next thread, or close it: its
        thread ended (``keep``), or it failed (not ``keep``)."""
        with self._lock:
            self._open.pop(id(conn), None)
            if pid != os.getpid():
                self._inherited.append(conn)
                return
            if keep and not self.closed and len(self._idle) < IDLE_CONNECTIONS and conn.getautocommit():
                self._idle.append((conn, pid))
                return
        conn.close()

    def close_all(self) -> None:
        """Close every connection this process opened (a forked child leaves its parent's alone)."""
        with self._lock:
            self.closed = True
            conns, self._open = [*self._open.values(), *self._idle], {}
            self._idle = []
            pid = os.getpid()
            self._inherited.extend(conn for conn, opened_in in conns if opened_in != pid)
        for conn, opened_in in conns:
            if opened_in == pid:
                conn.close()


class Holder:
    """One thread's connection and its cursor; its finalizer gives the connection back when
    the thread's locals go. The cursor runs the statements whose rows are taken at once (or
    that return none): a statement run on it needs no cursor of its own, made and freed."""

    def __init__(self, conn: apsw.Connection, connections: Connections) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.pid = process.pid
        self.finalizer = weakref.finalize(self, connections.release, conn, self.pid)

    def renew(self) -> None:
        """A new cursor, after a statement failed on this one: a statement stopped among
        its rows would keep its read snapshot open until the cursor's next statement."""
        with contextlib.suppress(apsw.Error):  # a closed connection: its next use says so
            self.cursor.close(True)
            self.cursor = self.conn.cursor()
