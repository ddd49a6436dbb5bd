"""A turn left empty (its last row deleted, or collected by gc) leaves no head.

Its head is deleted and the turn dropped from the owner head (and its
reservation from the usage head) in the transaction that empties it, so that
its clear turn id does not stay in ``turn_heads`` (nor, after a scrub, in the
file). The sealed owner head is what tells that from a turn removed by
someone without the key: a turn it still lists must have a head, so a turn
removed whole (rows and head) while it held rows is refused as before.
"""

from __future__ import annotations

import secrets
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import IntegrityError, Keyring, Principal, Scratchpad
from securepad.store import parts
from securepad.tables.entries.entries import every_row
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import Raw, as_admin, on_sqlite, whole_turn_removed

SECRET = "turn-named-after-a-secret"


def _raw(pad: Scratchpad, where: Any) -> AbstractContextManager[Raw]:
    return on_sqlite(where) if pad.backend == "sqlite" else as_admin(where)


def _head_turns(pad: Scratchpad) -> set[str]:
    rows = parts(pad).db.query("SELECT turn_id FROM turn_heads WHERE owner_user_id = 'alice'", admin=True)
    return {str(row["turn_id"]) for row in rows} - {OWNER_HEAD, USAGE_HEAD}


def _listed(pad: Scratchpad) -> set[str]:
    owner_head = parts(pad).heads.all_heads()["alice"][OWNER_HEAD]
    assert isinstance(owner_head, set)
    return owner_head


def test_deleting_a_turns_last_entry_deletes_its_head(pad: Scratchpad) -> None:
    ids = [pad.put(ALICE, SECRET, step, "tool", "x" * 3000, now=NOW)["scratchpad_id"] for step in (1, 2)]
    pad.put(ALICE, "kept", 1, "tool", "y", now=NOW)
    assert _head_turns(pad) == _listed(pad) == {SECRET, "kept"}
    pad.delete(ALICE, ids[0], now=NOW)
    assert _head_turns(pad) == {SECRET, "kept"}  # one entry left: the turn stays
    pad.delete(ALICE, ids[1], now=NOW)
    assert _head_turns(pad) == _listed(pad) == {"kept"}
    assert pad.turn(ALICE, SECRET, now=NOW).history(now=NOW) == []
    report = pad.verify(now=NOW)
    assert report["ok"], report["problems"]  # the usage head lost the turn's reservation too
    # The turn id used again starts afresh.
    pad.put(ALICE, SECRET, 1, "tool", "again", now=NOW)
    assert len(pad.turn(ALICE, SECRET, now=NOW).history(now=NOW)) == 1
    assert pad.verify(now=NOW)["ok"]


def test_a_turn_with_records_left_keeps_its_head(pad: Scratchpad) -> None:
    entry = pad.put(ALICE, SECRET, 1, "tool", "x", now=NOW)["scratchpad_id"]
    pad.turn(ALICE, SECRET, now=NOW).checkpoint(facts=["a fact"], now=NOW)
    pad.delete(ALICE, entry, now=NOW)
    assert _head_turns(pad) == {SECRET}
    assert pad.turn(ALICE, SECRET, now=NOW).latest_checkpoint(now=NOW) is not None
    assert pad.verify(now=NOW)["ok"]


def test_gc_that_collects_a_whole_turn_deletes_its_head(pad: Scratchpad) -> None:
    pad.put(ALICE, SECRET, 1, "tool", "x" * 3000, ttl_seconds=60, now=NOW)
    pad.turn(ALICE, SECRET, now=NOW).checkpoint(facts=["a fact"], ttl_seconds=60, now=NOW)
    pad.put(ALICE, "kept", 1, "tool", "y", ttl_seconds=3600, now=NOW)
    assert pad.gc(now=NOW + 120) == 1
    assert _head_turns(pad) == _listed(pad) == {"kept"}
    report = pad.verify(now=NOW + 120)
    assert report["ok"], report["problems"]


@pytest.mark.sqlite_only
def test_after_gc_and_a_scrub_the_turn_id_is_nowhere_in_the_file(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, SECRET, 1, "tool", "x" * 3000, ttl_seconds=60, now=NOW)
        pad.put(ALICE, "kept", 1, "tool", "y", ttl_seconds=3600, now=NOW)
        pad.gc(now=NOW + 120)  # waits, deletes, scrubs
    for path in db_path.parent.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path


def test_a_turn_removed_whole_while_it_held_rows_is_still_refused(pad: Scratchpad, store_location: Any) -> None:
    s = {"ids": [pad.put(ALICE, "t1", step, "tool", "x", now=NOW)["scratchpad_id"] for step in (1, 2)]}
    pad.put(ALICE, "t2", 1, "tool", "y", now=NOW)
    with _raw(pad, store_location) as raw:
        whole_turn_removed(raw, s)
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        with pytest.raises(IntegrityError, match="removed"):
            again.turn(ALICE, "t1", now=NOW).history(now=NOW)
        with pytest.raises(IntegrityError, match="removed"):
            again.put(ALICE, "t1", 3, "tool", "z", now=NOW)
        assert ("t1", "turn head") in {(p["turn_id"], p["what"]) for p in again.verify(now=NOW)["problems"]}


def test_an_emptied_turn_put_back_from_a_copy_is_named_by_verify(pad: Scratchpad, store_location: Any) -> None:
    """Rows and head put back after the turn was emptied: a one-turn rollback
    (SECURITY.md); its head is not in the owner head, which ``verify`` names."""
    entry = pad.put(ALICE, SECRET, 1, "tool", "x", now=NOW)["scratchpad_id"]
    pad.put(ALICE, "kept", 1, "tool", "y", now=NOW)
    taken: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
    with _raw(pad, store_location) as raw:
        for table in ("entries", "turn_heads"):
            columns = raw.columns(table)
            rows = raw.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE turn_id = ?", (SECRET,))
            taken[table] = (columns, rows)
    pad.delete(ALICE, entry, now=NOW)
    with _raw(pad, store_location) as raw:
        for table, (columns, rows) in taken.items():
            for row in rows:
                marks = ", ".join("?" * len(columns))
                raw.execute(f"INSERT INTO {table}({', '.join(columns)}) VALUES ({marks})", row)
    problems = {(p["turn_id"], p["what"], p["problem"]) for p in pad.verify(now=NOW)["problems"]}
    assert (SECRET, "turn head", "a turn head the owner head does not list") in problems


@pytest.mark.sqlite_only
def test_gc_that_empties_many_turns_of_an_owner_rewrites_its_owner_head_once(db_path: Path, keyring: Keyring) -> None:
    """An owner head grows with the owner's turns: one rewrite per emptied turn would cost O(turns^2)."""
    import apsw

    from securepad.store import sqlite_of

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for turn in range(12):
            pad.put(ALICE, f"t{turn}", 1, "tool", "x" * 500, ttl_seconds=60, now=NOW)
        pad.put(ALICE, "kept", 1, "tool", "y", ttl_seconds=3600, now=NOW)
        statements: list[str] = []
        conn = sqlite_of(pad).conn
        conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda event: statements.append(str(event["sql"])))
        try:
            assert pad.gc(now=NOW + 120) == 12
        finally:
            conn.trace_v2(0, None)
        upserts = [sql for sql in statements if sql.startswith("INSERT INTO turn_heads")]
        assert len(upserts) == 1  # the owner head and the usage head, once
        assert len([sql for sql in statements if sql.startswith("DELETE FROM turn_heads")]) == 12
        assert _head_turns(pad) == _listed(pad) == {"kept"}
        assert pad.verify(now=NOW + 120)["ok"]


@settings(max_examples=20)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "delete", "gc"]), st.integers(0, 3), st.integers(0, 7)),
        min_size=1,
        max_size=14,
    )
)
def test_the_owner_head_lists_exactly_the_turns_that_hold_rows(
    db_path: Path, keyring: Keyring, steps: list[tuple[str, int, int]]
) -> None:
    owner = f"o{secrets.token_hex(4)}"  # each example an owner of its own, in one store
    who = Principal(owner, "planner", "web")
    now = NOW
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(who, "anchor-turn", 1, "tool", "keeps the owner", ttl_seconds=86_400, now=now)
        taken = dict.fromkeys(range(4), 0)
        for action, turn, pick in steps:
            if action == "put":
                taken[turn] += 1
                pad.put(
                    who, f"t{turn}", taken[turn], "tool", "x" * 100 * (pick + 1), ttl_seconds=50 + pick * 10, now=now
                )
            elif action == "delete":
                listed = pad.list_for_turn(who, f"t{turn}", now=now)
                if listed:
                    pad.delete(who, listed[pick % len(listed)]["scratchpad_id"], now=now)
            else:
                now += 40
                pad.gc(now=now, wait=False)
        heads = parts(pad).heads.all_heads()[owner]
        with_rows = {str(row["turn_id"]) for row in every_row(parts(pad).db) if row["owner_user_id"] == owner}
        assert heads[OWNER_HEAD] == with_rows == set(heads) - {OWNER_HEAD, USAGE_HEAD}
        report = pad.verify(now=now)
        assert report["ok"], report["problems"]
