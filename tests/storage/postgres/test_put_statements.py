"""The statements of a put on PostgreSQL (docs/how-to/postgresql.md,
"What a call costs"), counted by the server, whatever the machine's load.

Each statement of a message costs the server a Bind, a portal and an executor
start-up and the client a result to read, whatever the statement does. A put
into a turn whose head this process sealed last sends one message: after the
anchor and the settings and locks, one statement that rewrites the turn's
head, if the stored one is still the one sealed here, and inserts the entry
from it (``WITH head AS (UPDATE ...) INSERT ... FROM head``, ``_Put.once``).
Any other put (a turn's first in this process, one after another process
wrote the turn) sends two: the first reads the key version, the quota, the
step's look and the turn's heads in one statement (``tables.heads.reading.beside_sql``);
the second inserts the entry and upserts the turn's head in one (a
data-modifying ``WITH``, ``OwnerHeads.write_bodies``). The folds must change
no answer: a collision of the entry's id in either write is retried as
before, and a failure of either half writes nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from securepad import Keyring, Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad.storage.base import DuplicateKeyError  # noqa: E402
from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from securepad.tables.entries import prepare  # noqa: E402
from tests.support.pg_prepared_runs import ran  # noqa: E402  (needs psycopg)
from tests.support.principals import ALICE  # noqa: E402
from tests.support.tamper_edits import pg_entry_copy  # noqa: E402  (needs psycopg)

Single = tuple[Scratchpad, ConnectionPool[Any]]

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, one segment


def _ran(pool: ConnectionPool[Any], put: Any) -> list[str]:
    """The prepared statements ``put()`` ran, as ``_kind`` names them, each as often as it ran."""
    return sorted(_kind(text) for text in ran(pool, put))


def _kind(text: str) -> str:
    """What a put's statement is, from its text (the text itself when it is none of a put's)."""
    if text == "SELECT 1":
        return "anchor"
    if text.startswith("SELECT set_config('role', "):
        # The store's lock and the owner's shared, the turn's exclusive; or the store's shared, the owner's exclusive.
        shared = text.count("pg_advisory_xact_lock_shared(")
        return {2: "settings, the turn's lock", 1: "settings, the owner's lock"}.get(shared, text)
    if "LEFT JOIN turn_heads" in text:
        return "read: version, quota, step, heads" + (", records" if "FROM checkpoints" in text else "")
    if text.startswith("WITH written AS (INSERT INTO entries(") and "INSERT INTO turn_heads" in text:
        return "write: entry, head upserted"
    # The head only if it is still the one sealed here and the key version the newest; the step
    # looked up unless it is above every step that head counts.
    once = ("WITH head AS (UPDATE turn_heads SET ", "owner_keys", ") INSERT INTO entries(")
    if text.startswith(once[0]) and all(part in text for part in once[1:]) and text.endswith(" FROM head"):
        looked_up = ", the step free" if "NOT EXISTS (" in text else ""
        return "write: entry if the head is the recorded one" + looked_up
    return text


def test_a_put_runs_one_read_statement_and_one_write_statement(
    pg_single: Single, pg_dsn: str, keyring: Keyring
) -> None:
    """Besides the first message's anchor and its settings and locks: a put
    into a turn this process wrote last runs one statement, its conditional
    write (3 in all); a turn's first put here one that reads the quota with
    the heads, and one that writes the entry with its turn's head (6
    statements before the folds, 4 now). A put after another process wrote
    the turn runs the one statement (which writes nothing), then the 4. A put
    within its turn's reservation (the owner's lock shared) reads no records'
    cost, which only a grant checks; a new turn's put (the owner's lock
    exclusive, a grant) does."""
    pad, pool = pg_single
    for step in range(1, 8):  # the statements prepared, past the server's custom plans
        pad.put(ALICE, "t1", step, "shell", TEXT)
    once = ["anchor", "settings, the turn's lock", "write: entry if the head is the recorded one"]
    assert _ran(pool, lambda: pad.put(ALICE, "t1", 8, "shell", TEXT)) == sorted(once)
    granted = ["anchor", "settings, the owner's lock", "read: version, quota, step, heads, records"]
    assert _ran(pool, lambda: pad.put(ALICE, "t2", 1, "shell", TEXT)) == sorted(
        [*granted, "write: entry, head upserted"]
    )
    with Scratchpad.open(pg_dsn, keyring=keyring) as other:
        other.put(ALICE, "t1", 9, "shell", TEXT)
    shared = ["anchor", "settings, the turn's lock", "read: version, quota, step, heads", "write: entry, head upserted"]
    assert _ran(pool, lambda: pad.put(ALICE, "t1", 10, "shell", TEXT)) == sorted([*once, *shared])
    assert _ran(pool, lambda: pad.put(ALICE, "t1", 11, "shell", TEXT)) == sorted(once)  # recorded again
    assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == list(range(1, 12))
    assert pad.verify()["ok"]


@pytest.mark.parametrize("turn", ["t1", "t2"])  # the turn this process wrote last (one message), a new one
def test_an_id_collision_in_the_folded_write_is_sealed_again_and_leaves_nothing(
    pg_single: Single, monkeypatch: pytest.MonkeyPatch, turn: str
) -> None:
    """The entry's insert fails inside the statement that writes its turn's
    head (a unique violation of its id): in the one message's conditional
    write or the two-message put's upsert. The store seals it again under a
    new id, as before the folds, and the failed statement left neither a row
    nor a head behind (the turn verifies)."""
    pad, _ = pg_single
    taken = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    ids = iter([taken])

    def new_entry_id() -> str:
        """The id just taken once, then fresh ones."""
        return next(ids, None) or secrets.token_hex(8)

    sent: list[str] = []  # what each one-message put's statement did
    write_once = PostgresDatabase.write_once

    def noted(db: PostgresDatabase, owner: str, turn_id: str, sql: str, params: Any) -> int | None:
        try:
            written = write_once(db, owner, turn_id, sql, params)
        except DuplicateKeyError:
            sent.append("DuplicateKeyError")
            raise
        sent.append(f"wrote {written}")
        return written

    monkeypatch.setattr(prepare, "new_entry_id", new_entry_id)
    monkeypatch.setattr(PostgresDatabase, "write_once", noted)
    second = pad.put(ALICE, turn, 2, "shell", "second")["scratchpad_id"]
    assert next(ids, None) is None and second != taken  # the taken id was tried, then another
    assert pad.get(ALICE, taken).observation == TEXT
    assert pad.get(ALICE, second).observation == "second"
    # The one message hit the taken id (then the two-message put wrote); a new turn's put sent no such message.
    assert sent == (["DuplicateKeyError"] if turn == "t1" else [])
    listed = {t: [e["step_num"] for e in pad.list_for_turn(ALICE, t)] for t in ("t1", "t2")}
    assert listed == ({"t1": [1, 2], "t2": []} if turn == "t1" else {"t1": [1], "t2": [2]})
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
