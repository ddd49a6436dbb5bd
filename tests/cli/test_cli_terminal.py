"""Terminal output at 80 columns: no word split across lines, no raw JSON in a
figure, each command's own options before the global ones; and read takes what
the model's read tool takes, and says what the CLI user sees."""

from __future__ import annotations

import re

import click
import pytest

from securepad.core.tool import MAX_TOOL_INT
from tests.support.cli_runner import Cli, as_json, every_command, ok, put

QUOTED = '"quoted" line\n' * 3000


def _words_whole(text: str, words: set[str]) -> None:
    """Every word of ``words`` (longer than 3 characters) appears whole in ``text``."""
    for word in words:
        if len(word) > 3 and word.isalpha():
            assert word in text, word


def test_stats_prints_figures_not_json(cli: Cli) -> None:
    ok(cli("init"))
    put(cli, 1)
    text = ok(cli("stats")).stdout
    assert "{" not in text and '"' not in text
    assert re.search(r"^key_usage\.owner_key_max_wraps +\d+$", text, re.M)
    if cli.backend == "sqlite":
        assert re.search(r"^file_bytes\.db +\d+$", text, re.M)


@pytest.mark.sqlite_only
def test_the_audit_at_80_columns_splits_no_word(cli: Cli) -> None:
    ok(cli("init"))
    result = cli("audit")
    assert result.exit_code == 0, result.stderr[-2000:]
    report = as_json(cli("--json", "audit"))
    lines = result.stdout.splitlines()
    # Only a line holding a long path (this test's HOME is deep) may be wider.
    assert [line for line in lines if len(line) > 80 and max(len(w) for w in line.split()) < 40] == []
    joined = " ".join(" ".join(lines).split())
    for row in report["results"]:
        assert f"pass {row['name']}" in joined
        _words_whole(result.stdout, set(row["happened"].split()))


def test_subcommand_help_opens_with_its_own_options(cli: Cli) -> None:
    commands: list[list[str]] = []
    for name, command in every_command().items():
        if isinstance(command, click.Group):
            commands += [[name, sub] for sub in command.commands]
        elif name != "bench":
            commands.append([name])
    for command in commands:
        text = ok(cli(*command, "--help")).stdout
        own, _, shared = text.partition("Global options")
        assert shared, command
        rows = re.findall(r"^  (-[-\w]+)", own, re.M)
        assert not {"--db", "--key-file", "--json", "--policy"} & set(rows), command
        assert "SECUREPAD_DB" in shared and "--json" in shared, command
    read_help = ok(cli("read", "--help")).stdout
    mode_help = " ".join(read_help[read_help.index("--mode") : read_help.index("-n ")].split())
    assert "head/tail" in mode_help and "grep" in mode_help


def test_read_refuses_what_the_model_s_tool_refuses(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1, QUOTED)
    for args in (["-n", str(10**26)], ["-n", str(MAX_TOOL_INT + 1)], ["--start", "-1"], ["--context", "51"]):
        result = cli("read", "--owner", "bob", entry, *args)
        assert result.exit_code == 2 and result.stderr.startswith("error: UsageError: "), args
    assert ok(cli("read", "--owner", "bob", entry, "-n", str(MAX_TOOL_INT)))


def test_the_read_cap_message_names_the_policy_cap_and_the_next_command(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1, QUOTED)
    result = ok(cli("read", "--owner", "bob", entry, "--mode", "lines"))
    status = result.stderr.strip().splitlines()[-1]
    shown = len(result.stdout) - 1  # echo adds a newline
    assert status.startswith(f"{shown} of {len(QUOTED)} characters")
    assert "read cap (max_read_chars 16000" in status and "escapes" in status
    nxt = re.search(r"read --mode lines --start (\d+)$", status)
    assert nxt is not None and int(nxt.group(1)) == result.stdout.count("\n")  # the next line, 1-based
    # Line 0 is line 1, as over MCP (and --start defaults to it).
    first = ok(cli("read", "--owner", "bob", entry, "--mode", "lines", "--start", "0", "--end", "1")).stdout
    assert (
        first == '"quoted" line\n\n' == ok(cli("read", "--owner", "bob", entry, "--mode", "lines", "--end", "1")).stdout
    )
