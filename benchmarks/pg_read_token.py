"""What a warm PostgreSQL read's head statement costs the server.

    python -m benchmarks.pg_read_token [--entries 1000] [--executions 3000] [--rounds 3]

A store in its own schema of the bench database (``SECUREPAD_BENCH_PG_DSN``)
with one turn of ``--entries`` entries; then one connection as the
application role, in one REPEATABLE READ transaction, so that every
statement sees the same snapshot (a warm read's token then always holds,
whatever else the server runs). Each statement is prepared, as the store
prepares it, and executed ``--executions`` times per round, the cases
alternating; the server process's CPU (``/proc/<pid>/stat``) per execution:

* ``SELECT 1``: a round trip that runs a prepared statement;
* ``warm``: what a read by entry (``Heads.entry_read_sql``) with its cached
  token sends: a call of the schema's read function, which compares the
  snapshot and returns the token row alone;
* ``warm, one statement``: the statement that function runs when the
  snapshot moved, with the same token (the warm read before migration 10):
  neither the turn's head nor its digest is evaluated;
* ``token part``: that statement's token alone (its inventory rows left out
  of the statement): what the rest of the plan costs to start;
* ``snapshot moved``: the function with another snapshot in the token (a
  commit happened elsewhere): the head and the digest of the turn's rows
  run, equal to the cached ones, so the inventory still stays out.

    python -m benchmarks.pg_read_token --commit-every-ms 1 [--entries 50] ...

The same store, read while another connection commits a transaction every
``--commit-every-ms`` milliseconds, so that the snapshot of nearly every read
has moved since its token was taken; the reading
connection in autocommit, as the store reads (each statement its own
snapshot), with the token of its first read. Per execution, the reading
server process's CPU (the committer's is not counted):

* ``SELECT 1``: as above;
* ``migration 10``: the warm read by entry as migration 10's function does it
  (created beside the store's under another name): the whole statement;
* ``migration 13``: the store's function, which computes the head and the
  digest by its lean statement and returns the token row.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from securepad import Keyring, Scratchpad
from securepad.bench import data
from securepad.bench.backends import PRINCIPAL, bench_policy
from securepad.storage.postgres.functions import pg_read_functions
from securepad.store import parts
from securepad.tables.heads.reading import ENTRY_TURN_SQL, InventoryReads

from .postgres import bench_database

__all__ = ["commit_costs", "main", "token_costs"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _prepared(sql: str) -> str:
    """The store's ``?`` placeholders as ``$1``, ``$2``... (``PREPARE``)."""
    numbers = iter(range(1, 1 << 16))
    return re.sub(r"\?", lambda _: f"${next(numbers)}", sql)


def _measure(
    cur: Any,
    pid: int,
    cases: dict[str, tuple[str, tuple[Any, ...]]],
    *,
    rounds: int,
    executions: int,
    start: Callable[[], None] | None = None,
    token_only: bool = False,
) -> dict[str, list[float]]:
    """Each case's statement prepared, then ``rounds`` rounds of the cases in
    turn (10 untimed executions, then ``executions`` timed): the server's CPU
    microseconds per execution of each, one figure a round. ``start`` runs
    after the statements are prepared and before the first round; with
    ``token_only`` an execution that returns more than the token row (the
    inventory came back: head or digest differed) is an error."""
    for index, (text, _) in enumerate(cases.values()):
        cur.execute(f"PREPARE token_{index} AS {_prepared(text)}")
    if start is not None:
        start()
    costs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for index, (name, (_, values)) in enumerate(cases.items()):
            statement = f"EXECUTE token_{index}({', '.join(['%s'] * len(values))})"
            for _ in range(10):
                cur.execute(statement, values)
            before = _server_cpu_s(pid)
            for _ in range(executions):
                cur.execute(statement, values)
                if len(cur.fetchall()) != 1 and token_only:
                    raise RuntimeError(f"{name}: the inventory came back")
            costs[name].append((_server_cpu_s(pid) - before) / executions * 1e6)
    return costs


def _turn(dsn: str, schema: str, entries: int) -> tuple[list[str], InventoryReads]:
    """A store in ``schema`` with one turn of ``entries`` entries: their ids, and its reads."""
    with tempfile.TemporaryDirectory(prefix="securepad-bench-token-") as tmp:
        keyring = Keyring.from_key_file(Path(tmp) / "key")
        with Scratchpad.open(dsn, keyring=keyring, policy=bench_policy(), schema=schema) as pad:
            ids: list[str] = []
            for first in range(0, entries, 100):
                batch = [(i, "bench", data.text(4096, salt=i)) for i in range(first, min(first + 100, entries))]
                ids += [str(view["scratchpad_id"]) for view in pad.put_many(PRINCIPAL, "token", batch)]
            return ids, parts(pad).heads.reads


def token_costs(dsn: str, *, entries: int = 1000, executions: int = 3000, rounds: int = 3) -> dict[str, list[float]]:
    """Server CPU microseconds per execution of each case, one figure per round."""
    import psycopg

    schema = f"bench_token_{secrets.token_hex(4)}"
    owner = PRINCIPAL.owner_user_id
    try:
        ids, reads = _turn(dsn, schema, entries)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            pid = int(row[0]) if row is not None else 0
            conn.execute("COMMIT")
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute(f"SET LOCAL ROLE securepad_app; SET LOCAL search_path = {schema}")
            conn.execute("SELECT set_config('securepad.owner', %s, true)", (owner,))
            cur = psycopg.ClientCursor(conn)
            sql, params = reads.sql(ENTRY_TURN_SQL, ids[len(ids) // 2], owner)
            cur.execute(sql.replace("?", "%s"), params)
            v = cur.fetchall()[-1]  # the token row: turn (2), head (4), digest (9), snapshot (10)
            token = (v[2], bytes(v[4]), v[9], v[10])
            call, call_params = reads.sql(ENTRY_TURN_SQL, ids[len(ids) // 2], owner, token, function=True)
            sql, params = reads.sql(ENTRY_TURN_SQL, ids[len(ids) // 2], owner, token)
            moved = tuple("0 0 1:1:" if value == v[10] else value for value in call_params)
            token_part = sql[: sql.index(" SELECT 'h' AS k")] + " SELECT * FROM token"
            cases: dict[str, tuple[str, tuple[Any, ...]]] = {
                "SELECT 1": ("SELECT ?::int", (1,)),
                "warm": (call, tuple(call_params)),
                "warm, one statement": (sql, tuple(params)),
                "token part": (token_part, tuple(params[:-1])),
                "snapshot moved": (call, moved),
            }
            costs = _measure(cur, pid, cases, rounds=rounds, executions=executions)
            conn.execute("ROLLBACK")
        return costs
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _commit_every(dsn: str, seconds: float, stop: threading.Event) -> None:
    """Commit a transaction that takes a transaction id every ``seconds`` until ``stop``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute("SELECT pg_current_xact_id()")
            time.sleep(seconds)


def commit_costs(
    dsn: str, *, entries: int = 50, executions: int = 3000, rounds: int = 3, every_ms: float = 1.0
) -> dict[str, list[float]]:
    """Server CPU microseconds per warm read by entry while another connection
    commits every ``every_ms`` ms, by migration 10's function and by the
    store's (migration 13's lean one, its turn scoped by migration 14), one
    figure per round, the cases alternating."""
    import psycopg

    schema = f"bench_token_{secrets.token_hex(4)}"
    owner = PRINCIPAL.owner_user_id
    stop = threading.Event()
    committer = threading.Thread(target=_commit_every, args=(dsn, every_ms / 1000, stop), daemon=True)
    try:
        ids, reads = _turn(dsn, schema, entries)
        with psycopg.connect(dsn, autocommit=True) as admin:
            # Migration 10's function by entry, beside the store's, as its owner would create it.
            admin.execute(f"SET ROLE securepad_admin; SET search_path = {schema}")
            old = pg_read_functions()["entry_turn_inventory"].replace(
                "entry_turn_inventory(", "entry_turn_inventory_10("
            )
            admin.execute(old)
            admin.execute(
                "GRANT EXECUTE ON FUNCTION entry_turn_inventory_10(text, text, bytea, text, text, text)"
                " TO securepad_app"
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            pid = int(row[0]) if row is not None else 0
            conn.execute(f"SET ROLE securepad_app; SET search_path = {schema}")
            conn.execute("SELECT set_config('securepad.owner', %s, false)", (owner,))
            cur = psycopg.ClientCursor(conn)
            entry = ids[len(ids) // 2]
            sql, params = reads.sql(ENTRY_TURN_SQL, entry, owner)
            cur.execute(sql.replace("?", "%s"), params)
            v = cur.fetchall()[-1]
            token = (v[2], bytes(v[4]), v[9], v[10])
            call, params = reads.sql(ENTRY_TURN_SQL, entry, owner, token, function=True)
            cases: dict[str, tuple[str, tuple[Any, ...]]] = {
                "SELECT 1": ("SELECT ?::int", (1,)),
                # Migration 10's function takes the id's turn whoever its owner: no scope arguments.
                "migration 10": ("SELECT * FROM entry_turn_inventory_10(?, ?, ?, ?, ?, ?)", tuple(params[:6])),
                "migration 13": (call, tuple(params)),
            }
            return _measure(
                cur, pid, cases, rounds=rounds, executions=executions, start=committer.start, token_only=True
            )
    finally:
        stop.set()
        if committer.is_alive():
            committer.join()
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_read_token", description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000, help="entries in the turn read")
    parser.add_argument("--executions", type=int, default=3000, help="executions of each case per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the cases alternating")
    parser.add_argument(
        "--commit-every-ms",
        type=float,
        default=None,
        help="read while another connection commits every this many ms (migration 10's function and 13's)",
    )
    args = parser.parse_args(argv)
    if args.commit_every_ms is None:
        costs = token_costs(bench_database(), entries=args.entries, executions=args.executions, rounds=args.rounds)
        during = ""
    else:
        costs = commit_costs(
            bench_database(),
            entries=args.entries,
            executions=args.executions,
            rounds=args.rounds,
            every_ms=args.commit_every_ms,
        )
        during = f", another connection committing every {args.commit_every_ms:g} ms"
    print(
        f"## Server CPU per execution, us (a turn of {args.entries} entries, {args.executions} executions a round"
        f"{during})"
    )
    print("| statement | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |")
    print("|---|" + "---:|" * args.rounds)
    for name, figures in costs.items():
        print(f"| {name} | " + " | ".join(f"{figure:.0f}" for figure in figures) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
