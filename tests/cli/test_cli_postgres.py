"""The command line on a PostgreSQL store: every command through click's
runner with ``--db postgresql://...`` and with ``SECUREPAD_DB``, on a fresh HOME;
and ``securepad audit`` on PostgreSQL, passing on a fresh store and failing,
naming the check, when row-level security or the application role is weakened."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from securepad import Keyring, Principal, Scratchpad
from securepad.audit import Audit
from securepad.cli import ENVIRONMENT, main
from tests.conftest import pg_login


class Cli:
    """``securepad`` on a fresh HOME, against one PostgreSQL database."""

    def __init__(self, home: Path, dsn: str) -> None:
        self.home, self.dsn = home, dsn
        self.env: dict[str, str | None] = {"HOME": str(home), "XDG_DATA_HOME": None, "XDG_CONFIG_HOME": None}
        self.env |= {var: None for var, _, _ in ENVIRONMENT}

    def __call__(self, *args: str, input: str | None = None, via_env: bool = False) -> Result:
        env = {**self.env, "SECUREPAD_DB": self.dsn} if via_env else self.env
        argv = list(args) if via_env else ["--db", self.dsn, *args]
        return CliRunner().invoke(main, argv, input=input, env=env, catch_exceptions=False)

    @property
    def key(self) -> Path:
        return self.home / ".config" / "securepad" / "key"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> Cli:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", *(var for var, _, _ in ENVIRONMENT)):
        monkeypatch.delenv(var, raising=False)
    return Cli(home, pg_dsn)


@pytest.fixture
def login(pg_dsn: str) -> Iterator[str]:
    """A plain login (no superuser, no BYPASSRLS) in both store roles: what the audit wants."""
    yield from pg_login(pg_dsn)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> object:
    return json.loads(ok(result).stdout)


@pytest.mark.parametrize("via_env", [False, True], ids=["--db", "SECUREPAD_DB"])
def test_every_command_on_postgresql(cli: Cli, via_env: bool, login: str) -> None:
    def run(*args: str, input: str | None = None) -> Result:
        return cli(*args, input=input, via_env=via_env)

    ok(run("init"))
    assert cli.key.exists()
    put = as_json(run("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", input="hello\nworld\n"))
    assert isinstance(put, dict)
    entry = put["scratchpad_id"]
    ok(run("put", "--owner", "alice", "--turn", "t", "--step", "1", input="alice's\n"))
    read = as_json(run("--json", "read", "--owner", "bob", entry, "--mode", "full"))
    assert isinstance(read, dict) and read["content"] == "hello\nworld\n"
    refused = run("read", "--owner", "alice", entry)
    assert refused.exit_code == 1 and "no such entry" in refused.stderr
    listed = as_json(run("--json", "list", "--owner", "bob", "--turn", "t"))
    assert [v["scratchpad_id"] for v in listed] == [entry]  # type: ignore[union-attr]
    stats = as_json(run("--json", "stats"))
    assert isinstance(stats, dict) and stats["entries"] == 2
    owner_stats = as_json(run("--json", "stats", "--owner", "bob"))
    assert isinstance(owner_stats, dict) and owner_stats["entries"] == 1
    ok(run("gc"))
    ok(run("keys", "rotate-owner", "bob"))
    read = as_json(run("--json", "read", "--owner", "bob", entry, "--mode", "head", "-n", "5"))
    assert isinstance(read, dict) and read["content"] == "hello"
    server, cli.dsn = cli.dsn, login  # the audit fails a login that can leave row-level security
    report = as_json(run("--json", "audit"))
    cli.dsn = server
    assert isinstance(report, dict) and report["passed"], [r for r in report["results"] if not r["passed"]]
    ok(run("forget-owner", "--yes", "bob"))
    gone = run("read", "--owner", "bob", entry)
    assert gone.exit_code == 1 and "no such entry" in gone.stderr
    missing = run("forget-owner", "--yes", "bob")
    assert missing.exit_code == 1
    stats = as_json(run("--json", "stats"))
    assert isinstance(stats, dict) and stats["entries"] == 1


@pytest.mark.parametrize("command", [["stats"], ["gc"], ["list", "--owner", "bob", "--turn", "t"]])
def test_a_missing_postgresql_store_fails_naming_it_and_creates_nothing(cli: Cli, command: list[str]) -> None:
    result = cli(*command)
    assert result.exit_code == 1
    assert "no store at postgresql://" in result.stderr and "securepad init" in result.stderr
    assert not cli.key.exists()
    with psycopg.connect(cli.dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('securepad')").fetchone() == (None,)


def test_an_unreachable_server_is_named_without_its_password(cli: Cli) -> None:
    cli.dsn = "postgresql://someone:hunter2@127.0.0.1:1/nowhere?connect_timeout=2"
    result = cli("stats")
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.stderr and "hunter2" not in result.stderr


def test_audit_passes_on_a_fresh_postgresql_store(cli: Cli, login: str) -> None:
    ok(cli("init"))
    ok(cli("put", "--owner", "carol", "--turn", "t", "--step", "1", input="real data\n"))
    cli.dsn = login
    result = ok(cli("audit"))
    assert "all" in result.stdout and "checks passed" in result.stdout
    report = as_json(cli("--json", "audit"))
    assert isinstance(report, dict)
    names = {r["name"] for r in report["results"]}
    assert {
        "application role privileges",
        "application login privileges",
        "row-level security forced",
        "column grants as documented",
        "functions as documented",
        "raw query without owner",
        "tamper: flipped bit",
        "audit tenants removed",
        "real entries unchanged",
    } <= names
    assert report["passed"] and report["failures"] == 0
    assert "hunter2" not in report["store"] and report["store"].startswith("postgresql://")


@pytest.mark.parametrize(
    "weaken, check",
    [
        ("ALTER TABLE securepad.entries NO FORCE ROW LEVEL SECURITY", "row-level security forced"),
        ("ALTER TABLE securepad.segments DISABLE ROW LEVEL SECURITY", "row-level security forced"),
        (
            "ALTER POLICY owner_rows ON securepad.owner_keys USING (true) WITH CHECK (true)",
            "row-level security forced",
        ),
        ("GRANT UPDATE ON securepad.entries TO securepad_app", "column grants as documented"),
        ("GRANT TRUNCATE ON securepad.segments TO securepad_app", "column grants as documented"),
        ("GRANT CREATE ON SCHEMA securepad TO securepad_app", "application role privileges"),
        (
            "ALTER FUNCTION securepad.turn_inventory(text, text, bytea, text, text, text) SECURITY DEFINER",
            "functions as documented",
        ),
        (
            "ALTER FUNCTION securepad.turn_inventory(text, text, bytea, text, text, text) RESET search_path",
            "functions as documented",
        ),
        (
            "GRANT EXECUTE ON FUNCTION securepad.entry_turn_inventory(text, text, bytea, text, text, text, text, text)"
            " TO PUBLIC",
            "functions as documented",
        ),
    ],
)
def test_audit_fails_naming_the_check_when_the_store_is_weakened(cli: Cli, login: str, weaken: str, check: str) -> None:
    """Changes to this test's own database only (roles are cluster-wide: see the next test)."""
    ok(cli("init"))
    with psycopg.connect(cli.dsn, autocommit=True) as conn:
        conn.execute(weaken)
    cli.dsn = login
    result = cli("--json", "audit")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    failed = [r["name"] for r in report["results"] if not r["passed"]]
    # Without row-level security the raw query sees rows too; nothing else may fail.
    assert check in failed and set(failed) <= {check, "raw query without owner"}, failed
    assert report["passed"] is False
    text = cli("audit")
    assert text.exit_code == 1 and check in text.stdout


@pytest.mark.usefixtures("roles_alone")
def test_audit_fails_when_the_application_role_may_bypass_rls(pg_dsn: str, pg_login_dsn: str, keyring: Keyring) -> None:
    """BYPASSRLS is a role attribute, shared by every database of the server: it is
    given only while the audit's first check runs, then taken back at once."""
    with Scratchpad.open(pg_login_dsn, keyring=keyring) as pad:
        pad.put(Principal("carol", "a", "c"), "t", 1, "x", "real")
        audit = Audit(pad)
        assert audit.checks[0] == "application role privileges"
        run = audit.run()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER ROLE securepad_app BYPASSRLS")
            try:
                first = next(run)
            finally:
                conn.execute("ALTER ROLE securepad_app NOBYPASSRLS")
        rest = list(run)
        report = audit.report()
    assert first.name == "application role privileges" and not first.passed
    assert "BYPASSRLS" in first.happened
    assert [r.name for r in report.failed] == ["application role privileges"]
    assert all(r.passed for r in rest)
