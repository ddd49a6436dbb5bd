"""Ready to be distributed by owner: on PostgreSQL every primary
key and unique constraint of a table that holds owners' rows includes
``owner_user_id``, checked on the live schema (pg_catalog), and a store made
at schema 1 (ids alone as keys) is converted when it opens."""

from __future__ import annotations

from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.crypto.primitives import HEADS_ERA, Wrapper, owner_key_aad
from securepad.keys.keyring import master_key

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")

from securepad.storage import schema  # noqa: E402
from securepad.storage.postgres import migrate  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

# Tables without owners' rows: reference tables on a distributed PostgreSQL.
REFERENCE_TABLES = {"store_meta", "schema_version"}

_CONSTRAINTS = """
SELECT c.relname AS table_name, k.conname AS name, k.contype AS kind,
       ARRAY(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY AS key(n, position)
             JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = key.n
             ORDER BY key.position) AS columns
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = %s AND k.contype IN ('p', 'u')
"""
_TABLES = """
SELECT c.relname AS table_name,
       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'owner_user_id'
               AND NOT a.attisdropped) AS has_owner
FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = %s AND c.relkind = 'r'
"""


def schema_of(dsn: str, schema: str = "securepad") -> tuple[dict[str, bool], list[dict[str, Any]]]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        tables = {row["table_name"]: row["has_owner"] for row in cur.execute(_TABLES, (schema,)).fetchall()}
        constraints = cur.execute(_CONSTRAINTS, (schema,)).fetchall()
    return tables, constraints


def test_every_key_of_an_owners_table_includes_the_owner(pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t1", 1, "shell", "x")
    tables, constraints = schema_of(pg_dsn)
    owners_tables = {name for name, has_owner in tables.items() if has_owner}
    assert set(tables) - owners_tables == REFERENCE_TABLES
    assert owners_tables == {
        "owner_keys",
        "entries",
        "segments",
        "checkpoints",
        "compaction_marks",
        "turn_heads",
    }
    keyed = {c["table_name"] for c in constraints if c["kind"] == "p"}
    assert owners_tables <= keyed  # every owner's table has a primary key
    without_owner = [
        (c["table_name"], c["name"], c["columns"])
        for c in constraints
        if c["table_name"] in owners_tables and "owner_user_id" not in c["columns"]
    ]
    assert without_owner == []
    # The owner leads each key, but for the keys by id (schema 11): led by the
    # owner, they tied on a young store with the tables' other owner-leading
    # indexes (docs/decisions/0010-young-store-plans.md).
    keys = {(c["table_name"], tuple(c["columns"])) for c in constraints if c["table_name"] in owners_tables}
    by_id = {key for key in keys if key[1][0] != "owner_user_id"}
    assert by_id == {(table, ("id", "owner_user_id")) for table in ("entries", "checkpoints", "compaction_marks")}


def test_a_schema_1_store_is_converted_and_keeps_its_entries(
    pg_dsn: str, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store of PostgreSQL's first schema (schema 5 of the one list), with an
    # entry: that schema plus the turn heads (schema 7) and the columns of the
    # one-segment entry and the listing part (schemas 9 and 10, the latter
    # added only when missing), which today's put needs, then the heads and
    # the one-segment column dropped again, as that schema had none.
    first = schema.BEFORE[schema.POSTGRES][1]
    migrations = schema.MIGRATIONS
    with monkeypatch.context() as patch:
        patch.setattr(migrate, "SCHEMA_VERSION", first)
        grown = migrations[first] + migrations[7] + migrations[9] + migrations[10]
        patch.setattr(schema, "MIGRATIONS", (*migrations[:first], grown, *migrations[first + 1 :]))
        with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
            entry = pad.put(ALICE, "t1", 1, "shell", "made at schema 1")["scratchpad_id"]
        _, constraints = schema_of(pg_dsn)
        assert ("entries", ["id"]) in [(c["table_name"], c["columns"]) for c in constraints]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE securepad.turn_heads")
        _wrapped_as_before_heads(conn, keyring)
        conn.execute("DELETE FROM securepad.store_meta WHERE key = 'turn_heads'")
        # Today's put keeps a one-segment entry in its row (schema 9); schema 1 kept it in segments.
        conn.execute(
            "INSERT INTO securepad.segments(entry_id, seq, data, owner_user_id)"
            " SELECT id, 0, only_segment, owner_user_id FROM securepad.entries WHERE only_segment IS NOT NULL"
        )
        conn.execute("ALTER TABLE securepad.entries DROP COLUMN only_segment")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        assert pad.get(ALICE, entry).observation == "made at schema 1"
        pad.put(ALICE, "t1", 2, "shell", "made at schema 2")
        assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1, 2]
    _, constraints = schema_of(pg_dsn)
    assert ("entries", ["id", "owner_user_id"]) in [(c["table_name"], c["columns"]) for c in constraints]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM securepad.schema_version ORDER BY version")]
    assert versions == list(range(1, migrate.SCHEMA_VERSION + 1))


def _wrapped_as_before_heads(conn: Any, keyring: Keyring) -> None:
    """The owner keys wrapped as a store from before heads wrapped them (no heads era in the AAD)."""
    master, _ = master_key(keyring, None)
    store_id = conn.execute("SELECT value FROM securepad.store_meta WHERE key = 'store_id'").fetchone()[0]
    wrap = Wrapper.for_master(master, store_id)
    for owner, version, wrapped in conn.execute(
        "SELECT owner_user_id, version, wrapped FROM securepad.owner_keys"
    ).fetchall():
        heads, before = (owner_key_aad(store_id, owner, version, era) for era in (HEADS_ERA, ""))
        conn.execute(
            "UPDATE securepad.owner_keys SET wrapped = %s WHERE owner_user_id = %s AND version = %s",
            (wrap.rewrap(bytes(wrapped), heads, wrap, before), owner, version),
        )
