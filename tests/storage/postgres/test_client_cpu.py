"""The PostgreSQL client's call path: what it keeps
between calls to spend less CPU, and what that must not change.

A store made from a DSN keeps the connection its last call gave back for the
next call (``pool.Lender``) instead of a trip through psycopg_pool per call.
What a user relies on: the pool's size still holds (a call waiting for the
pool is never starved by a kept connection), a connection that died while
kept is replaced within the call, a connection goes back to its pool in time
and when the store closes, and a pool passed in is never held between calls
(other code may share it). A message that prepares nothing new is made from
its remembered plan (``Statements.message``): the same commands as one made
afresh. Figures per call (pool requests, commands) are counted, not timed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg.pq import TransactionStatus  # noqa: E402  (needs psycopg)
from psycopg_pool import ConnectionPool  # noqa: E402

from securepad.storage.postgres import database, pool  # noqa: E402
from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from securepad.storage.postgres.pipeline import Watch, rows_of, send  # noqa: E402
from securepad.storage.postgres.prepared import EXECUTE, QUERY, Statements  # noqa: E402

PID = "SELECT pg_backend_pid() AS pid"


def requests(pool: ConnectionPool[Any]) -> int:
    """How many connections the pool has lent so far."""
    return int(pool.get_stats().get("requests_num", 0))


def test_a_store_from_a_dsn_takes_a_connection_from_its_pool_once_for_many_calls(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn)
    try:
        pid = db.query(PID)[0]["pid"]
        before = requests(db.connections.app)
        for _ in range(20):
            assert db.query(PID)[0]["pid"] == pid
        with db.transaction("alice") as tx:
            assert tx.query(PID)[0]["pid"] == pid
        assert db.query(PID, admin=True)[0]["pid"] == pid  # one pool for both roles: one kept connection
        assert requests(db.connections.app) == before
    finally:
        db.close()


def test_a_pool_passed_in_gets_each_connection_back_at_once(pg_dsn: str) -> None:
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        db = PostgresDatabase(pool)
        try:
            before = requests(pool)
            db.query("SELECT 1 AS one")
            db.query("SELECT 1 AS one")
            assert requests(pool) == before + 2
            with pool.connection(timeout=1) as conn:  # its only connection is free again
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            db.close()


def test_a_call_waiting_for_the_pool_gets_the_connection_a_call_gives_back(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn, pool_size=1, pool_timeout_s=5)
    try:
        db.query("SELECT 1 AS one")
        result: dict[str, Any] = {}

        def other() -> None:
            try:
                result["rows"] = db.query("SELECT 2 AS two")
            except Exception as exc:  # reported below, in the test's thread
                result["error"] = exc

        thread = threading.Thread(target=other)
        with db.transaction("alice") as tx:
            tx.query("SELECT 1 AS one")  # the pool's only connection, in use
            thread.start()
            for _ in range(200):  # until the other call waits for the pool
                if db.connections.lenders[0]._waiting:
                    break
                time.sleep(0.01)
            assert db.connections.lenders[0]._waiting == 1
        thread.join(timeout=4)  # well within the pool timeout: handed over, not kept
        assert result == {"rows": [{"two": 2}]}
        assert db.query("SELECT 3 AS three") == [{"three": 3}]
    finally:
        db.close()


def test_a_kept_connection_that_died_is_replaced_within_the_call(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn)
    try:
        pid = db.query(PID)[0]["pid"]
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
        assert db.query(PID)[0]["pid"] != pid
        with db.transaction("alice") as tx:
            assert tx.query("SELECT 1 AS one") == [{"one": 1}]
    finally:
        db.close()


def test_a_failed_transactions_connection_is_kept_only_rolled_back(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero), db.transaction("alice") as tx:
            tx.query("SELECT 1 / 0 AS x")
        kept = db.connections.lenders[0]._kept
        assert len(kept) == 1 and kept[0][0].pgconn.transaction_status == TransactionStatus.IDLE
        assert db.query("SELECT 1 AS one") == [{"one": 1}]
    finally:
        db.close()


def test_a_connection_goes_back_to_its_pool_after_keep_s(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "KEEP_S", 0.0)
    db = PostgresDatabase(pg_dsn)
    try:
        before = requests(db.connections.app)
        for _ in range(5):
            db.query("SELECT 1 AS one")
        assert requests(db.connections.app) == before + 5
        assert db.connections.lenders[0]._kept == []
    finally:
        db.close()


def test_closing_the_store_closes_the_kept_connection(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn)
    db.query("SELECT 1 AS one")
    ((conn, _, _),) = db.connections.lenders[0]._kept
    db.close()
    assert conn.closed and db.connections.lenders[0]._kept == []


def test_a_store_of_one_connection_migrates_a_new_schema(pg_dsn: str) -> None:
    """Opening asks the schema's version (a call: its connection is kept),
    then migrates on a connection taken from the pool directly: the kept one
    goes back first, or the pool of one would time out."""
    db = PostgresDatabase(pg_dsn, pool_size=1, pool_timeout_s=3)
    try:
        assert db.query("SELECT MAX(version) AS v FROM schema_version")[0]["v"] == database.SCHEMA_VERSION
    finally:
        db.close()


@pytest.mark.parametrize("prepared", [True, False])
def test_a_message_from_its_plan_is_the_message_made_afresh(pg_dsn: str, prepared: bool) -> None:
    batch = [("BEGIN", ()), ("SELECT %s::int AS a", (1,)), ("SELECT %s::text AS b, %s::int AS c", ("x", 2))]
    later = [("BEGIN", ()), ("SELECT %s::int AS a", (7,)), ("SELECT %s::text AS b, %s::int AS c", ("y", 8))]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        statements = Statements("securepad", enabled=prepared)
        call = Watch(conn, time.monotonic() + 60)
        send(call, statements, batch, first=True)  # prepares the statements (or not)
        afresh = statements.message(conn, later, first=True)  # prepares nothing new: its plan is kept
        planned = statements.message(conn, later, first=True)
        assert planned.commands == afresh.commands and planned.results == afresh.results
        kinds = [kind for kind, _, _ in planned.commands]
        assert kinds == ([EXECUTE, QUERY, EXECUTE, EXECUTE] if prepared else [QUERY, QUERY, QUERY])
        results = send(call, statements, later, first=True)
        assert [rows_of(call, result) for result in results[1:]] == [[{"a": 7}], [{"b": "y", "c": 8}]]
        conn.execute("ROLLBACK")


def test_the_kept_connections_rows_loader_is_kept_with_it(pg_dsn: str) -> None:
    """Its loaders per column type are made once, and rows load as a fresh
    loader loads them, whatever the statement's types."""
    db = PostgresDatabase(pg_dsn)
    try:
        assert db.query("SELECT 1 AS one") == [{"one": 1}]
        ((_, _, loader),) = db.connections.lenders[0]._kept
        assert loader is not None
        rows = db.query("SELECT 'x'::text AS t, '\\x00ff'::bytea AS b, 2.5::float8 AS f, NULL::bigint AS n, true AS ok")
        assert rows == [{"t": "x", "b": b"\x00\xff", "f": 2.5, "n": None, "ok": True}]
        assert db.connections.lenders[0]._kept[0][2] is loader
    finally:
        db.close()
