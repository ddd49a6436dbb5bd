"""On PostgreSQL, the audit fails when the login the application connects with
can leave row-level security (a superuser, BYPASSRLS, or a role with either it
may become), whatever rights ``securepad_app`` itself has."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.audit import Audit, AuditReport, run_audit
from tests.conftest import pg_login

pytest.importorskip("psycopg")
import psycopg

pytestmark = pytest.mark.slow

CHECK = "application login privileges"


def audited(dsn: str, keyring: Keyring) -> AuditReport:
    with Scratchpad.open(dsn, keyring=keyring) as pad:
        pad.put(Principal("carol", "a", "c"), "t", 1, "x", "real")
        assert CHECK in Audit(pad).checks
        return run_audit(pad)


def row(report: AuditReport) -> tuple[bool, str]:
    (found,) = [r for r in report.results if r.name == CHECK]
    return found.passed, found.happened


def test_a_plain_login_passes_every_check(pg_login_dsn: str, keyring: Keyring) -> None:
    report = audited(pg_login_dsn, keyring)
    assert report.passed, [(r.name, r.happened) for r in report.failed]
    passed, happened = row(report)
    assert passed and "securepad_login_" in happened and "not superuser" in happened


def test_a_superuser_login_fails_the_audit(pg_dsn: str, keyring: Keyring) -> None:
    report = audited(pg_dsn, keyring)
    passed, happened = row(report)
    assert not passed and "is a superuser" in happened and "RESET ROLE" in happened
    assert [r.name for r in report.failed] == [CHECK]  # the rest holds: securepad_app itself is sound


@pytest.fixture
def bypassing_login(pg_login_dsn: str, pg_dsn: str) -> Iterator[str]:
    yield from pg_login(pg_dsn, attributes="BYPASSRLS")


def test_a_login_with_bypassrls_fails_the_audit(bypassing_login: str, keyring: Keyring) -> None:
    report = audited(bypassing_login, keyring)
    passed, happened = row(report)
    assert not passed and "has BYPASSRLS" in happened and "superuser" not in happened.split(":")[0]
    assert [r.name for r in report.failed] == [CHECK]


@pytest.fixture
def login_via_a_bypassing_role(pg_login_dsn: str, pg_dsn: str) -> Iterator[str]:
    role = f"securepad_bypass_{secrets.token_hex(4)}"
    with psycopg.connect(pg_dsn, autocommit=True) as server:
        server.execute(f"CREATE ROLE {role} NOLOGIN BYPASSRLS")
        try:
            yield from pg_login(pg_dsn, member_of=role)
        finally:
            server.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_login_that_may_become_a_bypassing_role_fails_the_audit(
    login_via_a_bypassing_role: str, keyring: Keyring
) -> None:
    report = audited(login_via_a_bypassing_role, keyring)
    passed, happened = row(report)
    assert not passed and "may SET ROLE to securepad_bypass_" in happened
    assert [r.name for r in report.failed] == [CHECK]


@pytest.fixture
def createrole_login(pg_login_dsn: str, pg_dsn: str) -> Iterator[str]:
    yield from pg_login(pg_dsn, attributes="CREATEROLE")


def test_a_login_with_createrole_fails_the_audit(createrole_login: str, keyring: Keyring) -> None:
    report = audited(createrole_login, keyring)
    passed, happened = row(report)
    assert not passed and "has CREATEROLE" in happened
    assert [r.name for r in report.failed] == [CHECK]
