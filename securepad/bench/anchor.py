"""What the snapshot-rollback anchor costs a put (SQLite), each sync policy side by side.

    python -m securepad.bench.anchor [PUTS] [ROUNDS]

Four stores in one directory tree, one per setting: no anchor (``anchor=False``),
and ``anchor_sync`` = ``commit``, ``interval`` (1 s) and ``close``. Each round
puts PUTS (default 300) observations of 4 KiB into each store in turn (the
order rotates per round, so machine load falls on every setting alike), and
the median put time per setting over ROUNDS (default 5) rounds is printed
with its cost against no anchor, with the mean and the slowest put (where a
sync run inside a put shows). Also printed: the statements one put runs
(load-independent) with and without the anchor.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad.store import sqlite_of

PRINCIPAL = Principal("alice", "planner", "web")
TEXT = ("x" * 63 + "\n") * 64  # 4 KiB
SETTINGS: dict[str, tuple[bool, str]] = {
    "no anchor": (False, "commit"),
    "anchor_sync=commit": (True, "commit"),
    "anchor_sync=interval (1 s)": (True, "interval"),
    "anchor_sync=close": (True, "close"),
}


def _open(root: Path, name: str, anchored: bool, sync: str) -> Scratchpad:
    data, keys = root / name / "data", root / name / "keys"
    policy = Policy.from_dict({"storage": {"anchor_sync": sync, "anchor_interval_seconds": 1}})
    keyring = Keyring.from_key_file(keys / "key")
    return Scratchpad.open(data / "store.db", keyring=keyring, policy=policy, anchor=None if anchored else False)


def _statements(pad: Scratchpad, step: int) -> int:
    """How many statements one put runs (an apsw exec tracer on this thread's connection)."""
    conn = sqlite_of(pad).conn
    count = 0

    def trace(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        nonlocal count
        count += 1
        return True

    conn.exec_trace = trace
    try:
        pad.put(PRINCIPAL, "stmts", step, "shell", TEXT)
    finally:
        conn.exec_trace = None
    return count


def main(puts: int = 300, rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        names = list(SETTINGS)
        pads = {name: _open(root, str(i), *SETTINGS[name]) for i, name in enumerate(names)}
        times: dict[str, list[float]] = {name: [] for name in names}
        try:
            for round_no in range(rounds):
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for name in order:
                    pad = pads[name]
                    for i in range(puts):
                        start = time.perf_counter()
                        pad.put(PRINCIPAL, f"t{round_no}", i + 1, "shell", TEXT)
                        times[name].append(time.perf_counter() - start)
            statements = {name: _statements(pads[name], 1) for name in names}
        finally:
            for pad in pads.values():
                pad.close()
    base = statistics.median(times["no anchor"])
    mean_base = statistics.fmean(times["no anchor"])
    print(f"put of 4 KiB, {puts} puts x {rounds} rounds per setting (median and mean per put; statements per put):")
    for name in names:
        median, mean = statistics.median(times[name]), statistics.fmean(times[name])
        print(
            f"  {name:28s} median {median * 1e3:7.3f} ms ({(median / base - 1) * 100:+7.1f}%)"
            f"  mean {mean * 1e3:7.3f} ms ({(mean / mean_base - 1) * 100:+7.1f}%)"
            f"  slowest {max(times[name]) * 1e3:7.3f} ms  statements {statements[name]}"
        )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
