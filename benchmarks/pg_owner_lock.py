"""What one owner's writers wait for on PostgreSQL: the concurrency workload of
``benchmarks.postgres`` on PostgreSQL alone, its server processes sampled.

    python -m benchmarks.pg_owner_lock [--processes 8] [--seconds 5] [--owner-per-process]

Every ~2 ms a separate connection reads ``pg_stat_activity`` for the bench
database's client backends: each backend's state and wait event is one
sample. The table gives each (state, wait) its share of the samples: a
backend waiting for its client (``ClientRead``) is the client's time (its
CPU, here), one waiting on an ``advisory`` lock is a writer queued behind
another of the same owner (or turn, or store). ``--owner-per-process`` runs
each worker as an owner of its own, the case with no shared owner lock.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from securepad.bench.config import Config
from securepad.bench.workloads import run_concurrent

from .postgres import DATABASE, OWNER_PER_PROCESS, SecurepadPostgresBackend, bench_database

__all__ = ["main"]

_SAMPLE_SQL = (
    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
    " WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)
_SAMPLE_EVERY_S = 0.002


class _Sampler(threading.Thread):
    """Counts (state, wait event type, wait event) of the bench database's backends until ``stop``."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set():
                for state, kind, event in conn.execute(_SAMPLE_SQL, (DATABASE,)).fetchall():
                    self.counts[(str(state), str(kind or "-"), str(event or "-"))] += 1
                time.sleep(_SAMPLE_EVERY_S)

    def stop(self) -> None:
        self.done.set()
        self.join()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_owner_lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--owner-per-process", action="store_true", help="each worker puts as an owner of its own")
    args = parser.parse_args(argv)
    reason = SecurepadPostgresBackend.unavailable()
    if reason:
        print(reason)
        return 1
    sampler = _Sampler(bench_database())
    name = "securepad-postgresql"
    if args.owner_per_process:
        os.environ[OWNER_PER_PROCESS] = str(os.getpid())
        name = "securepad-postgresql-owner-per-process"
    config = dataclasses.replace(Config(), concurrency=((args.processes, 1),), concurrency_seconds=args.seconds)
    sampler.start()
    try:
        with tempfile.TemporaryDirectory(prefix="securepad-bench-pg-lock-") as tmp:
            records = [r for batch in run_concurrent(config, name, Path(tmp), lambda _: None) for r in batch]
    finally:
        sampler.stop()
    for r in records:
        print(
            f"## {r['backend']}, {args.processes} processes, {args.seconds:g} s: {r['put']['ops_per_s']:.0f} puts/s,"
            f" {r['read']['ops_per_s']:.0f} reads/s, {r['error_count']} errors, {r['lost_writes']} lost writes"
        )
    total = sum(sampler.counts.values()) or 1
    print("| backend state | wait | share of samples |")
    print("|---|---|---:|")
    for (state, kind, event), count in sampler.counts.most_common(12):
        print(f"| {state} | {kind} {event} | {100 * count / total:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
