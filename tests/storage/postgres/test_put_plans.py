"""What a put costs the PostgreSQL server, in rows and plans
(docs/decisions/0010-young-store-plans.md), whatever the machine's load.

A connection's prepared statements keep the generic plan made at their sixth
run. On a young store (not analyzed yet: its first minute, or its first 50
rows), that plan was made for a tiny table. Before schema 9, the put's step
check then read every entry of the owner through the primary key: 518 rows a
put in the CPU benchmark, 43% of the server's CPU per put.
"""

from __future__ import annotations

from typing import Any

import pytest

from securepad import Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad.storage.postgres import migrate  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

# The conftest fixture ``pg_single``: a store on one connection, and its pool.
Single = tuple[Scratchpad, ConnectionPool[Any]]

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB

# The put's step check (``listings.step_look`` inside ``access.quota_sql``), as the store sends it.
STEP_CHECK = (
    "SELECT MAX(expires_at) FROM (SELECT owner_user_id, actor, channel, expires_at FROM entries"
    " WHERE turn_id = $1 AND step_num = $2 AND owner_user_id = $3) AS taken"
)


def _generic_plan(pool: ConnectionPool[Any], sql: str, params: tuple[Any, ...]) -> str:
    """The generic plan of ``sql`` as the application role sees it (row-level security on)."""
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            "SELECT set_config('role', 'securepad_app', true), set_config('search_path', 'securepad', true),"
            " set_config('securepad.owner', %s, true), set_config('plan_cache_mode', 'force_generic_plan', true)",
            (params[-1],),
        )
        conn.execute(f"PREPARE young_plan AS {sql}", prepare=False)
        try:
            values = ", ".join(["%s"] * len(params))
            rows = psycopg.ClientCursor(conn).execute(f"EXPLAIN EXECUTE young_plan({values})", params).fetchall()
        finally:
            conn.execute("DEALLOCATE young_plan", prepare=False)
    return "\n".join(row[0] for row in rows)


def _entries_read(pool: ConnectionPool[Any], turn: str, step: int) -> int:
    """Rows the step check reads (EXPLAIN ANALYZE of its generic plan), counted by the server."""
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            "SELECT set_config('role', 'securepad_app', true), set_config('search_path', 'securepad', true),"
            " set_config('securepad.owner', 'alice', true), set_config('plan_cache_mode', 'force_generic_plan', true)"
        )
        conn.execute(f"PREPARE young_rows AS {STEP_CHECK}", prepare=False)
        try:
            explain = "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE young_rows(%s, %s, 'alice')"
            plan = psycopg.ClientCursor(conn).execute(explain, (turn, step)).fetchone()
        finally:
            conn.execute("DEALLOCATE young_rows", prepare=False)
    assert plan is not None

    def scanned(node: dict[str, Any]) -> int:
        own = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
        mine = own if "Relation Name" in node else 0
        return mine + sum(scanned(child) for child in node.get("Plans", []))

    return scanned(plan[0][0]["Plan"])


def test_on_a_young_store_the_step_check_takes_the_turns_index(pg_single: Single) -> None:
    pad, pool = pg_single
    for step in range(1, 6):
        pad.put(ALICE, "t1", step, "shell", TEXT)
    plan = _generic_plan(pool, STEP_CHECK, ("t1", 3, "alice"))
    assert "entries_owner_turn" in plan
    assert "entries_pkey" not in plan and "Seq Scan" not in plan


def test_a_puts_step_check_reads_no_more_rows_as_the_owner_grows(pg_single: Single) -> None:
    """Rows read by the step check of a new step: none, with 5 entries of the owner or with 60."""
    pad, pool = pg_single
    for step in range(1, 6):
        pad.put(ALICE, "t1", step, "shell", TEXT)
    few = _entries_read(pool, "t1", 1000)
    pad.put_many(ALICE, "t2", [(step, "shell", "x") for step in range(1, 56)])
    assert (few, _entries_read(pool, "t1", 1000)) == (0, 0)


def test_the_tie_breaking_ages_of_the_indexes_of_entries(pg_single: Single) -> None:
    """On a tie of costs the planner keeps the newest index (the planner's
    list of a table's indexes is newest first). The key (id, owner_user_id)
    must be the newest (schema 11: an entry by id and owner), and the turn's
    index newer than the owner's live bytes (schema 13: a turn's entries)."""
    _, pool = pg_single
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'securepad.entries'::regclass ORDER BY i.indexrelid DESC"
        ).fetchall()
        version = conn.execute("SELECT MAX(version) FROM securepad.schema_version").fetchone()
    newest_first = [row[0] for row in rows]
    assert newest_first[0] == "entries_pkey"
    assert newest_first.index("entries_owner_turn") < newest_first.index("entries_owner_usage")
    assert version == (migrate.SCHEMA_VERSION,) and migrate.SCHEMA_VERSION >= 15


def test_a_put_maintains_these_indexes_only(pg_single: Single) -> None:
    """Every index of a table a put inserts into or updates costs each put an
    index insertion (a new index must say which query needs it). entries: the
    key (an entry by id), a turn's entries (steps, listings, the turn's
    inventory), gc's expiry scan and the owner's live bytes (the quota's exact
    sum); turn_heads: its key."""
    _, pool = pg_single
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT t.relname, c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
            " JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = 'securepad' AND t.relname IN ('entries', 'turn_heads', 'owner_keys')"
        ).fetchall()
    found = {(table, index): definition.split(" USING ")[1] for table, index, definition in rows}
    assert found == {
        ("entries", "entries_pkey"): "btree (id, owner_user_id)",
        ("entries", "entries_owner_turn"): "btree (owner_user_id, turn_id, step_num)",
        ("entries", "entries_expires"): "btree (expires_at)",
        ("entries", "entries_owner_usage"): "btree (owner_user_id, expires_at, stored_bytes)",
        ("turn_heads", "turn_heads_pkey"): "btree (owner_user_id, turn_id)",
        ("owner_keys", "owner_keys_pkey"): "btree (owner_user_id, version)",
    }
