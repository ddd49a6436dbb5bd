"""The PostgreSQL client's CPU per put and per read, two source trees side by
side in one process, one operation each in turn.

    python -m benchmarks.pg_client_ab /path/to/other/tree [--ops 500] [--rounds 6] [--pool]

On a shared machine the client's CPU per operation moves with the load by
more than a change of a few microseconds (runs of ``benchmarks.pg_cpu``
minutes apart differ by 10 to 20 %). Here the other tree's ``securepad``
(a checkout of an older commit) is imported as a package of its own next to
this one, each opens a store in its own schema, and their puts (4 KiB, into
one turn) then their reads alternate one operation at a time, so both meet
the same load and the same caches. Reported per round (``--ops`` of each):
the client's CPU per operation of each tree (``time.thread_time`` around
each call) and the difference; the medians over the rounds.

Stores open from the DSN (``Scratchpad.open(dsn)``, the pool is the
store's own) unless ``--pool``: then each on a pool of one connection passed
in, as ``benchmarks.pg_cpu`` opens them. The server is
``SECUREPAD_BENCH_PG_DSN`` (default the local one), database ``securepad_bench``.
"""

from __future__ import annotations

import argparse
import importlib
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

from securepad.bench import data

from .postgres import bench_database

__all__ = ["main"]


def _open(package: ModuleType, source: Any, schema: str, key_file: Path) -> tuple[Any, Any]:
    policy = package.Policy.from_dict(
        {"access": {"scope": "owner"}, "limits": {"owner_quota_bytes": 1 << 45}}, name="bench"
    )
    pad = package.Scratchpad.open(source, keyring=package.Keyring.from_key_file(key_file), policy=policy, schema=schema)
    return pad, package.Principal("bench-owner", "bench-agent", "bench")


def compare(other: Path, *, ops: int, rounds: int, pool: bool) -> dict[str, dict[str, list[float]]]:
    """Client CPU microseconds per put and per read of each tree ("other",
    "this"), one figure per round."""
    import psycopg
    from psycopg_pool import ConnectionPool

    import securepad

    dsn = bench_database()
    result: dict[str, dict[str, list[float]]] = {op: {"other": [], "this": []} for op in ("put", "read")}
    with tempfile.TemporaryDirectory(prefix="securepad-bench-ab-") as tmp:
        root = Path(tmp)
        shutil.copytree(other / "securepad", root / "securepad_other")
        sys.path.insert(0, str(root))
        try:
            packages = {"other": importlib.import_module("securepad_other"), "this": securepad}
        finally:
            sys.path.remove(str(root))
        schemas = {name: f"bench_ab_{name}_{secrets.token_hex(3)}" for name in packages}
        texts = [data.text(4096, salt=i) for i in range(ops * rounds + 20)]
        try:
            with ExitStack() as stack:
                pads: dict[str, tuple[Any, Any]] = {}
                for name, package in packages.items():
                    source: Any = dsn
                    if pool:
                        source = stack.enter_context(
                            ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True})
                        )
                    pads[name] = _open(package, source, schemas[name], root / "config" / "key")
                    stack.callback(pads[name][0].close)
                ids: dict[str, list[str]] = {name: [] for name in pads}
                for name, (pad, who) in pads.items():  # warm: the owner's key, caches, the server's plans
                    for i in range(20):
                        ids[name].append(str(pad.put(who, "warm", i, "bench", texts[i])["scratchpad_id"]))
                        pad.read(who, ids[name][-1], "head", n=2000)
                for r in range(rounds):
                    for op in ("put", "read"):
                        spent = {name: 0.0 for name in pads}
                        for i in range(ops):
                            for name in ("other", "this") if i % 2 == 0 else ("this", "other"):
                                pad, who = pads[name]
                                start = time.thread_time()
                                if op == "put":
                                    step = r * ops + i
                                    view = pad.put(who, "cpu", step, "bench", texts[20 + step])
                                    spent[name] += time.thread_time() - start
                                    ids[name].append(str(view["scratchpad_id"]))
                                else:
                                    pad.read(who, ids[name][-ops + i], "head", n=2000)
                                    spent[name] += time.thread_time() - start
                        for name, seconds in spent.items():
                            result[op][name].append(seconds / ops * 1e6)
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                for schema in schemas.values():
                    admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_client_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="another source tree (its securepad/ package)")
    parser.add_argument("--ops", type=int, default=500, help="puts, then reads, of each tree per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pool", action="store_true", help="stores on a pool passed in, not from the DSN")
    args = parser.parse_args(argv)
    result = compare(args.other, ops=args.ops, rounds=args.rounds, pool=args.pool)
    print(f"## Client CPU per operation, us: {args.other} (other) and this tree, alternating")
    print("| op | other (median) | this (median) | other - this, per round | median |")
    print("|---|---:|---:|---|---:|")
    for op, figures in result.items():
        diffs = [a - b for a, b in zip(figures["other"], figures["this"], strict=True)]
        print(
            f"| {op} | {statistics.median(figures['other']):.0f} | {statistics.median(figures['this']):.0f}"
            f" | {', '.join(f'{d:+.0f}' for d in diffs)} | {statistics.median(diffs):+.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
