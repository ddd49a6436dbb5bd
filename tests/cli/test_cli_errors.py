"""One error format everywhere: ``error: Type: message`` on one line (a JSON object
with ``--json``), whose type is one of securepad.errors or the command line's
documented ``UsageError``, ``Aborted`` and ``Interrupted``; Ctrl-C exits 130.
Stored and user-given strings are shown as text, never read as markup."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

import securepad.errors
from securepad.cli import main
from tests.support.cli_runner import Cli, as_json, ok, put

CLI_TYPES = {"UsageError", "Aborted", "Interrupted"}


def _error(result: Any, status: int) -> dict[str, str]:
    assert result.exit_code == status, (result.stdout, result.stderr)
    error: dict[str, str] = json.loads(result.stderr)["error"]
    assert error["type"] in set(securepad.errors.__all__) | CLI_TYPES, error
    return error


@pytest.mark.sqlite_only
def test_a_missing_store_is_a_typed_error_in_the_one_format(cli: Cli) -> None:
    text = cli("stats")
    assert text.exit_code == 1 and text.stderr.startswith("error: NotFoundError: no store at ")
    assert len(text.stderr.splitlines()) == 1
    assert _error(cli("--json", "stats"), 1)["type"] == "NotFoundError"


def test_usage_errors_are_usage_errors_in_the_one_format(cli: Cli) -> None:
    ok(cli("init"))
    text = cli("stats", "--mystery")
    assert text.exit_code == 2 and text.stderr.startswith("error: UsageError: No such option '--mystery'.")
    assert len(text.stderr.splitlines()) == 1
    assert _error(cli("--json", "read", "--owner", "bob", "x", "-n", "many"), 2)["type"] == "UsageError"
    assert _error(cli("--json", "put", "--owner", "bob", "--turn", "t"), 2)["type"] == "UsageError"  # no --step
    missing_file = cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", "no-such-file")
    assert _error(missing_file, 2)["type"] == "UsageError"


def test_a_declined_confirmation_changes_nothing(cli: Cli) -> None:
    ok(cli("init"))
    put(cli, 1)
    result = cli("forget-owner", "bob", input="n\n")
    assert result.exit_code == 1 and "error: Aborted: not confirmed; nothing was changed" in result.stderr
    assert as_json(cli("--json", "stats"))["entries"] == 1


def _as_at_a_terminal() -> None:
    """In the child before it runs: Ctrl-C acts as a shell at a terminal leaves
    it (default action, not blocked), whatever this test process inherited
    or a library in it set (an ignored SIGINT survives exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _securepad(cli: Cli, *args: str) -> subprocess.Popen[bytes]:
    """``python -m securepad ARGS`` as a real process on ``cli``'s HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECUREPAD_", "XDG_"))} | {"HOME": str(cli.home)}
    return subprocess.Popen(
        [sys.executable, "-m", "securepad", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_as_at_a_terminal,
    )


@pytest.mark.sqlite_only
def test_ctrl_c_while_a_command_works_exits_130_with_a_plain_line(cli: Cli, tmp_path: Path) -> None:
    ok(cli("init"))
    fifo = tmp_path / "source"
    os.mkfifo(fifo)
    process = _securepad(cli, "put", "--owner", "bob", "--turn", "t", "--step", "1", str(fifo))
    writer = None
    for _ in range(3000):  # a writer can open the FIFO once the command has opened it to read
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert process.poll() is None
            select.select([], [], [], 0.01)
    assert writer is not None
    try:
        process.send_signal(signal.SIGINT)  # the command waits for its input
        _, err = process.communicate(timeout=30)
    finally:
        os.close(writer)
    assert process.returncode == 130 and err.decode().strip() == "interrupted"
    assert as_json(cli("--json", "stats"))["entries"] == 0


def test_deeply_nested_json_input_is_a_typed_one_line_error(cli: Cli) -> None:
    ok(cli("init"))
    deep = "[" * 100_000 + "]" * 100_000
    result = cli("put", "--owner", "bob", "--turn", "t", "--step", "1", "--kind", "json", input=deep)
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: UsageError: ") and "nested too deeply" in result.stderr
    bad = cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", "--kind", "json", input="{")
    assert "input is not valid json" in _error(bad, 2)["message"]
    assert as_json(cli("--json", "stats"))["entries"] == 0


def test_brackets_inside_json_strings_do_not_count_as_nesting(cli: Cli) -> None:
    ok(cli("init"))
    text = '{"a": "' + "[" * 5000 + '\\"{"}'
    ok(cli("put", "--owner", "bob", "--turn", "t", "--step", "1", "--kind", "json", input=text))
    assert as_json(cli("--json", "stats"))["entries"] == 1


@pytest.mark.parametrize("owner", ["\\[/]", "\\[link=https://example.com]x\\[/link]", "[bold]b[/bold]"])
def test_owner_ids_with_markup_are_shown_as_text(cli: Cli, owner: str) -> None:
    ok(cli("init"))
    ok(cli("put", "--owner", owner, "--turn", "t", "--step", "1", input="x"))
    result = ok(cli("keys", "rotate-owner", owner))
    assert "\x1b]8;" not in result.stdout + result.stderr  # no link rendered
    missing = cli("keys", "rotate-owner", owner + "-nobody")
    last = missing.stderr.splitlines()[-1]
    assert missing.exit_code == 1 and last.startswith("error: NotFoundError: ")
    assert owner.replace("\\", "\\\\") in last
    assert f"re-wrapping {owner}-nobody's item keys" in missing.stderr  # the progress label, as given


def test_every_error_type_the_group_names_is_documented() -> None:
    assert isinstance(main, click.Group)
    from securepad.cli.options import ABORTED, INTERRUPTED, USAGE_ERROR

    assert {USAGE_ERROR, ABORTED, INTERRUPTED} == CLI_TYPES


@pytest.mark.sqlite_only
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_ctrl_c_at_a_prompt_exits_130(cli: Cli, json_flag: list[str]) -> None:
    ok(cli("init"))
    process = _securepad(cli, *json_flag, "forget-owner", "bob")
    assert process.stdout is not None
    seen = b""
    while b"for good?" not in seen:  # the prompt is up: the process waits for an answer
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, seen
        chunk = os.read(process.stdout.fileno(), 4096)
        assert chunk, seen
        seen += chunk
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    if json_flag:
        assert json.loads(err) == {"error": {"type": "Interrupted", "message": "interrupted"}}
    else:
        assert err.decode().strip() == "interrupted"
