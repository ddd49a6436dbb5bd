"""``securepad audit``: passes on a sound deployment, fails (exit 1) on a weakened
one, catches a broken defence, removes its tenants and leaves real entries alone."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from securepad import ExpiredError, Keyring, Policy, Principal, Scratchpad, SecurepadError
from securepad.audit import Audit, run_audit
from securepad.cli import main
from securepad.policy import NOT_FOUND_MESSAGE
from securepad.store import parts
from securepad.tables.entries.listings import Listings
from tests.support.paths import ROOT

# The audit scans and copies the store's files: a SQLite feature (docs/how-to/postgresql.md).
pytestmark = [pytest.mark.slow, pytest.mark.sqlite_only]

REAL = [Principal("carol", "planner", "web"), Principal("dave", "coder", "slack")]


def audit_cli(db_path: Path, key_file: Path, *extra: str, env: dict[str, str] | None = None) -> Result:
    if not db_path.exists():  # only init creates a store; the audit of a missing one runs on a scratch store
        init = [arg for arg in extra if arg not in ("audit", "--json")]
        made = CliRunner().invoke(
            main, ["--db", str(db_path), "--key-file", str(key_file), *init, "init"], env=env, catch_exceptions=False
        )
        assert made.exit_code == 0, made.output
    # A wide terminal, so that table rows do not wrap check names.
    return CliRunner().invoke(
        main,
        ["--db", str(db_path), "--key-file", str(key_file), *extra],
        env={"COLUMNS": "250", **(env or {})},
        catch_exceptions=False,
    )


def report_of(result: Result) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in report["results"]}


def failed(report: dict[str, Any]) -> set[str]:
    return {row["name"] for row in report["results"] if not row["passed"]}


def put_real_entries(pad: Scratchpad) -> list[tuple[Principal, str]]:
    """Real owners' entries of every kind, one of them already expired."""
    carol, dave = REAL
    stored = [
        (carol, pad.put(carol, "t1", 1, "read_log", {"content": "log line\n" * 20_000, "metadata": {"path": "/a"}})),
        (carol, pad.put(carol, "t1", 2, "fetch", b"\x00\x01binary" * 20_000)),
        (dave, pad.put(dave, "t9", 1, "search", {"results": [{"title": f"r{i}"} for i in range(300)], "total": 300})),
        (dave, pad.put(dave, "t9", 2, "note", "short")),
    ]
    pad.put(dave, "t9", 3, "old", "expired long ago", ttl_seconds=60, now=time.time() - 3600)
    return [(who, view["scratchpad_id"]) for who, view in stored]


def checksums(pad: Scratchpad, entries: list[tuple[Principal, str]]) -> dict[str, str]:
    out = {}
    for who, entry_id in entries:
        observation = pad.get(who, entry_id).observation
        data = observation if isinstance(observation, bytes) else json.dumps(observation, sort_keys=True).encode()
        out[entry_id] = hashlib.sha256(data).hexdigest()
    return out


def owners_in_store(pad: Scratchpad) -> set[str]:
    rows = parts(pad).db.query("SELECT owner_user_id AS o FROM entries UNION SELECT owner_user_id FROM owner_keys")
    return {r["o"] for r in rows}


# -- the command -----------------------------------------------------------------------


def test_fresh_store_passes_every_check_and_exits_0(db_path: Path, key_file: Path) -> None:
    result = audit_cli(db_path, key_file, "--json", "audit")
    assert result.exit_code == 0, result.output
    report = report_of(result)  # stdout holds the JSON only: the progress bar is on stderr
    assert report["passed"] is True and report["failures"] == 0
    names = set(rows(report))
    expected = {
        "store file permissions",
        "key file permissions",
        "key file apart from the data",
        "secure_delete on",
        "policy sane",
        "cross-owner get",
        "cross-owner list",
        "cross-owner stats",
        "forged ids",
        "guessed ids",
        "malformed ids",
        "expired entries: others",
        "full-read cap",
        "tamper: row moved to another owner",
        "tamper: item key swapped",
        "tamper: owner key swapped",
        "at-rest canary scan",
        "gc scrubs expired entries",
        "audit tenants removed",
        "real entries unchanged",
    }
    assert expected <= names
    from securepad.core import read_modes

    assert {f"cross-owner read: {mode}" for mode in read_modes.MODES} <= names
    runtime = {"cross-owner resolve", "cross-owner tool calls"}
    assert (runtime <= names) == hasattr(Scratchpad, "turn")
    for row in report["results"]:
        assert row["tried"] and row["happened"], row


def test_table_output_has_one_row_per_check(db_path: Path, key_file: Path) -> None:
    result = audit_cli(db_path, key_file, "audit")
    assert result.exit_code == 0, result.output
    assert "checks passed" in result.stdout
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)) as pad:
        names = Audit(pad).checks
    for name in names:
        assert name.split(":")[0] in result.stdout
    assert "FAIL" not in result.stdout


def test_subcommand_options_and_policy(db_path: Path, key_file: Path) -> None:
    strict = ROOT / "policies" / "strict.toml"
    made = CliRunner().invoke(main, ["--key-file", str(key_file), "init", "--db", str(db_path)])
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(
        main, ["--key-file", str(key_file), "audit", "--db", str(db_path), "--policy", str(strict), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["policy"] == "strict" and report["store"] == str(db_path)
    assert "policy scope: owner+channel+actor" in rows(report)


def test_world_readable_key_file_is_refused_and_fails_the_audit_when_allowed(db_path: Path, key_file: Path) -> None:
    Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)).close()
    key_file.chmod(0o644)
    # Refused at open, with the fix in the message.
    result = audit_cli(db_path, key_file, "--json", "audit")
    assert result.exit_code == 1
    assert "chmod 600" in result.output
    # Allowed on purpose, the audit still flags it.
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file, allow_shared=True)) as pad:
        report = run_audit(pad).as_dict()
    assert failed(report) == {"key file permissions"}
    assert "0644" in rows(report)["key file permissions"]["happened"]


def test_world_readable_key_file_shows_the_fix(db_path: Path, key_file: Path) -> None:
    Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)).close()
    key_file.chmod(0o604)
    result = audit_cli(db_path, key_file, "audit")
    assert result.exit_code == 1
    assert f"chmod 600 {key_file}" in " ".join(result.output.split())


def test_key_file_inside_data_dir_fails(db_path: Path) -> None:
    db_path.parent.mkdir(mode=0o700)
    inside = db_path.parent / "keys" / "master.key"
    result = audit_cli(db_path, inside, "--json", "audit")
    assert result.exit_code == 1
    report = report_of(result)
    assert failed(report) == {"key file apart from the data"}
    assert "inside the store's data dir" in rows(report)["key file apart from the data"]["happened"]


def test_readable_store_file_and_dir_fail(db_path: Path, key_file: Path, tmp_path: Path) -> None:
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)):
        pass
    db_path.chmod(0o640)
    db_path.parent.chmod(0o755)
    # A store file others may read is refused at open...
    result = audit_cli(db_path, key_file, "--json", "audit")
    assert result.exit_code == 1
    assert "chmod 600" in result.output
    # ...and when shared on purpose, the audit still flags the file and its directory.
    shared = tmp_path / "shared.toml"
    shared.write_text('[access]\nscope = "owner"\nallow_shared_files = true\n')
    result = audit_cli(db_path, key_file, "--policy", str(shared), "--json", "audit")
    assert result.exit_code == 1
    assert failed(report_of(result)) == {"store file permissions", "store directory permissions"}


def test_policy_without_denied_log_is_not_sane(db_path: Path, key_file: Path, tmp_path: Path) -> None:
    policy = tmp_path / "quiet.toml"
    policy.write_text('[access]\nscope = "owner"\n[audit]\nlog_denied = false\n')
    result = audit_cli(db_path, key_file, "--policy", str(policy), "--json", "audit")
    assert result.exit_code == 1
    report = report_of(result)
    assert failed(report) == {"policy sane"}
    assert "log_denied is off" in rows(report)["policy sane"]["happened"]
    assert "not applicable" in rows(report)["denied attempts logged"]["happened"]


def test_master_key_from_environment_has_no_key_file_to_check(db_path: Path, key_file: Path) -> None:
    key = "A" * 43 + "="
    env = {"SP_TEST_KEY": key, "SECUREPAD_KEY_FILE": str(key_file)}  # the command line's key source wins
    for command in (["init"], ["--json", "audit"]):
        result = CliRunner().invoke(
            main, ["--db", str(db_path), "--master-key-env", "SP_TEST_KEY", *command], env=env, catch_exceptions=False
        )
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert "no key file" in rows(report)["key file permissions"]["happened"]
    assert not key_file.exists()


# -- real entries and cleanup ----------------------------------------------------------


def test_real_entries_unchanged_and_tenants_removed(db_path: Path, key_file: Path) -> None:
    keyring = Keyring.from_key_file(key_file)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entries = put_real_entries(pad)
        before = checksums(pad, entries)
        owners_before = owners_in_store(pad)
        stats_before = pad.stats()
        expired_before = parts(pad).db.query("SELECT id, expires_at FROM entries WHERE expires_at <= ?", (time.time(),))
    result = audit_cli(db_path, key_file, "--json", "audit")
    assert result.exit_code == 0, result.output
    assert (
        "5 entries, 2 owner keys and 0 turn records byte for byte"
        in (rows(report_of(result))["real entries unchanged"]["happened"])
    )
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        assert checksums(pad, entries) == before
        assert owners_in_store(pad) == owners_before == {"carol", "dave"}
        after = pad.stats()
        assert (after["entries"], after["bytes"], after["owners"]) == (
            stats_before["entries"],
            stats_before["bytes"],
            stats_before["owners"],
        )
        # The real expired entry was not gc'd by the audit: expiring it is the user's gc's job.
        assert parts(pad).db.query("SELECT id, expires_at FROM entries WHERE expires_at <= ?", (time.time(),)) == (
            expired_before
        )
        with pytest.raises(ExpiredError):
            pad.get(REAL[1], expired_before[0]["id"])
    assert [p.name for p in db_path.parent.iterdir() if p.name.startswith(".securepad-audit-")] == []


def test_stopping_the_audit_early_still_removes_its_tenants(pad: Scratchpad) -> None:
    put_real_entries(pad)
    audit = Audit(pad)
    results = audit.run()
    seen = [next(results) for _ in range(12)]  # past the tenants' setup, in the middle of the checks
    assert all(r.passed for r in seen)
    results.close()
    assert owners_in_store(pad) == {"carol", "dave"}
    assert [p for p in pad.path.parent.iterdir() if p.name.startswith(".securepad-audit-")] == []


def test_an_audit_runs_once(pad: Scratchpad) -> None:
    audit = Audit(pad)
    seen = []
    for result in audit.run():
        seen.append(result.name)
    assert tuple(seen) == audit.checks
    assert audit.report().passed
    with pytest.raises(SecurepadError):
        list(audit.run())


def test_on_result_sees_every_row(pad: Scratchpad, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    names: list[str] = []
    report = run_audit(pad, scratch_dir=scratch, on_result=lambda r: names.append(r.name))
    assert report.passed, [(r.name, r.happened) for r in report.failed]
    assert names == [r.name for r in report.results]
    assert list(scratch.iterdir()) == []
    assert report.as_dict()["checks"] == len(names)


def test_passphrase_store_passes(db_path: Path) -> None:
    keyring = Keyring.from_passphrase("correct horse", time_cost=1, memory_cost=64, parallelism=1)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        report = run_audit(pad)
    assert report.passed, [(r.name, r.happened) for r in report.failed]
    assert "no key file" in {r.name: r.happened for r in report.results}["key file apart from the data"]


# -- the audit catches broken defences -------------------------------------------------


def test_audit_catches_a_store_that_ignores_the_owner(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate the worst bug: the owner condition dropped from every query."""
    monkeypatch.setattr(Policy, "scope_sql", lambda self, principal: ("1 = 1", ()))
    monkeypatch.setattr(Policy, "authorize_row", lambda self, principal, row: None)
    # Owner b's step 1 shares a's turn id and step on purpose; with the owner condition
    # dropped, put's one-live-step check would refuse it and the tenants never be set up.
    monkeypatch.setattr(Listings, "check_step_free", lambda *args, **kwargs: None)
    report = run_audit(pad)
    assert not report.passed
    broken = {r.name for r in report.failed}
    assert {"cross-owner get", "cross-owner read: full", "cross-owner list", "cross-owner stats"} <= broken
    get_row = next(r for r in report.failed if r.name == "cross-owner get")
    # Served, or refused by b's turn head, which does not list a's entry:
    # either way not the NotFoundError the audit requires, so the check fails.
    assert "served" in get_row.happened or "not in the head of turn" in get_row.happened
    # Cleanup still ran.
    assert owners_in_store(pad) == set()


def test_audit_catches_a_leaky_refusal_message(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal that says 'not yours' instead of 'no such entry' tells that the id exists."""

    def authorize_row(self: Policy, principal: Principal, row: dict[str, Any]) -> None:
        if row["owner_user_id"] != principal.owner_user_id:
            from securepad import NotFoundError

            raise NotFoundError("that entry belongs to someone else")

    monkeypatch.setattr(Policy, "scope_sql", lambda self, p: ("owner_user_id = owner_user_id", ()))
    monkeypatch.setattr(Policy, "authorize_row", authorize_row)
    monkeypatch.setattr(Listings, "check_step_free", lambda *args, **kwargs: None)  # see above
    report = run_audit(pad)
    row = next(r for r in report.results if r.name == "cross-owner get")
    assert not row.passed
    assert "differs from an absent id's" in row.happened and NOT_FOUND_MESSAGE in row.happened


def test_audit_catches_secure_delete_off(pad: Scratchpad) -> None:
    parts(pad).db.conn.execute("PRAGMA secure_delete = OFF")
    report = run_audit(pad)
    assert "secure_delete on" in {r.name for r in report.failed}


def test_key_file_in_a_directory_others_can_write_fails(db_path: Path, key_file: Path) -> None:
    Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)).close()
    key_file.parent.chmod(0o777)
    result = audit_cli(db_path, key_file, "--json", "audit")
    assert result.exit_code == 1
    assert "chmod o-w" in result.output
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file, allow_shared=True)) as pad:
        assert "key file permissions" in failed(run_audit(pad).as_dict())


def test_a_postgresql_store_is_audited_with_the_checks_that_apply_there(pg_login_dsn: str, keyring: Keyring) -> None:
    """No file to scan or copy: the server's roles, row-level security and grants
    instead, rows tampered in place; the real rows are untouched (see
    tests/cli/test_cli_postgres.py for the failures)."""
    pytest.importorskip("psycopg")
    with Scratchpad.open(pg_login_dsn, keyring=keyring) as pad:
        ids = [pad.put(p, "turn", 1, "tool", f"real {p.owner_user_id}")["scratchpad_id"] for p in REAL]
        before = {k: v for k, v in pad.stats().items() if k != "key_usage"}  # the audit owners' keys count master wraps
        report = run_audit(pad)
        assert report.passed, [(r.name, r.happened) for r in report.failed]
        names = [r.name for r in report.results]
        assert "at-rest canary scan" not in names and "store file permissions" not in names
        assert names[-2:] == ["audit tenants removed", "real entries unchanged"]
        assert "2 entries, 2 owner keys" in report.results[-1].happened
        assert report.store.startswith("postgresql://")
        assert {k: v for k, v in pad.stats().items() if k != "key_usage"} == before
        for principal, entry_id in zip(REAL, ids, strict=True):
            assert pad.get(principal, entry_id).observation == f"real {principal.owner_user_id}"
