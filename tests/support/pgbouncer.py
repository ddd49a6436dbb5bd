"""PgBouncer in transaction pooling mode on a free local port, for the tests
and the pooler benchmark, and a store on a pool of its own."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from securepad import Scratchpad, SecurepadError

__all__ = ["SERVER_POOL_SIZE", "PgBouncer", "find_pgbouncer", "pooled_store"]

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
    """PgBouncer on a free local port in transaction pooling mode, its ini and
    userlist (``users``: login -> password or SCRAM secret) in a private
    temporary directory; every database forwarded to the server; stopped on exit.
    """

    def __init__(
        self,
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        users: dict[str, str] | None = None,
        auth_type: str = "trust",
        pool_size: int = SERVER_POOL_SIZE,
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
            "max_client_conn": "400",
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
            self.__exit__()
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

    def __exit__(self, *exc: object) -> None:
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
    """A store on a pool of its own that never prepares statements, as the
    PostgreSQL guide recommends behind a transaction pooler; with ``prepare``,
    psycopg's defaults (the store prepares until it notices a pooler)."""
    from psycopg_pool import ConnectionPool

    kwargs: dict[str, Any] = {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}
    pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=pool_size, kwargs=kwargs, open=True)
    try:
        pool.wait(timeout=10)
        return Scratchpad.open(pool, keyring=keyring, **options), pool
    except BaseException:
        pool.close()
        raise
