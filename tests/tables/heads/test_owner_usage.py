"""Each owner's quota reservation lives in its sealed usage head (``tables.heads.owner``).

the usage head holds the sum of the owner's turns' reservations,
and each turn head its bytes and its reservation: ``totals`` must equal
``reserved`` (the sum of the turns' ``r``), and ``used`` (the sum of their ``b``)
the entries' stored bytes.

No per-put counter row: the ``owner_usage`` table and its triggers are gone
(SQLite migration 11, PostgreSQL 8); the put writes the usage head with its
turn head in one statement; every write that adds or removes entries keeps the
total exact; the quota reads it; ``verify`` checks it against the entries; a
store written before is given its totals at the next open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from securepad import Keyring, Policy, QuotaExceededError, Scratchpad
from securepad.store import parts, sqlite_of
from securepad.tables.entries.entries import every_row
from securepad.tables.heads.heads import USAGE_HEAD
from tests.support.fixture_v7 import EXPECTED, copy_v7
from tests.support.older_heads import as_format_2
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import AGENT_BOB as BOB
from tests.support.principals import NOW
from tests.support.usage import exact, reserved, stored, totals, turns


def test_every_write_keeps_the_usage_total_exact(pad: Scratchpad) -> None:
    first = pad.put(ALICE, "t", 1, "tool", "x" * 5000, ttl_seconds=10, now=NOW)
    pad.put(ALICE, "t", 2, "tool", "y" * 100_000, now=NOW)
    pad.put_many(ALICE, "u", [(1, "tool", "a"), (2, "tool", b"b" * 3000)], now=NOW)
    pad.put(BOB, "t", 1, "tool", "bob's", now=NOW)
    exact(pad)
    before = totals(pad)["alice"]
    pad.delete(ALICE, pad.list_for_turn(ALICE, "u", now=NOW)[0]["scratchpad_id"], now=NOW)
    exact(pad)
    assert totals(pad)["alice"] < before  # a removal gives back what it held
    assert pad.gc(now=NOW + 20) == 1  # the first entry expired and is collected
    assert first["scratchpad_id"] not in {row["id"] for row in every_row(parts(pad).db)}
    exact(pad)
    pad.forget_owner("bob")
    assert "bob" not in totals(pad)
    assert pad.verify(now=NOW + 20)["ok"]


def test_a_new_owner_starts_at_zero_and_an_emptied_turn_gives_back_its_whole_reservation(pad: Scratchpad) -> None:
    pad.put(BOB, "t", 1, "tool", "x", now=NOW)
    pad.delete(BOB, pad.list_for_turn(BOB, "t", now=NOW)[0]["scratchpad_id"], now=NOW)
    pad.put(ALICE, "u", 1, "tool", "y", now=NOW)
    entry = pad.put(ALICE, "t", 1, "tool", "x", now=NOW)
    pad.delete(ALICE, entry["scratchpad_id"], now=NOW)
    # The delete left the turn empty: its head went, and with it the rest of its grant.
    assert totals(pad) == {"alice": reserved(pad)["alice"], "bob": 0} and set(stored(pad)) == {"alice"}
    assert turns(pad, "b") == {"alice": stored(pad)["alice"]}
    assert pad.verify(now=NOW)["ok"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "delete", "many"]), st.integers(0, 9_000), st.sampled_from(["a", "b"])),
        max_size=12,
    )
)
def test_the_total_equals_the_entries_after_any_writes(tmp_path: Path, ops: list[tuple[str, int, str]]) -> None:
    path = tmp_path / f"store-{abs(hash(tuple(ops)))}.db"
    with Scratchpad.open(path, keyring=Keyring.from_key_file(tmp_path / "key")) as pad:
        step = 0
        for op, size, turn in ops:
            step += 2
            listed = pad.list_for_turn(ALICE, turn, now=NOW)
            if op == "delete" and listed:
                pad.delete(ALICE, listed[size % len(listed)]["scratchpad_id"], now=NOW)
            elif op == "many":
                pad.put_many(ALICE, turn, [(step, "tool", "m" * size), (step + 1, "tool", b"n")], now=NOW)
            else:
                pad.put(ALICE, turn, step, "tool", "p" * size, now=NOW)
        exact(pad)
        assert pad.verify(now=NOW)["ok"]


def test_the_quota_reads_the_usage_total_and_a_refused_put_changes_nothing(
    store_location: Any, keyring: Keyring
) -> None:
    policy = Policy(owner_quota_bytes=20_000, max_entry_bytes=10_000)
    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        kept = pad.put(ALICE, "t", 1, "tool", "k" * 8_000, now=NOW)
        pad.put(ALICE, "t", 2, "tool", "k" * 8_000, now=NOW)
        before = totals(pad)
        with pytest.raises(QuotaExceededError):
            pad.put(ALICE, "t", 3, "tool", "k" * 8_000, now=NOW)
        with pytest.raises(QuotaExceededError):
            pad.put_many(ALICE, "t", [(3, "tool", "k" * 5_000), (4, "tool", "k" * 5_000)], now=NOW)
        assert totals(pad) == before
        pad.put(BOB, "t", 1, "tool", "k" * 8_000, now=NOW)  # another owner's quota is its own
        pad.delete(ALICE, kept["scratchpad_id"], now=NOW)
        pad.put(ALICE, "t", 3, "tool", "k" * 8_000, now=NOW)  # the delete made room
        exact(pad)


@pytest.mark.sqlite_only
def test_without_its_usage_head_the_quota_sums_the_entries_and_verify_names_it(db_path: Path, keyring: Keyring) -> None:
    policy = Policy(owner_quota_bytes=20_000, max_entry_bytes=10_000)
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        pad.put(ALICE, "t", 1, "tool", "k" * 8_000, now=NOW)
        pad.put(ALICE, "t", 2, "tool", "k" * 8_000, now=NOW)
    conn = apsw.Connection(str(db_path))
    conn.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (USAGE_HEAD,))
    conn.close()
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        with pytest.raises(QuotaExceededError):  # the exact sum over the live entries still refuses
            pad.put(ALICE, "t", 3, "tool", "k" * 8_000, now=NOW)
        problems = pad.verify(now=NOW)["problems"]
    assert [(p["owner_user_id"], p["what"]) for p in problems] == [("alice", "owner usage")]


@pytest.mark.sqlite_only
def test_a_put_runs_no_trigger_and_within_its_reservation_writes_its_turn_head_only(
    db_path: Path, keyring: Keyring
) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "x", now=NOW)
        conn = apsw.Connection(str(db_path))
        try:
            names = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
        assert not {name for name in names if "owner_usage" in name}
        statements: list[str] = []
        conn = sqlite_of(pad).conn
        conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda event: statements.append(str(event["sql"])))
        try:
            pad.put(ALICE, "t", 2, "tool", "y", now=NOW)
        finally:
            conn.trace_v2(0, None)
        # The turn head alone, no usage head: one head's upsert, or (the head this process
        # sealed last) the UPDATE of the turn's one head row.
        writes = [sql for sql in statements if sql.startswith(("INSERT INTO turn_heads", "UPDATE turn_heads"))]
        assert len(writes) == 1
        assert writes[0].count("(?, ?, ?, ?)") == 1 or writes[0].startswith(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?"
        )


def test_a_store_from_before_usage_heads_gets_them_at_open(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    conn = apsw.Connection(str(db))
    try:
        counted = dict(conn.execute("SELECT owner_user_id, stored_bytes FROM owner_usage").fetchall())
    finally:
        conn.close()
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: EXPECTED["now"]) as pad:
        # The migration's totals are the triggers' ones: expired entries not yet collected count.
        # Converted turns reserve what they hold: the sum of reservations is the sum of bytes.
        assert totals(pad) == counted == stored(pad) == reserved(pad)
        assert pad.verify(now=EXPECTED["now"])["ok"]
        pad.put(ALICE, "after", 1, "tool", "z" * 3000, now=EXPECTED["now"])
        exact(pad)
    conn = apsw.Connection(str(db))
    try:
        names = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}
        flag = conn.execute("SELECT value FROM store_meta WHERE key = 'owner_usage'").fetchall()
    finally:
        conn.close()
    assert not {name for name in names if "owner_usage" in name} and flag == []


def test_a_postgresql_store_from_before_usage_heads_gets_them_at_open(pg_dsn: str, keyring: Keyring) -> None:
    psycopg = pytest.importorskip("psycopg")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "x" * 5000, now=NOW)
        pad.put(BOB, "t", 1, "tool", "y" * 100, now=NOW)
        expected = stored(pad)
        as_format_2(pad)  # the heads of a store from before usage heads
    with psycopg.connect(pg_dsn) as conn:  # as PostgreSQL migration 8 leaves a store written before it
        conn.execute("SET ROLE securepad_admin")
        conn.execute("SET search_path = securepad")
        conn.execute("DELETE FROM turn_heads WHERE turn_id = %s", (USAGE_HEAD,))
        conn.execute("INSERT INTO store_meta(key, value) VALUES ('owner_usage', 'seed')")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        assert totals(pad) == reserved(pad)  # seeded with the turns' reservations
        assert pad.verify(now=NOW)["ok"]
        exact(pad)
        assert stored(pad) == expected
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET search_path = securepad")
        assert conn.execute("SELECT value FROM store_meta WHERE key = 'owner_usage'").fetchall() == []
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'securepad'").fetchall()
    assert ("owner_usage",) not in tables
