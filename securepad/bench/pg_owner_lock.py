"""Where one owner's writers hold the owner's lock on PostgreSQL.

``python -m securepad.bench.pg_owner_lock [--seconds 5] [--durability normal]``:
``--processes`` processes put (4 KiB, a turn each) and read for one owner
while this process samples ``pg_locks`` and ``pg_stat_activity`` every ~2 ms:
the state of the session that holds the owner's advisory lock (``WALSync``:
flushing its commit; ``ClientRead`` while idle in transaction: waiting for
its client's next message; active: working) and how many sessions wait for
it. The two views are read in one statement but not at one instant, so a
few samples show the holder already waiting for its next lock.

The figure on how often an optimistic
read of the usage head would have been stale came from a patched opening
statement (it read the usage head again before the lock wait), not from this module.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from securepad import Keyring, Policy, Principal, Scratchpad

from .postgres import bench_database

OWNER = Principal("lock-probe", "agent", "web")
TEXT = "x" * 4096
_SAMPLE = (
    "SELECT a.state, a.wait_event_type, a.wait_event, l.granted FROM pg_locks l"
    " JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.database ="
    " (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _worker(index: int, dsn: str, schema: str, key: str, durability: str, seconds: float, go: Any, out: Any) -> None:
    """One process's puts and reads for the owner, in its own turn; (puts, reads) to ``out``."""
    policy = Policy.from_dict({"access": {"scope": "owner"}, "storage": {"durability": durability}})
    pad = Scratchpad.open(dsn, keyring=Keyring.from_key_file(key), schema=schema, policy=policy)
    latest = pad.put(OWNER, f"w{index}", 0, "tool", TEXT)["scratchpad_id"]
    go.wait()
    end = time.monotonic() + seconds
    calls = puts = 0
    while time.monotonic() < end:
        calls += 1
        if calls % 2:
            puts += 1
            latest = pad.put(OWNER, f"w{index}", calls, "tool", TEXT)["scratchpad_id"]
        else:
            pad.get(OWNER, latest)
    out.put((puts, calls - puts))
    pad.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m securepad.bench.pg_owner_lock", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--durability", choices=("normal", "full"), default="normal")
    args = parser.parse_args(argv)
    dsn = bench_database()
    import psycopg

    schema = "lockprobe_" + secrets.token_hex(4)
    with tempfile.TemporaryDirectory(prefix="securepad-lock-") as tmp:
        key = str(Path(tmp) / "key")
        Keyring.create_key_file(key)
        Scratchpad.open(dsn, keyring=Keyring.from_key_file(key), schema=schema).close()
        go = multiprocessing.Event()
        out: multiprocessing.Queue[tuple[int, int]] = multiprocessing.Queue()
        workers = [
            multiprocessing.Process(target=_worker, args=(i, dsn, schema, key, args.durability, args.seconds, go, out))
            for i in range(args.processes)
        ]
        for worker in workers:
            worker.start()
        holder: collections.Counter[str] = collections.Counter()
        waiting: collections.Counter[int] = collections.Counter()
        samples = 0
        with psycopg.connect(dsn, autocommit=True) as monitor:
            time.sleep(2.0)  # every worker has opened its store and made its first put
            go.set()
            start = time.monotonic()
            while time.monotonic() - start < args.seconds:
                rows = monitor.execute(_SAMPLE).fetchall()
                samples += 1
                held = [row for row in rows if row[3]]
                waiting[len(rows) - len(held)] += 1
                for state, kind, event, _ in held:
                    holder[f"{state} ({kind}: {event})" if kind else str(state)] += 1
                if not held:
                    holder["(free)"] += 1
                time.sleep(0.002)
            results = [out.get() for _ in workers]
            for worker in workers:
                worker.join()
            monitor.execute(f"DROP SCHEMA {schema} CASCADE")
    puts = sum(r[0] for r in results)
    reads = sum(r[1] for r in results)
    print(f"## one owner, {args.processes} processes, {args.seconds:g} s, durability {args.durability!r}")
    print(f"puts/s {puts / args.seconds:.0f}, reads/s {reads / args.seconds:.0f}, {samples} samples")
    print("| owner's lock holder | share of samples |\n|---|---:|")
    for name, count in holder.most_common():
        print(f"| {name} | {count / samples:.1%} |")
    mean = sum(n * c for n, c in waiting.items()) / max(samples, 1)
    print(f"\nsessions waiting for the owner's lock: {mean:.1f} on average")
    return 0


if __name__ == "__main__":
    sys.exit(main())
