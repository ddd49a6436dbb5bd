"""Server-side prepared statements on PostgreSQL (``securepad.storage.postgres.prepared``).

The server's own statistics (``pg_prepared_statements``: how often each
statement of the session ran, and how often it was planned) guard what a put
and a read cost it, whatever the machine's load: how many statements run,
and that none is parsed and planned again in the steady state. Then what
must not break: a transaction pooler (PgBouncer in transaction mode, which
moves a client connection's transactions between server sessions), a reset
that deallocates the statements, a failed message, and pools that opt out.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.store import parts

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad.storage.postgres.prepared import EXECUTE, MAX_PER_CONNECTION, PREPARE, QUERY, Statements, numbered  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

# The conftest fixture ``pg_single``: a store on one connection, and its pool.
Single = tuple[Scratchpad, ConnectionPool[Any]]

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB

# Statements the server runs per call in the steady state, every one prepared:
# a put into a turn whose head this process sealed last: the anchor, the
# settings and locks, the entry with the turn's head in one conditional
# statement (``_Put.once``: one message, no BEGIN or COMMIT); a turn's first
# put here: the anchor, the settings and locks, the quota check (with the key
# version and the turn's heads), the entry (its one segment in its row) with
# the turn's head (BEGIN and COMMIT are not planned; before the folds,
# tests/storage/postgres/test_put_statements.py: 6); read: the anchor, the settings, the
# entry, the heads.
STATEMENTS = {"put (turn this process wrote last)": 3, "put (first into a turn)": 4, "read": 4}


def _statements(pool: ConnectionPool[Any]) -> dict[str, tuple[int, int]]:
    """name -> (times run, times planned anew) of the pool's one connection."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE name LIKE 'securepad_%'"
        ).fetchall()
    return {name: (generic + custom, custom) for name, generic, custom in rows}


def _delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> tuple[int, int, int]:
    """Statements run, statements planned anew, statements prepared anew."""
    ran = sum(count - before.get(name, (0, 0))[0] for name, (count, _) in after.items())
    planned = sum(custom - before.get(name, (0, 0))[1] for name, (_, custom) in after.items())
    return ran, planned, len(set(after) - set(before))


def test_put_and_read_run_prepared_statements_only_planned_once(pg_single: Single) -> None:
    pad, pool = pg_single
    entry = ""
    for step in range(1, 8):  # past the server's five custom plans per statement
        entry = pad.put(ALICE, "t1", step, "shell", TEXT)["scratchpad_id"]
        pad.put(ALICE, f"warm{step}", 1, "shell", TEXT)  # a turn's first put: the two messages
        pad.read(ALICE, entry, "head", n=100)
        pad.read(ALICE, entry, "head", n=100)  # a warm read: its cached token, the read function's call
    before = _statements(pool)
    for step in range(8, 18):
        pad.put(ALICE, "t1", step, "shell", TEXT)
    after_puts = _statements(pool)
    for turn in range(10):
        pad.put(ALICE, f"new{turn}", 1, "shell", TEXT)
    after_first_puts = _statements(pool)
    for _ in range(10):
        assert pad.read(ALICE, entry, "head", n=100)["content"] == TEXT[:100]
    after_reads = _statements(pool)
    assert _delta(before, after_puts) == (10 * STATEMENTS["put (turn this process wrote last)"], 0, 0)
    assert _delta(after_puts, after_first_puts) == (10 * STATEMENTS["put (first into a turn)"], 0, 0)
    assert _delta(after_first_puts, after_reads) == (10 * STATEMENTS["read"], 0, 0)


def test_a_pool_that_does_not_prepare_gets_no_prepared_statement(pg_dsn: str, keyring: Keyring) -> None:
    kwargs = {"autocommit": True, "prepare_threshold": None}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        entry = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
        assert pad.get(ALICE, entry).observation == TEXT
        assert _statements(pool) == {}


def test_deallocated_statements_are_noticed_and_the_call_still_answers(
    pg_single: Single,
) -> None:
    """A reset that deallocates the session's statements (DISCARD ALL, a
    pooler's reset query): the next call's first message fails at its anchor,
    before anything ran; the store stops preparing and sends it again."""
    pad, pool = pg_single
    entry = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    with pool.connection() as conn:
        conn.execute("DEALLOCATE ALL")
    assert pad.get(ALICE, entry).observation == TEXT
    second = pad.put(ALICE, "t1", 2, "shell", TEXT)["scratchpad_id"]
    assert pad.get(ALICE, second).observation == TEXT
    assert _statements(pool) == {}
    assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1, 2]


def test_a_failed_message_never_makes_a_name_taken(pg_single: Single) -> None:
    """A PREPARE is not undone by the failure of a later statement of its
    message (nor by ROLLBACK): the names of a failed message are never used
    again, so the statement is prepared afresh under a new name."""
    pad, _ = pg_single
    db = parts(pad).db
    good = ("SELECT COUNT(*) AS n FROM entries WHERE owner_user_id = ?", ("alice",))
    with pytest.raises(psycopg.errors.UndefinedColumn):
        db.queries(good, ("SELECT no_such_column FROM entries WHERE id = ?", ("x",)), owner="alice")
    assert db.query(*good, owner="alice") == [{"n": 0}]
    pad.put(ALICE, "t1", 1, "shell", TEXT)
    assert db.query(*good, owner="alice") == [{"n": 1}]


def test_through_a_transaction_pooler_the_store_stops_preparing_and_loses_nothing(
    pg_dsn: str, keyring: Keyring
) -> None:
    """A store opened from a DSN that names PgBouncer in transaction mode
    prepares at first; as soon as a transaction lands on another server
    session, its anchor fails and the store sends everything unprepared from
    then on: 16 clients, 0 errors, every write read back."""
    from tests.support.pgbouncer import PgBouncer, find_pgbouncer

    if find_pgbouncer() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the PgBouncer tests need Debian's pgbouncer")
        pytest.skip("the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)")
    with Scratchpad.open(pg_dsn, keyring=keyring):
        pass  # created directly, as the guide says
    dbname = pg_dsn.rsplit("/", 1)[1]
    errors: list[str] = []
    written: dict[str, str] = {}
    lock = threading.Lock()
    with PgBouncer(pool_size=4) as bouncer, Scratchpad.open(bouncer.dsn(dbname), keyring=keyring) as pad:

        def client(i: int) -> None:
            me = Principal(f"pooled-{i}", "agent", "web")
            for step in range(1, 9):
                try:
                    text = f"client {i} step {step}\n" * 50
                    entry = pad.put(me, "t", step, "shell", text)["scratchpad_id"]
                    assert pad.get(me, entry).observation == text
                    with lock:
                        written[entry] = me.owner_user_id
                except Exception as exc:  # every error counts, whatever its kind
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(written) == 16 * 8
        assert parts(pad).db._statements.enabled is False  # type: ignore[attr-defined]
    with Scratchpad.open(pg_dsn, keyring=keyring) as direct:
        for entry, owner in written.items():
            assert direct.get(Principal(owner, "agent", "web"), entry).observation.startswith("client ")


def test_placeholders_are_numbered_and_percent_signs_unescaped() -> None:
    assert numbered("SELECT %s, '%%', x LIKE %s || '%%'") == "SELECT $1, '%', x LIKE $2 || '%'"


def test_messages_prepare_each_statement_once_and_stop_at_the_cap(pg_dsn: str) -> None:
    statements = Statements("s")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        first = statements.message(conn, [("SELECT %s", (1,)), ("SELECT %s", (2,)), ("BEGIN", ())], first=True)
        kinds = [kind for kind, _, _ in first.commands]
        # The anchor's Parse and Execute, the repeated statement's Parse once, its two Executes, BEGIN.
        assert kinds == [PREPARE, EXECUTE, PREPARE, EXECUTE, EXECUTE, QUERY]
        assert first.commands[2][2] == ("SELECT $1",) and first.commands[-1][1] == "BEGIN"
        assert first.results == [3, 4, 5]
        statements.sent(first)
        again = statements.message(conn, [("SELECT %s", (3,))], first=True)
        assert [kind for kind, _, _ in again.commands] == [EXECUTE, EXECUTE] and again.results == [1]
        many = [(f"SELECT %s AS c{i}", (i,)) for i in range(MAX_PER_CONNECTION + 10)]
        capped = statements.message(conn, many, first=False)
        prepares = [kind for kind, _, _ in capped.commands].count(PREPARE)
        assert prepares == MAX_PER_CONNECTION - 1  # one statement exists (the anchor apart)
        statements.missing()
        assert statements.message(conn, [("SELECT %s", (3,))], first=True).commands == [(QUERY, "SELECT $1", (3,))]


def test_a_statement_prepared_for_one_owner_and_role_answers_for_another(
    pg_single: Single,
) -> None:
    """One prepared statement, run (on the pool's one connection) for alice,
    for bob, without an owner, and as the admin role: row-level security and
    the role are applied at each run, never frozen into the plan."""
    pad, pool = pg_single
    db = parts(pad).db
    bob = Principal("bob", "planner", "web")
    for step in range(1, 3):
        pad.put(ALICE, "t1", step, "shell", TEXT)
    pad.put(bob, "t1", 1, "shell", TEXT)
    sql = "SELECT owner_user_id, COUNT(*) AS n FROM entries WHERE expires_at > ? GROUP BY owner_user_id"
    before = _statements(pool)
    for _ in range(7):  # past the custom plans: the generic plan is cached
        assert db.query(sql, (0,), owner="alice") == [{"owner_user_id": "alice", "n": 2}]
    assert db.query(sql, (0,), owner="bob") == [{"owner_user_id": "bob", "n": 1}]
    assert db.query(sql, (0,)) == []
    everyone = sorted((row["owner_user_id"], row["n"]) for row in db.query(sql, (0,), admin=True))
    assert everyone == [("alice", 2), ("bob", 1)]
    ran = {name: count - before.get(name, (0, 0))[0] for name, (count, _) in _statements(pool).items()}
    # the anchor, the settings and the query: each prepared once, run all ten times
    assert sorted(count for count in ran.values() if count) == [10, 10, 10]
