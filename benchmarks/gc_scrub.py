"""What one gc costs in memory, WAL and time on a large SQLite store.

    python -m benchmarks.gc_scrub [--sizes 100,1024] [--out FILE] [--dir DIR]

For each size (MiB) a store is filled with 64 KiB entries (one expiring first,
a third expiring next, the rest live), then a fresh process opens it and runs
two gcs: the first collects the one entry (the deletes free a sliver: no
rebuild), the second the third (a rebuild: ``Database.scrub``). During each,
a thread samples the process's resident memory (``VmRSS``) and the WAL
file's size every 10 ms. Prints one JSON object per size. Nothing is
asserted: tests/maintenance/test_scrub.py holds the behaviour, this measures it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import DEFAULT_OUT
from securepad import Keyring, Principal, Scratchpad
from securepad.store import sqlite_of

ENTRY = 64 * 1024
BATCH = 200  # entries per put_many: 12.5 MiB, under one transaction's bound
OWNER = Principal("gc-bench", "agent", "web")
OWNER_ENTRIES = 8000  # owners of 500 MiB each: under the default owner quota
TTL = 100


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fill(db: Path, key: Path, size_mb: int, t0: float) -> int:
    """A store of about ``size_mb`` MiB of entries; returns how many."""
    count = size_mb * 1024 * 1024 // ENTRY
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        pad.put(OWNER, "first", 0, "tool", os.urandom(ENTRY), ttl_seconds=TTL, now=t0 - 10_000)
        for first in range(0, count, BATCH):
            items = [(i, "tool", os.urandom(ENTRY)) for i in range(first, min(first + BATCH, count))]
            # Every third batch expires before the rest: a third of the store.
            third = (first // BATCH) % 3 == 0
            owner = Principal(f"gc-bench-{first // OWNER_ENTRIES}", "agent", "web")
            ttl, now = (TTL, t0 - 5_000) if third else (None, None)
            pad.put_many(owner, f"t{first // BATCH}", items, ttl, now=now)
        sqlite_of(pad).checkpoint()
    return count


def _measure(pad: Scratchpad, db: Path, now: float) -> dict[str, Any]:
    wal = Path(f"{db}-wal")
    peak = {"rss": _rss_mb(), "wal": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], _rss_mb())
            with contextlib.suppress(FileNotFoundError):
                peak["wal"] = max(peak["wal"], wal.stat().st_size)
            time.sleep(0.01)

    before_rss, before_file = _rss_mb(), db.stat().st_size
    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    deleted = pad.gc(now=now)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return {
        "deleted": deleted,
        "seconds": round(seconds, 2),
        "rebuilt": db.stat().st_size < before_file,
        "rss_before_mb": round(before_rss, 1),
        "rss_peak_mb": round(peak["rss"], 1),
        "rss_after_mb": round(_rss_mb(), 1),
        "wal_peak_mb": round(peak["wal"] / 2**20, 1),
        "file_before_mb": round(before_file / 2**20, 1),
        "file_after_mb": round(db.stat().st_size / 2**20, 1),
    }


def _gcs(db: str, key: str, t0: float, out: Any) -> None:
    """In a fresh process: the two gcs, measured."""
    with Scratchpad.open(Path(db), keyring=Keyring.from_key_file(Path(key))) as pad:
        one = _measure(pad, Path(db), t0 - 9_000)
        third = _measure(pad, Path(db), t0 - 4_000)
    out.put({"one_entry": one, "a_third": third})


def run(size_mb: int, where: Path) -> dict[str, Any]:
    db, key = where / "data" / f"gc-{size_mb}.db", where / "config" / "key"
    t0 = time.time()
    started = time.perf_counter()
    entries = fill(db, key, size_mb, t0)
    filled_s = time.perf_counter() - started
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_gcs, args=(str(db), str(key), t0, out))
    child.start()
    result = out.get()
    child.join()
    return {"store_mb": size_mb, "entries": entries + 1, "fill_s": round(filled_s, 1), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gc_scrub", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1024", help="store sizes in MiB, comma-separated")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "gc_scrub.json")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            result = run(size, Path(tmp) / str(size))
            results.append(result)
            print(json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
