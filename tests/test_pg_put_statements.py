"""The statements of a put on PostgreSQL (issue 15, docs/how-to/postgresql.md
"Stop 24: statements per put"), counted by the server, whatever the machine's load.

Each statement of a message costs the server a Bind, a portal and an executor
start-up and the client a result to read, whatever the statement does. A
put's first message reads the key version, the quota, the step's look and the
turn's heads in one statement (``head_beside.beside_sql``); its second inserts the
entry and upserts the turn's head in one (a data-modifying ``WITH``,
``OwnerHeads.write_bodies``). The folds must change no answer: a collision of
the entry's id in the folded write is retried as before, and a failure of
either half writes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from securepad import Principal, Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)
from tamper_edits import pg_entry_copy  # noqa: E402  (needs psycopg)

from securepad import entry_put  # noqa: E402

Single = tuple[Scratchpad, ConnectionPool[Any]]

ALICE = Principal("alice", "planner", "web")
TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, one segment


def _runs(pool: ConnectionPool[Any]) -> dict[str, tuple[int, str]]:
    """name -> (times run, text) of the prepared statements of the pool's one connection."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT name, generic_plans + custom_plans, statement FROM pg_prepared_statements"
            " WHERE name LIKE 'securepad_%'"
        ).fetchall()
    return {name: (runs, text) for name, runs, text in rows}


def _ran(pool: ConnectionPool[Any], put: Any) -> list[str]:
    """The texts of the prepared statements ``put()`` ran, once each (the put runs each once)."""
    before = _runs(pool)
    put()
    after = _runs(pool)
    ran = {name: runs - before.get(name, (0, ""))[0] for name, (runs, _) in after.items()}
    assert all(count in (0, 1) for count in ran.values()), ran
    return sorted(after[name][1] for name, count in ran.items() if count)


def test_a_put_runs_one_read_statement_and_one_write_statement(pg_single: Single) -> None:
    """Besides the first message's anchor and its settings and locks: one
    statement reads the quota with the heads, one writes the entry with its
    turn's head (6 statements before the folds, 4 now), on a new turn too.
    A put within its turn's reservation (the owner's lock shared) reads no
    records' cost, which only a grant checks; a new turn's put (the owner's
    lock exclusive, a grant) does."""
    pad, pool = pg_single
    for step in range(1, 8):  # the statements prepared, past the server's custom plans
        pad.put(ALICE, "t1", step, "shell", TEXT)
    for turn, step, records in (("t1", 8, False), ("t2", 1, True)):  # an existing turn, a new one
        texts = _ran(pool, lambda turn=turn, step=step: pad.put(ALICE, turn, step, "shell", TEXT))
        assert len(texts) == 4, texts
        reads = [text for text in texts if "LEFT JOIN turn_heads" in text]
        writes = [text for text in texts if "INSERT INTO" in text]
        assert len(reads) == 1 and "owner_keys" in reads[0]
        assert ("FROM checkpoints" in reads[0]) is records
        assert len(writes) == 1 and writes[0].startswith("WITH written AS (INSERT INTO entries(")
        assert "INSERT INTO turn_heads" in writes[0]
    assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == list(range(1, 9))
    assert pad.verify()["ok"]


def test_an_id_collision_in_the_folded_write_is_sealed_again_and_leaves_nothing(
    pg_single: Single, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry's insert fails inside the heads' upsert (a unique violation of
    its id): the store seals it again under a new id, as before the fold, and
    the failed statement left neither a row nor a head behind (the turn verifies)."""
    pad, _ = pg_single
    taken = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    ids = iter([taken])

    class Secrets:
        """``secrets`` for ``entry_put``: the id just taken once, then fresh ones."""

        @staticmethod
        def token_hex(n: int) -> str:
            import secrets

            return next(ids, None) or secrets.token_hex(n)

    monkeypatch.setattr(entry_put, "secrets", Secrets)
    second = pad.put(ALICE, "t1", 2, "shell", "second")["scratchpad_id"]
    assert next(ids, None) is None and second != taken  # the taken id was tried, then another
    assert pad.get(ALICE, taken).observation == TEXT
    assert pad.get(ALICE, second).observation == "second"
    assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1, 2]
    assert pad.verify()["ok"]


def test_a_refused_head_in_the_folded_write_leaves_no_entry(pg_single: Single) -> None:
    """Row-level security refuses the head (another owner's) of the folded
    statement: the statement fails as a whole, so its entry is not inserted
    either (the server's rule, checked here on the store's own statement)."""
    pad, pool = pg_single
    pad.put(ALICE, "t1", 1, "shell", TEXT)
    with pool.connection() as conn:
        columns, copied = pg_entry_copy(conn, "'copy'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute(
                "SELECT set_config('role', 'securepad_app', true), set_config('search_path', 'securepad', true),"
                " set_config('securepad.owner', 'alice', true)"
            )
            conn.execute(
                f"WITH written AS (INSERT INTO entries({columns}) SELECT {copied} FROM entries"
                " WHERE owner_user_id = 'alice') INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed)"
                " VALUES ('bob', 't1', 1, 'x') ON CONFLICT (owner_user_id, turn_id) DO UPDATE SET"
                " key_version = excluded.key_version, sealed = excluded.sealed"
            )
        assert conn.execute("SELECT COUNT(*) FROM securepad.entries WHERE id = 'copy'").fetchone() == (0,)
    assert len(pad.list_for_turn(ALICE, "t1")) == 1
    assert pad.verify()["ok"]
