"""``python -m benchmarks.faults [part ...]``: the figures of docs/reliability.md (issue 18).

Parts: ``threads`` (descriptors and memory after many short-lived threads),
``damage`` (random damage of a store file: which error each gives),
``wal`` (the WAL under a long reader), ``vacuum`` (incremental vacuum's cost),
``caches`` (owner-key cache memory), ``postgres`` (a black hole and a restart
through a local fault-injecting proxy; needs the server of
SECUREPAD_TEST_PG_DSN). Prints one JSON object per part. Not part of the
test suite: nothing here is asserted.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

from securepad import Keyring, Policy, Principal, Scratchpad, SecurepadError, StoreBusyError

ALICE = Principal("alice", "planner", "web")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def threads(where: Path, count: int = 2000) -> dict[str, Any]:
    keyring = Keyring.from_key_file(where / "key")
    with Scratchpad.open(where / "threads.db", keyring=keyring) as pad:
        sid = pad.put(ALICE, "t", 1, "tool", "x" * 1000)["scratchpad_id"]
        gc.collect()
        fds, rss = _fds(), _rss_kb()
        for _ in range(count // 20):
            wave = [threading.Thread(target=pad.get, args=(ALICE, sid)) for _ in range(20)]
            for thread in wave:
                thread.start()
            for thread in wave:
                thread.join()
        time.sleep(0.1)
        gc.collect()
        return {
            "threads": count,
            "at_once": 20,
            "extra_fds": _fds() - fds,
            "extra_rss_mb": round((_rss_kb() - rss) / 1024, 1),
        }


def wal(where: Path, limit_mb: int = 64, size: int = 16 * 1024) -> dict[str, Any]:
    keyring = Keyring.from_key_file(where / "key")
    db = where / "wal.db"
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit_mb * 1024 * 1024}})
    with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        reader = apsw.Connection(str(db))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM entries").fetchall()
        started, puts, refused = time.perf_counter(), 0, 0
        while refused < 50:
            try:
                pad.put(ALICE, "t", puts + 1, "tool", random.randbytes(size))
                puts += 1
            except StoreBusyError:
                refused += 1
        held_s = time.perf_counter() - started
        peak = Path(f"{db}-wal").stat().st_size
        warning = pad.stats()["wal"]["warnings"]
        reader.execute("COMMIT")
        reader.close()
        pad.put(ALICE, "t", puts + 2, "tool", "after the reader")
        after = Path(f"{db}-wal").stat().st_size
    return {
        "limit_mb": limit_mb,
        "put_bytes": size,
        "puts_before_refusal": puts,
        "seconds_to_limit": round(held_s, 2),
        "wal_peak_mb": round(peak / 2**20, 1),
        "wal_after_reader_mb": round(after / 2**20, 2),
        "stats_warning": bool(warning),
    }


def vacuum(where: Path, entries: int = 2000, size: int = 20_000) -> dict[str, Any]:
    """gc with and without incremental vacuum: everything expired, and every
    other entry expired (live pages scattered through the file must move)."""
    keyring = Keyring.from_key_file(where / "key")
    out: dict[str, Any] = {"entries": entries, "entry_bytes": size}
    for keep_every in (0, 2):
        for on in (False, True):
            db = where / f"vacuum-{on}-{keep_every}.db"
            policy = Policy.from_dict({"storage": {"incremental_vacuum": on}})
            with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
                started = time.perf_counter()
                for step in range(entries):
                    ttl = 3600 if keep_every and step % keep_every == 0 else 10
                    pad.put(ALICE, "t", step, "tool", random.randbytes(size), ttl_seconds=ttl)
                put_s = time.perf_counter() - started
                before = db.stat().st_size
                started = time.perf_counter()
                pad.gc(now=time.time() + 60)
                gc_s = time.perf_counter() - started
                case = "all expired" if not keep_every else f"1 in {keep_every} kept"
                out[f"{case}, vacuum {'on' if on else 'off'}"] = {
                    "put_ms_each": round(put_s * 1000 / entries, 3),
                    "gc_s": round(gc_s, 3),
                    "file_mb_before_gc": round(before / 2**20, 1),
                    "file_mb_after_gc": round(db.stat().st_size / 2**20, 2),
                }
    return out


def _populate_owners(db: Path, key: Path, owners: int) -> None:
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        for i in range(owners):
            pad.put(Principal(f"owner-{i}", "a", "c"), "t", 1, "tool", "x")


def caches(where: Path, owners: int = 8192) -> dict[str, Any]:
    """Memory of the owner-key caches: RSS after reading as many owners as the
    cache holds, and after as many again (it should stay flat). The owners are
    written by a child process, so that this one starts with empty caches."""
    from securepad.store import OWNER_KEY_CACHE_SIZE

    db, key = where / "caches.db", where / "key"
    child = multiprocessing.get_context("fork").Process(target=_populate_owners, args=(db, key, owners))
    child.start()
    child.join()
    people = [Principal(f"owner-{i}", "a", "c") for i in range(owners)]
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        gc.collect()
        rss = [_rss_kb()]
        for lo, hi in ((0, OWNER_KEY_CACHE_SIZE), (OWNER_KEY_CACHE_SIZE, owners)):
            for p in people[lo:hi]:
                pad.list_for_turn(p, "t")  # opens the entry: caches the owner's AES-GCM key
            gc.collect()
            rss.append(_rss_kb())
    return {
        "cache_size": OWNER_KEY_CACHE_SIZE,
        "owners_read": owners,
        "rss_kb_growth_first_fill": rss[1] - rss[0],
        "bytes_per_cached_owner": round((rss[1] - rss[0]) * 1024 / OWNER_KEY_CACHE_SIZE),
        "rss_kb_growth_after_full": rss[2] - rss[1],
    }


def damage(where: Path, trials: int = 1000) -> dict[str, Any]:
    """Random damage of a store file (the test suite's 4 kinds): what each open-and-use gives."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_faults_sqlite import damaged_copies, exercise

    keyring = Keyring.from_key_file(where / "key")
    source = where / "damage.db"
    with Scratchpad.open(source, keyring=keyring) as pad:
        ids = [pad.put(ALICE, "t", step, "tool", random.randbytes(3000))["scratchpad_id"] for step in range(40)]
        pad.gc()  # checkpoints: everything in the main file, none in the WAL
    (where / "copies").mkdir()
    outcomes: dict[str, int] = {}
    for path in damaged_copies(source, where / "copies", trials=trials, seed=18):
        try:
            name = exercise(path, keyring, ids)
        except Exception as exc:
            name = f"untyped {type(exc).__name__}"
        outcomes[name] = outcomes.get(name, 0) + 1
        path.unlink()
    return {"trials": trials, "outcomes": outcomes}


def postgres(dsn: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_faults_postgres import LIMITS, FaultyProxy, through

    from securepad._pg import PostgresDatabase

    host = dsn.split("@", 1)[1].split("/", 1)[0]
    proxy = FaultyProxy((host.split(":")[0], int(host.split(":")[1]) if ":" in host else 5432))
    keyring = Keyring.from_key_file(Path(tempfile.mkdtemp()) / "key")
    out: dict[str, Any] = {"limits": LIMITS}
    db = PostgresDatabase(through(dsn, proxy), schema="securepad_faults", pool_size=4, **LIMITS)
    pad = Scratchpad(db, keyring, Policy.default(), time.time)
    try:
        sid = pad.put(ALICE, "t", 1, "tool", "x")["scratchpad_id"]
        proxy.black_hole = True
        started = time.perf_counter()
        try:
            pad.get(ALICE, sid)
        except SecurepadError as exc:
            out["black_hole"] = {"error": type(exc).__name__, "seconds": round(time.perf_counter() - started, 2)}
        proxy.black_hole = False
        for outage in (5.0, 15.0):
            proxy.refuse()
            until = time.monotonic() + outage
            while time.monotonic() < until:
                try:
                    pad.get(ALICE, sid)
                except SecurepadError:
                    time.sleep(0.05)
            proxy.heal()
            out[f"recovery_after_{outage:g}s_down"] = round(_until_it_works(lambda: pad.get(ALICE, sid)), 2)
        proxy.drop_all()
        started = time.perf_counter()
        pad.get(ALICE, sid)
        out["restart_then_call_s"] = round(time.perf_counter() - started, 3)
    finally:
        pad.close()
        proxy.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS securepad_faults CASCADE")
    return out


def _until_it_works(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    while True:
        try:
            call()
            return time.perf_counter() - started
        except SecurepadError:
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    parts = argv or ["threads", "wal", "vacuum", "caches"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            if part == "postgres":
                result = postgres(
                    os.environ.get("SECUREPAD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
                )
            else:
                result = globals()[part](Path(tmp))
            print(json.dumps({part: result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
