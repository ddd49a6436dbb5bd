"""Housekeeping under the PostgreSQL role split: the application login may only
act as securepad_app, the ops login only as securepad_admin; ``--admin DSN`` (or
SECUREPAD_ADMIN_DB) lets gc, stats and audit run, as ``Scratchpad.open(admin=)``."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.support.cli_runner import Cli, as_json, ok, put


def _login(dsn: str, role: str) -> str:
    url = urlsplit(dsn)
    return urlunsplit(url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}"))


@pytest.fixture
def logins(pg_cli: Cli) -> Iterator[tuple[str, str]]:
    """(application DSN, ops DSN) on the store ``pg_cli`` made."""
    cli = pg_cli
    assert cli.store is not None
    ok(cli("init"))
    app, ops = f"securepad_app_{secrets.token_hex(4)}", f"securepad_ops_{secrets.token_hex(4)}"
    with psycopg.connect(cli.store, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {app} LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE securepad_app")
        conn.execute(f"CREATE ROLE {ops} LOGIN NOSUPERUSER IN ROLE securepad_admin")
    try:
        yield _login(cli.store, app), _login(cli.store, ops)
    finally:
        with psycopg.connect(cli.store, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {app}")
            conn.execute(f"DROP ROLE IF EXISTS {ops}")


def test_housekeeping_runs_with_the_admin_login(pg_cli: Cli, logins: tuple[str, str]) -> None:
    cli, (app, ops) = pg_cli, logins
    put(cli, 1)
    as_app = Cli(cli.home, cli.env, app)
    refused = as_app("gc")
    assert refused.exit_code == 1 and refused.stderr.startswith("error: SecurepadError: ")
    assert as_json(as_app("--json", "--admin", ops, "gc")) == {"deleted": 0}
    assert as_json(as_app("--json", "stats", "--admin", ops))["entries"] == 1
    via_env = as_app("--json", "stats", env={"SECUREPAD_ADMIN_DB": ops})
    assert as_json(via_env)["entries"] == 1
    audit = as_app("--json", "--admin", ops, "audit")
    assert audit.exit_code == 0, (audit.stdout[-2000:], audit.stderr[-2000:])


@pytest.mark.sqlite_only
def test_admin_is_a_postgresql_option(cli: Cli) -> None:
    ok(cli("init"))
    result = cli("--admin", "postgresql://ops@localhost/db", "stats")
    assert result.exit_code == 2 and "error: UsageError: --admin" in result.stderr
