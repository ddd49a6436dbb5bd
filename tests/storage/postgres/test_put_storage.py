"""How a put's sealed bytes are stored on PostgreSQL
(measured with ``python -m benchmarks.pg_cpu``), in figures that do not depend on
the machine's load: the columns' storage, and the WAL records and bytes of
a put's INSERT of a 4 KiB entry.

Ciphertext does not compress. Before the storage migration (11 on this
branch, 12 on the main line), a row over 2 KiB made the server try pglz on
its biggest value before moving it out of line, on every put: about 5 us
of the INSERT's 55 to 69 us, 2% of the server's CPU per put.
"""

from __future__ import annotations

from typing import Any

import pytest

from securepad import Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from tests.support.principals import ALICE  # noqa: E402
from tests.support.tamper_edits import pg_entry_copy  # noqa: E402  (needs psycopg)

# The conftest fixture ``pg_single``: a store on one connection, and its pool.
Single = tuple[Scratchpad, ConnectionPool[Any]]

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB

# Every column that holds ciphertext of unbounded size: stored as is (EXTERNAL),
# never compressed. The small fixed-size ones (wrapped keys, nonces,
# commitments) never reach the 2 KiB at which the server looks at a row's values.
SEALED_COLUMNS = {
    ("entries", "only_segment"),
    ("entries", "sealed_meta"),
    ("entries", "sealed_listing"),
    ("segments", "data"),
    ("checkpoints", "sealed"),
    ("compaction_marks", "sealed"),
    ("turn_heads", "sealed"),
}


def _storage(pool: ConnectionPool[Any]) -> dict[tuple[str, str], str]:
    """Every bytea column of the store's tables and its storage ('e' external, 'x' extended)."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'securepad' AND c.relkind = 'r' AND a.atttypid = 'bytea'::regtype"
            " AND a.attnum > 0 AND NOT a.attisdropped"
        ).fetchall()
    return {(table, column): storage for table, column, storage in rows}


def _insert_cost(pool: ConnectionPool[Any], entry_id: str) -> dict[str, int]:
    """WAL records, bytes and full page images of inserting a copy of entry
    ``entry_id`` as the application role (row-level security on), as a put's
    INSERT does: the server detoasts the copied values and stores them again.
    Rolled back."""
    with pool.connection() as conn:
        columns, copied = pg_entry_copy(conn, "'copy' || id")
        with conn.transaction(force_rollback=True):
            conn.execute(
                "SELECT set_config('role', 'securepad_app', true), set_config('search_path', 'securepad', true),"
                " set_config('securepad.owner', 'alice', true)"
            )
            row = conn.execute(
                f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) INSERT INTO entries({columns})"
                f" SELECT {copied} FROM entries WHERE owner_user_id = 'alice' AND id = %s",
                (entry_id,),
                prepare=False,
            ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return {
        "records": int(plan["WAL Records"]),
        "bytes": int(plan["WAL Bytes"]),
        "full_pages": int(plan["WAL FPI"]),
    }


def test_sealed_bytes_are_stored_as_they_are(pg_single: Single) -> None:
    """The store's ciphertext columns are EXTERNAL; any other bytea column is small."""
    _, pool = pg_single
    storage = _storage(pool)
    assert {column: storage[column] for column in SEALED_COLUMNS} == dict.fromkeys(SEALED_COLUMNS, "e")
    others = {column for column, kind in storage.items() if kind == "x"}
    assert others <= {
        ("entries", "wrapped_key"),
        ("entries", "nonce_prefix"),
        ("entries", "commitment"),
        ("owner_keys", "wrapped"),
        ("checkpoints", "wrapped_key"),
        ("compaction_marks", "wrapped_key"),
    }


def test_a_4_kib_segment_is_stored_out_of_line_uncompressed(pg_single: Single) -> None:
    """The segment leaves the row (the row stays small for scans of the
    entries: a turn's listing, the quota's exact sum, gc) and is not compressed."""
    pad, pool = pg_single
    entry_id = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT length(only_segment), pg_column_size(only_segment), pg_column_compression(only_segment)"
            " FROM securepad.entries WHERE id = %s",
            (entry_id,),
        ).fetchone()
        toast = conn.execute(
            "SELECT reltoastrelid::regclass FROM pg_class WHERE oid = 'securepad.entries'::regclass"
        ).fetchone()
        assert toast is not None
        chunks = conn.execute(f"SELECT COUNT(*) FROM {toast[0]}").fetchone()
    assert row is not None
    length, stored, compression = row
    assert length > 4096 and stored >= length and compression is None
    assert chunks == (3,)  # out of line: three TOAST chunks of at most 1,996 bytes
    assert pad.read(ALICE, entry_id, "head", n=20)["content"] == TEXT[:20]


def test_a_puts_insert_writes_these_wal_records(pg_single: Single) -> None:
    """The INSERT of a 4 KiB entry logs the row, the segment's three TOAST
    chunks and their three TOAST index entries, and the entry's four index
    entries (tests/storage/postgres/test_put_plans.py lists the indexes): 11 WAL records
    (one or two more when an index page splits), about 5.6 KB. A checkpoint
    of the shared server in between makes the next change of each page log
    a full page image: the measure is then taken again (the pages are
    logged by then, though the insert rolled back)."""
    pad, pool = pg_single
    ids = [pad.put(ALICE, "t1", step, "shell", TEXT)["scratchpad_id"] for step in range(1, 6)]
    cost = _insert_cost(pool, str(ids[-1]))
    for _ in range(2):
        if cost["full_pages"]:
            cost = _insert_cost(pool, str(ids[-1]))
    assert 11 <= cost["records"] <= 13, cost
    assert 4096 < cost["bytes"] < 7000 and cost["full_pages"] == 0, cost
