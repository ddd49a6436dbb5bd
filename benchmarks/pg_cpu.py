"""CPU and round trips per put and per read, securepad on PostgreSQL beside
SQLite, alone (``benchmarks.postgres`` runs the same after its workloads).

    python -m benchmarks.pg_cpu [--ops 1000] [--size 4096] [--pool]

One client, ``--ops`` puts into one turn then as many reads, on each backend
(``benchmarks.pg_costs``), in the bench database (``SECUREPAD_BENCH_PG_DSN``).
The PostgreSQL store is opened from the DSN, as users open it; ``--pool`` adds
a row for a store on a pool passed in (every connection back to the pool after each call).
"""

from __future__ import annotations

import argparse
import json

from .pg_costs import cpu_per_op, cpu_table
from .postgres import bench_database

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="puts (into one turn), then as many reads")
    parser.add_argument("--size", type=int, default=4096, help="bytes per entry")
    parser.add_argument("--pool", action="store_true", help="also a store on a pool passed in (a second row)")
    args = parser.parse_args(argv)
    result = cpu_per_op(bench_database(), count=args.ops, size=args.size, pool=args.pool)
    print(f"## CPU and round trips per operation (one client, {args.ops} puts into one turn, then as many reads)")
    print("\n".join(cpu_table(result)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
