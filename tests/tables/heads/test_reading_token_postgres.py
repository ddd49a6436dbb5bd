"""A warm PostgreSQL read costs the server nothing per turn row while nothing commits.

A read sends the freshness token of its cached inventory (``tables.heads.reading``):
the server's snapshot (``xmin:xmax:xip``) with the postmaster's start time and
the cluster's system identifier, then the turn's sealed head and the server's
digest of the inventory. When the snapshot is the one sent, no transaction
has ended since the inventory was read, so no row can differ: the statement
evaluates neither the head nor the digest (proved here with EXPLAIN ANALYZE of
the exact statement, custom and generic plans). Any other snapshot (a commit
anywhere on the server, another database's included; another server lifetime
or cluster with the same transaction ids) runs the digest, and an admin edit
is refused as before.

The snapshot is made to stand still honestly: inside one REPEATABLE READ
transaction every statement sees the same snapshot. The shared server is
never restarted; another start time or system identifier is a token edited
in the test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.errors import IntegrityError
from securepad.store import parts
from tests.support.meters import ReadMeter

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg.rows import dict_row  # noqa: E402  (needs psycopg)

from tests.support.principals import ALICE, NOW  # noqa: E402

LATER = NOW + 100
TURN = "t1"
STEPS = 30
# The turn's tables: what the head and the digest read.
TURN_TABLES = ("turn_heads", "entries", "checkpoints", "compaction_marks")


@pytest.fixture
def store(pg_store_dsn: str, keyring: Keyring) -> Iterator[dict[str, Any]]:
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        views = pad.put_many(
            ALICE, TURN, [(step, "fetch", f"observation {step}") for step in range(1, STEPS + 1)], now=NOW
        )
        ids = [view["scratchpad_id"] for view in views]
        pad.turn(ALICE, TURN, now=NOW).checkpoint(facts=["first"], now=NOW)
        for _ in range(2):
            pad.get(ALICE, ids[0], now=LATER)
            pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
        yield {"pad": pad, "dsn": pg_store_dsn, "ids": ids, "reads": parts(pad).heads.reads}


@contextmanager
def app_transaction(dsn: str, isolation: str = "REPEATABLE READ", *, plans: list[str] | None = None) -> Iterator[Any]:
    """A cursor in one transaction as the application role, for owner alice
    (as the store's own statements run), binding parameters on the client.
    ``plans``: receives the text of every statement the server runs, nested
    ones (a function's) included, as auto_explain reports them (loaded by the
    test's superuser connection before it takes the application role)."""
    with psycopg.connect(dsn) as conn:
        if plans is not None:
            conn.execute("LOAD 'auto_explain'")
            conn.execute(
                "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
                " SET auto_explain.log_level = notice"
            )
            conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
            conn.execute("COMMIT")
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute("SET LOCAL ROLE securepad_app")
        conn.execute("SET LOCAL search_path = securepad")
        conn.execute("SELECT set_config('securepad.owner', 'alice', true)")
        yield psycopg.ClientCursor(conn, row_factory=dict_row)


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


def run(cur: Any, statement: tuple[str, Any]) -> list[dict[str, Any]]:
    cur.execute(_pg(statement[0]), statement[1])
    return list(cur.fetchall())


def token_of(rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    (v,) = [row for row in rows if row["k"] == "v"]
    return (v["turn_id"], bytes(v["sealed"]), v["actor"], v["channel"])


def rows_read(cur: Any, statement: tuple[str, Any], *, generic: bool = False) -> dict[str, int]:
    """Rows each turn table gave the statement (EXPLAIN ANALYZE: actual rows x loops
    over its scans; a scan never executed gives none). ``generic``: as a prepared
    statement's generic plan, as the store runs it after a few executions."""
    sql, params = statement
    if generic:
        counter = iter(range(1, 1000))
        numbered = re.sub(r"\?", lambda _: f"${next(counter)}", sql)
        cur.execute("DEALLOCATE ALL")
        cur.execute(f"PREPARE token_test AS {numbered}")
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        placeholders = ", ".join(["%s"] * len(params))
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE token_test({placeholders})", params)
    else:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _pg(sql), params)
    plan = next(iter(cur.fetchone().values()))[0]["Plan"]
    found = dict.fromkeys(TURN_TABLES, 0)

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") in found:
            found[node["Relation Name"]] += node.get("Actual Rows", 0) * node.get("Actual Loops", 0)
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan)
    return found


def _moved(token: tuple[Any, ...], field: int) -> tuple[Any, ...]:
    """``token`` with one field of its snapshot part changed: 0 the start time,
    1 the system identifier, 2 the transaction ids (``xmin:xmax:xip``)."""
    parts_ = token[3].split(" ")
    parts_[field] = {0: "1.5", 1: "1", 2: "3:3:"}[field]
    return (*token[:3], " ".join(parts_))


@pytest.mark.parametrize("generic", [False, True], ids=["custom_plan", "generic_plan"])
@pytest.mark.parametrize("by", ["turn", "entry"])
def test_an_unchanged_snapshot_evaluates_neither_the_head_nor_the_digest(
    store: dict[str, Any], by: str, generic: bool
) -> None:
    reads, ids = store["reads"], store["ids"]
    with app_transaction(store["dsn"]) as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
        cur.execute(
            "SELECT concat_ws(' ', extract(epoch FROM pg_postmaster_start_time()),"
            " (pg_control_system()).system_identifier, pg_current_snapshot()) AS server"
        )
        assert token[3] == cur.fetchone()["server"]  # this server's lifetime, its cluster, the snapshot
        statement = (
            reads.sql("?", TURN, "alice", token)
            if by == "turn"
            else reads.sql("(SELECT turn_id FROM entries WHERE id = ?)", ids[4], "alice", token)
        )
        # The entry's turn is looked up by its id (one row); nothing else of the turn is read.
        expected = {"turn_heads": 0, "entries": 0 if by == "turn" else 1, "checkpoints": 0, "compaction_marks": 0}
        assert rows_read(cur, statement, generic=generic) == expected
        rows = run(cur, statement)
        assert [row["k"] for row in rows] == ["v"] and rows[0]["n"] == 1
        assert token_of(rows) == token


@pytest.mark.parametrize("field", [0, 1, 2], ids=["start_time", "system_identifier", "transaction_ids"])
def test_another_snapshot_runs_the_head_and_the_digest(store: dict[str, Any], field: int) -> None:
    """A token of another server lifetime (restarted, restored from a backup) or
    another cluster, or taken before a commit, is never taken at its word."""
    reads = store["reads"]
    with app_transaction(store["dsn"]) as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
        other = _moved(token, field)
        statement = reads.sql("?", TURN, "alice", other)
        read = rows_read(cur, statement)
        assert read["turn_heads"] >= 1 and read["entries"] >= STEPS and read["checkpoints"] >= 1
        rows = run(cur, statement)
        # Head and digest equal: the inventory stays out, and the new snapshot comes back.
        assert [row["k"] for row in rows] == ["v"] and rows[0]["n"] == 1
        assert token_of(rows) == token


def test_an_edit_seen_only_by_the_digest_is_refused_when_the_snapshot_belongs_to_another_server(
    store: dict[str, Any],
) -> None:
    """The model of a restored or replaced server whose transaction ids repeat:
    a cached token whose ``xmin:xmax:xip`` equals the server's while a row
    differs. Equal start time and system identifier too, the statement would
    trust it (the first assertion: what the two fields are there for); with
    either one different, the digest runs and the edit is refused."""
    pad, reads, ids = store["pad"], store["reads"], store["ids"]
    cached = reads.cache.get(None, "alice", TURN)
    assert cached is not None
    with psycopg.connect(store["dsn"]) as admin:
        admin.execute("SET ROLE securepad_admin")
        admin.execute("DELETE FROM securepad.entries WHERE id = %s", (ids[5],))
    with app_transaction(store["dsn"]) as cur:
        now = token_of(run(cur, reads.sql("?", TURN, "alice")))[3]
        same_xids = (*cached.token[:3], now)
        assert [row["k"] for row in run(cur, reads.sql("?", TURN, "alice", same_xids))] == ["v"]
        for field in (0, 1):
            rows = run(cur, reads.sql("?", TURN, "alice", _moved(same_xids, field)))
            assert rows[-1]["n"] == 0 and sum(row["k"] == "e" for row in rows) == STEPS - 1
    reads.cache.put(None, "alice", TURN, _moved(same_xids, 0), cached.head)
    with pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
    reads.cache.put(None, "alice", TURN, _moved(same_xids, 1), cached.head)
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)


def _commit_in_another_database(dsn: str) -> None:
    """One transaction that takes a transaction id and commits, in the server's ``postgres`` database."""
    other = re.sub(r"/[^/]*$", "/postgres", dsn)
    with psycopg.connect(other, autocommit=True) as conn:
        conn.execute("SELECT pg_current_xact_id()")


def test_a_commit_in_another_database_makes_the_next_read_run_the_digest(store: dict[str, Any]) -> None:
    reads = store["reads"]
    with app_transaction(store["dsn"], "READ COMMITTED") as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
    _commit_in_another_database(store["dsn"])
    with app_transaction(store["dsn"], "READ COMMITTED") as cur:
        statement = reads.sql("?", TURN, "alice", token)
        read = rows_read(cur, statement)
        assert read["entries"] >= STEPS and read["turn_heads"] >= 1
        rows = run(cur, statement)
    assert rows[-1]["n"] == 1  # the same head and digest: still no inventory
    assert token_of(rows)[:3] == token[:3] and token_of(rows)[3] != token[3]


def test_a_warm_read_after_a_commit_elsewhere_fetches_no_inventory_and_keeps_the_new_snapshot(
    store: dict[str, Any],
) -> None:
    pad, reads, ids = store["pad"], store["reads"], store["ids"]
    before = reads.cache.get(None, "alice", TURN)
    assert before is not None
    _commit_in_another_database(store["dsn"])
    meter = ReadMeter(pad)
    assert meter.counts(lambda: pad.get(ALICE, ids[3], now=LATER)) == {"statements": 2, "rows": 2, "calls": 1}
    after = reads.cache.get(None, "alice", TURN)
    assert after is not None and after.head is before.head
    assert after.token[:3] == before.token[:3] and after.token[3] != before.token[3]


def _unsnapped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without the token's snapshot: in READ COMMITTED each statement
    has its own, and the server's other sessions commit in between."""
    return [row | {"channel": None} if row["k"] == "v" else row for row in rows]


def _scans(cur: Any) -> dict[str, int]:
    """Index and sequential scans of each turn table so far in the cursor's transaction."""
    cur.execute(
        "SELECT relname, seq_scan + coalesce(idx_scan, 0) AS n FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'securepad'"
    )
    found = {row["relname"]: row["n"] for row in cur.fetchall()}
    return {table: found.get(table, 0) for table in TURN_TABLES}


@pytest.mark.parametrize("by", ["turn", "entry"])
def test_after_a_commit_elsewhere_the_read_function_reads_the_turn_once_and_returns_the_token_row(
    store: dict[str, Any], by: str
) -> None:
    """Migration 13: the snapshot moved, the turn did not. The function's lean
    statement reads the head and the turn's rows once (the statement, had it
    run after it, would read them again: a digest read in another order than
    the statement's is a miss) and returns the row the statement returns:
    the head and digest sent, ``same`` set, the new snapshot."""
    from securepad.tables.heads.reading import ENTRY_TURN_SQL

    reads, ids = store["reads"], store["ids"]
    turn, value = ("?", TURN) if by == "turn" else (ENTRY_TURN_SQL, ids[4])
    with app_transaction(store["dsn"], "READ COMMITTED") as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
    _commit_in_another_database(store["dsn"])
    plans: list[str] = []
    with app_transaction(store["dsn"], "READ COMMITTED", plans=plans) as cur:
        for _ in range(8):  # past PL/pgSQL's custom plans: the generic plan reads in the same order
            before = _scans(cur)
            plans.clear()
            rows = run(cur, reads.sql(turn, value, "alice", token, function=True))
            # The call and the lean statement; never the statement (its token CTE).
            assert len(plans) == 2 and " h AS MATERIALIZED (" in plans[0]
            assert not any("token AS MATERIALIZED" in plan for plan in plans)
            after = _scans(cur)
            assert [row["k"] for row in rows] == ["v"] and rows[0]["n"] == 1
            assert token_of(rows)[:3] == token[:3] and token_of(rows)[3] != token[3]
            # One scan of each table; the entry's turn is looked up by its id in entries.
            once = {table: 1 for table in TURN_TABLES} | {"entries": 1 if by == "turn" else 2}
            assert {table: after[table] - before[table] for table in TURN_TABLES} == once
        assert _unsnapped(run(cur, reads.sql(turn, value, "alice", token))) == _unsnapped(rows)  # the statement's


@pytest.mark.parametrize("entry", ["unknown", "another_owners"])
def test_a_read_function_call_for_an_entry_it_cannot_see_returns_the_rows_of_the_statement(
    store: dict[str, Any], entry: str
) -> None:
    """No turn (an unknown id, or another owner's entry under row-level
    security): the lean statement finds no head, so the statement runs."""
    from securepad.tables.heads.reading import ENTRY_TURN_SQL

    pad, reads = store["pad"], store["reads"]
    value = "no-such-entry"
    if entry == "another_owners":
        value = pad.put(Principal("bob", "planner", "web"), "b1", 1, "fetch", "bob's", now=NOW)["scratchpad_id"]
    with app_transaction(store["dsn"]) as cur:
        token = _moved(token_of(run(cur, reads.sql("?", TURN, "alice"))), 2)
        expected = run(cur, reads.sql(ENTRY_TURN_SQL, value, "alice", token))
        assert run(cur, reads.sql(ENTRY_TURN_SQL, value, "alice", token, function=True)) == expected
        assert expected[-1]["k"] == "v" and expected[-1]["n"] == 0 and expected[-1]["turn_id"] is None


@pytest.mark.parametrize("by", ["turn", "entry"])
def test_after_a_change_of_the_turn_the_read_function_reads_the_digest_once(store: dict[str, Any], by: str) -> None:
    """A put to the turn seals another head: the lean statement reads the head
    and stops (no digest), and the statement returns the inventory."""
    from securepad.tables.heads.reading import ENTRY_TURN_SQL

    pad, reads, ids = store["pad"], store["reads"], store["ids"]
    turn, value = ("?", TURN) if by == "turn" else (ENTRY_TURN_SQL, ids[4])
    with app_transaction(store["dsn"], "READ COMMITTED") as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
    pad.put(ALICE, TURN, STEPS + 1, "fetch", "one more", now=LATER)
    with app_transaction(store["dsn"], "READ COMMITTED") as cur:
        before = _scans(cur)
        rows = run(cur, reads.sql(turn, value, "alice", token, function=True))
        after = _scans(cur)
        assert rows[-1]["n"] == 0 and sum(row["k"] == "e" for row in rows) == STEPS + 1
        lookups = 0 if by == "turn" else 2  # the entry's turn, in the lean statement and in the statement
        assert after["entries"] - before["entries"] == 1 + lookups
        assert _unsnapped(run(cur, reads.sql(turn, value, "alice", token))) == _unsnapped(rows)


def test_an_admin_edit_after_a_snapshot_was_cached_is_refused(store: dict[str, Any]) -> None:
    """The admin's transaction ends, so the snapshot moves: the digest runs and sees the edit."""
    pad, ids = store["pad"], store["ids"]
    with psycopg.connect(store["dsn"]) as admin:
        admin.execute("SET ROLE securepad_admin")
        admin.execute("UPDATE securepad.entries SET actor = 'other' WHERE id = %s", (ids[7],))
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)
    with pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=LATER).history(now=LATER)


def test_the_token_benchmark_runs_each_case(pg_dsn: str) -> None:
    """``python -m benchmarks.pg_read_token``: the figures the PostgreSQL guide quotes."""
    from benchmarks.pg_read_token import token_costs

    costs = token_costs(pg_dsn, entries=20, executions=20, rounds=1)
    assert list(costs) == ["SELECT 1", "warm", "warm, one statement", "token part", "snapshot moved"]
    assert all(len(figures) == 1 and figures[0] >= 0 for figures in costs.values())


def test_the_commit_benchmark_runs_each_case(pg_dsn: str) -> None:
    """``python -m benchmarks.pg_read_token --commit-every-ms 1``: the figures of the PostgreSQL guide."""
    from benchmarks.pg_read_token import commit_costs

    costs = commit_costs(pg_dsn, entries=10, executions=20, rounds=1, every_ms=1.0)
    assert list(costs) == ["SELECT 1", "migration 10", "migration 13"]
    assert all(len(figures) == 1 and figures[0] >= 0 for figures in costs.values())


def _stale(token: tuple[Any, ...], case: str) -> tuple[Any, ...]:
    """``token`` as a read would send it in each case the read functions tell apart."""
    if case == "warm":
        return token
    if case == "another_head":  # the snapshot moved and the head differs: the inventory comes back
        return (token[0], token[1][:-1] + bytes([token[1][-1] ^ 1]), token[2], _moved(token, 2)[3])
    return _moved(token, {"start_time": 0, "system_identifier": 1, "transaction_ids": 2}[case])


# The SHA-256 of each function's text as schema 14 creates it. Migrations
# are never edited, and schema 14 builds its functions from the read
# statement (``pg_read_functions``): a change to that statement would give new
# stores other functions than the ones existing stores have. Change the
# statement, and this test fails: add a migration that replaces both functions
# (CREATE OR REPLACE, same grants), and freeze schema 14's text as it was.
SCHEMA_14_FUNCTIONS = {
    "entry_turn_inventory": "1f298ac82f8ac585e6d7957fff54aa5604a92fe774ab1727236d32dfd1357f60",
    "turn_inventory": "b309af71244c309672a54280ed32c617d6a66bebfe94c253198ad44fe7f469b7",
}


# The same for schema 17, which replaces both (``pg_read_functions(lean=True)``).
SCHEMA_17_FUNCTIONS = {
    "entry_turn_inventory": "50c52cf5cbcee81894a5c7c4c0115eb7f3fdf55950596347492f62c20365bbff",
    "turn_inventory": "a46b9a3a2bf45a2a4b74f07681b489f2db9b559364cd9217ad0a0a3cbe2ebfd2",
}


def test_schema_14_creates_the_functions_it_always_created() -> None:
    import hashlib

    from securepad.storage.postgres.functions import pg_read_functions

    texts = pg_read_functions()
    assert {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()} == SCHEMA_14_FUNCTIONS


def test_schema_17_replaces_them_with_the_functions_it_always_created() -> None:
    import hashlib

    from securepad.storage.postgres.functions import pg_read_functions
    from securepad.storage.schema import MIGRATIONS, POSTGRES

    texts = pg_read_functions(lean=True)
    assert {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()} == SCHEMA_17_FUNCTIONS
    assert all(text.startswith(f"CREATE OR REPLACE FUNCTION {name}(") for name, text in texts.items())
    assert all(text in MIGRATIONS[17][0][POSTGRES] for text in texts.values())  # type: ignore[index]


@pytest.mark.parametrize("case", ["warm", "start_time", "system_identifier", "transaction_ids", "another_head"])
@pytest.mark.parametrize("by", ["turn", "entry"])
def test_the_read_function_returns_the_rows_of_the_statement(store: dict[str, Any], by: str, case: str) -> None:
    """Schema 14's functions (``pg_read_functions``): what a warm read calls
    returns exactly the statement's rows, in its order, whatever the token."""
    from securepad.tables.heads.reading import ENTRY_TURN_SQL

    reads, ids = store["reads"], store["ids"]
    turn, value = ("?", TURN) if by == "turn" else (ENTRY_TURN_SQL, ids[4])
    with app_transaction(store["dsn"]) as cur:
        token = _stale(token_of(run(cur, reads.sql("?", TURN, "alice"))), case)
        call = reads.sql(turn, value, "alice", token, function=True)
        assert call[0].startswith("SELECT * FROM ") and "inventory(" in call[0]
        expected = run(cur, reads.sql(turn, value, "alice", token))
        assert run(cur, call) == expected
        kinds = {row["k"] for row in expected}
        assert kinds == ({"v", "h", "e", "c", "k"} if case == "another_head" else {"v"})


def test_a_warm_read_calls_the_function_which_reads_no_turn_table(store: dict[str, Any]) -> None:
    """The store's warm read (a cached token) sends a call of the read function;
    with the snapshot unmoved it scans no table of the turn."""
    reads = store["reads"]
    statement = reads.read_sql("alice", TURN)
    assert statement[0] == "SELECT * FROM turn_inventory(?, ?, ?, ?, ?, ?)"
    with app_transaction(store["dsn"]) as cur:
        token = token_of(run(cur, reads.sql("?", TURN, "alice")))
        scans = (
            "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) AS n FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'securepad'"
        )
        before = run(cur, (scans, ()))[0]["n"]
        rows = run(cur, reads.sql("?", TURN, "alice", token, function=True))
        assert [row["k"] for row in rows] == ["v"] and token_of(rows) == token
        assert run(cur, (scans, ()))[0]["n"] == before
        run(cur, reads.sql("?", TURN, "alice", _moved(token, 2), function=True))
        assert run(cur, (scans, ()))[0]["n"] > before  # the same counters see the digest's scans


def test_the_read_functions_run_as_the_caller_and_only_the_application_role_may_call_them(
    store: dict[str, Any],
) -> None:
    """SECURITY INVOKER (row-level security applies as the application role),
    search_path pinned to the store's schema, owned by the admin role, EXECUTE
    for the application role and nobody else."""
    with psycopg.connect(store["dsn"], row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT p.proname AS name, p.prosecdef AS definer, pg_get_userbyid(p.proowner) AS owner,"
            " has_function_privilege('securepad_app', p.oid, 'EXECUTE') AS app,"
            " EXISTS (SELECT 1 FROM aclexplode(p.proacl) AS a WHERE a.grantee = 0) AS public,"
            " p.proconfig AS config"
            " FROM pg_proc AS p WHERE p.pronamespace = 'securepad'::regnamespace ORDER BY p.proname"
        ).fetchall()
    assert rows == [
        {
            "name": name,
            "definer": False,
            "owner": "securepad_admin",
            "app": True,
            "public": False,
            "config": ["search_path=securepad"],
        }
        for name in ("entry_turn_inventory", "turn_inventory")
    ]
