"""Faults on the SQLite backend: connections of ended threads, a full
disk, a damaged file, a long reader against the WAL, ``now=`` values, the file
shrinking after gc. Every failure is a typed ``SecurepadError``, never a raw
apsw exception, and leaves the store as it was."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import apsw
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from securepad import (
    InvalidArgumentError,
    Keyring,
    NotFoundError,
    Policy,
    Scratchpad,
    StorageFullError,
    StoreBusyError,
    StoreCorruptError,
)
from securepad.cli import main
from securepad.store import sqlite_of
from tests.support.faults import damaged_copies, exercise
from tests.support.principals import ALICE


def assert_one_error(result: Any, name: str) -> None:
    """The CLI failed with exit status 1 and one line on stderr naming
    ``name``, never a traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.startswith(f"error: {name}: ")
    assert result.stderr.count("\n") == 1, result.stderr


def assert_json_error(result: Any, name: str) -> dict[str, str]:
    """With ``--json``: exit status 1 and one JSON object on stderr whose type is ``name``."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1, result.stderr
    error: dict[str, str] = json.loads(result.stderr)["error"]
    assert error["type"] == name and error["message"]
    return error


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- 1. a thread's connection ends with the thread ------------------------------------


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_thousands_of_short_lived_threads_keep_the_fd_count_flat(pad: Scratchpad) -> None:
    entry = pad.put(ALICE, "t", 1, "tool", "x" * 100)["scratchpad_id"]
    gc.collect()
    before = open_fds()
    errors: list[BaseException] = []

    def use() -> None:
        try:
            assert pad.get(ALICE, entry).observation == "x" * 100
        except BaseException as exc:
            errors.append(exc)

    def wave() -> None:
        threads = [threading.Thread(target=use) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def settled_fds() -> int:
        # A thread's locals (and so its connection) go as its state is torn
        # down, which may finish just after join().
        time.sleep(0.05)
        gc.collect()
        return open_fds()

    for _ in range(25):  # 25 waves of 40 threads: 1,000 threads in all
        wave()
    after = settled_fds()
    assert errors == []
    # A connection kept per thread would leave 1,000 connections and about 2,000 descriptors.
    # Now a thread's connection closes with it. SQLite keeps a closed
    # connection's descriptor for reuse while another connection of the
    # process holds a lock on the file, so the count follows the most threads
    # that used the store at once (40 here), never the number that ever did.
    assert after - before <= 2 * 40 + 4


@pytest.mark.slow
def test_threads_past_a_low_descriptor_limit(tmp_path: Path) -> None:
    """With ``ulimit -n 128`` 400 threads (three times the limit), one after another, each put and read."""
    script = textwrap.dedent(
        f"""
        import resource, threading
        from securepad import Keyring, Principal, Scratchpad
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
        keyring = Keyring.from_key_file({str(tmp_path / "key")!r})
        p = Principal("alice", "a", "c")
        with Scratchpad.open({str(tmp_path / "s.db")!r}, keyring=keyring) as pad:
            def work(i):
                sid = pad.put(p, "t", i, "tool", "observation %d" % i)["scratchpad_id"]
                assert pad.get(p, sid).observation == "observation %d" % i
            for i in range(400):
                t = threading.Thread(target=work, args=(i,))
                t.start()
                t.join()
            open(__file__).close()  # plain open() still has descriptors
        print("ok")
        """
    )
    path = tmp_path / "threads.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


# -- 2. disk full ---------------------------------------------------------------------


@pytest.fixture
def small_disk_mib() -> int:
    """The disk-full tests fill a 3 MiB tmpfs (``small_disk`` in conftest)."""
    return 3


def fill(pad: Scratchpad, prefix: str, size: int = 64 * 1024) -> tuple[list[str], StorageFullError]:
    """Put random (incompressible) entries until the disk is full."""
    stored: list[str] = []
    for step in range(10_000):
        try:
            stored.append(pad.put(ALICE, prefix, step, "tool", random.randbytes(size), ttl_seconds=60)["scratchpad_id"])
        except StorageFullError as exc:
            return stored, exc
    raise AssertionError("the disk never filled")


def test_disk_full_is_a_typed_error_and_loses_nothing(small_disk: Path, keyring: Keyring) -> None:
    db = small_disk / "store.db"
    with Scratchpad.open(db, keyring=keyring) as pad:
        stored, full = fill(pad, "t")
        assert "full" in str(full) and str(db) in str(full)
        assert len(stored) > 5
        # Every acknowledged put is readable; the failed one left nothing.
        for sid in stored:
            pad.get(ALICE, sid)
        assert pad.stats()["entries"] == len(stored)
        # Small writes and deletes on the full disk: typed errors or success, never apsw's.
        for step in range(20):
            with contextlib.suppress(StorageFullError):
                pad.put(ALICE, "small", step, "tool", "s" * 2000)
        # gc on the full disk (everything expired): it succeeds or says the disk is full
        # (on main: apsw.SQLError "cannot rollback - no transaction is active").
        try:
            removed = pad.gc(now=time.time() + 120)  # past every ttl_seconds=60 put
        except StorageFullError:
            removed = None
        if removed is None:
            assert pad.stats(now=0)["entries"] >= len(stored)  # rolled back whole
        else:
            assert removed >= len(stored)
    # Once there is room again the store opens and works; gc frees the space.
    # (gc itself needs room on a full disk: secure_delete writes the zeroed
    # pages through the WAL.)
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    with Scratchpad.open(db, keyring=keyring) as pad:
        pad.gc(now=time.time() + 120)  # past every ttl_seconds=60 put
        sid = pad.put(ALICE, "after", 1, "tool", "room again")["scratchpad_id"]
        assert pad.get(ALICE, sid).observation == "room again"


def test_delete_on_a_full_disk(small_disk: Path, keyring: Keyring) -> None:
    db = small_disk / "store.db"
    with Scratchpad.open(db, keyring=keyring) as pad:
        stored, _ = fill(pad, "t", size=16 * 1024)
        outcomes = []
        for sid in stored[:5]:
            try:
                pad.delete(ALICE, sid)
                outcomes.append("deleted")
            except StorageFullError:
                outcomes.append("full")
                pad.get(ALICE, sid)  # a refused delete left the entry whole
        assert outcomes


def test_cli_prints_one_line_on_a_full_disk(small_disk: Path, tmp_path: Path) -> None:
    db = small_disk / "store.db"
    store = ["--db", str(db), "--key-file", str(tmp_path / "key")]
    assert CliRunner().invoke(main, [*store, "init"]).exit_code == 0  # only init creates a store
    (tmp_path / "big").write_bytes(random.randbytes(4 * 1024 * 1024))
    args = [*store, "put", "--owner", "alice", "--turn", "t", "--kind", "binary"]
    result = CliRunner().invoke(main, [*args, "--step", "1", str(tmp_path / "big")])
    assert_one_error(result, "StorageFullError")
    result = CliRunner().invoke(main, [*args, "--step", "2", "--json", str(tmp_path / "big")])
    assert "full" in assert_json_error(result, "StorageFullError")["message"]


# -- 2. a damaged file ----------------------------------------------------------------


def test_random_damage_gives_typed_errors(tmp_path: Path, keyring: Keyring) -> None:
    source = tmp_path / "source.db"
    with Scratchpad.open(source, keyring=keyring) as pad:
        ids = [pad.put(ALICE, "t", step, "tool", random.randbytes(3000))["scratchpad_id"] for step in range(40)]
        sqlite_of(pad).checkpoint()  # everything in the main file, none in the WAL
    (tmp_path / "copies").mkdir()
    outcomes: dict[str, int] = {}
    for path in damaged_copies(source, tmp_path / "copies", trials=50, seed=18):
        # Any apsw exception escaping here fails the test.
        name = exercise(path, keyring, ids)
        outcomes[name] = outcomes.get(name, 0) + 1
    assert set(outcomes) <= {"ok", "StoreCorruptError", "IntegrityError", "WrongKeyError", "SecurepadError"}
    assert outcomes.get("StoreCorruptError", 0) > 0


def test_not_a_database_at_open(tmp_path: Path, keyring: Keyring) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages you are looking for\n" * 200)
    path.chmod(0o600)  # private, as a store file must be: what is wrong is its content
    with pytest.raises(StoreCorruptError, match="damaged or is not a securepad store"):
        Scratchpad.open(path, keyring=keyring)


def test_cli_on_a_damaged_file_prints_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"x" * 10_000)
    path.chmod(0o600)
    Keyring.create_key_file(tmp_path / "key")  # the key exists: the file is what is wrong
    store = ["--db", str(path), "--key-file", str(tmp_path / "key")]
    assert_one_error(CliRunner().invoke(main, [*store, "stats"]), "StoreCorruptError")
    result = CliRunner().invoke(main, [*store, "stats", "--json"])
    assert "damaged" in assert_json_error(result, "StoreCorruptError")["message"]


def test_cli_db_inside_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file, not a folder")
    db = tmp_path / "plain" / "store.db"
    store = ["--db", str(db), "--key-file", str(tmp_path / "key")]
    # Creating it (init) fails on the path, in one line.
    result = CliRunner().invoke(main, [*store, "init"])
    assert_one_error(result, "SecurepadError")
    assert "cannot create store" in result.stderr
    assert (
        "cannot create store"
        in assert_json_error(CliRunner().invoke(main, [*store, "init", "--json"]), "SecurepadError")["message"]
    )
    # Any other command finds no store there (only init creates one), in one line too.
    result = CliRunner().invoke(main, [*store, "stats"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no store at" in result.stderr and result.stderr.count("\n") == 1


def test_cli_json_with_a_huge_integer(tmp_path: Path) -> None:
    source = tmp_path / "big.json"
    source.write_text('{"n": ' + "9" * 5000 + "}")
    store = ["--db", str(tmp_path / "s.db"), "--key-file", str(tmp_path / "key")]
    assert CliRunner().invoke(main, [*store, "init"]).exit_code == 0
    args = [*store, "put", "--owner", "alice", "--turn", "t", "--step", "1", "--kind", "json", str(source)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "input is not valid json" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "input is not valid json" in json.loads(result.stderr)["error"]["message"]


# -- 4. the WAL under a long reader ---------------------------------------------------


def test_wal_stays_bounded_under_a_long_reader(db_path: Path, keyring: Keyring) -> None:
    limit = 2 * 1024 * 1024
    # The anchor syncs at close: its background sync would be a second connection, whose
    # transaction, when it overlaps the write after the reader, leaves the restart to a later write.
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit, "anchor_sync": "close"}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        # The reader holds on throughout: a write waits 0.25 s for it, not the store's 2 s.
        assert sqlite_of(pad)._wal_wait_s == 2.0
        sqlite_of(pad)._wal_wait_s = 0.25
        pad.put(ALICE, "t", 0, "tool", "first")
        reader = apsw.Connection(str(db_path))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM entries").fetchall()  # holds one snapshot from here on
        refused = None
        for step in range(1, 200):
            try:
                pad.put(ALICE, "t", step, "tool", random.randbytes(32 * 1024))
            except StoreBusyError as exc:
                refused = exc
                break
        assert refused is not None and "write-ahead log" in str(refused)
        wal = Path(f"{db_path}-wal").stat().st_size
        # The limit, plus at most the one transaction that crossed it.
        assert wal <= limit + 256 * 1024
        stats = pad.stats()
        assert stats["wal"]["wal_limit_bytes"] == limit
        assert stats["wal"]["warnings"] and "long-lived reader" in stats["wal"]["warnings"][0]
        reader.execute("COMMIT")
        reader.close()
        # The reader is gone: the next write checkpoints and goes through, the WAL restarts.
        pad.put(ALICE, "t", 500, "tool", "after the reader")
        assert pad.stats()["wal"]["warnings"] == []
        assert Path(f"{db_path}-wal").stat().st_size <= limit


def test_wal_file_shrinks_after_a_checkpoint(db_path: Path, keyring: Keyring) -> None:
    """After the reader ends, a plain (passive) checkpoint cuts the WAL file back
    to 16 MiB instead of keeping its largest size until gc."""
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": 64 * 1024 * 1024}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        reader = apsw.Connection(str(db_path))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM entries").fetchall()
        for step in range(700):  # ~22 MiB through the WAL while the reader holds it
            # Turns of 50 steps: a turn's sealed head lists its entries and is
            # rewritten by each put, so one 700-step turn would add its head's size per put.
            pad.put(ALICE, f"t{step // 50}", step, "tool", random.randbytes(32 * 1024))
        assert Path(f"{db_path}-wal").stat().st_size > 20 * 1024 * 1024
        reader.execute("COMMIT")
        reader.close()
        for step in range(1000, 1300):  # auto-checkpoints now complete; the WAL restarts
            pad.put(ALICE, "t", step, "tool", "small")
        assert Path(f"{db_path}-wal").stat().st_size <= 16 * 1024 * 1024


def test_wal_limit_policy_is_validated() -> None:
    from securepad import PolicyError

    with pytest.raises(PolicyError, match=r"storage\.wal_limit_bytes"):
        Policy.from_dict({"storage": {"wal_limit_bytes": 1000}})
    with pytest.raises(PolicyError, match=r"storage\.incremental_vacuum"):
        Policy.from_dict({"storage": {"incremental_vacuum": 1}})


# -- 6. incremental vacuum ------------------------------------------------------------


def test_incremental_vacuum_gives_space_back(tmp_path: Path, keyring: Keyring) -> None:
    sizes = {}
    for vacuum in (False, True):
        db = tmp_path / f"store-{vacuum}.db"
        policy = Policy.from_dict({"storage": {"incremental_vacuum": vacuum}})
        with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
            for step in range(60):
                pad.put(ALICE, "t", step, "tool", random.randbytes(50_000), ttl_seconds=10)
            pad.put(ALICE, "keep", 1, "tool", "kept", ttl_seconds=3600)
            pad.gc(now=time.time() + 60, wait=False)  # a turn's quick gc: no scrub
            full = db.stat().st_size
            assert pad.list_for_turn(ALICE, "keep")
            pad.scrub()  # what a full gc ends with: the file is rebuilt whatever the option
            scrubbed = db.stat().st_size
            assert pad.list_for_turn(ALICE, "keep")
        sizes[vacuum] = full
        assert scrubbed < 300_000
    assert sizes[False] > 2_500_000  # the file keeps its pages (free, zeroed)
    assert sizes[True] < 300_000  # handed back to the file system


def test_incremental_vacuum_converts_an_existing_store(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        sid = pad.put(ALICE, "t", 1, "tool", random.randbytes(200_000), ttl_seconds=10)["scratchpad_id"]
        kept = pad.put(ALICE, "t", 2, "tool", "kept")["scratchpad_id"]
        pad.gc(now=time.time() + 60, wait=False)  # no scrub: the file keeps its pages
    big = db_path.stat().st_size
    policy = Policy.from_dict({"storage": {"incremental_vacuum": True}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        assert pad.stats()["wal"]["incremental_vacuum"] is True
        assert pad.get(ALICE, kept).observation == "kept"
        with pytest.raises(NotFoundError):
            pad.get(ALICE, sid)
    assert db_path.stat().st_size < big


# -- 7. now= --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["x", float("nan"), float("inf"), -float("inf"), True, 10**400, [1]],
    ids=["str", "nan", "inf", "-inf", "bool", "huge-int", "list"],
)
def test_now_must_be_a_finite_number(pad: Scratchpad, bad: Any) -> None:
    sid = pad.put(ALICE, "t", 1, "tool", "expires", ttl_seconds=10, now=1000)["scratchpad_id"]
    calls = [
        lambda: pad.get(ALICE, sid, now=bad),
        lambda: pad.put(ALICE, "t", 2, "tool", "x", now=bad),
        lambda: pad.gc(bad),
        lambda: pad.stats(now=bad),
        lambda: pad.list_for_turn(ALICE, "t", now=bad),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="now must be"):
            call()
    # A NaN never serves an expired entry (on main it did: NaN compares false).
    with pytest.raises(NotFoundError):
        pad.get(ALICE, sid, now=2000)
    assert not math.isnan(pad.stats(now=2000)["entries"])


def test_a_broken_clock_is_refused(db_path: Path, keyring: Keyring) -> None:
    with (
        Scratchpad.open(db_path, keyring=keyring, clock=lambda: float("nan")) as pad,
        pytest.raises(InvalidArgumentError, match="finite"),
    ):
        pad.put(ALICE, "t", 1, "tool", "x")


def test_a_transaction_sqlite_already_ended_does_not_hide_the_cause(db_path: Path, keyring: Keyring) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL and I/O errors;
    the helper's own ROLLBACK then failed and replaced the real error with
    ``apsw.SQLError: cannot rollback - no transaction is active``."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        db = sqlite_of(pad)
        with pytest.raises(StorageFullError, match="full"), db.transaction() as conn:
            conn.execute("INSERT INTO store_meta(key, value) VALUES ('probe', 'x')")
            conn.raw.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL
            raise StorageFullError("the disk holding the store is full")
        assert db.query("SELECT value FROM store_meta WHERE key = 'probe'") == []
        with db.transaction() as conn:  # the connection is usable again
            conn.execute("INSERT INTO store_meta(key, value) VALUES ('probe', 'y')")
        assert db.query("SELECT value FROM store_meta WHERE key = 'probe'") == [{"value": "y"}]


@given(now=st.floats(allow_nan=True, allow_infinity=True) | st.integers())
def test_now_is_accepted_exactly_when_finite(db_path: Path, keyring: Keyring, now: float) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        try:
            finite = math.isfinite(float(now))
        except OverflowError:  # an integer past the largest float
            finite = False
        if finite:
            assert pad.stats(now=now)["entries"] >= 0
        else:
            with pytest.raises(InvalidArgumentError, match="now must be"):
                pad.stats(now=now)
