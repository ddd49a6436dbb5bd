"""Parameters bound by the PostgreSQL server (``securepad.storage.postgres.pipeline.send``).

Each message is one libpq pipeline of the extended protocol: the parameters
travel apart from the statements' text, ``bytes`` in binary, the rest as
text the server reads as the type it gave each placeholder. What a user
relies on: every value the store binds comes back as it went, whatever its
bytes (NUL, quotes, percent signs, backslashes); the statements the server
keeps are the statements, never a message with an entry's bytes in it; and
a statement that fails raises its own error and leaves the connection usable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.store import parts

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from tests.support.principals import ALICE  # noqa: E402

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB


@pytest.fixture(params=["prepared", "unprepared"])
def single(request: pytest.FixtureRequest, pg_store_dsn: str, keyring: Keyring) -> Iterator[tuple[Scratchpad, Any]]:
    """A store on a pool of one connection: preparing statements, or not (as behind a transaction pooler)."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if request.param == "unprepared":
        kwargs["prepare_threshold"] = None
    with (
        ConnectionPool(pg_store_dsn, min_size=1, max_size=1, kwargs=kwargs) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad, pool


VALUES = [
    ("BIGINT", 2**62),
    ("BIGINT", -1),
    ("INTEGER", 0),
    ("DOUBLE PRECISION", 1.5),
    ("DOUBLE PRECISION", 1796136355.902496),
    ("DOUBLE PRECISION", float("inf")),
    ("DOUBLE PRECISION", float("-inf")),
    ("BOOLEAN", True),
    ("BOOLEAN", False),
    ("TEXT", "50% of 'it' \\ \"quoted\" ünïcødé ✓"),
    ("TEXT", ""),
    ("TEXT", None),
    ("BLOB", bytes(range(256)) * 20),
    ("BLOB", b"\x00"),
    ("BLOB", b""),
    ("BLOB", None),
]


@pytest.mark.parametrize(("kind", "value"), VALUES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(VALUES)])
def test_every_value_comes_back_as_it_was_bound(single: tuple[Scratchpad, Any], kind: str, value: Any) -> None:
    pad, _ = single
    rows = parts(pad).db.query(f"SELECT CAST(? AS {kind}) AS v, '100%' AS percent", (value,), owner="alice")
    assert rows == [{"v": value, "percent": "100%"}]
    assert type(rows[0]["v"]) is type(value)


def test_nan_comes_back_as_nan(single: tuple[Scratchpad, Any]) -> None:
    pad, _ = single
    rows = parts(pad).db.query("SELECT CAST(? AS DOUBLE PRECISION) AS v", (float("nan"),), owner="alice")
    assert math.isnan(rows[0]["v"])


def test_a_put_and_read_round_trip_an_entry_of_every_byte(single: tuple[Scratchpad, Any]) -> None:
    pad, _ = single
    data = bytes(range(256)) * 64  # 16 KiB, NULs and quotes among them
    entry = pad.put(ALICE, "t1", 1, "shell", data)["scratchpad_id"]
    text = pad.put(ALICE, "t1", 2, "shell", "it's 100% \\done\\ \x00 ✓")["scratchpad_id"]
    assert pad.get(ALICE, entry).observation == data
    assert pad.get(ALICE, text).observation == "it's 100% \\done\\ \x00 ✓"


def test_the_server_keeps_statements_not_messages(single: tuple[Scratchpad, Any]) -> None:
    """Each prepared statement's text on the server is the statement alone,
    with placeholders: no entry's bytes (before, the whole first message, the
    4 KiB entry in hex among it, was kept for each statement it prepared)."""
    pad, pool = single
    for step in range(1, 4):
        pad.get(ALICE, pad.put(ALICE, "t1", step, "shell", TEXT)["scratchpad_id"])
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'securepad_%' ORDER BY name"
        ).fetchall()
    if pool.kwargs.get("prepare_threshold", 0) is None:
        assert rows == []
        return
    assert len(rows) >= 6
    for (statement,) in rows:
        assert "\\x" not in statement and "line 1:" not in statement
        assert len(statement) < 4096  # a 4 KiB entry in hex is 8 KiB
        assert ";" not in statement.rstrip(";")


def test_a_failing_statement_raises_its_error_and_the_connection_serves_on(single: tuple[Scratchpad, Any]) -> None:
    pad, _ = single
    db = parts(pad).db
    with pytest.raises(psycopg.errors.DivisionByZero):
        db.queries(("SELECT 1 AS one", ()), ("SELECT 1 / CAST(? AS INTEGER) AS v", (0,)), owner="alice")
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        db.query("SELECT CAST(? AS INTEGER) AS v", ("not a number",), owner="alice")
    assert db.query("SELECT CAST(? AS INTEGER) AS v", (7,), owner="alice") == [{"v": 7}]
    entry = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    assert pad.get(ALICE, entry).observation == TEXT


def test_rows_load_as_psycopg_loads_text_rows(single: tuple[Scratchpad, Any]) -> None:
    """The store asks for its rows in binary (no hex text of a ``bytea`` to write
    and to parse): every kind of value it reads loads as psycopg's own cursors
    load the same rows as text, of the same Python types."""
    pad, pool = single
    sql = (
        "SELECT COUNT(*) AS n, SUM(x) AS s, MAX(x) AS m, 'h' AS k, NULL AS nothing, MAX(x) > 1 AS big,"
        " CAST(1.5 AS NUMERIC) AS d, CAST('2026-01-01 00:00:00+00' AS TIMESTAMPTZ) AS ts,"
        " CAST('{\"a\": [1, \"b\"]}' AS JSONB) AS j, decode('00ff27', 'hex') AS b, CAST(0.25 AS DOUBLE PRECISION) AS f"
        " FROM (VALUES (CAST(1 AS BIGINT)), (2)) AS t(x)"
    )
    rows = parts(pad).db.query(sql, owner="alice")
    with pool.connection() as conn:
        expected = conn.cursor(row_factory=psycopg.rows.dict_row).execute(sql).fetchall()
    assert rows == expected
    assert [type(v) for v in rows[0].values()] == [type(v) for v in expected[0].values()]
    assert rows[0]["b"] == b"\x00\xff'"
