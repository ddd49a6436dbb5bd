"""securepad on PostgreSQL side by side with securepad on SQLite: the
concurrency and resumption workloads of the suite, run by the suite's own code.

    python -m benchmarks.postgres [--processes 8] [--threads 1] [--seconds 5]

The server is ``SECUREPAD_BENCH_PG_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), a role that may create
databases and roles; the stores live in a database ``securepad_bench`` (created
when missing), each in a schema named after its directory, dropped when the
workload creates the store afresh. Workers and parent use the same principal,
as in the SQLite runs: every put of the run is one owner's, so PostgreSQL
serializes them on that owner's lock as SQLite serializes all writes.
``--owner-per-process`` (the default; ``--no-owner-per-process`` skips it)
adds a run in which each worker process puts as an owner of its own (reads
stay on the seeded entries), the multi-tenant case
where PostgreSQL writes different owners in parallel; SQLite is run the same
way for comparison. Then one client's CPU (its own and the server's) and
round trips per put and per read on each backend, the PostgreSQL store opened
from the DSN as users open it (``benchmarks.pg_costs``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from benchmarks import DEFAULT_OUT
from securepad import Keyring, Principal, Scratchpad
from securepad.bench.backends import PRINCIPAL, Backend, SecurepadBackend, bench_policy
from securepad.bench.config import Config
from securepad.bench.workloads import run_concurrent, run_resume
from securepad.store import parts

from .pg_costs import cpu_per_op, cpu_table

# The PostgreSQL modules imported with this one, before any workload's clock
# starts (the fresh-process resumption among them), as securepad's SQLite
# modules are imported with securepad: otherwise the resumption on PostgreSQL
# timed the imports of psycopg, psycopg_pool and securepad's _pg modules (and,
# where PYTHONDONTWRITEBYTECODE is set, compiling them), ~20-50 ms, and the
# SQLite one did not. Absent, ``unavailable`` says so.
with contextlib.suppress(ImportError):
    importlib.import_module("securepad.storage.postgres.database")

SERVER_DSN = os.environ.get("SECUREPAD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "securepad_bench"
SIDE_BY_SIDE = ("securepad", "securepad-postgresql")
# Set to the parent's pid: every other process (a worker) puts as an owner of its own.
OWNER_PER_PROCESS = "SECUREPAD_BENCH_OWNER_PER_PROCESS"


def _put_principal() -> Principal:
    parent = os.environ.get(OWNER_PER_PROCESS)
    if parent is None or int(parent) == os.getpid():
        return PRINCIPAL
    return Principal(f"bench-owner-{os.getpid()}", PRINCIPAL.actor, PRINCIPAL.channel)


def _get_any_owner(pad: Scratchpad, entry_id: str) -> str:
    """The whole content, whichever owner put it (the lost-writes check only)."""
    rows = parts(pad).db.query("SELECT owner_user_id FROM entries WHERE id = ?", (entry_id,), admin=True)
    owner = rows[0]["owner_user_id"] if rows else PRINCIPAL.owner_user_id
    return str(pad.get(Principal(owner, PRINCIPAL.actor, PRINCIPAL.channel), entry_id).observation)


class _OwnerPerProcess:
    """put as the process's owner (see OWNER_PER_PROCESS); get finds any owner's entry."""

    pad: Scratchpad

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = 3600, now: float | None = None) -> str:
        return str(self.pad.put(_put_principal(), turn_id, step, "bench", text, ttl, now=now)["scratchpad_id"])

    def get(self, entry_id: str) -> str:
        return _get_any_owner(self.pad, entry_id)


class SqliteOwnerPerProcess(_OwnerPerProcess, SecurepadBackend):
    name = "securepad-owner-per-process"


def _dsn(dbname: str) -> str:
    return urlunsplit(urlsplit(SERVER_DSN)._replace(path=f"/{dbname}"))


def _ensure_database() -> None:
    import psycopg

    with psycopg.connect(_dsn("postgres"), autocommit=True) as server:
        if server.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
            server.execute(f"CREATE DATABASE {DATABASE}")


def bench_database() -> str:
    """The DSN of the bench database, created when missing (for the other
    PostgreSQL benchmarks: ``pg_open``, ``pg_cpu``, ``pg_owner_lock``)."""
    _ensure_database()
    return _dsn(DATABASE)


# Like every Backend subclass with a name, known to open_backend (and its child processes) once defined.
class SecurepadPostgresBackend(SecurepadBackend):
    name = "securepad-postgresql"
    description = "securepad Scratchpad on PostgreSQL: the same client-side encryption, row-level security"

    def __init__(self, root: Path, *, create: bool = True, keyring: Keyring | None = None) -> None:
        Backend.__init__(self, root)
        import psycopg

        self.keyring = keyring or Keyring.from_key_file(root / "config" / "key")
        schema = "bench_" + hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()
        if create:
            _ensure_database()
            with psycopg.connect(_dsn(DATABASE), autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        self.pad = Scratchpad.open(_dsn(DATABASE), keyring=self.keyring, policy=bench_policy(), schema=schema)

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import psycopg

            psycopg.connect(_dsn("postgres"), connect_timeout=3).close()
        except Exception as exc:  # ImportError or any connection failure
            return f"no PostgreSQL at {SERVER_DSN}: {exc}"
        return None


class PostgresOwnerPerProcess(_OwnerPerProcess, SecurepadPostgresBackend):
    name = "securepad-postgresql-owner-per-process"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    reason = SecurepadPostgresBackend.unavailable()
    if reason:
        print(reason)
        return 1
    _ensure_database()
    import psycopg

    with psycopg.connect(_dsn("postgres"), autocommit=True) as server:
        server.execute(f"ALTER DATABASE {DATABASE} SET synchronous_commit = {args.synchronous_commit}")
    config = dataclasses.replace(
        Config(),
        concurrency=((args.processes, args.threads),),
        concurrency_seconds=args.seconds,
        resume_steps=tuple(int(s) for s in args.resume_steps.split(",")),
        resume_processes=args.resume_processes,
    )
    records = _run(config, owner_per_process=args.owner_per_process)
    _print_concurrent(records["concurrent"], args)
    _print_ratios(records["concurrent"])
    records["cpu"] = [cpu_per_op(_dsn(DATABASE), count=args.cpu_ops, size=config.concurrent_bytes)]
    _print_cpu(records["cpu"][0], args.cpu_ops)
    _print_resume(records["resume"], args.resume_processes)
    records["targets"] = targets(records["concurrent"], records["cpu"][0])
    _print_targets(records["targets"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **records}, indent=2, default=str))
    print(f"\nresults: {args.out}")
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each concurrency run")
    parser.add_argument("--resume-steps", default="10,100,1000")
    parser.add_argument("--resume-processes", type=int, default=8)
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="on",
        help="the bench database's default; the store's own transactions set synchronous_commit from the"
        " policy's durability (\"normal\": off, like SQLite's WAL + synchronous=NORMAL): this reaches"
        " only other sessions",
    )
    parser.add_argument(
        "--owner-per-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the concurrency case with an owner per worker (default: yes)",
    )
    parser.add_argument("--cpu-ops", type=int, default=1000, help="puts and reads of the CPU-per-operation run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "postgres.json")
    return parser.parse_args(argv)


def _run(config: Config, *, owner_per_process: bool) -> dict[str, list[dict[str, Any]]]:
    """The concurrency and resumption workloads on each backend side by side,
    then (``owner_per_process``) the concurrency one with an owner per worker."""
    records: dict[str, list[dict[str, Any]]] = {"concurrent": [], "resume": []}
    with tempfile.TemporaryDirectory(prefix="securepad-bench-pg-") as tmp:
        workdir = Path(tmp)
        for name in SIDE_BY_SIDE:
            for batch in run_concurrent(config, name, workdir, lambda _: None):
                records["concurrent"].extend(batch)
            for batch in run_resume(config, name, workdir, lambda _: None):
                records["resume"].extend(batch)
        if owner_per_process:
            os.environ[OWNER_PER_PROCESS] = str(os.getpid())
            try:
                for name in ("securepad-owner-per-process", "securepad-postgresql-owner-per-process"):
                    for batch in run_concurrent(config, name, workdir, lambda _: None):
                        records["concurrent"].extend(batch)
            finally:
                del os.environ[OWNER_PER_PROCESS]
    return records


def _print_concurrent(concurrent: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"## concurrency: {args.processes} processes x {args.threads} threads, {args.seconds:g} s, 50/50 put/read"
        f" (durability {bench_policy().durability!r}: SQLite synchronous=NORMAL, PostgreSQL synchronous_commit ="
        f" off in the store's transactions)"
    )
    print("| backend | put ops/s | read ops/s | all ops/s | put p99 ms | read p99 ms | errors | lost writes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in concurrent:
        print(
            f"| {r['backend']} | {r['put']['ops_per_s']:.0f} | {r['read']['ops_per_s']:.0f}"
            f" | {r['stats']['ops_per_s']:.0f} | {r['put']['p99'] * 1e3:.1f} | {r['read']['p99'] * 1e3:.1f}"
            f" | {r['error_count']} | {r['lost_writes']} |"
        )


def _print_resume(resume: list[dict[str, Any]], processes: int) -> None:
    print(f"\n## resumption in a fresh process ({processes} runs each)")
    print("| backend | steps | median ms | p90 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for r in resume:
        s = r["stats"]
        print(
            f"| {r['backend']} | {r['steps']} | {s['median'] * 1e3:.1f} | {s['p90'] * 1e3:.1f} | {s['max'] * 1e3:.1f} |"
        )


def _all_ops_ratio(concurrent: list[dict[str, Any]], sqlite: str, pg: str) -> float | None:
    """PostgreSQL's operations per second (puts and reads) over SQLite's, or None when either did not run."""
    by_name = {r["backend"]: r for r in concurrent}
    if sqlite not in by_name or pg not in by_name:
        return None
    return float(by_name[pg]["stats"]["ops_per_s"] / max(by_name[sqlite]["stats"]["ops_per_s"], 1e-9))


def targets(concurrent: list[dict[str, Any]], cpu: dict[str, Any]) -> list[dict[str, Any]]:
    """PostgreSQL's targets against SQLite, each with its figure from this run
    (``value`` None: not measured, e.g. ``--no-owner-per-process``)."""
    found = [
        (
            "one owner: PostgreSQL >= 0.6x SQLite's operations per second",
            "at_least",
            0.6,
            _all_ops_ratio(concurrent, "securepad", "securepad-postgresql"),
        ),
        (
            "an owner per process: PostgreSQL >= 0.8x SQLite's operations per second",
            "at_least",
            0.8,
            _all_ops_ratio(concurrent, "securepad-owner-per-process", "securepad-postgresql-owner-per-process"),
        ),
        ("CPU per put, client + server: PostgreSQL <= 1.2x SQLite's", "at_most", 1.2, cpu["ratio"]["put"]),
    ]
    return [
        {
            "target": name,
            "value": value,
            "met": None if value is None else (value >= limit if bound == "at_least" else value <= limit),
        }
        for name, bound, limit, value in found
    ]


def _print_targets(found: list[dict[str, Any]]) -> None:
    print("\n## targets (figures from this run)")
    for t in found:
        verdict = {True: "met", False: "missed", None: "not measured"}[t["met"]]
        figure = "" if t["value"] is None else f"{t['value']:.2f}x"
        print(f"{verdict:<12} {t['target']}: {figure}")


def _print_ratios(concurrent: list[dict[str, Any]]) -> None:
    """PostgreSQL's throughput as a multiple of SQLite's, one owner and an owner per process."""
    by_name = {r["backend"]: r for r in concurrent}
    pairs = (
        ("one owner", "securepad", "securepad-postgresql"),
        ("an owner per process", "securepad-owner-per-process", "securepad-postgresql-owner-per-process"),
    )
    print("\n| case | PostgreSQL / SQLite, put | read | all |")
    print("|---|---:|---:|---:|")
    for case, sqlite, pg in pairs:
        if sqlite in by_name and pg in by_name:
            a, b = by_name[sqlite], by_name[pg]
            ratios = [b[k]["ops_per_s"] / max(a[k]["ops_per_s"], 1e-9) for k in ("put", "read", "stats")]
            print(f"| {case} | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {ratios[2]:.2f}x |")


def _print_cpu(cpu: dict[str, Any], count: int) -> None:
    print(f"\n## CPU and round trips per operation (one client, {count} puts then {count} head reads, 4 KiB)")
    print("\n".join(cpu_table(cpu)))


if __name__ == "__main__":
    raise SystemExit(main())
