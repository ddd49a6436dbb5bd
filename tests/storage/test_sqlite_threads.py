"""A SQLite store's connections as threads come and go (``storage.sqlite_threads``): an
ended thread's connection waits for the next thread, at most ``IDLE_CONNECTIONS`` of them,
never one left inside a transaction or inherited through fork; closing the store closes them."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.storage.sqlite_threads import IDLE_CONNECTIONS, Connections
from securepad.store import sqlite_of

ALICE = Principal("alice", "agent", "web")


def _in_threads(count: int, work: Callable[[], Any]) -> list[Any]:
    """``work``'s results in ``count`` threads alive at once, after every thread ended."""
    results: list[Any] = [None] * count
    started = threading.Barrier(count)

    def run(i: int) -> None:
        results[i] = work()
        started.wait()  # every thread holds its connection at once

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()  # a thread's locals go as its state is torn down
    return results


def _connection(path: Path) -> apsw.Connection:
    return apsw.Connection(str(path))


def test_the_next_threads_use_the_connections_ended_threads_left(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry = pad.put(ALICE, "t", 1, "tool", "kept")["scratchpad_id"]
        db = sqlite_of(pad)

        def read() -> apsw.Connection:
            assert pad.get(ALICE, entry).observation == "kept"
            return db.conn

        first = _in_threads(4, read)  # held here: no id of theirs is given to another object
        second = _in_threads(4, read)
        assert {id(conn) for conn in second} == {id(conn) for conn in first}  # none opened again
        assert pad.get(ALICE, entry).observation == "kept"


def test_at_most_idle_connections_wait_and_the_rest_close(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        db = sqlite_of(pad)
        conns = _in_threads(IDLE_CONNECTIONS + 4, lambda: db.conn)
        closed = []
        for conn in conns:
            try:
                conn.execute("SELECT 1").fetchall()
            except apsw.ConnectionClosedError:
                closed.append(conn)
        assert len(closed) == 4
    for conn in conns:  # closing the store closes those that waited
        with pytest.raises(apsw.ConnectionClosedError):
            conn.execute("SELECT 1")


def test_a_connection_inside_a_transaction_or_failed_is_closed_not_kept(tmp_path: Path) -> None:
    connections = Connections()
    in_transaction, failed, clean = (_connection(tmp_path / "s.db") for _ in range(3))
    for conn in (in_transaction, failed, clean):
        connections.add(conn)
    in_transaction.execute("BEGIN")
    connections.release(in_transaction, os.getpid())
    connections.release(failed, os.getpid(), keep=False)
    connections.release(clean, os.getpid())
    for conn in (in_transaction, failed):
        with pytest.raises(apsw.ConnectionClosedError):
            conn.execute("SELECT 1")
    assert connections.take_idle() is clean
    assert connections.take_idle() is None
    connections.close_all()


def test_a_connection_of_another_process_is_never_taken_nor_closed(tmp_path: Path) -> None:
    connections = Connections()
    parents = _connection(tmp_path / "s.db")
    connections.add(parents)
    connections.release(parents, os.getpid())
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: the parent's waiting connection is not its to use or close
        taken = connections.take_idle()
        connections.close_all()
        os.write(write, b"none" if taken is None else b"taken")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.close(read)
    os.waitpid(child, 0)
    assert answer == b"none"
    assert parents.execute("SELECT 1").fetchall() == [(1,)]
    assert connections.take_idle() is parents
    connections.close_all()


def test_a_closed_store_keeps_no_connection_of_an_ending_thread(db_path: Path, keyring: Keyring) -> None:
    pad = Scratchpad.open(db_path, keyring=keyring)
    db = sqlite_of(pad)
    release = threading.Event()
    holding: list[apsw.Connection] = []

    def hold() -> None:
        holding.append(db.conn)
        release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    while not holding:
        threading.Event().wait(0.01)
    pad.close()
    release.set()
    thread.join()
    gc.collect()
    with pytest.raises(apsw.ConnectionClosedError):
        holding[0].execute("SELECT 1")
