"""What sealed turn heads cost: put and turn read with and without them, and verify.

``python -m benchmarks.heads [--entries N] [--verify-entries N] [--long-turn N]``

``turn_length`` puts into a turn of 5 steps and into one of ``--long-turn``
(500) steps, on one store that holds both (so the B-trees are the same): a
head of constant size makes both cost the same statements, WAL frames and
time (``tests/tables/heads/test_heads.py`` guards the first two).

Both sides run in one process on the same machine, alternating, on stores
filled the same way. "Without heads" swaps the store's head hooks
(``Heads.change`` and ``Inventories.checked``) for pass-throughs on that store only:
it measures what the heads add, not a supported mode. Timings depend on the
load of the machine; the statement and WAL-frame counts of
``securepad.bench.costs`` do not (``tests/tables/entries/test_hot_path.py`` guards them).

``read_length`` (``--read-lengths 1,20,500``, ``--pg DSN`` for PostgreSQL
too) reads the tail (2,000 characters) of a 4 KiB entry of turns of those
lengths, warm (the same read just ran; the garbage collector paused during
the timed reads, as ``timeit`` does), with the verified-head cache
(``head_cache``) and without it (``Heads.cache_limit(0)``: every read
recounts its turn's inventory, as before the cache), alternating in blocks
of ten reads on one store. Besides the time it counts what a read sends and fetches
(statements, rows; round trips on PostgreSQL), which load does not change
(``tests/tables/heads/test_reading.py`` guards them), and on PostgreSQL the serving
backend's CPU per read (``/proc/<pid>/stat``: the server still reads the
turn's rows to digest them).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from securepad import Keyring, Principal, Scratchpad
from securepad.store import parts
from securepad.tables.heads.reading import CACHE_TURNS
from tests.support.meters import ReadMeter
from tests.support.store_costs import put_costs, turn_put_costs

__all__ = ["main", "read_length", "run"]

ALICE = Principal("alice", "agent", "web")
_NOW = 1_000_000.0
_TURN_STEPS = 20
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# read_length alternates the two sides in blocks of this many timed reads.
_BLOCK = 10


def _without_heads(pad: Scratchpad) -> None:
    heads = parts(pad).heads

    def change(*args: Any, **kwargs: Any) -> int:
        return 0

    def checked(
        owner: str, turn_id: str, fetch: Callable[[], Any], check: Callable[..., None], first: Any = None
    ) -> Any:
        return fetch() if first is None else first[0]

    heads.change = change  # type: ignore[method-assign]
    heads.inventories.checked = checked  # type: ignore[method-assign]


def _timed(call: Callable[[], Any], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e6)
    return times


def _side(root: Path, keyring: Keyring, heads: bool, entries: int) -> dict[str, Any]:
    pad = Scratchpad.open(root / ("with.db" if heads else "without.db"), keyring=keyring)
    try:
        if not heads:
            _without_heads(pad)
        now = time.time()
        step = iter(range(1, 10**9))
        puts = _timed(
            lambda: pad.put(
                ALICE, f"t{next(step) % (entries // _TURN_STEPS)}", next(step), "tool", "x" * 4096, now=now
            ),
            entries,
        )
        reads = _timed(lambda: pad.turn(ALICE, "t1", now=now).history(now=now), 200)
        costs = put_costs(pad, ALICE, 4096)
    finally:
        pad.close()
    return {
        "put_us_median": round(statistics.median(puts), 1),
        "turn_read_us_median": round(statistics.median(reads), 1),
        "put_statements": costs["statements"],
        "put_wal_frames": costs["wal_frames"],
    }


def _turn_length(root: Path, keyring: Keyring, long_turn: int, repeat: int) -> dict[str, Any]:
    """Put cost into a 5-step turn and into a ``long_turn``-step one, alternating, on one store."""
    with Scratchpad.open(root / "length.db", keyring=keyring) as pad:
        for turn, steps in (("short", 5), ("long", long_turn)):
            pad.put_many(ALICE, turn, [(s, "tool", "x" * 512) for s in range(1, steps + 1)], now=_NOW)
        next_step = {"short": 6, "long": long_turn + 1}
        times: dict[str, list[float]] = {"short": [], "long": []}
        for _ in range(repeat):
            for turn in times:
                step, next_step[turn] = next_step[turn], next_step[turn] + 1
                started = time.perf_counter()
                pad.put(ALICE, turn, step, "tool", "x" * 4096, now=_NOW)
                times[turn].append((time.perf_counter() - started) * 1e6)
        costs = {}
        for turn in times:
            costs[turn] = turn_put_costs(pad, ALICE, turn, next_step[turn])
            next_step[turn] += 1
    return {
        f"{turn}_turn": {
            "steps": 5 if turn == "short" else long_turn,
            "put_us_median": round(statistics.median(times[turn]), 1),
            **costs[turn],
        }
        for turn in times
    }


def _server_cpu_s(pid: int | None) -> float:
    """A local server process's user + system CPU seconds (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def read_length(
    pad: Scratchpad, lengths: tuple[int, ...], repeat: int, server_pid: int | None = None
) -> dict[str, Any]:
    """Warm ``read(tail, 2000)`` of a 4 KiB entry in turns of ``lengths`` steps,
    with and without the verified-head cache, alternating: median µs, CPU µs
    per read (client, and server with ``server_pid``), and the statements,
    rows and calls of one read."""
    heads = parts(pad).heads
    text = "".join(f"line {i}: {'x' * 60}\n" for i in range(64))  # about 4 KiB
    tails = {}
    for length in lengths:
        turn = f"length-{length}"
        for first in range(1, length + 1, 100):
            batch = [(step, "tool", text) for step in range(first, min(first + 100, length + 1))]
            views = pad.put_many(ALICE, turn, batch, now=_NOW)
        tails[length] = views[-1]["scratchpad_id"]
    meter = ReadMeter(pad)
    sides = {"cache": CACHE_TURNS, "no_cache": 0}
    out: dict[str, Any] = {}
    for length in lengths:

        def read(entry: str = tails[length]) -> None:
            pad.read(ALICE, entry, "tail", n=2000, now=_NOW)

        times: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [0.0, 0.0] for side in sides}
        counts = {}
        for block in range(max(repeat // _BLOCK, 1) + 1):
            for side, turns in sides.items():
                heads.cache_limit(turns)
                read()  # warm: the cache (when on) holds the turn
                if block == 0:
                    counts[side] = meter.counts(read)
                    continue
                gc.disable()  # as timeit does: the warm-up's garbage is not the reads' cost
                try:
                    for _ in range(_BLOCK):
                        client, server = time.process_time(), _server_cpu_s(server_pid)
                        started = time.perf_counter()
                        read()
                        times[side].append((time.perf_counter() - started) * 1e6)
                        cpu[side][0] += time.process_time() - client
                        cpu[side][1] += _server_cpu_s(server_pid) - server
                finally:
                    gc.enable()
        out[f"{length}_steps"] = {}
        for side in sides:
            reads = len(times[side])
            out[f"{length}_steps"][side] = {
                "read_us_median": round(statistics.median(times[side]), 1),
                "client_cpu_us": round(cpu[side][0] / reads * 1e6, 1),
                **({"server_cpu_us": round(cpu[side][1] / reads * 1e6, 1)} if server_pid is not None else {}),
                **counts[side],
            }
    heads.cache_limit(CACHE_TURNS)
    return out


def _read_length_sqlite(root: Path, keyring: Keyring, lengths: tuple[int, ...], repeat: int) -> dict[str, Any]:
    with Scratchpad.open(root / "read-length.db", keyring=keyring) as pad:
        return read_length(pad, lengths, repeat)


def _read_length_pg(dsn: str, keyring: Keyring, lengths: tuple[int, ...], repeat: int) -> dict[str, Any]:
    import psycopg
    from psycopg_pool import ConnectionPool

    schema = f"bench_heads_{secrets.token_hex(4)}"
    try:
        with (
            ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool,
            Scratchpad.open(pool, keyring=keyring, schema=schema) as pad,
        ):
            with pool.connection() as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return read_length(pad, lengths, repeat, int(row[0]) if row is not None else None)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _verify(root: Path, keyring: Keyring, count: int) -> dict[str, Any]:
    with Scratchpad.open(root / "verify.db", keyring=keyring) as pad:
        now = time.time()
        batch = [(step, "tool", f"observation {step} " + "y" * 200) for step in range(1, 101)]
        for turn in range(count // 100):
            pad.put_many(ALICE, f"turn-{turn}", batch, now=now)
        report = pad.verify(now=now)
    return {"entries": report["entries"], "turns": report["turns"], "ok": report["ok"], "seconds": report["seconds"]}


def run(
    entries: int = 2000,
    verify_entries: int = 100_000,
    long_turn: int = 500,
    read_lengths: tuple[int, ...] = (1, 20, 500),
    read_repeat: int = 200,
    pg: str | None = None,
) -> dict[str, Any]:
    """Both sides, the turn lengths and the verify figure, as a dict
    (``read_length`` on PostgreSQL too with a DSN ``pg``)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        keyring = Keyring.from_key_file(root / "key")
        without = _side(root, keyring, False, entries)
        with_heads = _side(root, keyring, True, entries)
        length = _turn_length(root, keyring, long_turn, 200)
        reads = {"sqlite": _read_length_sqlite(root, keyring, read_lengths, read_repeat)}
        if pg is not None:
            reads["postgresql"] = _read_length_pg(pg, keyring, read_lengths, read_repeat)
        verified = _verify(root, keyring, verify_entries) if verify_entries else None
    return {
        "entries_per_side": entries,
        "without_heads": without,
        "with_heads": with_heads,
        "turn_length": length,
        "read_length": reads,
        "verify": verified,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heads", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000, help="puts per side (4 KiB each, 20 steps a turn)")
    parser.add_argument("--verify-entries", type=int, default=100_000, help="entries in the store verify walks")
    parser.add_argument("--long-turn", type=int, default=500, help="steps of the long turn (turn_length)")
    parser.add_argument("--read-lengths", default="1,20,500", help="turn lengths of read_length, comma-separated")
    parser.add_argument("--read-repeat", type=int, default=200, help="timed reads per side and length")
    parser.add_argument("--pg", metavar="DSN", help="run read_length on PostgreSQL too (a schema of its own, dropped)")
    args = parser.parse_args(argv)
    lengths = tuple(int(length) for length in args.read_lengths.split(","))
    result = run(args.entries, args.verify_entries, args.long_turn, lengths, args.read_repeat, args.pg)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
