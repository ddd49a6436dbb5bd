"""The command line never surprises: each test runs ``securepad`` through
click's runner on a fresh HOME, in a scratch working directory, as a new user would."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import apsw
import click
import pytest
from click.testing import Result

from securepad import InvalidArgumentError, Keyring, Policy, PolicyError, Principal, Scratchpad
from securepad.cli import ENVIRONMENT, for_terminal
from tests.support.cli_runner import Cli, every_command, fresh_home, ok
from tests.support.paths import ROOT

LOG = "".join(f"line {i}{' ERROR' if i % 2 == 0 else ''}\n" for i in range(1, 11))


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return fresh_home(tmp_path, monkeypatch, None)


def put(cli: Cli, step: int, text: str = "hello\n", *extra: str) -> Result:
    return cli("put", "--owner", "bob", "--turn", "t", "--step", str(step), *extra, input=text)


# -- commands that silently did the wrong thing -----------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["list", "--turn", "t"],
        ["stats"],
        ["read", "0123456789abcdef"],
        ["gc"],
        ["mcp", "--turn", "t"],
        ["turn", "show", "--turn", "t"],
    ],
)
def test_a_missing_store_fails_naming_it_and_creates_nothing(cli: Cli, tmp_path: Path, command: list[str]) -> None:
    owner = ["--owner", "bob"] if command[0] in ("list", "read", "mcp", "turn") else []
    for db in ("./s.dbb", str(tmp_path / "nonexistent" / "dir" / "x.db")):
        result = cli("--db", db, *command, *owner)
        assert result.exit_code == 1, result.stdout
        assert "no store at" in result.stderr and "securepad init" in result.stderr
        assert str(Path(db).name) in result.stderr
    assert not (tmp_path / "work" / "s.dbb").exists() and not (tmp_path / "nonexistent").exists()
    assert not cli.db.exists() and not cli.key.exists()  # nor the default store, nor a key


def test_only_init_creates_the_store_and_its_key(cli: Cli) -> None:
    assert cli("list", "--owner", "bob", "--turn", "t").exit_code == 1
    assert not cli.db.exists() and not cli.key.exists()
    assert "store ready at" in ok(cli("init")).stdout
    assert cli.db.exists() and cli.key.exists()
    ok(cli("init"))  # again: checks the key, changes nothing
    ok(put(cli, 1))
    assert "hello" in ok(cli("list", "--owner", "bob", "--turn", "t")).stdout


def test_a_mistyped_key_file_leaves_no_stray_key(cli: Cli) -> None:
    ok(cli("init"))
    result = cli("--key-file", "./x", "list", "--owner", "bob", "--turn", "t")
    assert result.exit_code == 1
    assert "no key file at" in result.stderr and "never creates" in result.stderr
    assert not Path("x").exists()


def test_init_on_postgresql_creates_a_key_file_only_with_a_new_store(cli: Cli, pg_dsn: str) -> None:
    """One rule on both backends: a key file is created only together with a new store."""
    ok(cli("--db", pg_dsn, "init"))
    assert cli.key.exists()
    ok(cli("--db", pg_dsn, "init"))  # again: the same key, nothing created
    cli.key.unlink()
    for command in (("init",), ("stats",)):
        result = cli("--db", pg_dsn, *command)
        assert result.exit_code == 1 and "key file" in result.stderr, command
        assert not cli.key.exists(), command


def test_a_key_file_on_a_passphrase_store_says_it_uses_a_passphrase(cli: Cli, tmp_path: Path) -> None:
    env = {"PASS": "correct horse battery staple"}
    ok(cli("--db", "p.db", "--passphrase-env", "PASS", "init", env=env))
    ok(cli("init"))  # the default store and its key file
    result = cli("--db", "p.db", "stats")
    assert result.exit_code == 1
    assert "WrongKeyError" in result.stderr and "uses a passphrase" in result.stderr


def test_rotate_master_says_what_to_do_next(cli: Cli) -> None:
    ok(cli("init"))
    ok(put(cli, 1))
    result = ok(cli("keys", "rotate-master", "--new-key-file", "new.key"))
    advice = " ".join(result.stderr.split())
    assert "--key-file new.key" in advice and "mv " not in advice  # never a move over a key file
    report = json.loads(
        ok(cli("--json", "keys", "rotate-master", "--key-file", "new.key", "--new-key-file", "b.key")).stdout
    )
    assert "b.key" in report["next"]
    assert ok(cli("--key-file", "b.key", "stats")).stdout


def test_rotate_master_install_puts_the_new_key_in_place(cli: Cli) -> None:
    ok(cli("init"))
    ok(put(cli, 1))
    old_key = cli.key.read_bytes()
    report = json.loads(ok(cli("keys", "rotate-master", "--install", "--json")).stdout)
    assert report["installed"] == str(cli.key) and report["owner_keys_rewrapped"] == 1
    assert cli.key.read_bytes() != old_key
    # No ".new" file left behind (beside the key: the store's anchor and its lock),
    # and the old key kept under a new name, never destroyed.
    kept = [p for p in cli.key.parent.iterdir() if not p.name.startswith("anchor-")]
    assert sorted(kept) == [cli.key, cli.key.with_name("key.replaced-1"), cli.key.with_name("key.stores")]
    assert report["old_key_kept"] == str(cli.key.with_name("key.replaced-1"))
    assert cli.key.with_name("key.replaced-1").read_bytes() == old_key
    assert (
        "hello"
        in ok(
            cli(
                "read",
                "--owner",
                "bob",
                json.loads(ok(cli("list", "--owner", "bob", "--turn", "t", "--json")).stdout)[0]["scratchpad_id"],
            )
        ).stdout
    )
    # The old key no longer opens the store.
    Path("old.key").write_bytes(old_key)
    Path("old.key").chmod(0o600)
    assert "WrongKeyError" in cli("--key-file", "old.key", "stats").stderr


def test_rotate_master_install_needs_a_key_file_source(cli: Cli) -> None:
    ok(cli("init"))
    result = cli("keys", "rotate-master", "--install", "--new-master-key-env", "NEW", env={"NEW": "A" * 43 + "="})
    assert result.exit_code == 2 and "--install" in result.stderr


def test_key_sources_are_exclusive_and_unset_variables_are_usage_errors(cli: Cli) -> None:
    ok(cli("init"))
    both = cli("--master-key-env", "MK", "--key-file", str(cli.key), "stats", env={"MK": "A" * 43 + "="})
    assert both.exit_code == 2 and "two key sources" in both.stderr
    after = cli("stats", "--master-key-env", "MK", "--key-file", str(cli.key), env={"MK": "A" * 43 + "="})
    assert after.exit_code == 2 and "two key sources" in after.stderr
    for option in ("--master-key-env", "--passphrase-env"):
        unset = cli(option, "NOPE_UNSET", "stats")
        assert unset.exit_code == 2, unset.stderr
        assert "environment variable NOPE_UNSET" in unset.stderr and "is not set" in unset.stderr
    # The environment's key file yields to a key source on the command line.
    env = {"SECUREPAD_KEY_FILE": str(cli.key), "MK": "A" * 43 + "="}
    assert cli("--master-key-env", "MK", "stats", env=env).exit_code == 1  # WrongKeyError, not a usage error


def test_put_refuses_a_step_already_live_in_the_turn(cli: Cli) -> None:
    ok(cli("init"))
    ok(put(cli, 1, "first\n"))
    again = put(cli, 1, "second\n")
    assert again.exit_code == 1 and "step 1 is already recorded in turn 't'" in again.stderr
    rows = json.loads(ok(cli("list", "--owner", "bob", "--turn", "t", "--json")).stdout)
    assert [r["step_num"] for r in rows] == [1]
    ok(put(cli, 2, "second\n"))


def test_put_and_record_follow_one_rule_for_a_live_step(pad: Scratchpad) -> None:
    bob = Principal("bob", "planner", "web")
    first = pad.put(bob, "t", 1, "tool", "first")
    with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
        pad.put(bob, "t", 1, "tool", "second")
    turn = pad.turn(bob, "t")
    with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
        turn.record(1, "tool", "second")
    assert turn.resolve("{{step1.content}}") == "first"
    # Another owner, another turn, or a deleted entry leave the step free.
    pad.put(Principal("alice", "planner", "web"), "t", 1, "tool", "hers")
    pad.put(bob, "t2", 1, "tool", "elsewhere")
    pad.delete(bob, first["scratchpad_id"])
    pad.put(bob, "t", 1, "tool", "again")


def test_forget_owner_names_the_owner_and_refuses_a_missing_one(cli: Cli) -> None:
    ok(cli("init"))
    ok(put(cli, 1))
    missing = cli("forget-owner", "nosuchowner", "--yes")
    assert missing.exit_code == 1 and "not found" in missing.stdout and "forgotten" not in missing.stdout
    asked = cli("forget-owner", "bob", input="n\n")
    assert "owner 'bob'" in asked.stdout and asked.exit_code == 1
    assert ok(cli("stats", "--owner", "bob", "--json")).stdout.count('"entries": 1')
    done = json.loads(ok(cli("forget-owner", "bob", "--yes", "--json")).stdout)
    assert done["found"] and done["entries"] == 1


def test_bench_names_only_the_files_it_wrote(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a machine without matplotlib
    args = ["bench", "--tiny", "--workloads", "open", "--backends", "securepad", "--no-progress", "--out", "res"]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    assert "chart skipped" in result.stdout and "quick.png" not in result.stdout
    assert "results: res/quick.json" in result.stdout
    assert sorted(p.name for p in Path("res").iterdir()) == ["quick.json"]
    assert json.loads(Path("res/quick.json").read_text())["meta"]["chart"] is None


def test_grep_context_matches_grep(cli: Cli) -> None:
    ok(cli("init"))
    entry = json.loads(ok(put(cli, 1, LOG, "--json")).stdout)["scratchpad_id"]
    result = ok(
        cli(
            "read",
            "--owner",
            "bob",
            entry,
            "--mode",
            "grep",
            "--pattern",
            "ERROR",
            "--context",
            "1",
            "--max-matches",
            "3",
        )
    )
    # grep -n -m3 -C1 ERROR: the last match's trailing context line is there.
    expected = ["1-line 1", "2:line 2 ERROR", "3-line 3", "4:line 4 ERROR", "5-line 5", "6:line 6 ERROR", "7-line 7"]
    assert result.stdout.splitlines() == expected


# -- click's and users' habits ----------------------------------------------------------


def test_global_options_work_after_the_subcommand(cli: Cli, tmp_path: Path) -> None:
    db = str(tmp_path / "elsewhere.db")
    ok(cli("init", "--db", db))
    ok(cli("put", "--owner", "bob", "--turn", "t", "--step", "1", "--db", db, input="x\n"))
    rows = json.loads(ok(cli("list", "--owner", "bob", "--turn", "t", "--json", "--db", db)).stdout)
    assert [r["step_num"] for r in rows] == [1]
    assert json.loads(ok(cli("--json", "list", "--owner", "bob", "--turn", "t", "--db", db)).stdout) == rows
    # The command line after the subcommand wins over the one before it and over the environment.
    rows = json.loads(ok(cli("--db", "nope.db", "list", "--db", db, "--owner", "bob", "--turn", "t", "--json")).stdout)
    assert len(rows) == 1
    shown = json.loads(ok(cli("turn", "--db", db, "show", "--owner", "bob", "--turn", "t", "--json")).stdout)
    assert [s["step_num"] for s in shown] == [1]
    assert not cli.db.exists()


def _help(cli: Cli, *command: str) -> str:
    return ok(cli(*command, "--help")).stdout


def test_every_help_shows_its_environment_variables(cli: Cli) -> None:
    top = _help(cli)
    for var, option, _ in ENVIRONMENT:
        assert var in top and option in top
    for command in (["list"], ["put"], ["read"], ["stats"], ["mcp"], ["turn", "show"], ["audit"], ["init"]):
        text = _help(cli, *command)
        assert "SECUREPAD_DB" in text and "SECUREPAD_KEY_FILE" in text and "SECUREPAD_POLICY" in text, command
        if command[0] in ("list", "put", "read", "mcp", "turn"):
            assert "SECUREPAD_OWNER" in text and "SECUREPAD_ACTOR" in text and "SECUREPAD_CHANNEL" in text
            owner_help = text[text.index("--owner") : text.index("--actor")]
            assert "required]" not in owner_help  # the variable satisfies --owner
        if command[0] in ("list", "put", "mcp", "turn"):
            assert "SECUREPAD_TURN" in text, command


def test_every_command_honours_the_variables(cli: Cli, tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    env = {"SECUREPAD_DB": str(db), "SECUREPAD_OWNER": "bob", "SECUREPAD_TURN": "t"}
    ok(cli("init", env=env))
    ok(cli("put", "--step", "1", input="x\n", env=env))
    assert len(json.loads(ok(cli("list", "--json", env=env)).stdout)) == 1
    assert ok(cli("turn", "show", env=env)).stdout.startswith("step 1")
    missing = cli("list", env={"SECUREPAD_DB": str(db), "SECUREPAD_OWNER": "bob"})
    assert missing.exit_code == 2 and "--turn" in missing.stderr and "SECUREPAD_TURN" in missing.stderr
    # An exported owner narrows stats, and stats says so.
    narrowed = ok(cli("stats", env=env))
    assert "owner 'bob' only (from SECUREPAD_OWNER)" in narrowed.stderr
    assert "owner 'bob'" not in ok(cli("stats", "--owner", "bob", env=env)).stderr


def test_version_and_short_help_everywhere(cli: Cli) -> None:
    assert re.fullmatch(r"securepad \d+\.\d+\.\d+\S*\n", ok(cli("--version")).stdout)
    commands: list[list[str]] = [[]]
    for name, command in every_command().items():
        commands.append([name])
        if isinstance(command, click.Group):
            commands += [[name, sub] for sub in command.commands]
    for command in commands:
        assert ok(cli(*command, "-h")).stdout.startswith("Usage: "), command


def test_json_errors_are_json_and_text_errors_are_one_line(cli: Cli, tmp_path: Path) -> None:
    long_dir = tmp_path / ("d" * 90)
    result = cli("--json", "list", "--owner", "bob", "--turn", "t", "--db", str(long_dir / "store.db"))
    assert result.exit_code == 1 and result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert error["type"] == "NotFoundError" and str(long_dir) in error["message"]
    usage = cli("list", "--owner", "bob", "--json", "--mystery")
    assert usage.exit_code == 2 and json.loads(usage.stderr)["error"]["type"] == "UsageError"
    ok(cli("init"))
    text = cli("read", "--owner", "bob", "0123456789abcdef")
    assert text.exit_code == 1 and text.stderr == "error: NotFoundError: no such entry\n"
    wide = cli("--db", str(long_dir / "store.db"), "stats")
    assert len(wide.stderr.splitlines()) == 1 and str(long_dir) in wide.stderr  # never wrapped at 80 columns


def test_shipped_policies_by_name(cli: Cli) -> None:
    assert "(policy strict)" in ok(cli("--policy", "strict", "init")).stdout.splitlines()[0]
    stats = json.loads(ok(cli("stats", "--policy", "channel", "--json")).stdout)
    assert stats["policy"] == "channel"
    unknown = cli("stats", "--policy", "stric")
    assert unknown.exit_code == 1 and "no shipped policy named 'stric'" in unknown.stderr and "strict" in unknown.stderr
    path = cli("stats", "--policy", "policies/strict.toml")
    assert path.exit_code == 1 and "a shipped policy is named without a path" in path.stderr


def test_policy_load_takes_a_shipped_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Policy.shipped() == ("channel", "default", "strict")
    assert Policy.load("strict").scope == "owner+channel+actor"
    assert Policy.load("default") == Policy.default()
    with pytest.raises(PolicyError, match="no shipped policy named 'nope'"):
        Policy.load("nope")
    Path("mine").write_text('[access]\nscope = "owner+channel"\n')  # a file is named by a path
    assert Policy.load("./mine").scope == "owner+channel"
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_key_file(tmp_path / "k"), policy="strict") as pad:
        assert pad.policy.name == "strict"


def test_bench_never_imports_from_the_working_directory(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for package in ("benchmarks", "securepad_bench"):
        Path(package).mkdir()
        Path(package, "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        Path(package, "runner.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    saved = tmp_path / "saved.json"
    saved.write_text((ROOT / "docs" / "bench-results" / "full.json").read_text())
    result = ok(cli("bench", "--from-json", str(saved)))
    assert "securepad bench (full)" in result.stdout
    assert not marker.exists()


# -- stored text is data ---------------------------------------------


def test_stored_markup_and_control_sequences_are_shown_as_text(cli: Cli) -> None:
    ok(cli("init"))
    nasty = "[/] [link=https://evil.example]click[/link] [bold]x\x1b]8;;https://evil.example\x07y\x1b[31mred\x9b2J\n"
    ok(put(cli, 1, nasty))
    table = ok(cli("list", "--owner", "bob", "--turn", "t", env={"COLUMNS": "250"}))
    assert "[/] [link=https://evil.example]click[/link]" in table.stdout
    assert "\x1b" not in table.stdout and "\x9b" not in table.stdout and "\x07" not in table.stdout
    shown = ok(cli("turn", "show", "--owner", "bob", "--turn", "t")).stdout
    assert "[link=https://evil.example]" in shown and "\x1b" not in shown and "\x9b" not in shown
    as_json = ok(cli("list", "--owner", "bob", "--turn", "t", "--json")).stdout
    assert "\x1b" not in as_json and "\x9b" not in as_json
    assert json.loads(as_json)[0]["summary"].startswith(nasty.split("\n")[0][:40])  # the JSON is exact


def test_user_strings_keep_their_brackets_in_errors(cli: Cli) -> None:
    Path("bad.toml").write_text("[acess]\nscope = 'owner'\n")
    ok(cli("init"))
    result = cli("stats", "--policy", "./bad.toml")
    assert result.exit_code == 1 and "unknown policy section [acess]" in result.stderr


def test_for_terminal_strips_sequences_and_controls() -> None:
    assert for_terminal("a\x1b[2Jb\x1b]8;;http://x\x07c\x1b]8;;\x1b\\d\te\nf") == "abcd\te\nf"
    assert for_terminal("x\x00y\x9b2Jz\x7f\x85") == "x\\x00yz\\x7f\\x85"


def test_an_older_copy_of_the_store_is_refused_until_adopted(cli: Cli, tmp_path: Path) -> None:
    ok(cli("init"))
    ok(put(cli, 1))
    saved = tmp_path / "saved.db"
    shutil.copy(cli.db, saved)  # the WAL is empty after the CLI's close
    ok(put(cli, 2))
    for suffix in ("-wal", "-shm"):
        Path(f"{cli.db}{suffix}").unlink(missing_ok=True)
    shutil.copy(saved, cli.db)
    refused = cli("stats")
    assert refused.exit_code == 1 and "snapshot rollback" in refused.stderr and "anchor-adopt" in refused.stderr
    assert "anchor reset" in ok(cli("anchor-adopt", "--yes")).stdout
    assert json.loads(ok(cli("--json", "stats")).stdout)["anchor"]["sync"] == "interval"
    moved = tmp_path / "elsewhere" / "anchor"
    ok(cli("--anchor", str(moved), "anchor-adopt", "--yes"))
    assert moved.exists()
    ok(cli("stats", env={"SECUREPAD_ANCHOR": str(moved)}))


# -- verify ----------------------------------------------------------------------------


def test_verify_passes_a_genuine_store_and_names_a_deleted_entry(cli: Cli) -> None:
    ok(cli("init"))
    for step in (1, 2, 3):
        ok(put(cli, step, f"step {step}\n"))
    report = json.loads(ok(cli("--json", "verify")).stdout)
    assert report["ok"] and report["entries"] == 3 and report["problems"] == []
    conn = apsw.Connection(str(cli.db))
    with conn:
        conn.execute("DELETE FROM entries WHERE step_num = 2")
    conn.close()
    result = cli("--json", "verify")
    assert result.exit_code == 1
    (problem,) = json.loads(result.stdout)["problems"]
    # A head is a constant-size tally: verify names the turn and that rows went.
    # The owner's usage head holds the turns' sealed reservations, which a
    # deleted row does not change: it still equals their sum, and nothing else is named.
    assert (problem["owner_user_id"], problem["turn_id"], problem["what"]) == ("bob", "t", "turn")
    table = cli("verify")
    assert table.exit_code == 1 and "holds 2 entries, its head 3" in table.stdout
