"""TLS settings on PostgreSQL, as far as a server without TLS can test them.

The local test server runs with ``ssl = off`` (and its configuration is
shared: the tests do not change it). What holds without a certificate:

* the store hands libpq the DSN's ``sslmode``, ``sslrootcert`` (and the other
  ``ssl*`` settings) unchanged, on the connection that checks the server and
  on every pooled one;
* a DSN that requires TLS (``require``, ``verify-ca``, ``verify-full``)
  against a server without it fails at once with ``StoreUnavailableError``
  naming the reason, never falls back to a clear connection, creates
  nothing, and shows no password (the library's and the command line's message);
* ``prefer`` (libpq's default) falls back to a clear connection without a
  word: why the PostgreSQL guide asks for ``verify-full``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import pytest

from securepad import Keyring, Scratchpad, StoreUnavailableError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from tests.support.principals import ALICE  # noqa: E402

PASSWORD = "tls-test-secret-3141"


def _with(dsn: str, *, password: str | None = None, **query: str) -> str:
    """``dsn`` with a password and query settings (a postgresql:// URL)."""
    split = urlsplit(dsn)
    netloc = split.netloc
    if password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':')[0]}:{password}@{host}"
    return urlunsplit(split._replace(netloc=netloc, query=urlencode(query)))


@pytest.fixture
def conninfos(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The connection settings of every connection the process makes (libpq's
    parse of what psycopg was given); the real connect runs."""
    seen: list[dict[str, Any]] = []
    connect = psycopg.Connection.connect.__func__

    def recording(cls: type[Any], conninfo: str = "", **kwargs: Any) -> Any:
        seen.append({**conninfo_to_dict(conninfo), **kwargs})
        return connect(cls, conninfo, **kwargs)

    def module_connect(conninfo: str = "", **kwargs: Any) -> Any:
        return recording(psycopg.Connection, conninfo, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(recording))
    monkeypatch.setattr(psycopg, "connect", module_connect)
    yield seen


def test_the_ssl_settings_reach_libpq_unchanged(
    pg_dsn: str, keyring: Keyring, tmp_path: Path, conninfos: list[dict[str, Any]]
) -> None:
    """``prefer`` against this server falls back to a clear connection, so the
    store opens: every connection it made carried the DSN's settings as given."""
    root = tmp_path / "db-ca.pem"
    dsn = _with(pg_dsn, sslmode="prefer", sslrootcert=str(root), sslcompression="0")
    with Scratchpad.open(dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "shell", "over a connection libpq chose")
        assert pad.list_for_turn(ALICE, "t")
    with psycopg.connect(dsn) as conn:
        assert conn.pgconn.ssl_in_use is False  # libpq fell back to a clear connection, silently
    assert conninfos
    for info in conninfos:
        assert (info["sslmode"], info["sslrootcert"], info["sslcompression"]) == ("prefer", str(root), "0")


@pytest.mark.parametrize("mode", ["require", "verify-ca", "verify-full"])
def test_a_dsn_that_requires_tls_is_refused_by_a_server_without_it(
    pg_dsn: str, keyring: Keyring, tmp_path: Path, mode: str, conninfos: list[dict[str, Any]]
) -> None:
    dsn = _with(pg_dsn, password=PASSWORD, sslmode=mode, sslrootcert=str(tmp_path / "db-ca.pem"))
    with pytest.raises(StoreUnavailableError, match="server does not support SSL") as refused:
        Scratchpad.open(dsn, keyring=keyring)
    assert PASSWORD not in str(refused.value)
    assert len(conninfos) == 1  # no pool was made, no retry
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # nothing was created
        assert conn.execute("SELECT to_regclass('securepad.schema_version')").fetchone() == (None,)


def test_the_command_line_refuses_it_without_showing_the_password(pg_dsn: str, tmp_path: Path) -> None:
    dsn = _with(pg_dsn, password=PASSWORD, sslmode="verify-full")
    env = {**os.environ, "HOME": str(tmp_path), "SECUREPAD_KEY_FILE": str(tmp_path / "key")}
    for command in (["init"], ["stats", "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "securepad", "--db", dsn, *command],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "server does not support SSL" in done.stderr + done.stdout
        assert PASSWORD not in done.stderr + done.stdout
        if "--json" in command and done.stdout.strip():
            json.loads(done.stdout)
