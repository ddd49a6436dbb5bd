"""Time grep's worst patterns on a large entry, through the real store (decrypting
every segment), and check each call against the stated bound.

    python -m benchmarks.grep_worst [--mib 100] [--only NAME] [--out FILE]

The bound: a grep call's cost is linear in the bytes it scans,
whatever the pattern, and no call runs longer than the work budget
(``GREP_TIME_BUDGET_S``, plus the one bounded RE2 call in flight) before it
returns a partial result that says where to go on. The figures printed per
pattern: seconds for the call, MiB scanned, MiB/s, RE2 calls, whether the
budget cut it short. Every call must finish within ``--bound`` seconds
(default: the budget plus 1 s). The figures are also written as JSON to
``--out`` (default: ``securepad-bench-results/grep_worst.json``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import DEFAULT_OUT
from securepad import Keyring, Policy, Principal, Scratchpad
from securepad.core.grep import GREP_TIME_BUDGET_S

MIB = 1 << 20


def _two_char_lines(size: int) -> str:
    return "a\n" * (size // 2)


def _json_list(size: int) -> list[dict[str, object]]:
    item = {"id": 0, "title": "result title here", "tags": ["x", "y"], "score": 0.5}
    return [dict(item, id=i) for i in range(size // 80)]


def _ab_text(size: int) -> str:
    # Long lines of a/b: the text on which an exponential DFA runs out of its cache.
    line = ("ab" * 40 + "aabba" * 20 + "b") + "\n"
    return line * (size // len(line))


def _one_line(size: int) -> str:
    return "x" * size


def _long_lines(size: int) -> str:
    return ("y" * 400 + "\n") * (size // 401)


def _log_lines(size: int) -> str:
    line = "2026-01-01T00:00:00 INFO request served path=/api/v1/items status=200 ms=12\n"
    return line * (size // len(line))


_GROUPS = "".join("(.)" for _ in range(300))

# name -> (observation builder, pattern, max_matches)
CASES: dict[str, tuple[Callable[[int], object], str, int]] = {
    "cross-line pattern, 2-char lines": (_two_char_lines, r"\S[\s\S]*\n[\s\S]*\S", 50),
    "cross-line pattern, json list": (_json_list, r"\S[\s\S]*\n[\s\S]*\S", 50),
    "300 capture groups, 2-char lines": (_two_char_lines, _GROUPS, 1),
    "240 capture groups, max_matches=1": (_long_lines, "(.*)" * 240, 1),
    "300 capture groups + every line matches": (_log_lines, _GROUPS[: 3 * 60], 1_000_000),
    "DFA blow-up (a|b)*a(a|b){20}": (_ab_text, r"(a|b)*a(a|b){20}c", 50),
    "counted repetition, no match, one line": (_one_line, r"[a-z]{200}y", 50),
    "text anchors (line by line)": (_two_char_lines, r"\Ab\z", 50),
    "match-all pattern": (_two_char_lines, r"", 1_000_000),
    "plain literal, no match": (_log_lines, r"status=500", 50),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grep_worst", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--mib", type=float, default=100.0, help="size of each entry in MiB")
    parser.add_argument("--only", action="append", help="run only the cases whose name contains this")
    parser.add_argument("--bound", type=float, default=None, help="seconds no call may exceed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "grep_worst.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    size = int(args.mib * MIB)
    bound = args.bound if args.bound is not None else GREP_TIME_BUDGET_S + 1.0
    records: list[dict[str, Any]] = []
    policy = Policy.from_dict(
        {"access": {"scope": "owner"}, "limits": {"max_entry_bytes": 4 * size + MIB, "owner_quota_bytes": 1 << 40}}
    )
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="securepad-bench-grep-") as tmp:
        root = Path(tmp)
        keyring = Keyring.create_key_file(root / "key")
        with Scratchpad.open(root / "store.db", keyring=keyring, policy=policy) as pad:
            alice = Principal("alice", "agent", "bench")
            for step, (name, (build, pattern, max_matches)) in enumerate(CASES.items(), 1):
                if args.only and not any(part in name for part in args.only):
                    continue
                view = pad.put(alice, "grep", step, "tool", build(size))
                started = time.perf_counter()
                result = pad.read(alice, view["scratchpad_id"], mode="grep", pattern=pattern, max_matches=max_matches)
                took = time.perf_counter() - started
                meta = result["metadata"]
                scanned = meta["bytes_scanned"]
                worst = max(worst, took)
                records.append(
                    {
                        "case": name,
                        "pattern": pattern,
                        "max_matches": max_matches,
                        "seconds": took,
                        "entry_bytes": view["size_bytes"],
                        "text_chars": meta["size_full"],
                        "bytes_scanned": scanned,
                        "mib_per_s": scanned / MIB / took if took else None,
                        "re2_calls": meta["re2_calls"],
                        "matches": meta["matches"],
                        "budget_exhausted": meta["budget_exhausted"],
                    }
                )
                rate = f"{scanned / MIB / took:7.1f} MiB/s" if scanned and took else "   n/a"
                print(
                    f"{name:42s} {took:7.2f} s  entry {view['size_bytes'] / MIB:6.1f} MiB"
                    f"  scanned {scanned / MIB:6.1f} MiB {rate}  re2 calls {meta['re2_calls']}"
                    f"  matches {meta['matches']}  budget hit {meta['budget_exhausted']}",
                    flush=True,
                )
                pad.delete(alice, view["scratchpad_id"])
    within = worst <= bound
    print(f"slowest call {worst:.2f} s; bound {bound:g} s ({'within the bound' if within else 'OVER THE BOUND'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"mib": args.mib, "budget_s": GREP_TIME_BUDGET_S, "bound_s": bound, "slowest_s": worst}
    args.out.write_text(json.dumps({**summary, "within_bound": within, "cases": records}, indent=2))
    print(f"results: {args.out}")
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
