"""The hot path's load-independent costs, and the migration that made them.

Statements and WAL frames per put, and key work per listed entry, do not
depend on the machine's load, so they are guarded here (timings live in the
benchmarks). ``securepad.bench.costs`` measures them: SQLite's statement trace,
the WAL file's size after a truncating checkpoint, ``crypto.WORK``.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from securepad import (
    IntegrityError,
    InvalidArgumentError,
    Keyring,
    Policy,
    PolicyError,
    Principal,
    Scratchpad,
    SecurepadError,
)
from securepad.bench.costs import measure
from securepad.keys.keystore import WRAP_FLUSH_EVERY
from securepad.storage.sqlite import SCHEMA_VERSION
from securepad.store import parts, sqlite_of
from tests.support.counting import compiled
from tests.support.paths import FIXTURES
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.store_costs import listing_costs, put_costs, wal_frames

# A put into a turn whose head this process sealed last: BEGIN IMMEDIATE; the
# turn head's UPDATE, only while it is that head, the key version the newest and
# the step free; INSERT entries (a one-segment entry carries its segment:
# migration 8) only when that UPDATE wrote; COMMIT.
PUT_STATEMENTS = 4
# Else (another process wrote the turn last, or the entry has several segments):
# BEGIN IMMEDIATE; one SELECT of the key version, the quota, the step's look and
# the turn's head; INSERT entries; the turn head's upsert; COMMIT.
PUT_READING_HEAD_STATEMENTS = 5
# None: no trigger writes on a put; the usage total is the usage head's,
# written by the turn head's upsert (one statement, two rows: tables/heads/owner.py).
PUT_TRIGGER_STATEMENTS = 0
# A batch of given steps: BEGIN IMMEDIATE; one SELECT of the key version, the
# quota, the steps' latest expiry and the turn's heads; one INSERT of every entry;
# the heads' upsert; COMMIT, whatever the batch's size (up to 64 entries an INSERT; and
# with every 256th wrap of a key, its count: ``WRAP_FLUSH_EVERY``).
PUT_MANY_STATEMENTS = 5
# Measured on a store of 200 entries (bench/costs.py, 7 puts each): 4 KiB 7-11
# (entries leaf and overflow page, its id index and the turn index, owner_usage,
# the turn_heads leaf, page 1; more when a page splits), 64 KiB 23-27.
# Before migration 8 (segments row, its overflow and key index): 4 KiB 9-13, 64 KiB 24-25;
# before the turn heads: 9 and 25; before migration 6: 13.3 and 31.1.
# 4 KiB 12 when a turn_heads split (4 pages more) falls on a put whose row also
# takes a third entries page (the listing part shifts where rows end:
# 5 puts of 30 measured; i12 alone: 11, the split on a two-page put).
MAX_FRAMES = {4 * 1024: 12, 64 * 1024: 27}


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
        # One item key: one HKDF, one header digest; no unwrap (the owner key is cached);
        # no sealed head opened (the turn's is the one this process sealed last).
        assert (costs["key_derivations"], costs["key_unwraps"], costs["header_digests"]) == (1, 0, 1)
        assert costs["head_opens"] == 0


def test_a_put_into_an_owners_turn_writes_no_counter_page(db_path: Path, keyring: Keyring) -> None:
    """The owner's usage total is its usage head, which the put's turn-head
    upsert writes and which shares the turn head's page when the owner has few turns:
    20 puts of 4 KiB into an existing turn, measured (bench/costs.py) 130 frames
    (6 or 7 each), 150 with the owner_usage row before SQLite migration 11; 136
    since the turn's index holds each entry's id, expiry and stored bytes
    (schema 12: its leaf pages split more often)."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for step in range(200):
            pad.put(ALICE, f"turn-{step % 3}", step, "tool", "y" * 4096)
        frames = []
        for step in range(1000, 1020):
            assert sqlite_of(pad).checkpoint()
            pad.put(ALICE, "turn-1", step, "tool", "z" * 4096)
            frames.append(wal_frames(pad))
    assert sum(frames) <= 142, frames


def test_the_step_look_in_the_quota_statement_refuses_only_a_live_step_in_scope(
    db_path: Path, keyring: Keyring
) -> None:
    bob = Principal("bob", "agent", "web")
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "live", now=1000.0)
        pad.put(ALICE, "t", 2, "tool", "expires", 10, now=1000.0)
        pad.put(bob, "t", 3, "tool", "bob's step 3", now=1000.0)
        with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
            pad.put(ALICE, "t", 1, "tool", "again", now=1001.0)
        pad.put(ALICE, "t", 2, "tool", "after expiry", now=1011.0)  # the expired entry does not hold the step
        pad.put(ALICE, "t", 3, "tool", "alice's step 3", now=1001.0)  # bob's entry is outside alice's scope
        assert [e["summary"] for e in pad.list_for_turn(ALICE, "t", now=1011.0)] == [
            "live",
            "after expiry",
            "alice's step 3",
        ]


@pytest.mark.parametrize("count", [1, 8, 32])
def test_a_batch_of_up_to_64_runs_five_statements_whatever_its_size(filled: Scratchpad, count: int) -> None:
    steps = iter(range(1000, 1200))
    for _ in range(2):  # the first batch makes the turn's head; the second writes into it
        batch = [(next(steps), "tool", "b" * 4096) for _ in range(count)]
        costs = measure(filled, lambda batch=batch: filled.put_many(ALICE, f"batch-{count}", batch))
        assert costs["statements"] == PUT_MANY_STATEMENTS, costs
        assert (costs["key_derivations"], costs["header_digests"]) == (count, count)


def test_a_batch_refuses_a_taken_step_and_stores_nothing(filled: Scratchpad) -> None:
    filled.put_many(ALICE, "taken", [(1, "tool", "one"), (2, "tool", "two")])
    with pytest.raises(InvalidArgumentError, match="step 2 is already recorded"):
        filled.put_many(ALICE, "taken", [(3, "tool", "three"), (2, "tool", "again")])
    assert [e["step_num"] for e in filled.list_for_turn(ALICE, "taken")] == [1, 2]


def test_a_large_put_adds_one_statement_per_segment(filled: Scratchpad) -> None:
    costs = put_costs(filled, ALICE, 1024 * 1024)  # 16 segments of 64 KiB, in the segments table
    assert costs["statements"] == PUT_READING_HEAD_STATEMENTS + 16


def test_a_listing_is_one_query_and_constant_key_work_per_entry(filled: Scratchpad) -> None:
    for step in range(50):
        filled.put(ALICE, "long", step, "tool", f"observation {step}")
    costs = listing_costs(filled, ALICE, "long")
    assert costs["entries"] == 50
    assert costs["statements"] == 2  # the rows, and the turn head
    assert costs["wal_frames"] == 0
    # Each entry's listing part opens under the owner's listing key,
    # derived once and cached with the owner key: no per-entry key work at all.
    assert (costs["key_unwraps"], costs["key_derivations"], costs["header_digests"]) == (0, 0, 0)


# What SQLite compiles at every run of a read's turn statement: the
# ``PRAGMA data_version`` that the table-valued function prepares inside it.
_DATA_VERSION_PRAGMA = (apsw.SQLITE_PRAGMA, "data_version", None)


@pytest.mark.parametrize("operation", ["read", "get", "list_for_turn", "put", "put_many"])
def test_a_warm_call_runs_its_statements_as_compiled(filled: Scratchpad, operation: str) -> None:
    """No statement of a warm call is compiled again: none has a plan that
    depends on a bound value (SQLite would compile it again at every bind)."""
    entry = filled.list_for_turn(ALICE, "turn-3")[0]["scratchpad_id"]
    steps = iter(range(1000, 2000))
    calls = {
        "read": lambda: filled.read(ALICE, entry, "tail", n=2000),
        "get": lambda: filled.get(ALICE, entry),
        "list_for_turn": lambda: filled.list_for_turn(ALICE, "turn-3"),
        "put": lambda: filled.put(ALICE, "turn-3", next(steps), "tool", "z" * 4096),
        "put_many": lambda: filled.put_many(ALICE, "turn-4", [(next(steps), "tool", "z" * 4096) for _ in range(2)]),
    }
    call = calls[operation]
    call()  # warm
    found = compiled(sqlite_of(filled).conn, call)
    assert set(found) <= {_DATA_VERSION_PRAGMA}, found
    assert len(found) <= 1, found


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
        # (the empty one with the owner's first key, then the one listing the turn)
        # and 2 usage-head seals (a zero one with the key, then the turn's first grant:
        # a put within its turn's reservation does not rewrite the usage head)
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == 24
        assert _file_wraps(pad) == 0  # no counter UPDATE per put
        for step in range(10, WRAP_FLUSH_EVERY):
            pad.put(ALICE, "t", step, "tool", "x")
        assert 0 < _file_wraps(pad) < 3 * WRAP_FLUSH_EVERY + 3  # a put's transaction wrote them
        pad.put(ALICE, "t", WRAP_FLUSH_EVERY, "tool", "x")
        counted = pad.stats()["key_usage"]["owner_key_max_wraps"]
    # 257 item keys and turn heads, 2 owner heads, the zero usage head and one per grant (a few)
    assert 2 * (WRAP_FLUSH_EVERY + 1) + 4 <= counted <= 2 * (WRAP_FLUSH_EVERY + 1) + 8
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        assert _file_wraps(pad) == counted  # close wrote the rest
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == counted


def test_a_put_left_to_a_transaction_for_the_key_use_count_writes_it(db_path: Path, keyring: Keyring) -> None:
    """A put that leaves the one-message path because the owner key's use count is due
    is one whose transaction writes the count: no put runs a transaction of its own
    that only adds its wraps to the pending ones (the head's and its entry's, 2)."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        conn, keys = sqlite_of(pad).conn, parts(pad).keys
        statements: list[str] = []

        def traced(_cursor: apsw.Cursor, sql: str, _bindings: object) -> bool:
            statements.append(sql)
            return True

        conn.exec_trace = traced
        flushes, alone = 0, []
        for step in range(3 * WRAP_FLUSH_EVERY // 2):
            before = keys.pending_wraps().get(("alice", 1), 0)
            statements.clear()
            pad.put(ALICE, "t", step, "tool", "x")
            added = keys.pending_wraps().get(("alice", 1), 0) - before
            flushes += added < 0
            if step and len(statements) != PUT_STATEMENTS and added == 2:
                alone.append(step)  # a transaction that neither wrote the count nor a grant
        conn.exec_trace = None
    assert flushes >= 1
    assert alone == []


def test_a_put_refused_for_a_taken_step_counts_the_wraps_it_made(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "x")
        with pytest.raises(SecurepadError):
            pad.put(ALICE, "t", 1, "tool", "taken step")
        # item key, turn head, owner head (empty with the key, then listing the turn),
        # usage head (zero with the key, then the put's total); then the refused put's
        # item key and turn head, sealed before the store refused its step: never fewer
        # wraps counted than made
        assert pad.stats()["key_usage"]["owner_key_max_wraps"] == 8


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
    assert version == SCHEMA_VERSION  # 6, then 7 (the turn heads), 8 (one-segment entries inline)
    assert (after_entries, after_segments) == (entries + 1, segments)  # one segment: in its row (migration 8)
    names = {name for _, name in objects}
    assert {"entries_expires", "entries_owner_usage", "entries_v6", "segments_v6"}.isdisjoint(names)
    assert "entries_owner_turn" in names
    # Migration 11: the owner_usage triggers and table went; the usage heads took them over.
    assert {"owner_usage", "owner_usage_insert", "owner_usage_delete", "owner_usage_update"}.isdisjoint(names)
    conn = apsw.Connection(str(path))
    try:
        sql = {str(n): str(s) for n, s in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    assert "WITHOUT ROWID" not in sql["entries"] and "WITHOUT ROWID" not in sql["segments"]


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


# -- migration 8: a one-segment entry's segment in its row --------------------------------------------


def _v7_store(tmp_path: Path) -> tuple[Path, Keyring]:
    """A copy of the schema-7 store written by main e7494e0 (``tests/fixtures/make_store_v7.py``)."""
    expected = json.loads((FIXTURES / "store_v7.json").read_text())
    path = tmp_path / "store.db"
    shutil.copy(FIXTURES / "store_v7.db", path)
    path.chmod(0o600)
    keys = tmp_path / "keys"
    keys.mkdir()
    for source, target in (("store_v7.key", "key"), ("store_v7.anchor", f"anchor-{expected['store_id']}")):
        (keys / target).write_bytes((FIXTURES / source).read_bytes())
        (keys / target).chmod(0o600)
    return path, Keyring.from_key_file(keys / "key")


def _entry_columns(path: Path) -> list[str]:
    conn = apsw.Connection(str(path))
    try:
        return [str(row[1]) for row in conn.execute("PRAGMA table_info(entries)")]
    finally:
        conn.close()


def _stored(path: Path, entry_id: str) -> tuple[bool, int]:
    """(whether the entry's row holds its segment, how many segments rows it has)."""
    conn = apsw.Connection(str(path))
    try:
        inline = conn.execute("SELECT only_segment IS NOT NULL FROM entries WHERE id = ?", (entry_id,)).fetchall()
        count = conn.execute("SELECT COUNT(*) FROM segments WHERE entry_id = ?", (entry_id,)).fetchall()
    finally:
        conn.close()
    return bool(inline[0][0]), int(count[0][0])  # type: ignore[arg-type]


def test_migration_8_keeps_a_one_segment_entry_in_its_row_and_reads_old_rows(tmp_path: Path) -> None:
    path, keyring = _v7_store(tmp_path)
    expected = json.loads((FIXTURES / "store_v7.json").read_text())
    old_small, old_large = expected["entries"]["small_text"]["id"], expected["entries"]["text"]["id"]
    assert _schema(path)[0] == 7 and "only_segment" not in _entry_columns(path)
    with Scratchpad.open(path, keyring=keyring) as pad:
        small = pad.put(ALICE, "after-8", 1, "tool", "a small observation")["scratchpad_id"]
        large = pad.put(ALICE, "after-8", 2, "tool", "z" * (3 * 64 * 1024))["scratchpad_id"]
        batch = [v["scratchpad_id"] for v in pad.put_many(ALICE, "after-8", [(3, "t", "one"), (4, "t", "y" * 70_000)])]
        assert pad.get(ALICE, small).observation == "a small observation"
        assert pad.read(ALICE, large, "tail", n=3)["content"] == "zzz"
        assert [pad.get(ALICE, i).observation for i in batch] == ["one", "y" * 70_000]
        assert pad.get(ALICE, old_small).observation == "a one-segment text\nwith two lines"
        assert pad.read(ALICE, old_large, "tail", n=9)["content"] == "last line"
        assert pad.verify()["ok"]
    assert _schema(path)[0] == SCHEMA_VERSION and "only_segment" in _entry_columns(path)
    assert _stored(path, small) == (True, 0)  # no segments row
    assert _stored(path, batch[0]) == (True, 0)
    assert _stored(path, large) == (False, 3)  # several segments: the segments table, as before
    assert _stored(path, batch[1]) == (False, 2)
    assert _stored(path, old_small) == (False, 1)  # written before: left where it was


def test_a_tampered_inline_segment_is_refused(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        mine = pad.put(ALICE, "t", 1, "tool", "mine")["scratchpad_id"]
        other = pad.put(ALICE, "t", 2, "tool", "other")["scratchpad_id"]
    conn = apsw.Connection(str(db_path))
    conn.execute(
        "UPDATE entries SET only_segment = (SELECT only_segment FROM entries WHERE id = ?) WHERE id = ?", (other, mine)
    )
    conn.close()
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, mine)
        assert pad.get(ALICE, other).observation == "other"
        assert not pad.verify()["ok"]


def test_a_failed_migration_8_leaves_the_v7_store_as_it_was(tmp_path: Path) -> None:
    path, keyring = _v7_store(tmp_path)
    conn = apsw.Connection(str(path))
    conn.execute("ALTER TABLE entries ADD COLUMN only_segment TEXT")  # makes migration 8 fail
    conn.close()
    before = _schema(path)
    assert before[0] == 7
    with pytest.raises(SecurepadError):
        Scratchpad.open(path, keyring=keyring)
    assert _schema(path) == before
    conn = apsw.Connection(str(path))
    conn.execute("ALTER TABLE entries DROP COLUMN only_segment")
    conn.close()
    with Scratchpad.open(path, keyring=keyring) as pad:
        assert _schema(path)[0] == SCHEMA_VERSION
        assert pad.stats()["entries"] == before[2]
        assert pad.verify()["ok"]


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
