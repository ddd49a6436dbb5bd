"""The command line on a PostgreSQL store, end to end, beyond
``test_cli_postgres.py``'s tour: every read mode, the turn and the key commands,
gc of expired entries, verify (and audit) on a store edited by the admin role,
and the failures a user meets: a malformed DSN, a server that is down, the
wrong owner, the wrong key. Each runs ``securepad`` through click's runner with
``--db postgresql://...`` or ``SECUREPAD_DB`` on a fresh HOME; one runs it as a
real process (``python -m securepad``)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from securepad.cli import ENVIRONMENT, main
from tests.support.pgbouncer import PgBouncer, find_pgbouncer

LOG = "".join(f"line {i}{' ERROR' if i % 3 == 0 else ''}\n" for i in range(1, 21))


class Cli:
    """``securepad`` on a fresh HOME against one PostgreSQL database, the DSN
    given with ``--db`` or (``via_env``) in ``SECUREPAD_DB``."""

    def __init__(self, home: Path, dsn: str, via_env: bool = False) -> None:
        self.home, self.dsn, self.via_env = home, dsn, via_env
        self.env: dict[str, str | None] = {"HOME": str(home), "XDG_DATA_HOME": None, "XDG_CONFIG_HOME": None}
        self.env |= {var: None for var, _, _ in ENVIRONMENT}

    def __call__(
        self, *args: str, input: str | bytes | None = None, env: dict[str, str | None] | None = None
    ) -> Result:
        extra = {"SECUREPAD_DB": self.dsn} if self.via_env else {}
        argv = list(args) if self.via_env else ["--db", self.dsn, *args]
        return CliRunner().invoke(
            main, argv, input=input, env={**self.env, **extra, **(env or {})}, catch_exceptions=False
        )

    def put(self, owner: str, step: int, text: str = LOG, *extra: str, turn: str = "t") -> str:
        result = ok(self("--json", "put", "--owner", owner, "--turn", turn, "--step", str(step), *extra, input=text))
        return str(json.loads(result.stdout)["scratchpad_id"])

    @property
    def key(self) -> Path:
        return self.home / ".config" / "securepad" / "key"


@pytest.fixture(params=[False, True], ids=["--db", "SECUREPAD_DB"])
def cli(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> Cli:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", *(var for var, _, _ in ENVIRONMENT)):
        monkeypatch.delenv(var, raising=False)
    return Cli(home, pg_dsn, via_env=request.param)


@pytest.fixture
def made_by_init(cli: Cli) -> Cli:
    """``cli`` after ``init`` made the store and its key file (the key file is
    then known to serve this store alone)."""
    ok(cli("init"))
    return cli


@pytest.fixture
def store(cli: Cli, pg_store_dsn: str, key_file: Path) -> Cli:
    """``cli`` after ``init``, on a store no test has written to, with its key
    as the default key file."""
    cli.key.parent.mkdir(parents=True, mode=0o700)
    cli.key.write_bytes(key_file.read_bytes())
    cli.key.chmod(0o600)
    ok(cli("init"))
    return cli


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


def failed(result: Result, kind: str) -> str:
    """The --json error of a command that failed with exit status 1: its message."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    error = json.loads(result.stderr)["error"]
    assert error["type"] == kind, error
    return str(error["message"])


def admin(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A statement as the server's superuser, outside securepad (the admin role's view)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


# -- every read mode -------------------------------------------------------------------


def test_every_read_mode_on_postgresql(store: Cli) -> None:
    entry = store.put("bob", 1)

    def read(*args: str) -> dict[str, Any]:
        result: dict[str, Any] = as_json(store("--json", "read", "--owner", "bob", entry, *args))
        return result

    assert read("--mode", "full")["content"] == LOG
    assert read("--mode", "head", "-n", "7")["content"] == LOG[:7]
    assert read("--mode", "tail", "-n", "9")["content"] == LOG[-9:]
    ranged = read("--mode", "range", "--start", "5", "--end", "12")
    assert ranged["content"] == LOG[5:12] and ranged["metadata"]["truncated"]
    assert read("--mode", "lines", "--start", "3", "--end", "4")["content"] == "line 3 ERROR\nline 4\n"
    grep = read("--mode", "grep", "--pattern", "ERROR$", "--max-matches", "2")
    assert grep["content"].splitlines() == ["3:line 3 ERROR", "6:line 6 ERROR"]
    # Text output: the content on stdout, the size line on stderr.
    text = ok(store("read", "--owner", "bob", entry, "--mode", "tail", "-n", "9"))
    assert text.stdout == LOG[-9:] + "\n" and "9 of" in text.stderr
    bad = store("--json", "read", "--owner", "bob", entry, "--mode", "grep", "--pattern", "(")
    assert "invalid pattern" in failed(bad, "InvalidArgumentError")
    assert read("--mode", "full")["content"] == LOG  # the failure changed nothing


def test_put_kinds_list_and_turn_show(store: Cli, tmp_path: Path) -> None:
    source = tmp_path / "obs.json"
    source.write_text(json.dumps({"results": [{"title": "a"}, {"title": "b"}], "total": 2}))
    first = json.loads(
        ok(store("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", "--kind", "json", str(source))).stdout
    )
    raw = bytes(range(256)) * 4
    second = as_json(
        store("--json", "put", "--owner", "bob", "--turn", "t", "--step", "2", "--kind", "binary", input=raw)
    )
    listed = as_json(store("--json", "list", "--owner", "bob", "--turn", "t"))
    assert [(e["step_num"], e["kind"], e["scratchpad_id"]) for e in listed] == [
        (1, first["kind"], first["scratchpad_id"]),
        (2, "binary", second["scratchpad_id"]),
    ]
    shown = as_json(store("--json", "turn", "show", "--owner", "bob", "--turn", "t"))
    assert [s["step_num"] for s in shown] == [1, 2]
    # The same step again is refused, and nothing is added.
    again = store("--json", "put", "--owner", "bob", "--turn", "t", "--step", "2", input="other")
    assert "already recorded" in failed(again, "InvalidArgumentError")
    assert len(as_json(store("--json", "list", "--owner", "bob", "--turn", "t"))) == 2
    # The owner and turn from the environment, as the table a person reads.
    table = ok(store("list", env={"SECUREPAD_OWNER": "bob", "SECUREPAD_TURN": "t"}))
    assert first["scratchpad_id"] in table.stdout and second["scratchpad_id"] in table.stdout


# -- another owner, the wrong key ------------------------------------------------------


def test_another_owner_finds_nothing(store: Cli) -> None:
    entry = store.put("bob", 1)
    store.put("alice", 1, "alice's\n")
    assert "no such entry" in failed(store("--json", "read", "--owner", "mallory", entry), "NotFoundError")
    assert "no such entry" in failed(store("--json", "read", "--owner", "alice", entry), "NotFoundError")
    assert as_json(store("--json", "list", "--owner", "mallory", "--turn", "t")) == []
    assert as_json(store("--json", "turn", "show", "--owner", "mallory", "--turn", "t")) == []
    assert as_json(store("--json", "stats", "--owner", "mallory"))["entries"] == 0
    assert "has no key" in failed(store("--json", "keys", "rotate-owner", "mallory"), "NotFoundError")
    missing = store("--json", "forget-owner", "--yes", "mallory")
    assert missing.exit_code == 1 and json.loads(missing.stdout)["found"] is False
    assert as_json(store("--json", "stats"))["entries"] == 2
    assert as_json(store("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG


def test_the_wrong_key_is_refused_and_creates_nothing(store: Cli, tmp_path: Path) -> None:
    store.put("bob", 1)
    other = base64.b64encode(secrets.token_bytes(32)).decode()
    wrong = store("--json", "--master-key-env", "OTHER_KEY", "stats", env={"OTHER_KEY": other})
    assert "does not open this store" in failed(wrong, "WrongKeyError")
    absent = tmp_path / "elsewhere" / "key"
    result = store("--key-file", str(absent), "stats")
    assert result.exit_code == 1 and "no key file" in result.stderr and not absent.exists()
    # init on an existing store never makes a key for it: it asks for this store's key.
    again = store("--json", "--key-file", str(absent), "init")
    assert "no key file" in failed(again, "NotFoundError") and not absent.exists()
    wrong_init = store("--json", "--master-key-env", "OTHER_KEY", "init", env={"OTHER_KEY": other})
    assert failed(wrong_init, "WrongKeyError")


# -- gc, keys, forget-owner ------------------------------------------------------------


def test_gc_collects_expired_entries(store: Cli) -> None:
    short = store.put("bob", 1, "short-lived\n", "--ttl", "1")
    kept = store.put("bob", 2, "kept\n")
    time.sleep(1.2)  # the entry's expiry passes (the store's clock is the wall clock)
    assert as_json(store("--json", "gc")) == {"deleted": 1}
    assert failed(store("--json", "read", "--owner", "bob", short), "NotFoundError")
    assert as_json(store("--json", "read", "--owner", "bob", kept, "--mode", "full"))["content"] == "kept\n"
    assert as_json(store("--json", "gc")) == {"deleted": 0}
    assert as_json(store("--json", "verify"))["ok"]
    assert admin(store.dsn, "SELECT COUNT(*) FROM securepad.entries") == [(1,)]


def test_rotate_master_with_install(made_by_init: Cli) -> None:
    store = made_by_init
    entry = store.put("bob", 1)
    before = store.key.read_bytes()
    report = as_json(store("--json", "keys", "rotate-master", "--install"))
    assert report["owner_keys_rewrapped"] == 1 and report["installed"] == str(store.key)
    assert store.key.read_bytes() != before
    assert as_json(store("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG
    old = store.home / "old-key"
    old.write_bytes(before)
    old.chmod(0o600)
    assert failed(store("--json", "--key-file", str(old), "stats"), "WrongKeyError")


def test_rotate_master_to_an_environment_key(store: Cli) -> None:
    entry = store.put("bob", 1)
    new = base64.b64encode(secrets.token_bytes(32)).decode()
    report = as_json(store("--json", "keys", "rotate-master", "--new-master-key-env", "NEW_KEY", env={"NEW_KEY": new}))
    assert "--master-key-env NEW_KEY" in report["next"]
    assert failed(store("--json", "stats"), "WrongKeyError")  # the old key file no longer opens it
    read = store(
        "--json", "--master-key-env", "NEW_KEY", "read", "--owner", "bob", entry, "--mode", "full", env={"NEW_KEY": new}
    )
    assert as_json(read)["content"] == LOG


def test_rotate_owner_then_forget_owner(store: Cli) -> None:
    bob = [store.put("bob", step) for step in (1, 2)]
    alice = store.put("alice", 1, "alice's\n")
    report = as_json(store("--json", "keys", "rotate-owner", "bob"))
    assert report["complete"]
    for entry in bob:
        assert as_json(store("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG
    assert as_json(store("--json", "verify"))["ok"]
    forgotten = as_json(store("--json", "forget-owner", "--yes", "bob"))
    assert forgotten["found"] is True
    assert admin(store.dsn, "SELECT COUNT(*) FROM securepad.entries WHERE owner_user_id = 'bob'") == [(0,)]
    assert admin(store.dsn, "SELECT COUNT(*) FROM securepad.owner_keys WHERE owner_user_id = 'bob'") == [(0,)]
    assert as_json(store("--json", "read", "--owner", "alice", alice, "--mode", "full"))["content"] == "alice's\n"
    assert as_json(store("--json", "verify"))["ok"]


def test_forget_owner_asks_first(store: Cli) -> None:
    store.put("bob", 1)
    declined = store("forget-owner", "bob", input="n\n")
    assert declined.exit_code == 1
    assert as_json(store("--json", "stats", "--owner", "bob"))["entries"] == 1
    ok(store("forget-owner", "bob", input="y\n"))
    assert as_json(store("--json", "stats", "--owner", "bob"))["entries"] == 0


def test_writes_past_the_policy_limits_change_nothing(store: Cli, tmp_path: Path) -> None:
    """A policy file with small limits (--policy PATH): an entry past max_entry_bytes and
    one past the owner's quota are typed errors, and the store is as it was."""
    policy = tmp_path / "small.toml"
    policy.write_text("[limits]\nmax_entry_bytes = 6000\nowner_quota_bytes = 16000\n")
    small = Cli(store.home, store.dsn, via_env=store.via_env)
    small.env["SECUREPAD_POLICY"] = str(policy)
    kept = small.put("bob", 1, "k" * 5000)

    def state() -> list[tuple[Any, ...]]:
        return admin(
            store.dsn,
            "SELECT (SELECT COUNT(*) FROM securepad.entries), (SELECT COUNT(*) FROM securepad.segments),"
            " (SELECT array_agg(sealed ORDER BY owner_user_id, turn_id) FROM securepad.turn_heads)",
        )

    before = state()
    too_big = small("--json", "put", "--owner", "bob", "--turn", "t", "--step", "2", input="b" * 7000)
    assert "max_entry_bytes" in failed(too_big, "QuotaExceededError")
    assert state() == before
    small.put("bob", 2, "q" * 5000)
    before = state()
    over = small("--json", "put", "--owner", "bob", "--turn", "t", "--step", "3", input="q" * 5000)
    assert "quota" in failed(over, "QuotaExceededError")
    assert state() == before
    assert as_json(small("--json", "read", "--owner", "bob", kept, "--mode", "full"))["content"] == "k" * 5000
    assert as_json(small("--json", "verify"))["ok"]


def test_the_anchor_is_refused_on_postgresql(store: Cli, tmp_path: Path) -> None:
    """The snapshot-rollback anchor is a SQLite store's (SECURITY.md): on PostgreSQL
    anchor-adopt and an anchor path are typed errors that change nothing."""
    entry = store.put("bob", 1)
    adopt = store("--json", "anchor-adopt", "--yes")
    assert "SQLite" in failed(adopt, "InvalidArgumentError")
    anchor = tmp_path / "anchor"
    given = store("--json", "stats", env={"SECUREPAD_ANCHOR": str(anchor)})
    assert "SQLite" in failed(given, "InvalidArgumentError") and not anchor.exists()
    assert as_json(store("--json", "stats"))["anchor"] is None
    assert as_json(store("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG


# -- verify and audit ------------------------------------------------------------------


def test_verify_passes_then_names_rows_the_admin_role_deleted(store: Cli) -> None:
    ids = [store.put("bob", step) for step in (1, 2, 3)]
    other = store.put("alice", 1, "alice's\n")
    report = as_json(store("--json", "verify"))
    assert report["ok"] and (report["owners"], report["turns"], report["entries"]) == (2, 2, 4)
    assert "no problem found" in ok(store("verify")).stdout
    admin(store.dsn, "DELETE FROM securepad.segments WHERE entry_id = %s", (ids[1],))
    admin(store.dsn, "DELETE FROM securepad.entries WHERE id = %s", (ids[1],))
    result = store("--json", "verify")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    # The turn (bob's usage head holds his turns' reservations: unchanged by the delete).
    assert problems and {(p["owner_user_id"], p["turn_id"]) for p in problems} == {("bob", "t")}
    text = store("verify")
    assert text.exit_code == 1 and "verify FAILED" in text.stdout and "bob" in text.stdout
    listed = store("--json", "list", "--owner", "bob", "--turn", "t")
    assert failed(listed, "IntegrityError")
    # Alice's turn is untouched and still reads.
    assert as_json(store("--json", "read", "--owner", "alice", other, "--mode", "full"))["content"] == "alice's\n"
    # The audit runs verify first: the store as found fails it, exit 1.
    audit = store("--json", "audit")
    assert audit.exit_code == 1
    assert json.loads(audit.stdout)["verify"]["ok"] is False


# -- a store that cannot be reached or named -------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://someone:hunter2@[::1/securepad",  # libpq quotes the whole URI in its message
        "postgresql://someone:hunter2@127.0.0.1:5432/securepad?no_such_option=1",
        "postgres://someone:hunter2@127.0.0.1:notaport/securepad",
    ],
    ids=["unclosed-ipv6", "unknown-option", "bad-port"],
)
@pytest.mark.parametrize("command", [["init"], ["stats"], ["put", "--owner", "bob", "--turn", "t", "--step", "1"]])
def test_a_malformed_dsn_is_a_typed_error_without_its_password(
    cli: Cli, dsn: str, command: list[str], tmp_path: Path
) -> None:
    cli.dsn = dsn
    result = cli("--json", *command, input="x")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    error = json.loads(result.stderr)["error"]
    assert error["type"] in ("SecurepadError", "StoreUnavailableError"), error
    assert "hunter2" not in result.stderr + result.stdout and "Traceback" not in result.stderr
    assert not cli.key.exists()


@pytest.fixture
def bouncer(pg_dsn: str) -> Iterator[PgBouncer]:
    if find_pgbouncer() is None:
        reason = "this test stops a PgBouncer in front of the server: it needs Debian's pgbouncer"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with PgBouncer(pool_size=2) as b:
        yield b


def test_a_server_that_goes_down_is_a_retryable_error_for_every_command(
    cli: Cli, pg_dsn: str, bouncer: PgBouncer
) -> None:
    """The store is reached through a PgBouncer that then stops: the server is
    down as far as the command line can tell. Each command fails with
    StoreUnavailableError and exit status 1, and creates nothing."""
    cli.dsn = bouncer.dsn(pg_dsn.rsplit("/", 1)[1])
    ok(cli("init"))
    entry = cli.put("bob", 1)
    key = cli.key.read_bytes()
    bouncer.__exit__(None, None, None)
    commands = [
        ["init"],
        ["stats"],
        ["gc"],
        ["verify"],
        ["audit"],
        ["put", "--owner", "bob", "--turn", "t", "--step", "2"],
        ["read", "--owner", "bob", entry],
        ["list", "--owner", "bob", "--turn", "t"],
        ["turn", "show", "--owner", "bob", "--turn", "t"],
        ["keys", "rotate-owner", "bob"],
        ["keys", "rotate-master", "--install"],
        ["forget-owner", "--yes", "bob"],
    ]
    for command in commands:
        message = failed(cli("--json", *command, input="x"), "StoreUnavailableError")
        assert "PostgreSQL" in message, (command, message)
    text = cli("stats")
    assert text.exit_code == 1 and text.stderr.startswith("error: StoreUnavailableError: ")
    assert cli.key.read_bytes() == key and not cli.key.with_name("key.new").exists()
    # The server itself kept everything.
    assert admin(pg_dsn, "SELECT COUNT(*) FROM securepad.entries") == [(1,)]


# -- SCRAM through the command line; a real process ------------------------------------


def test_the_application_login_with_a_scram_password(store: Cli, pg_dsn: str, bouncer: PgBouncer) -> None:
    """An application host's login: a role with a SCRAM password, member of
    securepad_app only, checked by PgBouncer (``auth_type = scram-sha-256``; the
    local server trusts 127.0.0.1). A principal's commands work; housekeeping is
    refused (the role may not become securepad_admin); the password never shows."""
    role, password = f"securepad_scram_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE securepad_app")
        secret = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()
    try:
        assert secret is not None and str(secret[0]).startswith("SCRAM-SHA-256$")
        entry = store.put("bob", 1)
        dbname = pg_dsn.rsplit("/", 1)[1]
        with PgBouncer(users={role: str(secret[0])}, auth_type="scram-sha-256") as scram:
            app = Cli(store.home, scram.dsn(dbname, role, password), via_env=store.via_env)
            assert as_json(app("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG
            second = app.put("bob", 2, "through SCRAM\n")
            assert [e["scratchpad_id"] for e in as_json(app("--json", "list", "--owner", "bob", "--turn", "t"))] == [
                entry,
                second,
            ]
            assert as_json(app("--json", "stats", "--owner", "bob"))["entries"] == 2
            refused = app("--json", "gc")
            assert refused.exit_code == 1 and json.loads(refused.stderr)["error"]["type"] == "SecurepadError"
            outputs = [refused.stdout + refused.stderr]
            for wrong in (password + "x", ""):
                bad = Cli(store.home, scram.dsn(dbname, role, wrong), via_env=store.via_env)
                result = bad("--json", "stats", "--owner", "bob")
                message = failed(result, "StoreUnavailableError")
                assert "SASL authentication failed" in message or "no password supplied" in message, message
                outputs.append(result.stdout + result.stderr)
            assert not any(password in out for out in outputs)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_real_process_reads_the_dsn_from_the_environment(pg_dsn: str, tmp_path: Path) -> None:
    """``python -m securepad`` with SECUREPAD_DB, as a deployment runs it: exit
    codes 0, 1 (not found) and 2 (usage)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECUREPAD_", "XDG_"))}
    env |= {"HOME": str(home), "SECUREPAD_DB": pg_dsn}

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "securepad", *args],
            input=input,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert run("init").returncode == 0
    put = run("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", input="hello\n")
    assert put.returncode == 0, put.stderr
    entry = json.loads(put.stdout)["scratchpad_id"]
    read = run("read", "--owner", "bob", entry, "--mode", "full")
    assert (read.returncode, read.stdout) == (0, "hello\n\n")
    other = run("--json", "read", "--owner", "alice", entry)
    assert other.returncode == 1 and json.loads(other.stderr)["error"]["type"] == "NotFoundError"
    usage = run("read", entry)  # no owner
    assert usage.returncode == 2 and "--owner" in usage.stderr
    verified = run("--json", "verify")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"]


def test_demo_runs_on_a_throwaway_store_and_leaves_the_postgresql_store_alone(store: Cli) -> None:
    """The demo damages a copy of a store's file: with a PostgreSQL store it says
    so and runs on a throwaway SQLite store (it used to stop half-way, exit 1)."""
    entry = store.put("bob", 1)
    before = admin(store.dsn, "SELECT id, sealed_meta FROM securepad.entries ORDER BY id")
    result = ok(store("--json", "demo"))
    steps = json.loads(result.stdout)
    assert steps and all(s["ok"] for s in steps), steps
    assert "throwaway store" in result.stderr
    assert admin(store.dsn, "SELECT id, sealed_meta FROM securepad.entries ORDER BY id") == before
    assert as_json(store("--json", "read", "--owner", "bob", entry, "--mode", "full"))["content"] == LOG
