"""An entry comes back whole (``get``), goes away (``delete``), a turn can be
dropped (``turn drop``), and ``put`` says what it stored in one line."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import apsw

from tests.support.cli_runner import Cli, as_json, ok, put

BINARY = bytes(range(256)) * 800  # 200 KiB, every byte value
TEXT = "naïve\tcafé\r\n" + "line\n" * 30_000  # past the read cap, with a CR and a tab


def test_get_returns_a_binary_entry_whole_and_exact(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1, BINARY, "--kind", "binary")
    assert ok(cli("get", "--owner", "bob", entry)).stdout_bytes == BINARY  # piped: the raw bytes
    ok(cli("get", "--owner", "bob", entry, "--output", "out.bin"))
    assert Path("out.bin").read_bytes() == BINARY and (Path("out.bin").stat().st_mode & 0o777) == 0o600
    again = cli("get", "--owner", "bob", entry, "--output", "out.bin")
    assert again.exit_code == 1 and "error: InvalidArgumentError:" in again.stderr  # never over a file
    shown = as_json(cli("--json", "get", "--owner", "bob", entry))
    assert shown["encoding"] == "base64" and base64.b64decode(shown["content"]) == BINARY
    assert shown["size_bytes"] == len(BINARY) and shown["kind"] == "binary"


def test_get_returns_text_as_stored_past_the_read_cap(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1, TEXT.encode())
    assert ok(cli("get", "--owner", "bob", entry)).stdout_bytes == TEXT.encode()
    document = {"rows": [{"n": i} for i in range(3)], "é": None}
    as_json_entry = put(cli, 2, json.dumps(document), "--kind", "json")
    assert json.loads(ok(cli("get", "--owner", "bob", as_json_entry)).stdout) == document


def test_get_is_refused_to_another_owner_and_another_turn(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1)
    other = cli("get", "--owner", "alice", entry)
    assert other.exit_code == 1 and other.stderr == "error: NotFoundError: no such entry\n"
    wrong_turn = cli("get", "--owner", "bob", "--turn", "elsewhere", entry)
    assert wrong_turn.exit_code == 1 and "NotFoundError" in wrong_turn.stderr
    assert ok(cli("get", "--owner", "bob", "--turn", "t", entry)).stdout == "hello\n"


def test_delete_removes_one_entry_and_frees_its_step(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1)
    assert cli("delete", "--owner", "alice", entry).exit_code == 1  # not alice's
    assert f"deleted {entry}" in ok(cli("delete", "--owner", "bob", entry)).stdout
    gone = cli("get", "--owner", "bob", entry)
    assert gone.exit_code == 1 and "NotFoundError" in gone.stderr
    put(cli, 1)  # the step is free again
    assert as_json(cli("--json", "delete", "--owner", "bob", put(cli, 2)))["deleted"]


def test_turn_drop_deletes_the_owners_turn_whole(cli: Cli) -> None:
    ok(cli("init"))
    for step in (1, 2, 3):
        put(cli, step)
    kept = put(cli, 1, turn="other")
    ok(cli("put", "--owner", "alice", "--turn", "t", "--step", "1", input="alice's"))
    declined = cli("turn", "drop", "--owner", "bob", "--turn", "t", input="n\n")
    assert declined.exit_code == 1 and len(as_json(cli("--json", "list", "--owner", "bob", "--turn", "t"))) == 3
    result = as_json(cli("--json", "turn", "drop", "--owner", "bob", "--turn", "t", "--yes"))
    assert (result["owner_user_id"], result["turn_id"], result["entries"]) == ("bob", "t", 3)
    assert as_json(cli("--json", "list", "--owner", "bob", "--turn", "t")) == []
    assert [e["scratchpad_id"] for e in as_json(cli("--json", "list", "--owner", "bob", "--turn", "other"))] == [kept]
    assert len(as_json(cli("--json", "list", "--owner", "alice", "--turn", "t"))) == 1
    put(cli, 1)  # the turn takes writes again, from its first step


def test_turn_drop_is_the_way_out_of_a_turn_found_tampered(cli: Cli) -> None:
    ok(cli("init"))
    victim = put(cli, 1)
    put(cli, 2)
    if cli.store is None:
        with apsw.Connection(str(cli.db)) as conn:
            conn.execute("DELETE FROM entries WHERE id = ?", (victim,))
    else:  # the server's admin login, with no key
        import psycopg

        with psycopg.connect(cli.store, autocommit=True) as conn:
            conn.execute("DELETE FROM securepad.entries WHERE id = %s", (victim,))
    refused = cli("list", "--owner", "bob", "--turn", "t")
    assert refused.exit_code == 1 and "error: IntegrityError:" in refused.stderr
    assert as_json(cli("--json", "turn", "drop", "--owner", "bob", "--turn", "t", "--yes"))["entries"] == 1
    assert as_json(cli("--json", "list", "--owner", "bob", "--turn", "t")) == []
    assert as_json(cli("--json", "verify"))["ok"] is True


def test_put_prints_one_short_line_and_keeps_the_source_file_name(cli: Cli) -> None:
    ok(cli("init"))
    Path("report.log").write_text("x" * 5000)
    line = ok(cli("put", "--owner", "bob", "--turn", "t", "--step", "1", "report.log")).stdout
    assert line.startswith("stored ") and line.count("\n") == 1 and len(line) <= 80
    entry = line.split()[1].rstrip(":")
    assert ok(cli("get", "--owner", "bob", entry)).stdout == "x" * 5000
    view = as_json(cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "2", "report.log"))
    assert view["metadata"] == {"source": "report.log"}
    from_stdin = as_json(cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "3", input="y"))
    assert from_stdin["metadata"] == {}
    assert os.path.exists("report.log")
