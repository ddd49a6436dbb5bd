"""A fresh process opens a PostgreSQL store and resumes a turn: where the time goes.

    python -m benchmarks.pg_open [--runs 15] [--steps 10] [--compare /path/to/other/tree]

Each run is a new Python process that imports securepad and psycopg, opens
the store from its DSN (``Scratchpad.open``) and resumes a turn of ``--steps``
entries (``pad.turn(...).history()`` and ``.tools()``, as the suite's
resumption workload does). It reports, apart, the imports (outside the
store's hands), the open and the resume in milliseconds (medians), and what
the open and the resume cost that does not depend on the machine's load: the
connections made and the round trips (the waits of psycopg's connections for
the server, as tests/storage/postgres/test_open_costs.py counts them).

``--compare`` runs another source tree (a checkout of an older commit) in
alternation with this one, on the same store, so that before and after meet
the same load. Modules are compiled once, before the runs, into a cache of
the run's (as a deployed process finds them). The server is ``SECUREPAD_BENCH_PG_DSN`` (default the local
one); the store lives in a database ``securepad_bench``, schema ``bench_open``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from securepad import Keyring, Principal, Scratchpad
from securepad.bench import data

from .postgres import bench_database

__all__ = ["main"]

SCHEMA = "bench_open"
PRINCIPAL = Principal("bench-open", "agent", "bench")

# The child: imports, open, resume, each timed; connections and waits counted
# by wrappers around psycopg's own (the real ones run).
_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from securepad import Keyring, Principal, Scratchpad
t1 = time.perf_counter()
import psycopg, psycopg_pool
t2 = time.perf_counter()
counts = {"connections": 0, "round_trips": 0}
connect, wait, module_connect = psycopg.Connection.connect.__func__, psycopg.Connection.wait, psycopg.connect
def counted_connect(cls, conninfo="", **kwargs):
    counts["connections"] += 1
    return connect(cls, conninfo, **kwargs)
def counted_module_connect(conninfo="", **kwargs):
    return counted_connect(psycopg.Connection, conninfo, **kwargs)
def counted_wait(self, *args, **kwargs):
    counts["round_trips"] += 1
    return wait(self, *args, **kwargs)
psycopg.Connection.connect = classmethod(counted_connect)
psycopg.connect = counted_module_connect
psycopg.Connection.wait = counted_wait
dsn, key, schema, owner, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
keyring = Keyring.from_key_file(key)
t3 = time.perf_counter()
pad = Scratchpad.open(dsn, keyring=keyring, schema=schema)
t4 = time.perf_counter()
at_open = dict(counts)
turn = pad.turn(Principal(owner, "agent", "bench"), "turn")
history, tools = list(turn.history()), list(turn.tools())
t5 = time.perf_counter()
assert len(history) == steps and tools, (len(history), len(tools))
pad.close()
print(json.dumps({
    "import_ms": 1000 * (t2 - t0), "open_ms": 1000 * (t4 - t3), "resume_ms": 1000 * (t5 - t4),
    "open_connections": at_open["connections"], "open_round_trips": at_open["round_trips"],
    "resume_connections": counts["connections"] - at_open["connections"],
    "resume_round_trips": counts["round_trips"] - at_open["round_trips"],
}))
"""


def _tree_of_this_module() -> Path:
    return Path(__file__).resolve().parents[2]


def _child(tree: Path, dsn: str, key: Path, steps: int, pycache: Path) -> dict[str, Any]:
    # Compiled modules cached (in a directory of the run's, not in the trees), as
    # a deployed process finds them: with PYTHONDONTWRITEBYTECODE (set on the
    # development machine) every import compiles its module again, ~4 ms each.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(pycache / tree.name)}
    argv = [sys.executable, "-c", _CHILD, dsn, str(key), SCHEMA, PRINCIPAL.owner_user_id, str(steps)]
    # Run from a directory of its own: the current one would come first on sys.path.
    done = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the child on {tree} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _store(dsn: str, key: Path, steps: int) -> None:
    """A store with one turn of ``steps`` entries of 8 KiB (the resumption workload's)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    with Scratchpad.open(dsn, keyring=Keyring.from_key_file(key), schema=SCHEMA) as pad:
        for i in range(steps):
            pad.put(PRINCIPAL, "turn", i + 1, "bench", data.text(8 * 1024, salt=i))


def run(trees: list[Path], *, runs: int, steps: int) -> dict[str, list[dict[str, Any]]]:
    """``runs`` fresh processes per tree, the trees in alternation."""
    dsn = bench_database()
    results: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="securepad-bench-open-") as tmp:
        key, pycache = Path(tmp) / "key", Path(tmp) / "pycache"
        _store(dsn, key, steps)
        for tree in trees:
            _child(tree, dsn, key, steps, pycache)  # compiles and caches the modules: not counted
        for _ in range(runs):
            for tree in trees:
                results[str(tree)].append(_child(tree, dsn, key, steps, pycache))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_open", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per tree (default 15)")
    parser.add_argument("--steps", type=int, default=10, help="entries of the resumed turn (default 10)")
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another source tree to alternate with"
    )
    args = parser.parse_args(argv)
    trees = [_tree_of_this_module(), *(p.resolve() for p in args.compare)]
    results = run(trees, runs=args.runs, steps=args.steps)
    print(f"## a fresh process: open a PostgreSQL store and resume a turn of {args.steps} steps ({args.runs} runs)")
    print("| tree | imports ms | open ms | resume ms | connections at open | round trips at open | at resume |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tree, rows in results.items():

        def median(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return float(statistics.median(r[key] for r in rows))

        print(
            f"| {tree} | {median('import_ms'):.1f} | {median('open_ms'):.1f} | {median('resume_ms'):.1f}"
            f" | {median('open_connections'):.0f} | {median('open_round_trips'):.0f}"
            f" | {median('resume_round_trips'):.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
