"""The LangGraph / LangChain adapter, with the real packages and a scripted chat model."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import Field

from securepad import (
    SCRATCHPAD_READ_TOOL,
    SCRATCHPAD_READ_TOOL_STRICT,
    AsyncScratchpad,
    Keyring,
    Scratchpad,
    Turn,
)
from securepad.errors import InvalidArgumentError
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import AGENT_BOB as BOB

if TYPE_CHECKING:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatResult
    from langchain_core.tools import BaseTool

pytestmark = pytest.mark.xdist_group("langgraph")


LOG = "".join(f"2024-05-01 line {i}: ok\n" for i in range(1, 20_000)) + "2024-05-01 line 20000: ERROR disk full\n"


@functools.cache
def scripted_chat_model() -> type[BaseChatModel]:
    """The class ``ScriptedChatModel`` (made once, when a test first needs it)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        """A chat model that answers with the next step of its script: a function of
        the messages it is given, so it can use ids it only learns during the run."""

        script: list[Callable[[list[BaseMessage]], AIMessage]]
        seen: list[list[BaseMessage]] = Field(default_factory=list)

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
        ) -> ChatResult:
            step = self.script[len(self.seen)]
            self.seen.append(list(messages))
            return ChatResult(generations=[ChatGeneration(message=step(messages))])

    # Its fields' types name the messages imported here, not the module's names.
    ScriptedChatModel.model_rebuild(_types_namespace={"AIMessage": AIMessage, "BaseMessage": BaseMessage})
    return ScriptedChatModel


@functools.cache
def log_tools() -> tuple[BaseTool, BaseTool]:
    """The tools ``read_log`` and ``word_count`` (made once, when a test first needs them)."""
    from langchain_core.tools import tool

    @tool
    def read_log(path: str) -> str:
        """Read a log file."""
        return LOG

    @tool
    def word_count(text: str) -> int:
        """Count the words of a text."""
        return len(text.split())

    return read_log, word_count


@pytest.fixture
def pad(tmp_path: Path) -> Iterator[Scratchpad]:
    with Scratchpad.open(tmp_path / "store.db", keyring=Keyring.from_key_file(tmp_path / "key")) as store:
        yield store


@pytest.fixture
def turn(pad: Scratchpad) -> Turn:
    return pad.turn(ALICE, "turn-1")


def call(name: str, arguments: dict[str, Any], call_id: str) -> AIMessage:
    from langchain_core.messages import AIMessage

    return AIMessage(content="", tool_calls=[{"name": name, "args": arguments, "id": call_id, "type": "tool_call"}])


def last_tool_content(messages: Sequence[BaseMessage]) -> str:
    from langchain_core.messages import ToolMessage

    content = [m for m in messages if isinstance(m, ToolMessage)][-1].content
    assert isinstance(content, str)
    return content


# -- the read tool -------------------------------------------------------------------------


def test_the_read_tool_reads_this_turn(pad: Scratchpad, turn: Turn) -> None:
    from langchain_core.tools import BaseTool

    from securepad.integrations.langgraph import scratchpad_read_tool

    read = scratchpad_read_tool(turn)
    assert isinstance(read, BaseTool) and read.name == "scratchpad_read"
    assert read.args_schema == SCRATCHPAD_READ_TOOL["function"]["parameters"]
    assert scratchpad_read_tool(turn, strict=True).args_schema == SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]
    view = turn.record(1, "read_log", LOG)
    tail = json.loads(read.invoke({"scratchpad_id": view["scratchpad_id"], "mode": "tail", "n": 39}))
    assert tail["content"] == "2024-05-01 line 20000: ERROR disk full\n"
    bad = json.loads(read.invoke({"scratchpad_id": view["scratchpad_id"], "mode": "grep"}))
    assert bad["ok"] is False and "needs pattern" in bad["error"]
    unknown = json.loads(read.invoke({"scratchpad_id": view["scratchpad_id"], "owner_user_id": "bob"}))
    assert "unknown argument" in unknown["error"]
    bobs = pad.turn(BOB, "turn-1").record(1, "read_log", LOG)["scratchpad_id"]
    refused = json.loads(read.invoke({"scratchpad_id": bobs}))["error"].replace(bobs, "ID")
    absent = json.loads(read.invoke({"scratchpad_id": "0123456789abcdef"}))["error"].replace("0123456789abcdef", "ID")
    assert refused == absent
    asynchronous = json.loads(asyncio.run(read.ainvoke({"scratchpad_id": view["scratchpad_id"], "n": 10})))
    assert asynchronous["content"] == "2024-05-01"


# -- offloading ToolMessages ---------------------------------------------------------------


def test_large_tool_messages_are_replaced_by_the_view(pad: Scratchpad, turn: Turn) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from securepad.integrations.langgraph import METADATA_KEY, offload_tool_messages

    messages: list[BaseMessage] = [
        HumanMessage("why?"),
        AIMessage(
            content="",
            tool_calls=[
                {"name": "read_log", "args": {"path": "/var/log/app"}, "id": "c1", "type": "tool_call"},
                {"name": "word_count", "args": {"text": "a b"}, "id": "c2", "type": "tool_call"},
            ],
        ),
        ToolMessage(LOG, tool_call_id="c1", name="read_log", id="m1"),
        ToolMessage("2", tool_call_id="c2", name="word_count", id="m2"),
    ]
    out = offload_tool_messages(turn, messages)
    assert out[:2] == messages[:2] and messages[2].content == LOG  # the given messages are not changed
    big, small = out[2], out[3]
    assert isinstance(big, ToolMessage) and big.id == "m1" and big.tool_call_id == "c1"
    view = json.loads(big.content)  # type: ignore[arg-type]
    assert view["kind"] == "text" and "ERROR disk full" in view["summary"] and len(big.content) < 4000
    assert big.response_metadata[METADATA_KEY] == {
        "step_num": 1,
        "offloaded": True,
        "scratchpad_id": view["scratchpad_id"],
    }
    assert small.content == "2" and small.response_metadata[METADATA_KEY] == {"step_num": 2, "offloaded": False}
    assert pad.get(ALICE, view["scratchpad_id"]).observation == LOG
    # Recorded messages are never recorded again.
    assert offload_tool_messages(turn, out) == out
    assert len(turn.steps()) == 2


def test_json_lists_and_long_text_and_scratchpad_reads(turn: Turn) -> None:
    from langchain_core.messages import AIMessage, ToolMessage

    from securepad.integrations.langgraph import offload_tool_messages

    rows = json.dumps({"results": [{"name": f"f{i}.py"} for i in range(400)], "total": 400})
    messages: list[BaseMessage] = [
        ToolMessage(rows, tool_call_id="c1", name="search"),
        ToolMessage([{"type": "text", "text": "part"}], tool_call_id="c2", name="multi"),
        ToolMessage("y" * 3000, tool_call_id="c3", name="echo"),
        ToolMessage("x" * 9000, tool_call_id="c4", name="scratchpad_read"),
        ToolMessage("x" * 9000, tool_call_id="c5"),
        AIMessage(content="", tool_calls=[{"name": "scratchpad_read", "args": {}, "id": "c5", "type": "tool_call"}]),
    ]
    out = offload_tool_messages(turn, messages)
    search = json.loads(out[0].content)  # type: ignore[arg-type]
    assert search["kind"] == "json" and search["count"] == 400 and "{{step1.results" in search["ref_hint"]
    assert json.loads(out[1].content) == [{"type": "text", "text": "part"}]  # type: ignore[arg-type]
    assert "[... 1500 characters omitted; {{step3}} is the full text ...]" in out[2].content
    assert out[3] is messages[3] and out[4] is messages[4]  # scratchpad_read's own answers stay
    assert turn.resolve("{{step1.results.399.name}}") == "f399.py"


def test_the_async_variant_records_the_same(turn: Turn) -> None:
    from langchain_core.messages import ToolMessage

    from securepad.integrations.langgraph import METADATA_KEY, aoffload_tool_messages, offload_tool_messages

    messages: list[BaseMessage] = [ToolMessage(LOG, tool_call_id="c1", name="read_log")]
    out = asyncio.run(aoffload_tool_messages(turn, messages))
    assert out[0].response_metadata[METADATA_KEY]["offloaded"] is True
    assert asyncio.run(aoffload_tool_messages(turn, out)) == out
    with pytest.raises(InvalidArgumentError):
        offload_tool_messages("not a turn", messages)  # type: ignore[arg-type]


# -- references ----------------------------------------------------------------------------


def test_references_in_tool_arguments_are_resolved_from_the_store(turn: Turn) -> None:
    from langchain_core.tools import tool

    from securepad.integrations.langgraph import resolve_references

    @tool
    def total(sizes: list[int], label: str) -> str:
        """Add sizes up."""
        return f"{label}: {sum(sizes)}"

    turn.record(1, "read_log", LOG)
    turn.record(2, "stat", {"sizes": [1, 2, 3], "unit": "bytes"})
    _, word_count = log_tools()
    counted = resolve_references(word_count, turn)
    assert counted.name == "word_count" and counted.description == word_count.description
    assert counted.invoke({"text": "{{step1}}"}) == len(LOG.split())
    summed = resolve_references(total, turn)
    assert summed.args_schema["properties"]["sizes"]["type"] == "array"  # type: ignore[index]
    # A whole-string reference keeps the value's type: the list reaches the tool as a list.
    assert summed.invoke({"sizes": "{{step2.sizes}}", "label": "${step2.unit}"}) == "bytes: 6"
    bad = json.loads(summed.invoke({"sizes": "{{step2.nope}}", "label": "x"}))
    assert bad["ok"] is False and "has no field 'nope'" in bad["error"]
    assert asyncio.run(counted.ainvoke({"text": "{{step1.content}}"})) == len(LOG.split())
    assert json.loads(asyncio.run(counted.ainvoke({"text": "{{step7}}"})))["ok"] is False


# -- a graph with a scripted model -----------------------------------------------------------


def build_graph(turn: Any, model: Any) -> Any:
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from securepad.integrations.langgraph import offload_node, resolve_references, scratchpad_read_tool

    read_log, word_count = log_tools()
    tools = [read_log, resolve_references(word_count, turn), scratchpad_read_tool(turn)]
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode(tools))
    graph.add_node("offload", offload_node(turn))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "offload")
    graph.add_edge("offload", "agent")
    return graph.compile()


def scripted_model() -> Any:
    from langchain_core.messages import AIMessage, ToolMessage

    def grep_it(messages: list[BaseMessage]) -> AIMessage:
        view = json.loads(last_tool_content(messages))
        arguments = {"scratchpad_id": view["scratchpad_id"], "mode": "grep", "pattern": "ERROR"}
        return call("scratchpad_read", arguments, "c2")

    def answer(messages: list[BaseMessage]) -> AIMessage:
        found = json.loads([m for m in messages if isinstance(m, ToolMessage)][-2].content)  # type: ignore[arg-type]
        return AIMessage(content=f"{found['content'].split(':', 1)[1]} ({last_tool_content(messages)} words)")

    return scripted_chat_model()(
        script=[
            lambda messages: call("read_log", {"path": "/var/log/app.log"}, "c1"),
            grep_it,
            lambda messages: call("word_count", {"text": "{{step1.content}}"}, "c3"),
            answer,
        ]
    )


def check_run(state: dict[str, Any], model: Any, turn: Turn) -> None:
    from langchain_core.messages import ToolMessage

    from securepad.integrations.langgraph import METADATA_KEY

    words = len(LOG.split())  # counted from the stored log, passed by reference
    assert state["messages"][-1].content == f"2024-05-01 line 20000: ERROR disk full ({words} words)"
    # The model never had the log in its context: it saw the view, then what it read.
    assert all("line 12345: ok" not in str(m.content) for seen in model.seen for m in seen)
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [m.response_metadata.get(METADATA_KEY, {}).get("step_num") for m in tool_messages] == [1, None, 2]
    assert [(s["step_num"], s["executor_name"], s["offloaded"]) for s in turn.steps()] == [
        (1, "read_log", True),
        (2, "word_count", False),
    ]


def test_a_graph_offloads_and_reads(turn: Turn) -> None:
    from langchain_core.messages import HumanMessage

    model = scripted_model()
    state = build_graph(turn, model).invoke({"messages": [HumanMessage("Why did the upload fail?")]})
    check_run(state, model, turn)


def test_an_async_graph_on_an_async_turn(tmp_path: Path) -> None:
    from langchain_core.messages import HumanMessage

    async def main() -> None:
        keyring = Keyring.from_key_file(tmp_path / "key")
        async with await AsyncScratchpad.open(tmp_path / "store.db", keyring=keyring) as pad:
            turn = await pad.turn(ALICE, "turn-1")
            model = scripted_model()
            state = await build_graph(turn, model).ainvoke({"messages": [HumanMessage("Why?")]})
            check_run(state, model, turn.sync)

    asyncio.run(main())
