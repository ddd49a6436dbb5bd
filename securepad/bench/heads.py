"""What sealed turn heads (issue 14) cost: put and turn read with and without them, and verify.

``python -m securepad.bench.heads [--entries N] [--verify-entries N] [--long-turn N]``

``turn_length`` puts into a turn of 5 steps and into one of ``--long-turn``
(500) steps, on one store that holds both (so the B-trees are the same): a
head of constant size makes both cost the same statements, WAL frames and
time (``tests/test_turn_heads.py`` guards the first two).

Both sides run in one process on the same machine, alternating, on stores
filled the same way. "Without heads" swaps the store's head hooks
(``Heads.change`` and ``Heads.checked``) for pass-throughs on that store only:
it measures what the heads add, not a supported mode. Timings depend on the
load of the machine; the statement and WAL-frame counts of
``securepad.bench.costs`` do not (``tests/test_hot_path.py`` guards them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

from securepad import Keyring, Principal, Scratchpad
from securepad.bench.costs import put_costs, wal_frames
from securepad.store import parts, sqlite_of

__all__ = ["main", "run", "turn_put_costs"]

ALICE = Principal("alice", "agent", "web")
_NOW = 1_000_000.0
_TURN_STEPS = 20


def _without_heads(pad: Scratchpad) -> None:
    heads = parts(pad).entries.heads

    def change(*args: Any, **kwargs: Any) -> None:
        return None

    def checked(
        owner: str, turn_id: str, fetch: Callable[[], Any], check: Callable[..., None], first: Any = None
    ) -> Any:
        return fetch() if first is None else first[0]

    heads.change = change  # type: ignore[method-assign]
    heads.checked = checked  # type: ignore[method-assign]


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


def turn_put_costs(pad: Scratchpad, principal: Principal, turn_id: str, step: int) -> dict[str, int]:
    """Statements and WAL frames of one 4 KiB put at ``step`` into ``turn_id`` (a SQLite store)."""
    db = sqlite_of(pad)
    if not db.checkpoint():
        raise RuntimeError("a reader kept the WAL from being emptied; cannot count frames")
    counts = {"statements": 0}

    def trace(event: dict[str, Any]) -> None:
        counts["statements"] += 0 if event.get("trigger") else 1

    db.conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        pad.put(principal, turn_id, step, "tool", "x" * 4096, now=_NOW)
    finally:
        db.conn.trace_v2(0, None)
    counts["wal_frames"] = wal_frames(pad)
    return counts


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


def _verify(root: Path, keyring: Keyring, count: int) -> dict[str, Any]:
    with Scratchpad.open(root / "verify.db", keyring=keyring) as pad:
        now = time.time()
        batch = [(step, "tool", f"observation {step} " + "y" * 200) for step in range(1, 101)]
        for turn in range(count // 100):
            pad.put_many(ALICE, f"turn-{turn}", batch, now=now)
        report = pad.verify(now=now)
    return {"entries": report["entries"], "turns": report["turns"], "ok": report["ok"], "seconds": report["seconds"]}


def run(entries: int = 2000, verify_entries: int = 100_000, long_turn: int = 500) -> dict[str, Any]:
    """Both sides and the verify figure, as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        keyring = Keyring.from_key_file(root / "key")
        without = _side(root, keyring, False, entries)
        with_heads = _side(root, keyring, True, entries)
        length = _turn_length(root, keyring, long_turn, 200)
        verified = _verify(root, keyring, verify_entries)
    return {
        "entries_per_side": entries,
        "without_heads": without,
        "with_heads": with_heads,
        "turn_length": length,
        "verify": verified,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m securepad.bench.heads", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000, help="puts per side (4 KiB each, 20 steps a turn)")
    parser.add_argument("--verify-entries", type=int, default=100_000, help="entries in the store verify walks")
    parser.add_argument("--long-turn", type=int, default=500, help="steps of the long turn (turn_length)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.entries, args.verify_entries, args.long_turn), indent=2))


if __name__ == "__main__":
    main()
