"""``securepad mcp``: driven over stdio by the official MCP SDK's own client."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

from securepad import SCRATCHPAD_READ_TOOL, Keyring, Principal, Scratchpad
from securepad.cli import main
from tests.support.paths import ROOT
from tests.support.principals import AGENT_ALICE as ALICE

if TYPE_CHECKING:
    from mcp import Client

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("mcp")]

LOG = "".join(f"{i}: ok\n" for i in range(1, 5000)) + "5000: ERROR disk full\n"
ABSENT_ID = "0123456789abcdef"


@dataclass
class Store:
    db: Path
    key: Path
    ids: dict[str, str]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Alice's turn t1 (a big log and a small result), Bob's entry in a turn of the
    same id, Alice's entry in another turn and in another channel."""
    db, key = tmp_path / "store.db", tmp_path / "key"
    ids: dict[str, str] = {}
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        turn = pad.turn(ALICE, "t1")
        ids["log"] = turn.record(1, "read_log", {"content": LOG, "metadata": {"path": "/var/log/app"}})["scratchpad_id"]
        turn.record(2, "echo", {"ok": True})
        ids["small"] = turn.steps()[1]["scratchpad_id"]
        ids["bob"] = pad.turn(Principal("bob", "agent", "web"), "t1").record(1, "read_log", "bob's secret\n" * 999)[
            "scratchpad_id"
        ]
        ids["other_turn"] = pad.turn(ALICE, "t2").record(1, "read_log", "another turn\n" * 999)["scratchpad_id"]
        ids["slack"] = pad.turn(Principal("alice", "agent", "slack"), "t1").record(3, "read_log", "x" * 9000)[
            "scratchpad_id"
        ]
    return Store(db, key, ids)


@asynccontextmanager
async def connect(store: Store, *args: str, env: dict[str, str] | None = None) -> AsyncIterator[Client]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    command = [sys.executable, "-m", "securepad", "--db", str(store.db), "--key-file", str(store.key), *args]
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
    # The server's stderr is this test's (stdio_client's default is the
    # sys.stderr of when mcp was first imported, perhaps inside a CliRunner).
    async with Client(stdio_client(params, errlog=sys.stderr), read_timeout_seconds=120) as client:
        yield client


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def alice_args(*extra: str) -> tuple[str, ...]:
    return ("mcp", "--owner", "alice", "--actor", "agent", "--channel", "web", "--turn", "t1", *extra)


def test_lists_the_two_tools_with_the_turns_schema(store: Store) -> None:
    async def main_() -> None:
        async with connect(store, *alice_args()) as client:
            listed = (await client.list_tools()).tools
            by_name = {tool.name: tool for tool in listed}
            assert set(by_name) == {"scratchpad_read", "scratchpad_list"}
            read = by_name["scratchpad_read"]
            assert read.input_schema == SCRATCHPAD_READ_TOOL["function"]["parameters"]
            assert read.description == SCRATCHPAD_READ_TOOL["function"]["description"]
            assert by_name["scratchpad_list"].input_schema["properties"] == {}
            assert read.annotations is not None and read.annotations.read_only_hint is True

    run(main_)


def test_reads_the_turns_entries(store: Store) -> None:
    log = store.ids["log"]

    async def main_() -> None:
        async with connect(store, *alice_args()) as client:
            tail = await client.call_tool("scratchpad_read", {"scratchpad_id": log, "mode": "tail", "n": 22})
            assert tail.is_error is False
            assert tail.structured_content["content"] == "5000: ERROR disk full\n"
            assert json.loads(tail.content[0].text) == tail.structured_content  # type: ignore[union-attr]
            grep = await client.call_tool(
                "scratchpad_read", {"scratchpad_id": log, "mode": "grep", "pattern": "ERROR", "context": 1}
            )
            assert "4999-4999: ok\n5000:5000: ERROR disk full" in grep.structured_content["content"]
            lines = await client.call_tool(
                "scratchpad_read", {"scratchpad_id": log, "mode": "lines", "start": 2, "end": 3}
            )
            assert lines.structured_content["content"].rstrip("\n") == "2: ok\n3: ok"
            # The strict schema's nulls mean "not given" here too.
            nulls = await client.call_tool("scratchpad_read", {"scratchpad_id": log, "mode": None, "n": 5, "end": None})
            assert nulls.structured_content["content"] == "1: ok"
            small = await client.call_tool("scratchpad_read", {"scratchpad_id": store.ids["small"], "mode": "full"})
            assert json.loads(small.structured_content["content"]) == {"ok": True}
            full = await client.call_tool("scratchpad_read", {"scratchpad_id": log, "mode": "full"})
            assert full.structured_content["metadata"]["capped"] is True  # never more than the read cap
            assert len(full.structured_content["content"]) <= 16_000

    run(main_)


BAD_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({}, "scratchpad_id is required"),
    ({"scratchpad_id": 7}, "scratchpad_id is required"),
    ({"scratchpad_id": "LOG", "mode": "everything"}, "mode must be one of"),
    ({"scratchpad_id": "LOG", "n": "10"}, "n must be an integer"),
    ({"scratchpad_id": "LOG", "n": -1}, "n must be 0 or more"),
    ({"scratchpad_id": "LOG", "mode": "grep"}, "needs pattern"),
    ({"scratchpad_id": "LOG", "mode": "grep", "pattern": "(a"}, "invalid pattern"),
    ({"scratchpad_id": "LOG", "mode": "range", "start": 9, "end": 3}, "greater than end"),
    # The principal and turn are the server's, not the model's to choose.
    ({"scratchpad_id": "BOB", "owner_user_id": "bob"}, "unknown argument"),
    ({"scratchpad_id": "LOG", "turn_id": "t2"}, "unknown argument"),
]


def test_bad_arguments_are_tool_errors(store: Store) -> None:
    from mcp.shared.exceptions import MCPError

    async def main_() -> None:
        async with connect(store, *alice_args()) as client:
            for arguments, message in BAD_ARGUMENTS:
                named = {k: store.ids[v.lower()] if v in ("LOG", "BOB") else v for k, v in arguments.items()}
                result = await client.call_tool("scratchpad_read", named)
                assert result.is_error is True, arguments
                assert message in result.content[0].text, (arguments, result.content)  # type: ignore[union-attr]
                assert result.structured_content == {"ok": False, "error": result.content[0].text}  # type: ignore[union-attr]
            listed = await client.call_tool("scratchpad_list", {"turn_id": "t2"})
            assert listed.is_error is True and "takes no arguments" in listed.content[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError, match="unknown tool"):
                await client.call_tool("scratchpad_write", {})

    run(main_)


def test_another_owners_id_is_refused_exactly_like_an_absent_one(store: Store) -> None:
    async def main_() -> None:
        async with connect(store, *alice_args()) as client:
            answers = {}
            for name in ("bob", "other_turn", "absent"):
                scratchpad_id = ABSENT_ID if name == "absent" else store.ids[name]
                result = await client.call_tool("scratchpad_read", {"scratchpad_id": scratchpad_id, "mode": "full"})
                assert result.is_error is True
                answers[name] = result.content[0].text.replace(scratchpad_id, "ID")  # type: ignore[union-attr]
            # Bob's id, the id of Alice's other turn and an id that never existed get one answer.
            assert answers["bob"] == answers["other_turn"] == answers["absent"]
            # Under the default policy (scope "owner") Alice's entry of another channel is hers.
            slack = await client.call_tool("scratchpad_read", {"scratchpad_id": store.ids["slack"], "n": 3})
            assert slack.is_error is False and slack.structured_content["content"] == "xxx"
            assert "bob's secret" not in json.dumps(answers)

    run(main_)


def test_list_shows_only_the_principals_turn(store: Store) -> None:
    async def main_() -> None:
        async with connect(store, *alice_args()) as client:
            listed = await client.call_tool("scratchpad_list", {})
            assert listed.is_error is False
            body = listed.structured_content
            ids = {entry["scratchpad_id"] for entry in body["entries"]}
            assert ids == {store.ids["log"], store.ids["small"], store.ids["slack"]}
            first = body["entries"][0]
            assert first["step_num"] == 1 and first["executor_name"] == "read_log" and first["kind"] == "text"
            assert "5000: ERROR disk full" in first["summary"]

    run(main_)


def test_the_policy_scope_applies(store: Store) -> None:
    """With scope owner+channel, Alice's server for channel web does not see her slack entry."""

    async def main_() -> None:
        policy = str(ROOT / "policies" / "channel.toml")
        async with connect(store, "--policy", policy, *alice_args()) as client:
            listed = await client.call_tool("scratchpad_list", {})
            assert {e["scratchpad_id"] for e in listed.structured_content["entries"]} == {
                store.ids["log"],
                store.ids["small"],
            }
            slack = await client.call_tool("scratchpad_read", {"scratchpad_id": store.ids["slack"]})
            absent = await client.call_tool("scratchpad_read", {"scratchpad_id": ABSENT_ID})
            assert slack.is_error is True
            assert slack.content[0].text.replace(store.ids["slack"], "ID") == absent.content[0].text.replace(  # type: ignore[union-attr]
                ABSENT_ID, "ID"
            )

    run(main_)


def test_the_principal_and_turn_can_come_from_the_environment(store: Store) -> None:
    env = {"SECUREPAD_OWNER": "bob", "SECUREPAD_ACTOR": "agent", "SECUREPAD_CHANNEL": "web", "SECUREPAD_TURN": "t1"}

    async def main_() -> None:
        async with connect(store, "mcp", env=env) as client:
            listed = await client.call_tool("scratchpad_list", {})
            assert [e["scratchpad_id"] for e in listed.structured_content["entries"]] == [store.ids["bob"]]
            mine = await client.call_tool(
                "scratchpad_read", {"scratchpad_id": store.ids["bob"], "mode": "head", "n": 12}
            )
            assert mine.structured_content["content"] == "bob's secret"
            theirs = await client.call_tool("scratchpad_read", {"scratchpad_id": store.ids["log"]})
            assert theirs.is_error is True and "5000" not in theirs.content[0].text  # type: ignore[union-attr]

    run(main_)


def test_the_command_needs_a_turn_and_a_valid_principal(store: Store) -> None:
    runner = CliRunner()
    base = ["--db", str(store.db), "--key-file", str(store.key), "mcp"]
    missing = runner.invoke(main, [*base, "--owner", "alice"], env={"SECUREPAD_TURN": None})
    assert missing.exit_code == 2 and "--turn" in missing.output
    bad = runner.invoke(main, [*base, "--owner", "", "--turn", "t1"])
    assert bad.exit_code == 1 and "InvalidArgumentError" in bad.output


def test_the_command_says_how_to_install_the_sdk(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "securepad.integrations.mcp", None)
    result = CliRunner().invoke(
        main, ["--db", str(store.db), "--key-file", str(store.key), "mcp", "--owner", "alice", "--turn", "t1"]
    )
    assert result.exit_code == 1 and "pip install '.[mcp]'" in result.output  # from the checkout: no index serves it
