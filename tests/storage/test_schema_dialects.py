"""The one migration list (``storage/schema.py``) renders each table per
dialect, with steps of one dialect beside: the two live schemas must agree,
table by table and column by column (name, type family, NOT NULL, default,
primary and unique keys).

Differences on purpose are listed here, each with its reason.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

pytest.importorskip("psycopg")
import psycopg

from securepad import Keyring, Scratchpad

# SQLite declared type -> the type family it is compared as.
SQLITE_TYPES = {"TEXT": "text", "INTEGER": "integer", "REAL": "real", "BLOB": "blob"}
# PostgreSQL data_type -> type family (its integers are 32- or 64-bit; SQLite's are all 64-bit).
PG_TYPES = {
    "text": "text",
    "integer": "integer",
    "bigint": "integer",
    "double precision": "real",
    "bytea": "blob",
}
# Columns only one dialect has, and why.
PG_ONLY = {
    # Row-level security needs the owner on every row; SQLite finds it through the entry.
    ("segments", "owner_user_id"),
}
# Tables only one dialect has (migration bookkeeping).
IGNORED_TABLES = {"schema_version", "sqlite_sequence", "sqlite_stat1"}


def _sqlite_schema(path: Path) -> dict[str, dict[str, tuple[str, bool]]]:
    conn = apsw.Connection(str(path))
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        schema: dict[str, dict[str, tuple[str, bool]]] = {}
        for table in tables:
            if table in IGNORED_TABLES:
                continue
            columns = {}
            for _, name, declared, notnull, _, pk in conn.execute(f"PRAGMA table_info({table})"):
                family = SQLITE_TYPES.get(str(declared).upper(), f"?{declared}")
                # A single-column INTEGER/TEXT primary key is NOT NULL in PostgreSQL, and in practice here.
                columns[str(name)] = (family, bool(notnull) or bool(pk))
            schema[str(table)] = columns
    finally:
        conn.close()
    return schema


def _sqlite_keys(path: Path) -> dict[str, set[tuple[str, ...]]]:
    """Primary keys and unique constraints of each table, as column tuples."""
    conn = apsw.Connection(str(path))
    keys: dict[str, set[tuple[str, ...]]] = {}
    try:
        for (table,) in list(conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")):
            found: set[tuple[str, ...]] = set()
            pk = sorted((r[5], r[1]) for r in conn.execute(f"PRAGMA table_info({table})") if r[5])
            if pk:
                found.add(tuple(name for _, name in pk))
            for _, index, unique, *_ in list(conn.execute(f"PRAGMA index_list({table})")):
                if unique:
                    found.add(tuple(str(r[2]) for r in conn.execute(f"PRAGMA index_info({index})")))
            keys[str(table)] = found
    finally:
        conn.close()
    return keys


def _pg_schema(dsn: str) -> tuple[dict[str, dict[str, tuple[str, bool]]], dict[str, set[tuple[str, ...]]]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'securepad' ORDER BY table_name, ordinal_position"
        ).fetchall()
        constraints = conn.execute(
            "SELECT tc.table_name, tc.constraint_name, kcu.column_name FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu"
            " ON tc.constraint_name = kcu.constraint_name AND tc.table_schema = kcu.table_schema"
            " WHERE tc.table_schema = 'securepad' AND tc.constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
            " ORDER BY tc.table_name, tc.constraint_name, kcu.ordinal_position"
        ).fetchall()
    schema: dict[str, dict[str, tuple[str, bool]]] = {}
    for table, column, data_type, nullable in rows:
        if table in IGNORED_TABLES or (table, column) in PG_ONLY:
            continue
        schema.setdefault(table, {})[column] = (PG_TYPES.get(data_type, f"?{data_type}"), nullable == "NO")
    grouped: dict[tuple[str, str], list[str]] = {}
    for table, name, column in constraints:
        grouped.setdefault((table, name), []).append(column)
    keys: dict[str, set[tuple[str, ...]]] = {}
    for (table, _), columns in grouped.items():
        if table not in IGNORED_TABLES:
            keys.setdefault(table, set()).add(tuple(columns))
    return schema, keys


@pytest.fixture
def both(tmp_path: Path, pg_dsn: str, keyring: Keyring) -> tuple[Path, str]:
    path = tmp_path / "s.db"
    for where in (path, pg_dsn):
        with Scratchpad.open(where, keyring=keyring):
            pass
    return path, pg_dsn


def test_the_two_dialects_have_the_same_tables_and_columns(both: tuple[Path, str]) -> None:
    path, dsn = both
    sqlite, (pg, _) = _sqlite_schema(path), _pg_schema(dsn)
    assert sorted(sqlite) == sorted(pg)
    for table in sqlite:
        assert sqlite[table] == pg[table], table


def test_the_two_dialects_have_the_same_keys(both: tuple[Path, str]) -> None:
    path, dsn = both
    sqlite, (_, pg) = _sqlite_keys(path), _pg_schema(dsn)
    tables = set(_sqlite_schema(path))
    # PostgreSQL's keys include owner_user_id (its schema 2: ready to shard
    # by owner, tests/keys/test_keystore_postgres.py), first, or after the id in the
    # keys by id (its schema 11); apart from the owner they agree.
    assert {t: _owner_off(sqlite.get(t, set())) for t in tables} == {t: _owner_off(pg.get(t, set())) for t in tables}


def _owner_off(keys: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    return {tuple(c for c in key if c != "owner_user_id") if len(key) > 1 else key for key in keys}


def test_the_comparison_sees_a_difference(tmp_path: Path, keyring: Keyring) -> None:
    path = tmp_path / "s.db"
    with Scratchpad.open(path, keyring=keyring):
        pass
    before = _sqlite_schema(path)
    conn = apsw.Connection(str(path))
    conn.execute("ALTER TABLE checkpoints ADD COLUMN extra TEXT")
    conn.close()
    assert _sqlite_schema(path)["checkpoints"] != before["checkpoints"]


def test_every_table_is_compared(both: tuple[Path, str]) -> None:
    path, _ = both
    assert {"store_meta", "owner_keys", "entries", "segments", "checkpoints", "compaction_marks", "turn_heads"} <= set(
        _sqlite_schema(path)
    )
    assert ("owner_user_id", "turn_id", "seq") in _sqlite_keys(path)["checkpoints"]
