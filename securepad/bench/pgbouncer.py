"""Clients through PgBouncer in transaction pooling mode, and straight to the server.

``python -m securepad.bench.pgbouncer`` starts Debian's ``pgbouncer`` on a free
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
run). ``PgBouncer`` is also what the tests start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import secrets
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import SecurepadError

__all__ = ["TARGETS", "PgBouncer", "find_pgbouncer", "main", "pooled_store", "run"]

SERVER_DSN = os.environ.get("SECUREPAD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
CLIENTS = (1, 8, 32, 64)
# Server connections PgBouncer keeps per database and user: far fewer than the clients.
SERVER_POOL_SIZE = 8


def find_pgbouncer() -> str | None:
    """The pgbouncer executable (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """PgBouncer on a free local port, in transaction pooling mode, with its own
    ini and userlist in a private temporary directory; stopped on exit.

    ``users`` maps login names to passwords (or SCRAM secrets) for the userlist;
    ``auth_type`` is PgBouncer's (``trust``, ``scram-sha-256``...). Every
    database name is forwarded to the server at ``server_host:server_port``.
    """

    def __init__(
        self,
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        users: dict[str, str] | None = None,
        auth_type: str = "trust",
        pool_size: int = SERVER_POOL_SIZE,
        max_clients: int = 400,
    ) -> None:
        exe = find_pgbouncer()
        if exe is None:
            raise SecurepadError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.exe, self.port = exe, _free_port()
        self._settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "auth_type": auth_type,
            "pool_mode": "transaction",
            "default_pool_size": str(pool_size),
            "max_client_conn": str(max_clients),
            "ignore_startup_parameters": "extra_float_digits,options",
            "server_reset_query": "",
            "unix_socket_dir": "",
        }
        self._server = f"host={server_host} port={server_port}"
        # Even with trust, PgBouncer admits only the users its auth_file lists.
        self._users = users if users is not None else {"postgres": ""}
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str, user: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def __enter__(self) -> PgBouncer:
        self._dir = Path(tempfile.mkdtemp(prefix="securepad-pgbouncer-"))
        ini, users, log = self._dir / "pgbouncer.ini", self._dir / "userlist.txt", self._dir / "pgbouncer.log"
        lines = ["[databases]", f"* = {self._server}", "", "[pgbouncer]"]
        lines += [f"{k} = {v}" for k, v in self._settings.items()]
        lines += [f"auth_file = {users}", f"logfile = {log}", f"pidfile = {self._dir / 'pgbouncer.pid'}"]
        ini.write_text("\n".join(lines) + "\n")
        users.write_text("".join(f'"{u}" "{p}"\n' for u, p in self._users.items()))
        command = [self.exe, "-q", str(ini)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            account = pwd.getpwnam("postgres")
            for path in (self._dir, ini, users):
                os.chown(path, account.pw_uid, account.pw_gid)
            os.chmod(users, 0o600)
            command[1:1] = ["-u", "postgres"]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._wait_ready(log)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self, log: Path) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                text = log.read_text(errors="replace") if log.exists() else ""
                raise SecurepadError(f"pgbouncer exited ({self._proc.returncode}): {err.strip()} {text[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise SecurepadError(f"pgbouncer did not listen on port {self.port} within 10 s")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def pooled_store(dsn: str, keyring: Any, *, pool_size: int = 8, prepare: bool = False, **options: Any) -> Any:
    """A store on a pool of its own (``Scratchpad.open`` takes pools): by default
    one that never prepares statements (``prepare_threshold=None``), as the
    PostgreSQL guide recommends behind a transaction pooler; with ``prepare``,
    psycopg's defaults, so the store prepares until it notices a pooler."""
    from psycopg_pool import ConnectionPool

    from ..store import Scratchpad

    kwargs: dict[str, Any] = {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=pool_size, kwargs=kwargs, open=True)
    try:
        pool.wait(timeout=10)
        return Scratchpad.open(pool, keyring=keyring, **options), pool
    except BaseException:
        pool.close()
        raise


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
    from ..principal import Principal

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
    parser = argparse.ArgumentParser(prog="python -m securepad.bench.pgbouncer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per target and client count (default 10)")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--quick", action="store_true", help="1 and 8 clients, 1 s each (a smoke run)")
    parser.add_argument("--server", default=SERVER_DSN, help="the PostgreSQL server behind PgBouncer")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds = [c for c in args.clients if c <= 8] or [1], min(args.seconds, 1.0)
    from ..keys.keyring import Keyring

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
