"""A sealed row of another owner, duplicated under the caller's
owner in a table rebuilt without its primary key, is never served.

The attacker edits the file: rebuilds a sealed table without its key
constraints, copies one of bob's rows (same id) and relabels the copy to alice
with an owner-key version alice does not have. Alice's first fetch finds the
copy, which fails to unwrap; the re-fetch that follows (for an owner-key
rotation that may have happened meanwhile) must stay within alice's scope and
re-check the row, or it hands her bob's row. Every sealed table is attacked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import IntegrityError, Keyring, NotFoundError, Scratchpad, Turn
from tests.support.principals import ALICE, BOB

NOW = 5_000_000.0
TURN = "turn-shared"
SECRET = "bob-secret-4f1c"
REFUSED = (IntegrityError, NotFoundError)


def _rebuild_with_relabelled_copy(db_path: Path, table: str, row_id: str) -> None:
    conn = apsw.Connection(str(db_path))
    try:
        with conn:
            conn.execute(f"CREATE TABLE rebuilt AS SELECT * FROM {table}")
            conn.execute(f"DROP TABLE {table}")
            conn.execute(f"ALTER TABLE rebuilt RENAME TO {table}")
            conn.execute(f"CREATE TEMP TABLE copy AS SELECT * FROM {table} WHERE id = ?", (row_id,))
            conn.execute("UPDATE copy SET owner_user_id = 'alice', key_version = key_version + 7")
            conn.execute(f"INSERT INTO {table} SELECT * FROM copy")
    finally:
        conn.close()


def _bobs_row(db_path: Path, table: str) -> str:
    conn = apsw.Connection(str(db_path))
    try:
        rows = list(conn.execute(f"SELECT id FROM {table} WHERE owner_user_id = 'bob'"))
    finally:
        conn.close()
    assert len(rows) == 1
    return str(rows[0][0])


@pytest.fixture
def attacked(db_path: Path, keyring: Keyring, request: pytest.FixtureRequest) -> Any:
    table: str = request.param
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.turn(ALICE, TURN, now=NOW).record(1, "alice_tool", "alice's own text", now=NOW)
        bob = pad.turn(BOB, TURN, now=NOW)
        bob.record(1, "read_file", {"content": SECRET, "metadata": {"path": "secret.txt"}}, now=NOW)
        if table == "checkpoints":
            bob.checkpoint(facts=[SECRET], now=NOW)
        elif table == "compaction_marks":
            bob.mark_compaction(now=NOW)
    _rebuild_with_relabelled_copy(db_path, table, _bobs_row(db_path, table))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        yield table, pad


CALLS: dict[str, Callable[[Scratchpad, Turn], Any]] = {
    "latest_checkpoint": lambda pad, turn: turn.latest_checkpoint(now=NOW),
    "reread_report": lambda pad, turn: turn.reread_report(now=NOW),
    "resume_extend": lambda pad, turn: turn.resume(extend_ttl=7200, now=NOW),
    "steps": lambda pad, turn: turn.steps(now=NOW),
    "history": lambda pad, turn: turn.history(now=NOW),
    "list_for_turn": lambda pad, turn: pad.list_for_turn(ALICE, TURN, now=NOW),
    "mark_compaction": lambda pad, turn: turn.mark_compaction(now=NOW),
}


@pytest.mark.parametrize("attacked", ["entries", "checkpoints", "compaction_marks"], indirect=True)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_relabelled_duplicate_of_bobs_row_is_never_served(attacked: Any, call: str) -> None:
    table, pad = attacked
    turn = pad.turn(ALICE, TURN, now=NOW)
    touches_table = {
        # (without a mark, reread_report looks at no entry)
        "entries": call not in ("latest_checkpoint", "reread_report"),
        "checkpoints": call in ("latest_checkpoint", "resume_extend"),
        "compaction_marks": call in ("reread_report", "resume_extend"),
    }[table]
    if touches_table:
        # The copy is alice's by its clear columns only: it must fail, not fall back to bob's row.
        with pytest.raises(REFUSED):
            CALLS[call](pad, turn)
    else:
        # every read of the turn checks the turn's whole inventory
        # (every table) against its head: a refusal is right too; a leak never is.
        try:
            result = CALLS[call](pad, turn)
        except IntegrityError:
            return
        assert SECRET not in repr(result)


@pytest.mark.parametrize("attacked", ["entries", "checkpoints", "compaction_marks"], indirect=True)
def test_bob_still_reads_his_own_rows(attacked: Any) -> None:
    table, pad = attacked
    bob = pad.turn(BOB, TURN, now=NOW)
    assert pad.list_for_turn(BOB, TURN, now=NOW)[0]["executor_name"] == "read_file"
    if table == "checkpoints":
        latest = bob.latest_checkpoint(now=NOW)
        assert latest is not None and latest["facts"] == [SECRET]
    if table == "compaction_marks":
        assert bob.reread_report(now=NOW)["mark"] is not None
