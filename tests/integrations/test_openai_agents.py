"""The OpenAI Agents SDK adapter, with the real SDK and a scripted model (no network)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from securepad import SCRATCHPAD_READ_TOOL_STRICT, AsyncScratchpad, Keyring, Scratchpad, Turn
from securepad.errors import InvalidArgumentError
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import AGENT_BOB as BOB

if TYPE_CHECKING:
    from agents import FunctionTool, ToolOutputImage
    from agents.testing import ModelCall, ModelStep
    from agents.tool_context import ToolContext

pytestmark = pytest.mark.xdist_group("openai_agents")


LOG = "".join(f"2024-05-01 line {i}: ok\n" for i in range(1, 20_000)) + "2024-05-01 line 20000: ERROR disk full\n"


@pytest.fixture
def pad(tmp_path: Path) -> Iterator[Scratchpad]:
    with Scratchpad.open(tmp_path / "store.db", keyring=Keyring.from_key_file(tmp_path / "key")) as store:
        yield store


@pytest.fixture
def turn(pad: Scratchpad) -> Turn:
    return pad.turn(ALICE, "turn-1")


def invoke(tool: FunctionTool, arguments: dict[str, Any] | str) -> Any:
    from agents.tool_context import ToolContext

    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=text)
    return asyncio.run(tool.on_invoke_tool(ctx, text))


def strict_arguments(scratchpad_id: str, **given: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = dict.fromkeys(SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]["properties"])
    arguments.update(scratchpad_id=scratchpad_id, **given)
    return arguments


def enabled(tool: FunctionTool) -> bool:
    from agents import Agent, RunContextWrapper

    check = tool.is_enabled
    assert callable(check)
    return bool(asyncio.run(check(RunContextWrapper(context=None), Agent(name="a"))))  # type: ignore[misc]


@functools.cache
def log_tools() -> tuple[FunctionTool, FunctionTool]:
    """The tools ``read_log`` and ``word_count`` (made once, when a test first needs them)."""
    from agents import function_tool

    @function_tool
    def read_log(path: str) -> str:
        """Read a log file."""
        return LOG

    @function_tool
    def word_count(text: str) -> int:
        """Count the words of a text."""
        return len(text.split())

    return read_log, word_count


# -- scratchpad_read_tool ------------------------------------------------------------------


def test_the_read_tool_has_the_strict_schema(turn: Turn) -> None:
    from agents import FunctionTool

    from securepad.integrations.openai_agents import scratchpad_read_tool

    tool = scratchpad_read_tool(turn)
    assert isinstance(tool, FunctionTool) and tool.name == "scratchpad_read" and tool.strict_json_schema
    assert tool.params_json_schema == SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]
    assert tool.description == SCRATCHPAD_READ_TOOL_STRICT["function"]["description"]


def test_the_read_tool_reads_this_turn_and_answers_bad_calls(pad: Scratchpad, turn: Turn) -> None:
    from securepad.integrations.openai_agents import scratchpad_read_tool

    tool = scratchpad_read_tool(turn)
    assert not enabled(tool)  # nothing offloaded yet: not offered
    view = turn.record(1, "read_log", LOG)
    assert enabled(tool)
    tail = json.loads(invoke(tool, strict_arguments(view["scratchpad_id"], mode="tail", n=39)))
    assert tail["content"] == "2024-05-01 line 20000: ERROR disk full\n"
    grep = json.loads(invoke(tool, strict_arguments(view["scratchpad_id"], mode="grep", pattern="ERROR")))
    assert "20000:2024-05-01 line 20000: ERROR disk full" in grep["content"]
    bad = json.loads(invoke(tool, strict_arguments(view["scratchpad_id"], mode="grep")))
    assert bad == {"ok": False, "error": bad["error"]} and "needs pattern" in bad["error"]
    assert json.loads(invoke(tool, "{not json"))["ok"] is False
    # Bob's id is refused exactly like one that never existed.
    bobs = pad.turn(BOB, "turn-1").record(1, "read_log", LOG)["scratchpad_id"]
    refused = json.loads(invoke(tool, strict_arguments(bobs)))["error"].replace(bobs, "ID")
    absent = json.loads(invoke(tool, strict_arguments("0123456789abcdef")))["error"].replace("0123456789abcdef", "ID")
    assert refused == absent
    assert scratchpad_read_tool(turn, only_when_offloaded=False).is_enabled is True


def test_the_read_tool_takes_an_async_turn(tmp_path: Path) -> None:
    from agents.tool_context import ToolContext

    from securepad.integrations.openai_agents import scratchpad_read_tool

    async def main() -> None:
        async with await AsyncScratchpad.open(tmp_path / "s.db", keyring=Keyring.from_key_file(tmp_path / "k")) as pad:
            turn = await pad.turn(ALICE, "t")
            view = await turn.record(1, "read_log", LOG)
            tool = scratchpad_read_tool(turn)
            ctx = ToolContext(context=None, tool_name="scratchpad_read", tool_call_id="c", tool_arguments="{}")
            result = json.loads(await tool.on_invoke_tool(ctx, json.dumps({"scratchpad_id": view["scratchpad_id"]})))
            assert result["content"].startswith("2024-05-01 line 1: ok")

    asyncio.run(main())


# -- offload_outputs -----------------------------------------------------------------------


def test_large_outputs_reach_the_model_as_the_view(pad: Scratchpad, turn: Turn) -> None:
    from securepad.integrations.openai_agents import offload_outputs

    read_log, word_count = log_tools()
    tool = offload_outputs(read_log, turn)
    assert tool.name == "read_log" and tool.params_json_schema == read_log.params_json_schema
    shown = json.loads(invoke(tool, {"path": "/var/log/app"}))
    assert shown["ok"] is True and shown["kind"] == "text" and shown["step_num"] == 1
    assert "ERROR disk full" in shown["summary"] and len(json.dumps(shown)) < 4000
    entry = pad.get(ALICE, shown["scratchpad_id"])
    assert entry.observation == LOG and entry.executor_name == "read_log"
    # A small output is what the model gets, and it is recorded too (step 2).
    assert invoke(offload_outputs(word_count, turn), {"text": "three small words"}) == "3"
    assert [s["step_num"] for s in turn.steps()] == [1, 2]


def test_json_text_is_recorded_as_a_structure(turn: Turn) -> None:
    from agents import function_tool

    from securepad.integrations.openai_agents import offload_outputs

    @function_tool
    def search(query: str) -> str:
        """Search."""
        return json.dumps({"results": [{"name": f"file{i}.py", "size": i} for i in range(500)], "total": 500})

    shown = json.loads(invoke(offload_outputs(search, turn), {"query": "x"}))
    assert shown["kind"] == "json" and shown["count"] == 500 and shown["total"] == 500
    assert "{{step1.results" in shown["ref_hint"]


def test_references_in_arguments_are_resolved_from_the_store(turn: Turn) -> None:
    from securepad.integrations.openai_agents import offload_outputs

    read_log, word_count = log_tools()
    invoke(offload_outputs(read_log, turn), {"path": "/var/log/app"})
    counted = invoke(offload_outputs(word_count, turn), {"text": "{{step1.content}}"})
    assert counted == str(len(LOG.split()))
    bad = json.loads(invoke(offload_outputs(word_count, turn), {"text": "{{step9.content}}"}))
    assert bad["ok"] is False and "unknown step 9" in bad["error"]
    assert len(turn.steps()) == 2  # the bad call ran nothing and recorded nothing
    literal = offload_outputs(word_count, turn, resolve_references=False)
    assert invoke(literal, {"text": "{{step1.content}}"}) == "1"


def test_images_pass_through_and_odd_values_are_kept_as_text(turn: Turn) -> None:
    from agents import FunctionTool, ToolOutputImage, function_tool

    from securepad.integrations.openai_agents import offload_outputs

    read_log, _ = log_tools()
    image = ToolOutputImage(image_url="data:image/png;base64,AAAA")

    def screenshot() -> ToolOutputImage:
        """Take a screenshot."""
        return image

    # The SDK reads the output type from the annotation, evaluated in the module's
    # globals: the class is imported here, so the annotation is given as the class.
    screenshot.__annotations__["return"] = ToolOutputImage
    assert invoke(offload_outputs(function_tool(screenshot), turn), {}) == image
    assert turn.steps() == []

    async def odd(ctx: ToolContext[Any], arguments: str) -> Any:
        return {1, 2}

    plain = FunctionTool(name="odd", description="d", params_json_schema={}, on_invoke_tool=odd)
    assert invoke(offload_outputs(plain, turn), "{}") == "{1, 2}"
    with pytest.raises(InvalidArgumentError):
        offload_outputs(read_log.on_invoke_tool, turn)  # type: ignore[arg-type]


# -- a whole run with a scripted model -------------------------------------------------------


def last_tool_output(call: ModelCall) -> str:
    outputs = [item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    output = outputs[-1]["output"]
    return output if isinstance(output, str) else json.dumps(output)


def test_an_agent_run_offloads_reads_and_refers(turn: Turn) -> None:
    read_log, word_count = log_tools()
    """The model reads a big log (offloaded: it sees the view), greps it with
    scratchpad_read, passes the whole log to another tool by reference, and answers."""

    from agents import Agent, RunConfig, Runner
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from securepad.integrations.openai_agents import offload_outputs, scratchpad_read_tool

    def grep_the_log(call: ModelCall) -> ModelStep:
        view = json.loads(last_tool_output(call))
        arguments = strict_arguments(view["scratchpad_id"], mode="grep", pattern="ERROR")
        return ModelStep(output=[function_call("scratchpad_read", arguments, call_id="c2")])

    def answer(call: ModelCall) -> ModelStep:
        return ModelStep(output=[assistant_message(f"{last_tool_output(call)} words")])

    model = ScriptedModel(
        [
            [function_call("read_log", {"path": "/var/log/app.log"}, call_id="c1")],
            ModelStep(responder=grep_the_log),
            ModelStep(
                responder=lambda call: [function_call("word_count", {"text": "{{step1.content}}"}, call_id="c3")]
            ),
            ModelStep(responder=answer),
        ]
    )
    agent = Agent(
        name="ops",
        instructions="Find errors in logs.",
        model=model,
        tools=[offload_outputs(read_log, turn), offload_outputs(word_count, turn), scratchpad_read_tool(turn)],
    )
    result = asyncio.run(Runner.run(agent, "Why did the upload fail?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == f"{len(LOG.split())} words"
    calls = model.calls
    assert len(calls) == 4
    # The model never had the log in its context, only the view and what it read.
    assert all("line 12345: ok" not in json.dumps(call.input, default=str) for call in calls)
    assert [tool.name for tool in calls[0].tools] == ["read_log", "word_count"]  # nothing offloaded yet
    assert "scratchpad_read" in [tool.name for tool in calls[1].tools]
    grep = json.loads(last_tool_output(calls[2]))
    assert "20000:2024-05-01 line 20000: ERROR disk full" in grep["content"]
    assert [(s["step_num"], s["executor_name"], s["offloaded"]) for s in turn.steps()] == [
        (1, "read_log", True),
        (2, "word_count", False),
    ]
