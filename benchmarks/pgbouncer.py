"""Clients through PgBouncer in transaction pooling mode, and straight to the server.

``python -m benchmarks.pgbouncer`` starts Debian's ``pgbouncer`` on a free
local port in front of the PostgreSQL server (``--server``, default the local
one), creates a throwaway database, and runs 1, 8, 32 and 64 client threads
(``--clients``), each its own owner and its own pooled connection, 50/50
put/read of 4 KiB, for each target (``--targets``):

* ``pgbouncer``: a store opened on a pool to PgBouncer's DSN with the store's
  defaults: it prepares its statements until it notices the pooler, then
  stops (``securepad/storage/postgres/prepared.py``);
* ``pgbouncer-unprepared``: the pool the PostgreSQL guide recommends behind a
  pooler (``prepare_threshold=None``: never prepares);
* ``direct``: straight to the server, one server connection per client,
  statements prepared.

It prints ops/s, p50 and p99 per target and client count, errors and lost
writes (entries acknowledged but not in the store), then stops PgBouncer and
drops the database. ``--quick`` runs 1 and 8 clients for 1 s each (a smoke
run). ``PgBouncer`` (``tests.support.pgbouncer``) is also what the tests start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.support.pgbouncer import SERVER_POOL_SIZE, PgBouncer, pooled_store

__all__ = ["TARGETS", "main", "run"]

SERVER_DSN = os.environ.get("SECUREPAD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
CLIENTS = (1, 8, 32, 64)


@contextlib.contextmanager
def _database(server_dsn: str) -> Iterator[str]:
    import psycopg

    name = f"securepad_bench_{secrets.token_hex(6)}"
    with psycopg.connect(server_dsn, autocommit=True) as server:
        server.execute(f"CREATE DATABASE {name}")
        try:
            yield name
        finally:
            server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


TARGETS = ("pgbouncer", "pgbouncer-unprepared", "direct")


def run(clients: int, dsn: str, keyring: Any, *, seconds: float, prepare: bool, size: int = 4096) -> dict[str, Any]:
    """``clients`` threads, an owner each, alternating put and read for ``seconds``;
    one store on a pool of ``clients`` connections to ``dsn`` (``prepare``: see ``pooled_store``)."""
    from securepad import Principal

    pad, pool = pooled_store(dsn, keyring, pool_size=clients, prepare=prepare)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    written = [0] * clients
    stop = threading.Event()
    tag = secrets.token_hex(4)

    def worker(i: int) -> None:
        who = Principal(f"bench-{tag}-{i}", "agent", "bench")
        payload = "x" * size
        last: str | None = None
        step = 0
        while not stop.is_set():
            started = time.perf_counter()
            try:
                if last is None or step % 2 == 0:
                    step += 1
                    last = pad.put(who, "turn", step, "tool", payload)["scratchpad_id"]
                    written[i] += 1
                else:
                    step += 1
                    pad.get(who, last)
            except Exception as exc:  # counted, not raised: the figure is the error count
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies[i].append(time.perf_counter() - started)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
        stored = sum(pad.stats(Principal(f"bench-{tag}-{i}", "agent", "bench"))["entries"] for i in range(clients))
    finally:
        pad.close()
        pool.close()
    flat = sorted(x for xs in latencies for x in xs)
    return {
        "clients": clients,
        "ops": len(flat),
        "ops_per_s": len(flat) / elapsed,
        "p50_ms": 1000 * statistics.median(flat) if flat else 0.0,
        "p99_ms": 1000 * flat[min(len(flat) - 1, int(len(flat) * 0.99))] if flat else 0.0,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "lost_writes": sum(written) - int(stored),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pgbouncer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per target and client count (default 10)")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--quick", action="store_true", help="1 and 8 clients, 1 s each (a smoke run)")
    parser.add_argument("--server", default=SERVER_DSN, help="the PostgreSQL server behind PgBouncer")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds = [c for c in args.clients if c <= 8] or [1], min(args.seconds, 1.0)
    from securepad import Keyring

    parts = urlsplit(args.server)
    keys = tempfile.TemporaryDirectory(prefix="securepad-bench-key-")
    keyring = Keyring.from_key_file(Path(keys.name) / "key")
    with (
        keys,
        _database(args.server) as dbname,
        PgBouncer(server_host=parts.hostname or "127.0.0.1", server_port=parts.port or 5432) as b,
    ):
        direct = urlunsplit(parts._replace(path=f"/{dbname}"))
        print(
            f"PgBouncer {b.port}, transaction pooling, {SERVER_POOL_SIZE} server connections;"
            f" direct: a server connection per client; 50/50 put/get of 4 KiB, {args.seconds:g} s each"
        )
        print("| target | clients | ops/s | p50 ms | p99 ms | errors | lost writes |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for target in args.targets:
            dsn = direct if target == "direct" else b.dsn(dbname)
            for clients in args.clients:
                r = run(clients, dsn, keyring, seconds=args.seconds, prepare=target != "pgbouncer-unprepared")
                print(
                    f"| {target} | {r['clients']} | {r['ops_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
                    f" {r['errors']} | {r['lost_writes']} |",
                    flush=True,
                )
                if r["errors"]:
                    print(f"  first error: {r['first_error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
