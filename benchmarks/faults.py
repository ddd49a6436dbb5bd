"""The figures of the docs' reliability page: what faults do to a store.

    python -m benchmarks.faults [--out FILE] [--quick] [--dsn DSN] [PART ...]

Parts: ``threads`` (descriptors and memory after many short-lived threads),
``damage`` (random damage of a store file: which error each gives),
``wal`` (the WAL under a long reader), ``vacuum`` (incremental vacuum's cost),
``caches`` (owner-key cache memory), ``postgres`` (a black hole, outages and a
restart through a local fault-injecting proxy; the server is ``--dsn``,
default ``SECUREPAD_BENCH_PG_DSN`` or ``postgresql://postgres@127.0.0.1:5432/postgres``).
Default: every part but ``postgres``. Prints one JSON object per part and
writes them all to ``--out`` (default ``securepad-bench-results/faults.json``).
``--quick`` shrinks the sizes (a smoke run; its figures mean nothing).
Nothing here is asserted: the test suite holds the behaviour, this measures it.

The fault tools (``damaged_copies``, ``exercise``, ``FaultyProxy``) are the
test suite's, from ``tests.support.faults``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import random
import resource
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

from benchmarks import DEFAULT_OUT
from securepad import Keyring, Policy, Principal, Scratchpad, SecurepadError, StoreBusyError
from tests.support.faults import ALICE, LIMITS, damaged_copies, exercise, proxy_for, through

SERVER_DSN = os.environ.get("SECUREPAD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PARTS = ("threads", "damage", "wal", "vacuum", "caches", "postgres")


# -- the measurements ------------------------------------------------------------------


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
        started, puts, refused, held_s, waited_s = time.perf_counter(), 0, 0, 0.0, 0.0
        while refused < 3:  # each refusal waits (WAL_WAIT_MS) for the reader first
            before = time.perf_counter()
            try:
                pad.put(ALICE, "t", puts + 1, "tool", random.randbytes(size))
                puts += 1
            except StoreBusyError:
                refused += 1
                held_s = held_s or before - started
                waited_s = time.perf_counter() - before
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
        "refusal_waited_s": round(waited_s, 2),
        "wal_peak_mb": round(peak / 2**20, 1),
        "wal_after_reader_mb": round(after / 2**20, 2),
        "stats_warning": bool(warning),
    }


def vacuum(where: Path, entries: int = 2000, size: int = 20_000) -> dict[str, Any]:
    """gc with and without incremental vacuum: everything expired, and every
    other entry expired (live pages scattered through the file must move).
    The gc measured is the quick one a turn runs as it starts (``wait=False``,
    no scrub), where the option decides whether the file shrinks; then the
    ``scrub`` that a full gc (or forget-owner) ends with, which rebuilds the
    file whatever the option."""
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
                pad.gc(now=time.time() + 60, wait=False)
                gc_s = time.perf_counter() - started
                after_gc = db.stat().st_size
                started = time.perf_counter()
                pad.scrub()
                scrub_s = time.perf_counter() - started
                case = "all expired" if not keep_every else f"1 in {keep_every} kept"
                out[f"{case}, vacuum {'on' if on else 'off'}"] = {
                    "put_ms_each": round(put_s * 1000 / entries, 3),
                    "gc_s": round(gc_s, 3),
                    "file_mb_before_gc": round(before / 2**20, 1),
                    "file_mb_after_gc": round(after_gc / 2**20, 2),
                    "scrub_s": round(scrub_s, 3),
                    "file_mb_after_scrub": round(db.stat().st_size / 2**20, 2),
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


def postgres(dsn: str, where: Path | None = None) -> dict[str, Any]:
    """A black hole, two outages and a restart through a ``FaultyProxy`` in
    front of the server of ``dsn`` (the store in schema ``securepad_faults``,
    dropped afterwards; the key file in ``where``, default a temporary dir)."""
    if where is None:
        with tempfile.TemporaryDirectory() as tmp:
            return postgres(dsn, Path(tmp))
    from securepad.storage.postgres.database import PostgresDatabase

    proxy = proxy_for(dsn)
    keyring = Keyring.from_key_file(where / "key")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "faults.json", help="where the JSON goes")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures")
    parser.add_argument("--dsn", default=SERVER_DSN, help="the PostgreSQL server of the postgres part")
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}: the parts are {', '.join(PARTS)}")
    parts = args.parts or [p for p in PARTS if p != "postgres"]
    quick: dict[str, dict[str, Any]] = {
        "threads": {"count": 200},
        "damage": {"trials": 20},
        "wal": {"limit_mb": 2},
        "vacuum": {"entries": 100},
        "caches": {},
    }
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    results: dict[str, Any] = {"args": {"parts": parts, "quick": args.quick}}
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            where = Path(tmp) / part
            where.mkdir()
            if part == "postgres":
                result = postgres(args.dsn, where)
            else:
                result = _MEASURES[part](where, **(quick[part] if args.quick else {}))
            results[part] = result
            print(json.dumps({part: result}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results: {args.out}")
    return 0


_MEASURES: dict[str, Callable[..., dict[str, Any]]] = {
    "threads": threads,
    "damage": damage,
    "wal": wal,
    "vacuum": vacuum,
    "caches": caches,
}


if __name__ == "__main__":
    raise SystemExit(main())
