"""What a put and a read of one turn cost as the turn grows: the verified
inventory kept between reads (``head_cache``) against the turn's length.

``python -m benchmarks.turn_reads [--lengths 100,1000,3000,6000] [--repeat 40] [--pg DSN]``

For each length, a fresh store holds one turn of that many ~1 KiB entries
and, beside it, a turn of another owner. Three rows per length, each the
median of ``--repeat`` rounds (the garbage collector paused, as ``timeit``
does):

* ``put+get``: a put into the turn, then a ``get`` of the entry it stored
  (this process's own write, then a read of the same turn);
* ``get after other``: another connection (a second store object on the same
  file or server, as another process would be) puts into the other owner's
  turn, then this process reads an entry of the long turn; only the read is
  timed;
* ``rows/read``: the rows the ``get`` of each case fetched (the entry's row
  and the head's statement; the turn's inventory when it was recounted):
  counted, so independent of the machine's load (``tests/tables/heads/test_reading_freshness.py``
  guards them).
"""

from __future__ import annotations

import argparse
import gc
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from securepad import Keyring, Principal, Scratchpad
from tests.support.meters import ReadMeter

__all__ = ["main", "run"]

ALICE = Principal("alice", "agent", "web")
BOB = Principal("bob", "agent", "web")
_NOW = 1_000_000.0
_TEXT = "observation " + "x" * 1000


def _fill(pad: Scratchpad, principal: Principal, turn: str, steps: int) -> None:
    for first in range(1, steps + 1, 200):
        batch = [(step, "fetch", f"{step} {_TEXT}") for step in range(first, min(first + 200, steps + 1))]
        pad.put_many(principal, turn, batch, ttl_seconds=86_400, now=_NOW)


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    times = []
    gc.disable()
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return statistics.median(times) * 1000


@contextmanager
def _sqlite_stores(path: Path, keyring: Keyring) -> Iterator[tuple[Scratchpad, Scratchpad]]:
    with Scratchpad.open(path, keyring=keyring) as pad, Scratchpad.open(path, keyring=keyring) as other:
        yield pad, other


@contextmanager
def _pg_stores(dsn: str, keyring: Keyring) -> Iterator[tuple[Scratchpad, Scratchpad]]:
    import psycopg
    from psycopg_pool import ConnectionPool

    schema = f"bench_turn_reads_{secrets.token_hex(4)}"
    try:
        with (
            ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool,
            ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as other_pool,
            Scratchpad.open(pool, keyring=keyring, schema=schema) as pad,
            Scratchpad.open(other_pool, keyring=keyring, schema=schema) as other,
        ):
            yield pad, other
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _one_length(stores: Any, length: int, repeat: int) -> dict[str, Any]:
    with stores as (pad, other):
        _fill(pad, ALICE, "long", length)
        _fill(other, BOB, "elsewhere", 1)
        step = [length]
        last: list[str] = []

        def put_get() -> None:
            step[0] += 1
            view = pad.put(ALICE, "long", step[0], "fetch", f"{step[0]} {_TEXT}", ttl_seconds=86_400, now=_NOW)
            last[:] = [view["scratchpad_id"]]
            pad.get(ALICE, view["scratchpad_id"], now=_NOW + 1)

        put_get()
        put_get()
        meter = ReadMeter(pad)
        put_get_ms = _median_ms(put_get, repeat)
        step[0] += 1
        view = pad.put(ALICE, "long", step[0], "fetch", _TEXT, ttl_seconds=86_400, now=_NOW)
        rows_after_put = meter.counts(lambda: pad.get(ALICE, view["scratchpad_id"], now=_NOW + 1))["rows"]

        other_step = [1]
        reads: list[float] = []

        def read_after_other() -> None:
            other_step[0] += 1
            other.put(BOB, "elsewhere", other_step[0], "fetch", _TEXT, ttl_seconds=86_400, now=_NOW)
            started = time.perf_counter()
            pad.get(ALICE, last[0], now=_NOW + 1)
            reads.append(time.perf_counter() - started)

        read_after_other()
        reads.clear()
        gc.disable()
        try:
            for _ in range(repeat):
                read_after_other()
        finally:
            gc.enable()
        other.put(BOB, "elsewhere", other_step[0] + 1, "fetch", _TEXT, ttl_seconds=86_400, now=_NOW)
        rows_after_other = meter.counts(lambda: pad.get(ALICE, last[0], now=_NOW + 1))["rows"]
        return {
            "length": length,
            "put_get_ms": put_get_ms,
            "get_after_other_ms": statistics.median(reads) * 1000,
            "rows_after_put": rows_after_put,
            "rows_after_other": rows_after_other,
        }


def run(lengths: list[int], repeat: int, pg: str | None = None) -> list[dict[str, Any]]:
    """One row per (backend, length): see the module's docstring."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        keyring = Keyring.from_key_file(Path(tmp) / "key")
        for length in lengths:
            row = _one_length(_sqlite_stores(Path(tmp) / f"turn-{length}.db", keyring), length, repeat)
            results.append({"backend": "sqlite", **row})
        if pg is not None:
            for length in lengths:
                results.append({"backend": "postgresql", **_one_length(_pg_stores(pg, keyring), length, repeat)})
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000,3000,6000")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--pg", default=None, help="a PostgreSQL DSN: the same on a fresh schema there")
    args = parser.parse_args(argv)
    rows = run([int(n) for n in args.lengths.split(",")], args.repeat, args.pg)
    print(
        f"{'backend':<11} {'turn':>6} {'put+get ms':>11} {'get after other ms':>19} {'rows/get after put':>19}"
        f" {'rows/get after other':>21}"
    )
    for row in rows:
        print(
            f"{row['backend']:<11} {row['length']:>6} {row['put_get_ms']:>11.2f} {row['get_after_other_ms']:>19.2f}"
            f" {row['rows_after_put']:>19} {row['rows_after_other']:>21}"
        )


if __name__ == "__main__":
    main()
