"""securepad for the OpenAI Agents SDK (extra ``openai``).

- ``scratchpad_read_tool(turn)``: a ``FunctionTool`` for ``scratchpad_read``
  (the strict schema), answering from this turn and principal only; by default
  it is offered to the model only once something has been offloaded.
- ``offload_outputs(tool, turn)``: the same tool, whose outputs are recorded in
  the turn (encrypted, whatever their size) before they reach the model: the
  model gets what ``Turn.record`` returns, the output itself when it is small
  or the synthetic view with its ``scratchpad_id`` when it is not. Its
  arguments may refer to earlier steps (``{{step1.content}}``), resolved from
  the store.
- ``SecurepadSession(session_id, pad, principal)``: the SDK's session protocol,
  so that the conversation itself is sealed per owner too (see
  ``securepad.integrations.openai_session``).

The turn is either an ``AsyncTurn`` (``await pad.turn(...)`` on an
``AsyncScratchpad``) or a ``Turn``, whose calls then run in asyncio's default
thread pool.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from agents import AgentBase, FunctionTool, RunContextWrapper, ToolOutputFileContent, ToolOutputImage, ToolOutputText
from agents.tool_context import ToolContext

from ..aio import AsyncTurn
from ..core.tool import SCRATCHPAD_READ_TOOL_STRICT, TOOL_NAME
from ..errors import InvalidArgumentError
from ..turn import Turn
from ._common import as_observation, as_text, error_text, resolve_json_arguments
from .openai_session import SecurepadSession

__all__ = ["SecurepadSession", "offload_outputs", "scratchpad_read_tool"]


def scratchpad_read_tool(turn: Turn | AsyncTurn, *, only_when_offloaded: bool = True) -> FunctionTool:
    """The ``scratchpad_read`` function tool of ``turn``, with the strict schema.

    It answers with the read's JSON result, or ``{"ok": false, "error": ...}``
    for anything wrong with the call (never an exception for bad input). With
    ``only_when_offloaded`` (the default) the tool is enabled only while the
    turn has offloaded entries, as ``Turn.tools()`` offers it.

    Raises:
        InvalidArgumentError: ``turn`` is not a ``Turn`` or ``AsyncTurn``.
    """
    bound = AsyncTurn.wrap(turn)
    function = SCRATCHPAD_READ_TOOL_STRICT["function"]

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        return json.dumps(await bound.call_tool(TOOL_NAME, arguments), ensure_ascii=False)

    async def offloaded(ctx: RunContextWrapper[Any], agent: AgentBase[Any]) -> bool:
        return bool(await bound.tools())

    return FunctionTool(
        name=TOOL_NAME,
        description=function["description"],
        params_json_schema=copy.deepcopy(function["parameters"]),
        on_invoke_tool=invoke,
        strict_json_schema=True,
        is_enabled=offloaded if only_when_offloaded else True,
    )


def offload_outputs(tool: FunctionTool, turn: Turn | AsyncTurn, *, resolve_references: bool = True) -> FunctionTool:
    """A copy of ``tool`` whose every output is recorded in ``turn`` (at the next
    free step, ``executor_name`` being the tool's name) before the model sees it.

    The model gets the output when it is small, else the synthetic view (as
    JSON text). Text outputs that hold JSON are recorded as structures, so the
    view has their count and schema and references reach their fields. With
    ``resolve_references`` (the default), ``{{stepN.path}}`` / ``${stepN.path}``
    in the arguments are filled from the stored observations first; a bad
    reference is answered to the model as ``{"ok": false, "error": ...}``
    without running the tool. Image and file outputs pass through unrecorded;
    any other value that JSON cannot hold is recorded as its text.

    Raises:
        InvalidArgumentError: ``tool`` is not a ``FunctionTool``, or ``turn`` not a turn.
    """
    if not isinstance(tool, FunctionTool):
        raise InvalidArgumentError("offload_outputs wraps an agents.FunctionTool")
    bound = AsyncTurn.wrap(turn)
    original = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        if resolve_references:
            try:
                arguments = await resolve_json_arguments(bound, arguments)
            except InvalidArgumentError as exc:
                return error_text(str(exc))
        output = await original(ctx, arguments)
        if _media(output):
            return output
        if isinstance(output, ToolOutputText):
            output = output.text
        try:
            _, shown = await bound.append(tool.name, as_observation(output))
        except InvalidArgumentError:
            # Not a JSON value: the model would get its text, so that is what is kept.
            _, shown = await bound.append(tool.name, str(output))
        return as_text(shown)

    # The output becomes the turn's text, so an output schema of the tool no longer applies.
    return dataclasses.replace(tool, on_invoke_tool=invoke, output_json_schema=None, _output_type_adapter=None)


def _media(output: Any) -> bool:
    """An image or file output (or a list with one): the model gets those as they are."""
    items = output if isinstance(output, list) else [output]
    return any(
        isinstance(item, ToolOutputImage | ToolOutputFileContent)
        or (isinstance(item, dict) and item.get("type") in ("image", "file"))
        for item in items
    )
