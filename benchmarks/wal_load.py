"""Many writers and readers on one SQLite store: refused writes and the WAL's size.

    python -m benchmarks.wal_load [--processes 8] [--threads 4] [--seconds 45]
        [--size 4096] [--limit-mb 256] [--out FILE]

Each process opens the store and runs its threads, each half puts and half
reads (``get`` of one of its own entries) of ``--size`` random bytes, for
``--seconds``. The parent samples the WAL file's size every 20 ms. Prints
one JSON object: operations per second, puts refused (``StoreBusyError``)
and other errors, the WAL's peak size against its limit, the checkpoints the
store objects tried by mode (``Database.wal_status``). Nothing is asserted:
the tests hold the behaviour (tests/storage/test_sqlite_wal_checkpoint.py), this measures it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import DEFAULT_OUT
from securepad import Keyring, Policy, Principal, Scratchpad, SecurepadError, StoreBusyError
from securepad.store import sqlite_of


def _worker(db: str, key: str, limit: int, proc: int, threads: int, seconds: float, size: int, out: Any) -> None:
    """One process: ``threads`` threads of puts and gets; its counts go to ``out``."""
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit}})
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    with Scratchpad.open(Path(db), keyring=Keyring.from_key_file(Path(key)), policy=policy) as pad:
        stop_at = time.monotonic() + seconds

        def run(thread: int) -> None:
            mine: Counter[str] = Counter()
            principal = Principal(f"owner-{proc}-{thread}", "agent", "web")
            rng = random.Random(proc * 1000 + thread)  # a workload, not a secret
            ids: list[str] = []
            step = 0
            while time.monotonic() < stop_at:
                if not ids or rng.random() < 0.5:
                    try:
                        view = pad.put(principal, f"t{step // 500}", step, "tool", rng.randbytes(size))
                        ids.append(view["scratchpad_id"])
                        mine["puts"] += 1
                    except StoreBusyError:
                        mine["puts_refused"] += 1
                    except SecurepadError as exc:
                        mine[f"put_error {type(exc).__name__}"] += 1
                    step += 1
                else:
                    try:
                        pad.get(principal, rng.choice(ids))
                        mine["reads"] += 1
                    except SecurepadError as exc:
                        mine[f"read_error {type(exc).__name__}"] += 1
            with lock:
                counts.update(mine)

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        checkpoints = sqlite_of(pad).wal_status()["checkpoints"]
        assert isinstance(checkpoints, dict)
        counts.update({f"checkpoint_{mode}": n for mode, n in checkpoints.items()})
    out.put(dict(counts))


def run(processes: int, threads: int, seconds: float, size: int, limit_mb: int, where: Path) -> dict[str, Any]:
    """The load, once; its figures."""
    db, key = where / "data" / "load.db", where / "config" / "key"
    limit = limit_mb * 1024 * 1024
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit}})
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), policy=policy):
        pass  # created (and its key) before the processes start
    wal = Path(f"{db}-wal")
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                peak[0] = max(peak[0], wal.stat().st_size)
            time.sleep(0.02)

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    procs = [
        context.Process(target=_worker, args=(str(db), str(key), limit, p, threads, seconds, size, out))
        for p in range(processes)
    ]
    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    for proc in procs:
        proc.start()
    totals: Counter[str] = Counter()
    for _ in procs:
        totals.update(out.get())
    for proc in procs:
        proc.join()
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    ops = totals["puts"] + totals["reads"]
    return {
        "processes": processes,
        "threads": threads,
        "seconds": seconds,
        "entry_bytes": size,
        "wal_limit_mb": limit_mb,
        "ops": ops,
        "ops_per_s": round(ops / elapsed),
        "puts": totals["puts"],
        "reads": totals["reads"],
        "puts_refused": totals["puts_refused"],
        "errors": {k: v for k, v in totals.items() if "error" in k},
        "wal_peak_mb": round(peak[0] / 2**20, 1),
        "checkpoints": {k.removeprefix("checkpoint_"): v for k, v in totals.items() if k.startswith("checkpoint_")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wal_load", description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--limit-mb", type=int, default=256)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "wal_load.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.processes, args.threads, args.seconds, args.size, args.limit_mb, Path(tmp))
    print(json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
