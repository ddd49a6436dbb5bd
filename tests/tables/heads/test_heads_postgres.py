"""On PostgreSQL: the constant-size heads refuse rows deleted, altered
or removed with their heads by the database's owner (the admin side), on the
read path of the turn, and verify names them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from securepad import IntegrityError, Keyring, Scratchpad  # noqa: E402
from tests.support.principals import ALICE, BOB, NOW  # noqa: E402

TURN = "t1"


def _filled(pg_dsn: str, keyring: Keyring) -> list[str]:
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        ids = [pad.put(ALICE, TURN, s, "tool", f"step {s} " + "x" * 2000, now=NOW)["scratchpad_id"] for s in (1, 2, 3)]
        pad.turn(ALICE, TURN, now=NOW).checkpoint(facts=["a"], now=NOW)
        pad.put(BOB, TURN, 1, "tool", "bob's", now=NOW)
    return ids


def _sql(pg_dsn: str, *statements: tuple[str, tuple[Any, ...]]) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = securepad")
        for sql, params in statements:
            conn.execute(sql, params)


EDITS: dict[str, Callable[[list[str]], list[tuple[str, tuple[Any, ...]]]]] = {
    "tail_truncation": lambda ids: [("DELETE FROM entries WHERE id = %s", (ids[2],))],
    "expiry_moved_earlier": lambda ids: [("UPDATE entries SET expires_at = %s WHERE id = %s", (NOW + 10, ids[1]))],
    "stored_bytes_changed": lambda ids: [("UPDATE entries SET stored_bytes = 1 WHERE id = %s", (ids[0],))],
    "checkpoint_deleted": lambda ids: [("DELETE FROM checkpoints WHERE owner_user_id = 'alice'", ())],
    "owner_emptied": lambda ids: [
        (f"DELETE FROM {table} WHERE owner_user_id = 'alice'", ())
        for table in ("segments", "entries", "checkpoints", "compaction_marks", "turn_heads")
    ],
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_admin_edit_is_refused_on_the_turn_read_and_named_by_verify(
    pg_dsn: str, keyring: Keyring, edit: str
) -> None:
    ids = _filled(pg_dsn, keyring)
    _sql(pg_dsn, *EDITS[edit](ids))
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=NOW).history(now=NOW + 100)
        with pytest.raises(IntegrityError):
            pad.list_for_turn(ALICE, TURN, now=NOW + 100)
        assert len(pad.turn(BOB, TURN, now=NOW).history(now=NOW + 100)) == 1  # bob's turn is untouched
        report = pad.verify(now=NOW + 100)
    assert [p["owner_user_id"] for p in report["problems"]] and {p["owner_user_id"] for p in report["problems"]} == {
        "alice"
    }


def test_a_genuine_store_after_delete_extend_and_gc_verifies(pg_dsn: str, keyring: Keyring) -> None:
    ids = _filled(pg_dsn, keyring)
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.delete(ALICE, ids[1])
        pad.turn(ALICE, TURN, now=NOW).resume(extend_ttl=7200, now=NOW + 100)
        pad.put(ALICE, TURN, 9, "tool", "short", ttl_seconds=10, now=NOW + 100)
        assert pad.gc(now=NOW + 200) == 1
        assert [e["step_num"] for e in pad.list_for_turn(ALICE, TURN, now=NOW + 200)] == [1, 3]
        assert pad.turn(ALICE, TURN, now=NOW).tools(now=NOW + 200)
        assert pad.verify(now=NOW + 200)["ok"]
