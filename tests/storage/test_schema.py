"""One migration list for both dialects (``storage/schema.py``), and the stores
numbered before it: each dialect's old numbers map to the list's, and such a
store opens, migrates and ends with the schema of a new store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Scratchpad
from securepad.errors import SecurepadError
from securepad.storage import schema
from securepad.storage.sqlite import Database
from tests.support.principals import ALICE


def test_the_version_is_the_position_in_the_list() -> None:
    assert len(schema.MIGRATIONS) - 1 == schema.SCHEMA_VERSION
    assert schema.MIGRATIONS[0] == ()
    for dialect in (schema.SQLITE, schema.POSTGRES):
        assert [v for v, _ in schema.steps(dialect, 0, schema.SCHEMA_VERSION)] == list(
            range(1, schema.SCHEMA_VERSION + 1)
        )


@pytest.mark.parametrize("dialect", [schema.SQLITE, schema.POSTGRES])
def test_each_old_number_maps_forward_to_one_version_of_the_list(dialect: str) -> None:
    before = schema.BEFORE[dialect]
    assert before[0] == 0 and before[-1] == schema.SCHEMA_VERSION
    assert list(before) == sorted(set(before))
    assert schema.version_of(dialect, len(before) - 1, marked=False) == schema.SCHEMA_VERSION
    assert schema.version_of(dialect, 3, marked=True) == 3  # a store of the list keeps its number


def test_each_step_is_written_for_both_dialects_or_names_its_own() -> None:
    """The shared parts hold no dialect's own words; a dialect's part is keyed by a known dialect."""
    for step in schema.MIGRATIONS:
        for part in step:
            if isinstance(part, str):
                assert "BYTEA" not in part and " BLOB" not in part and "WITHOUT ROWID" not in part
            else:
                assert set(part) <= {schema.SQLITE, schema.POSTGRES}


def _sqlite_schema(path: Path) -> list[Any]:
    conn = apsw.Connection(str(path))
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return [(kind, name, " ".join(str(sql).split())) for kind, name, sql in rows]
    finally:
        conn.close()


def _sqlite_store_numbered_before(path: Path, old: int) -> None:
    """The schema a store of SQLite's old ``old`` has, numbered as it was (no mark)."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.touch(mode=0o600)
    conn = apsw.Connection(str(path))
    with conn:
        for _, sql in schema.steps(schema.SQLITE, 0, schema.BEFORE[schema.SQLITE][old]):
            conn.execute(sql)
        conn.execute(f"PRAGMA user_version = {old}")
    conn.close()


@pytest.mark.parametrize("old", range(1, len(schema.BEFORE[schema.SQLITE])))
def test_a_sqlite_store_numbered_before_opens_with_the_schema_of_a_new_one(tmp_path: Path, old: int) -> None:
    fresh, path = tmp_path / "s" / "fresh.db", tmp_path / "s" / f"old{old}.db"
    Database(fresh).close()
    _sqlite_store_numbered_before(path, old)
    db = Database(path)
    try:
        version = schema.BEFORE[schema.SQLITE][old]
        assert db.upgraded == (None if version == schema.SCHEMA_VERSION else (version, schema.SCHEMA_VERSION))
        assert db.query("PRAGMA user_version")[0]["user_version"] == schema.SCHEMA_VERSION
        assert db.query(schema.NUMBERING_SQL, admin=True) != []
    finally:
        db.close()
    assert _sqlite_schema(path) == _sqlite_schema(fresh)


def test_a_sqlite_store_newer_than_the_list_is_refused(db_path: Path) -> None:
    Database(db_path).close()
    conn = apsw.Connection(str(db_path))
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SecurepadError, match="newer than this securepad understands"):
        Database(db_path)


@pytest.mark.parametrize("old", [1, 8, 14])
def test_a_postgresql_store_numbered_before_opens_and_takes_the_lists_numbers(
    pg_dsn: str, keyring: Keyring, monkeypatch: pytest.MonkeyPatch, old: int
) -> None:
    psycopg = pytest.importorskip("psycopg")
    from psycopg_pool import ConnectionPool

    from securepad.storage.postgres import migrate

    version = schema.BEFORE[schema.POSTGRES][old]
    with monkeypatch.context() as patch, ConnectionPool(pg_dsn, min_size=1, max_size=1) as pool:
        patch.setattr(migrate, "SCHEMA_VERSION", version)
        assert migrate.migrate("securepad", lambda: None, lambda: pool) is None  # a new store
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM securepad.store_meta WHERE key = %s", (schema.NUMBERING_KEY,))
        conn.execute("DELETE FROM securepad.schema_version WHERE version > %s", (old,))
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        upgraded = None if version == schema.SCHEMA_VERSION else {"from": version, "to": schema.SCHEMA_VERSION}
        assert pad.schema_upgrade == upgraded
        pad.put(ALICE, "t1", 1, "shell", "after the one list")
        assert pad.get(ALICE, pad.list_for_turn(ALICE, "t1")[0]["scratchpad_id"]).observation == "after the one list"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT version FROM securepad.schema_version ORDER BY version").fetchall()
        mark = conn.execute(schema.NUMBERING_SQL.replace("store_meta", "securepad.store_meta")).fetchall()
    assert [row[0] for row in rows] == list(range(1, schema.SCHEMA_VERSION + 1))
    assert len(mark) == 1
