"""The hot path's load-independent costs (issue 13), and the migration that made them.

Statements and WAL frames per put, and key work per listed entry, do not
depend on the machine's load, so they are guarded here (timings live in the
benchmarks). ``securepad.bench.costs`` measures them: SQLite's statement trace,
the WAL file's size after a truncating checkpoint, ``crypto.WORK``.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from securepad import Keyring, Policy, PolicyError, Principal, Scratchpad, SecurepadError
from securepad._db import SCHEMA_VERSION
from securepad.bench.costs import listing_costs, put_costs
from securepad.keystore import WRAP_FLUSH_EVERY
from securepad.store import sqlite_of

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ALICE = Principal("alice", "agent", "web")

# BEGIN IMMEDIATE; the step's look; one SELECT of the key version and the quota;
# INSERT entries; INSERT segments (one per 64 KiB segment); the turn head's
# SELECT and upsert (issue 14); COMMIT.
PUT_STATEMENTS = 8  # issue 14: + the turn head's SELECT and its upsert
# The owner_usage trigger: its firing and its upsert.
PUT_TRIGGER_STATEMENTS = 2
# Measured on a store of 200 entries: 4 KiB 9 (entries leaf, its id index and
# the turn index, a segments leaf + overflow page and its key index,
# owner_usage, page 1); 64 KiB 25. Before migration 6: 13.3 and 31.1.
# Issue 14's turn head adds its turn_heads leaf: 4 KiB 11-13, 64 KiB 28-30 measured
# (13 and 30 when the new turn's head split a turn_heads page).
MAX_FRAMES = {4 * 1024: 13, 64 * 1024: 30}


@pytest.fixture
def filled(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    pad = Scratchpad.open(db_path, keyring=keyring)
    for step in range(200):
        pad.put(ALICE, f"turn-{step % 20}", step, "tool", "y" * 4096)
    yield pad
    pad.close()


@pytest.mark.parametrize("size", sorted(MAX_FRAMES))
def test_a_put_runs_few_statements_and_appends_few_wal_frames(filled: Scratchpad, size: int) -> None:
    runs = [put_costs(filled, ALICE, size) for _ in range(5)]
    for costs in runs:
        assert costs["statements"] == PUT_STATEMENTS, costs
        assert costs["trigger_statements"] == PUT_TRIGGER_STATEMENTS, costs
        assert costs["wal_frames"] <= MAX_FRAMES[size], costs
        # One item key: one HKDF, one header digest; no unwrap (the owner key is cached).
        assert (costs["key_derivations"], costs["key_unwraps"], costs["header_digests"]) == (1, 0, 1)


def test_a_large_put_adds_one_statement_per_segment(filled: Scratchpad) -> None:
    costs = put_costs(filled, ALICE, 1024 * 1024)  # 16 segments of 64 KiB
    assert costs["statements"] == PUT_STATEMENTS + 15


def test_a_listing_is_one_query_and_constant_key_work_per_entry(filled: Scratchpad) -> None:
    for step in range(50):
        filled.put(ALICE, "long", step, "tool", f"observation {step}")
    costs = listing_costs(filled, ALICE, "long")
    assert costs["entries"] == 50
    assert costs["statements"] == 2  # the rows, and the turn head (issue 14)
    assert costs["wal_frames"] == 0
    # Today: the item key of each entry is unwrapped and expanded (issue 13 wants one key per owner).
    assert costs["key_unwraps"] <= costs["entries"]
    assert costs["key_derivations"] <= costs["entries"]
    assert costs["header_digests"] <= costs["entries"]


def _file_wraps(pad: Scratchpad) -> int:
    rows = sqlite_of(pad).query("SELECT MAX(wrap_count) AS n FROM owner_keys", admin=True)
    return int(rows[0]["n"] or 0)


def test_wrap_counts_are_kept_in_memory_and_written_with_a_later_put_and_at_close(
    db_path: Path, keyring: Keyring
) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for step in range(10):
            pad.put(ALICE, "t", step, "tool", "x")
        # file + this process's pending: 10 item keys, 10 turn-head seals, 2 owner-head seals
        # (issue 14: the empty one with the owner's first key, then the one listing the turn)
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == 22
        assert _file_wraps(pad) == 0  # no counter UPDATE per put
        for step in range(10, WRAP_FLUSH_EVERY):
            pad.put(ALICE, "t", step, "tool", "x")
        assert 0 < _file_wraps(pad) < 2 * WRAP_FLUSH_EVERY + 2  # a put's transaction wrote them
        pad.put(ALICE, "t", WRAP_FLUSH_EVERY, "tool", "x")
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        assert _file_wraps(pad) == 2 * (WRAP_FLUSH_EVERY + 1) + 2  # close wrote the rest
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == 2 * (WRAP_FLUSH_EVERY + 1) + 2


def test_a_failed_put_counts_no_wrap(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "x")
        with pytest.raises(SecurepadError):
            pad.put(ALICE, "t", 1, "tool", "taken step")
        # item key, turn head, owner head (empty with the key, then listing the turn)
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == 4


# -- migration 6 --------------------------------------------------------------------------------


def _old_store(tmp_path: Path) -> tuple[Path, Keyring]:
    path = tmp_path / "store.db"
    shutil.copy(FIXTURES / "store_v1.db", path)
    path.chmod(0o600)
    key = tmp_path / "key"
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    return path, Keyring.from_key_file(key)


def _schema(path: Path) -> tuple[int, list[tuple[str, str]], int, int]:
    conn = apsw.Connection(str(path))
    try:
        version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
        objects = [(str(t), str(n)) for t, n in conn.execute("SELECT type, name FROM sqlite_master ORDER BY name")]
        entries = int(conn.execute("SELECT COUNT(*) FROM entries").fetchall()[0][0])  # type: ignore[arg-type]
        segments = int(conn.execute("SELECT COUNT(*) FROM segments").fetchall()[0][0])  # type: ignore[arg-type]
    finally:
        conn.close()
    return version, objects, entries, segments


def test_migration_6_makes_rowid_tables_with_only_the_indexes_queries_need(tmp_path: Path) -> None:
    path, keyring = _old_store(tmp_path)
    version, _, entries, segments = _schema(path)
    assert version == 5
    with Scratchpad.open(path, keyring=keyring) as pad:
        pad.put(ALICE, "after-migration", 1, "tool", "new entry")
        assert pad.read(ALICE, pad.list_for_turn(ALICE, "after-migration")[0]["scratchpad_id"])["content"]
    version, objects, after_entries, after_segments = _schema(path)
    assert version == SCHEMA_VERSION  # 6, then 7 (issue 14's turn heads)
    assert (after_entries, after_segments) == (entries + 1, segments + 1)
    names = {name for _, name in objects}
    assert {"entries_expires", "entries_owner_usage", "entries_v6", "segments_v6"}.isdisjoint(names)
    assert {"entries_owner_turn", "owner_usage_insert", "owner_usage_delete", "owner_usage_update"} <= names
    conn = apsw.Connection(str(path))
    try:
        sql = {str(n): str(s) for n, s in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
        usage = conn.execute("SELECT SUM(stored_bytes) FROM entries").fetchall()[0][0]
        counted = conn.execute("SELECT SUM(stored_bytes) FROM owner_usage").fetchall()[0][0]
    finally:
        conn.close()
    assert "WITHOUT ROWID" not in sql["entries"] and "WITHOUT ROWID" not in sql["segments"]
    assert usage == counted  # the triggers came back with the tables


def test_a_failed_migration_leaves_the_old_store_as_it_was(tmp_path: Path) -> None:
    path, keyring = _old_store(tmp_path)
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE segments_v6(x)")  # makes migration 6 fail halfway
    conn.close()
    before = _schema(path)
    with pytest.raises(SecurepadError):
        Scratchpad.open(path, keyring=keyring)
    assert _schema(path) == before
    conn = apsw.Connection(str(path))
    conn.execute("DROP TABLE segments_v6")
    conn.close()
    with Scratchpad.open(path, keyring=keyring) as pad:
        assert _schema(path)[0] == SCHEMA_VERSION
        assert pad.stats()["entries"] == before[2]


# -- durability -----------------------------------------------------------------------------------


def _synchronous(pad: Scratchpad) -> int:
    return int(sqlite_of(pad).conn.execute("PRAGMA synchronous").fetchall()[0][0])  # type: ignore[arg-type]


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
def test_durability_sets_synchronous_on_every_connection(
    db_path: Path, keyring: Keyring, durability: str, synchronous: int
) -> None:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "storage": {"durability": durability}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        assert pad.policy.durability == durability
        assert _synchronous(pad) == synchronous
        seen: list[int] = []
        worker = threading.Thread(target=lambda: seen.append(_synchronous(pad)))  # another thread's connection
        worker.start()
        worker.join()
        assert seen == [synchronous]
        pad.put(ALICE, "t", 1, "tool", "kept")
        assert pad.get(ALICE, pad.list_for_turn(ALICE, "t")[0]["scratchpad_id"]).observation == "kept"


def test_the_default_durability_is_normal() -> None:
    assert Policy.default().durability == "normal"


@pytest.mark.parametrize("value", ["off", "FULL", 2, True, ""])
def test_an_unknown_durability_is_refused(value: object) -> None:
    with pytest.raises(PolicyError, match=r"storage\.durability"):
        Policy.from_dict({"access": {"scope": "owner"}, "storage": {"durability": value}})
