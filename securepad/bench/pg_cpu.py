"""CPU and round trips per put and per read, securepad on PostgreSQL beside
SQLite, alone (``securepad.bench.postgres`` runs the same after its workloads).

    python -m securepad.bench.pg_cpu [--ops 1000] [--size 4096]

One client, ``--ops`` puts into one turn then as many reads, on each backend
(``securepad.bench.pg_costs``), in the bench database (``SECUREPAD_BENCH_PG_DSN``).
"""

from __future__ import annotations

import argparse
import json

from .pg_costs import cpu_per_op
from .postgres import bench_database

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securepad.bench.pg_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="puts (into one turn), then as many reads")
    parser.add_argument("--size", type=int, default=4096, help="bytes per entry")
    args = parser.parse_args(argv)
    result = cpu_per_op(bench_database(), count=args.ops, size=args.size)
    print(f"## CPU and round trips per operation (one client, {args.ops} puts into one turn, then as many reads)")
    print("| backend | op | ops/s | client CPU us | server CPU us | total CPU us | round trips |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in ("securepad", "securepad-postgresql"):
        for op in ("put", "read"):
            m = result[name][op]
            print(
                f"| {name} | {op} | {m['ops_per_s']:.0f} | {m['client_cpu_us']:.0f} | {m['server_cpu_us']:.0f}"
                f" | {m['cpu_us']:.0f} | {m['round_trips']:.1f} |"
            )
    print(f"\nPostgreSQL CPU per put {result['ratio']['put']:.2f}x SQLite's, per read {result['ratio']['read']:.2f}x")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
