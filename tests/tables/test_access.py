"""Every statement that finds a turn (or a row) from an id is held to the
principal's scope: another owner's id reads exactly what an absent id reads.

The attack: Alice holds a leaked id of Bob's and names a large turn of her own
after a guess of Bob's turn name. Had the read looked the id's turn up
whoever its owner, her read of Bob's id would read her own turn's inventory
when the guess is right, and nothing otherwise: the time of a ``get`` (or of
the model's ``scratchpad_read``) would test guesses of Bob's turn names. The
tests count what the reads do instead of timing them: the statements run, the
rows each one returns, and on SQLite the virtual machine's steps, which grow
with every row a statement visits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, NotFoundError, Policy, Principal, Scratchpad
from securepad.storage.postgres import migrate
from securepad.store import parts, sqlite_of
from securepad.tables.heads.heads import Heads
from securepad.tables.heads.reading import ENTRY_TURN_SQL
from tests.support.principals import ALICE, BOB

GUESS = "job-42"  # Bob's turn name, and the name of Alice's guessing turn


def _ids(pad: Scratchpad, principal: Principal, turn: str, count: int, first: int = 1) -> list[str]:
    steps = range(first, first + count)
    views = pad.put_many(principal, turn, [(step, "shell", f"output {step}\n" * 20) for step in steps])
    return [str(view["scratchpad_id"]) for view in views]


def _well_formed_absent(bob_id: str) -> str:
    """An id of the same form as a real one that no row has."""
    return bob_id[:-4] + ("0000" if not bob_id.endswith("0000") else "1111")


@contextmanager
def _traced(pad: Scratchpad) -> Iterator[list[dict[str, Any]]]:
    """Each statement run on this thread's SQLite connection: its text, the
    rows it returned, and its virtual machine steps (which count every row visited)."""
    conn = sqlite_of(pad).conn
    runs: dict[int, dict[str, Any]] = {}
    order: list[dict[str, Any]] = []

    def trace(event: dict[str, Any]) -> None:
        if event["code"] == apsw.SQLITE_TRACE_STMT:
            runs[event["id"]] = run = {"sql": event["sql"], "rows": 0, "steps": 0}
            order.append(run)
        elif event["code"] == apsw.SQLITE_TRACE_ROW and event["id"] in runs:
            runs[event["id"]]["rows"] += 1
        elif event["code"] == apsw.SQLITE_TRACE_PROFILE and event["id"] in runs:
            status = event["stmt_status"]
            runs.pop(event["id"])["steps"] = status["SQLITE_STMTSTATUS_VM_STEP"]

    conn.trace_v2(apsw.SQLITE_TRACE_STMT | apsw.SQLITE_TRACE_ROW | apsw.SQLITE_TRACE_PROFILE, trace)
    try:
        yield order
    finally:
        conn.trace_v2(0, None)


def _refused(call: Callable[[], object]) -> None:
    with pytest.raises(NotFoundError):
        call()


def _runs(pad: Scratchpad, call: Callable[[], object]) -> list[dict[str, Any]]:
    with _traced(pad) as order:
        _refused(call)
    return order


def _shape(runs: list[dict[str, Any]], *ids: str) -> list[tuple[str, int]]:
    """The statements (the ids written out of their text) and the rows each returned."""
    shaped = []
    for run in runs:
        sql = run["sql"]
        for value in ids:
            sql = sql.replace(value, "<id>")
        shaped.append((sql, run["rows"]))
    return shaped


@pytest.fixture
def guessed(db_path: Path, keyring: Keyring) -> Iterator[tuple[Scratchpad, str, str]]:
    """A SQLite store where Bob has an entry in turn ``GUESS`` and Alice a
    large turn of the same name; Bob's id, and an absent id of the same form."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        bob_id = _ids(pad, BOB, GUESS, 1)[0]
        _ids(pad, ALICE, GUESS, 40)
        _ids(pad, ALICE, "other", 1)
        yield pad, bob_id, _well_formed_absent(bob_id)


@pytest.mark.parametrize("how", ["get", "read", "delete"])
def test_a_read_of_another_owners_id_runs_the_statements_of_an_absent_id(
    guessed: tuple[Scratchpad, str, str], how: str
) -> None:
    """Same statements, same rows returned by each, same steps: none of
    Alice's rows of the turn the id belongs to is read."""
    pad, bob_id, absent = guessed
    call = {"get": pad.get, "read": pad.read, "delete": pad.delete}[how]
    for scratchpad_id in (bob_id, absent):  # warm every cache first
        _refused(lambda scratchpad_id=scratchpad_id: call(ALICE, scratchpad_id))
    bobs = _runs(pad, lambda: call(ALICE, bob_id))
    absents = _runs(pad, lambda: call(ALICE, absent))
    assert _shape(bobs, bob_id, absent) == _shape(absents, bob_id, absent)
    # Alice's 40 entries of the guessed turn would be 40 rows of the head statement.
    assert sum(run["rows"] for run in bobs) < 10


def test_the_work_of_a_read_of_another_owners_id_does_not_grow_with_the_guessed_turn(
    db_path: Path, keyring: Keyring
) -> None:
    """The virtual machine's steps of Alice's read of Bob's id (every row a
    statement visits is steps) are the same whether her turn named like
    Bob's holds 2 entries or 60: the read visits none of them."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        bob_id = _ids(pad, BOB, GUESS, 1)[0]
        _ids(pad, ALICE, GUESS, 2)
        _refused(lambda: pad.get(ALICE, bob_id))
        small = _runs(pad, lambda: pad.get(ALICE, bob_id))
        _ids(pad, ALICE, GUESS, 60, first=3)
        _refused(lambda: pad.get(ALICE, bob_id))
        large = _runs(pad, lambda: pad.get(ALICE, bob_id))
    assert [run["steps"] for run in large] == [run["steps"] for run in small]


def test_a_read_in_a_turn_never_looks_the_ids_turn_up(guessed: tuple[Scratchpad, str, str]) -> None:
    """A read by id within a turn (``Turn.read``, the model's scratchpad_read)
    reads the head of the turn it names, never the turn of the id."""
    pad, bob_id, absent = guessed
    _refused(lambda: pad.read(ALICE, bob_id, turn_id="other"))
    bobs = _runs(pad, lambda: pad.read(ALICE, bob_id, turn_id="other"))
    absents = _runs(pad, lambda: pad.read(ALICE, absent, turn_id="other"))
    turn = pad.turn(ALICE, "other")
    with _traced(pad) as tool:
        answer = turn.call_tool("scratchpad_read", {"scratchpad_id": bob_id})
    assert answer["ok"] is False
    assert _shape(tool, bob_id, absent) == _shape(absents, bob_id, absent)
    assert _shape(bobs, bob_id, absent) == _shape(absents, bob_id, absent)
    assert not any("SELECT turn_id FROM entries WHERE id" in run["sql"] for run in bobs)


def _admin_rows(pad: Scratchpad, statement: tuple[str, Any]) -> list[dict[str, Any]]:
    """The rows of a read's head statement run by the admin role (PostgreSQL's
    row-level security does not hide other owners' rows from it): what the
    statement itself selects, whatever the server's policies."""
    return [row for row in parts(pad).db.query(statement[0], statement[1], admin=True) if row.get("k") != "v"]


def test_the_head_statement_of_a_read_by_id_names_the_owner(pad: Scratchpad) -> None:
    """On both backends, and on PostgreSQL without row-level security's help:
    the head statement of Alice's read of Bob's id returns what it returns for
    an absent id (Alice's owner head and key), never her turn named like Bob's."""
    bob_id = _ids(pad, BOB, GUESS, 1)[0]
    _ids(pad, ALICE, GUESS, 5)
    absent = _well_formed_absent(bob_id)
    heads = parts(pad).heads
    scope = pad.policy.scope_columns(ALICE)
    bobs = _admin_rows(pad, heads.entry_read_sql("alice", bob_id, scope))
    absents = _admin_rows(pad, heads.entry_read_sql("alice", absent, scope))
    assert bobs == absents
    assert {row["k"] for row in bobs} <= {"h", "k"} and all(row["turn_id"] != GUESS for row in bobs)
    # A delete's read of the id's turn head: the owner head alone, as for an absent id.
    assert _admin_rows(pad, Heads.entry_select_sql("alice", bob_id, scope)) == _admin_rows(
        pad, Heads.entry_select_sql("alice", absent, scope)
    )
    assert all(row["turn_id"] != GUESS for row in _admin_rows(pad, Heads.entry_select_sql("alice", bob_id, scope)))


def _snapshot_out(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with the server snapshot of the token row (its ``channel``)
    left out: a commit anywhere on the server between two statements moves it."""
    return [{**row, "channel": None} if row["k"] == "v" else row for row in rows]


def test_the_read_function_of_postgresql_looks_the_turn_up_within_the_owner(pg_dsn: str, keyring: Keyring) -> None:
    """The server function a warm read by id calls (migration 14) finds no
    turn for another owner's id, even run by a role that sees every row: its
    rows are an absent id's, whatever token is sent (Alice's turn named like Bob's)."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        bob_id = _ids(pad, BOB, GUESS, 1)[0]
        alices = _ids(pad, ALICE, GUESS, 5)
        absent = _well_formed_absent(bob_id)
        reads = parts(pad).heads.reads
        rows = parts(pad).db.query(*reads.sql("?", GUESS, "alice"), owner="alice")
        v = next(row for row in rows if row["k"] == "v")
        token = (v["turn_id"], bytes(v["sealed"]), v["actor"], v["channel"])
        moved = (*token[:3], "0 0 1:1:")
        for sent in (token, moved):
            for _ in range(5):  # a commit elsewhere on the server moves the snapshot in the token
                found = {}
                for value in (alices[0], bob_id, absent):
                    statement = reads.sql(ENTRY_TURN_SQL, value, "alice", sent, function=True)
                    assert statement[0].startswith("SELECT * FROM entry_turn_inventory(")
                    found[value] = _snapshot_out(parts(pad).db.query(*statement, admin=True))
                if found[bob_id] == found[absent]:
                    break
            assert found[bob_id] == found[absent]
            assert all(row["turn_id"] != GUESS for row in found[bob_id])
            assert any(row["turn_id"] == GUESS for row in found[alices[0]])  # her own id finds her turn


@pytest.mark.parametrize("scope", ["owner+channel", "owner+channel+actor"])
def test_an_id_outside_the_principals_scope_reads_what_an_absent_id_reads(
    db_path: Path, keyring: Keyring, scope: str
) -> None:
    """Within one owner, a principal held to a channel (and actor) reading an
    id of another channel finds no turn from it either."""
    policy = Policy.from_dict({"access": {"scope": scope}})
    cli = Principal("alice", "planner" if scope == "owner+channel" else "coder", "cli")
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        other = _ids(pad, cli, GUESS, 1)[0]
        _ids(pad, ALICE, GUESS, 30)
        absent = _well_formed_absent(other)
        assert pad.get(cli, other).turn_id == GUESS  # the turn's inventory, verified, is now cached
        _refused(lambda: pad.get(ALICE, other))
        outside = _runs(pad, lambda: pad.get(ALICE, other))
        absents = _runs(pad, lambda: pad.get(ALICE, absent))
        assert _shape(outside, other, absent) == _shape(absents, other, absent)
        assert pad.get(cli, other).turn_id == GUESS  # its own principal still reads it


def test_a_schema_17_store_gets_the_scoped_read_function(
    pg_dsn: str, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 18 replaces schema 17's entry function (six arguments, the
    id's turn whoever its owner) with the scoped one; reads by id, warm ones
    included (they call it), then answer as before."""
    import psycopg

    with monkeypatch.context() as patch:
        patch.setattr(migrate, "SCHEMA_VERSION", 17)
        with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
            bob_id = _ids(pad, BOB, GUESS, 1)[0]
            mine = _ids(pad, ALICE, GUESS, 3)[1]

    def arguments() -> list[str]:
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                "SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = 'entry_turn_inventory'"
            ).fetchall()
        return [str(row[0]) for row in rows]

    assert arguments() == ["text, text, bytea, text, text, text"]
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        assert arguments() == ["text, text, bytea, text, text, text, text, text"]
        for _ in range(3):  # cold, then warm: the function
            assert pad.get(ALICE, mine).observation == "output 2\n" * 20
            _refused(lambda: pad.get(ALICE, bob_id))
        assert pad.verify()["ok"] is True


@pytest.mark.parametrize("scope", ["owner+channel", "owner+channel+actor"])
def test_the_read_function_of_postgresql_holds_the_turn_to_the_channel_and_actor(
    pg_dsn: str, keyring: Keyring, scope: str
) -> None:
    """The server function's two scope arguments, each alone: an id of the
    owner's in another channel (or, same channel, of another actor) finds no
    turn, by the function (with a token, the snapshot the same or moved), by
    the statement and by a delete's head read, run by a role that sees every
    row; an id in the scope finds its turn."""
    policy = Policy.from_dict({"access": {"scope": scope}})
    other = Principal("alice", "planner", "cli") if scope == "owner+channel" else Principal("alice", "coder", "web")
    with Scratchpad.open(pg_dsn, keyring=keyring, policy=policy) as pad:
        outside = _ids(pad, other, GUESS, 1)[0]
        mine = _ids(pad, ALICE, GUESS, 5)
        absent = _well_formed_absent(outside)
        in_scope = pad.policy.scope_columns(ALICE)
        reads = parts(pad).heads.reads
        rows = parts(pad).db.query(*reads.sql("?", GUESS, "alice"), owner="alice")
        v = next(row for row in rows if row["k"] == "v")
        token = (v["turn_id"], bytes(v["sealed"]), v["actor"], v["channel"])
        for sent in (token, (*token[:3], "0 0 1:1:"), None):
            # The token holds the server's snapshot, which a commit anywhere on
            # the server (another test's) moves: the two answers are compared
            # again when one moved between them.
            for _ in range(5):
                found = {}
                for value in (mine[0], outside, absent):
                    statement = reads.sql(ENTRY_TURN_SQL, value, "alice", sent, function=True, scope=in_scope)
                    assert statement[0].startswith("SELECT * FROM entry_turn_inventory(") == (sent is not None)
                    found[value] = _snapshot_out(parts(pad).db.query(*statement, admin=True))  # the token row too
                if found[outside] == found[absent]:
                    break
            assert found[outside] == found[absent]
            assert all(row["turn_id"] != GUESS for row in found[outside])
            assert any(row["turn_id"] == GUESS for row in found[mine[0]])
        heads = {
            value: _admin_rows(pad, Heads.entry_select_sql("alice", value, in_scope)) for value in (outside, absent)
        }
        assert heads[outside] == heads[absent] and all(row["turn_id"] != GUESS for row in heads[outside])
        _refused(lambda: pad.get(ALICE, outside))
        assert pad.get(other, outside).turn_id == GUESS
