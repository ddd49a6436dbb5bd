"""What sealed turn heads (issue 14) cost: put and turn read with and without them, and verify.

``python -m securepad.bench.heads [--entries N] [--verify-entries N]``

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

from securepad import Keyring, Principal, Scratchpad
from securepad.bench.costs import put_costs
from securepad.store import parts

__all__ = ["main", "run"]

ALICE = Principal("alice", "agent", "web")
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


def _verify(root: Path, keyring: Keyring, count: int) -> dict[str, Any]:
    with Scratchpad.open(root / "verify.db", keyring=keyring) as pad:
        now = time.time()
        batch = [(step, "tool", f"observation {step} " + "y" * 200) for step in range(1, 101)]
        for turn in range(count // 100):
            pad.put_many(ALICE, f"turn-{turn}", batch, now=now)
        report = pad.verify(now=now)
    return {"entries": report["entries"], "turns": report["turns"], "ok": report["ok"], "seconds": report["seconds"]}


def run(entries: int = 2000, verify_entries: int = 100_000) -> dict[str, Any]:
    """Both sides and the verify figure, as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        keyring = Keyring.from_key_file(root / "key")
        without = _side(root, keyring, False, entries)
        with_heads = _side(root, keyring, True, entries)
        verified = _verify(root, keyring, verify_entries)
    return {"entries_per_side": entries, "without_heads": without, "with_heads": with_heads, "verify": verified}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m securepad.bench.heads", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000, help="puts per side (4 KiB each, 20 steps a turn)")
    parser.add_argument("--verify-entries", type=int, default=100_000, help="entries in the store verify walks")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.entries, args.verify_entries), indent=2))


if __name__ == "__main__":
    main()
