"""securepad for LangGraph and LangChain (extra ``langgraph``).

- ``scratchpad_read_tool(turn)``: a LangChain tool for ``scratchpad_read``,
  answering from this turn and principal only (sync and async).
- ``offload_node(turn)``: a graph node to put after the ``ToolNode``. Each
  new ``ToolMessage`` is recorded in the turn (encrypted, whatever its size)
  and its content replaced by what the turn shows the model: the output
  itself when small, else the synthetic view with its ``scratchpad_id``.
  This is the eviction deepagents does to large tool results, but encrypted
  and owner-scoped, and the model can read the rest with ``scratchpad_read``.
- ``offload_tool_messages(turn, messages)``: the same on a list of messages,
  for loops that are not graphs.
- ``resolve_references(tool, turn)``: a tool whose arguments may refer to
  earlier steps (``{{step1.content}}``), resolved from the store.
- ``SecurepadSaver(pad, principal)``: a checkpointer, so that the graph's own
  state (checkpoints, pending writes, channel values) is sealed per owner too
  (see ``securepad.integrations.langgraph_saver``).

A recorded message carries ``response_metadata["securepad"]`` (its
``step_num``, ``scratchpad_id`` and whether it was ``offloaded``) and is never
recorded twice. Results of ``scratchpad_read`` itself are left as they are:
they are already cut to the read cap, and storing them again would hand the
model an id instead of what it asked to read.

The turn is an ``AsyncTurn`` or a ``Turn``; either works in ``invoke`` and
``ainvoke`` (a ``Turn``'s calls then run in asyncio's default thread pool).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from ..aio import AsyncTurn
from ..core.tool import SCRATCHPAD_READ_TOOL, SCRATCHPAD_READ_TOOL_STRICT, TOOL_NAME
from ..errors import InvalidArgumentError
from ..turn import Turn, record_next
from ._common import as_observation, as_text, error_text
from .langgraph_saver import SecurepadSaver

__all__ = [
    "METADATA_KEY",
    "SecurepadSaver",
    "aoffload_tool_messages",
    "offload_node",
    "offload_tool_messages",
    "resolve_references",
    "scratchpad_read_tool",
]

# Where a recorded ToolMessage keeps what securepad did with it.
METADATA_KEY = "securepad"
# What every synthetic view has (see ``Turn.record``).
_VIEW_KEYS = frozenset({"ok", "scratchpad_id", "step_num", "size_bytes", "kind", "summary"})


def scratchpad_read_tool(turn: Turn | AsyncTurn, *, strict: bool = False) -> BaseTool:
    """The ``scratchpad_read`` tool of ``turn``: ``SCRATCHPAD_READ_TOOL``'s schema
    (``SCRATCHPAD_READ_TOOL_STRICT``'s with ``strict=True``, for
    ``bind_tools(..., strict=True)``). It answers with the read's JSON result, or
    ``{"ok": false, "error": ...}`` for anything wrong with the call; bad
    input never raises.

    Raises:
        InvalidArgumentError: ``turn`` is not a ``Turn`` or ``AsyncTurn``.
    """
    bound = AsyncTurn.wrap(turn)
    function = (SCRATCHPAD_READ_TOOL_STRICT if strict else SCRATCHPAD_READ_TOOL)["function"]

    def read(**arguments: Any) -> str:
        return json.dumps(bound.sync.call_tool(TOOL_NAME, arguments), ensure_ascii=False)

    async def aread(**arguments: Any) -> str:
        return json.dumps(await bound.call_tool(TOOL_NAME, arguments), ensure_ascii=False)

    return StructuredTool.from_function(
        func=read,
        coroutine=aread,
        name=TOOL_NAME,
        description=function["description"],
        args_schema=copy.deepcopy(function["parameters"]),
        infer_schema=False,
    )


def resolve_references(tool: BaseTool, turn: Turn | AsyncTurn) -> BaseTool:
    """``tool`` with ``{{stepN.path}}`` / ``${stepN.path}`` in its arguments filled
    from the turn's stored observations (``Turn.resolve``) before it runs, so
    the model passes earlier results by reference instead of copying them. A
    bad reference is answered as ``{"ok": false, "error": ...}`` without
    running the tool. The model sees ``tool``'s name, description and schema;
    the arguments are checked by ``tool`` itself, after resolution (so a
    reference may stand for a list or a number). For tools without injected
    arguments (``InjectedState``, ``InjectedStore``, ...).

    Raises:
        InvalidArgumentError: ``turn`` is not a turn.
    """
    bound = AsyncTurn.wrap(turn)
    # The parameters a model is shown for ``tool`` (its injected arguments left out).
    parameters = convert_to_openai_tool(tool)["function"]["parameters"]

    def run(**arguments: Any) -> Any:
        try:
            resolved = bound.sync.resolve(arguments)
        except InvalidArgumentError as exc:
            return error_text(str(exc))
        return tool.invoke(resolved)

    async def arun(**arguments: Any) -> Any:
        try:
            resolved = await bound.resolve(arguments)
        except InvalidArgumentError as exc:
            return error_text(str(exc))
        return await tool.ainvoke(resolved)

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=tool.name,
        description=tool.description,
        args_schema=parameters,
        infer_schema=False,
        return_direct=tool.return_direct,
    )


def offload_tool_messages(turn: Turn | AsyncTurn, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """``messages`` with each ``ToolMessage`` not yet recorded recorded in ``turn``
    (at the next free step, ``executor_name`` being the tool's name) and its
    content replaced by what the turn shows. The other messages, and the
    ``ToolMessage`` objects given, are not changed.

    Raises:
        InvalidArgumentError: ``turn`` is not a turn, or a content that cannot be stored.
        QuotaExceededError, StoreBusyError: as for ``Turn.record``.
    """
    sync = AsyncTurn.wrap(turn).sync
    done = {id(message): _replaced(message, *record_next(sync, *_recorded(message))) for message in _pending(messages)}
    return [done.get(id(message), message) for message in messages]


async def aoffload_tool_messages(turn: Turn | AsyncTurn, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """``offload_tool_messages`` for async code: the store calls run in worker threads.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``offload_tool_messages``.
    """
    bound = AsyncTurn.wrap(turn)
    done = {id(message): _replaced(message, *await bound.append(*_recorded(message))) for message in _pending(messages)}
    return [done.get(id(message), message) for message in messages]


def offload_node(turn: Turn | AsyncTurn, *, messages_key: str = "messages") -> RunnableLambda[Any, dict[str, Any]]:
    """A graph node (sync and async) that offloads the new ``ToolMessage``\\ s of
    ``state[messages_key]``. It returns only the messages it replaced, with
    their ids, so that the ``add_messages`` reducer swaps them in place.

    Raises:
        InvalidArgumentError: ``turn`` is not a turn (when the node is made);
            when it runs, as for ``offload_tool_messages``.
    """
    bound = AsyncTurn.wrap(turn)

    def changed(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> dict[str, Any]:
        return {messages_key: [new for old, new in zip(before, after, strict=True) if new is not old]}

    def node(state: Mapping[str, Any]) -> dict[str, Any]:
        before = list(state[messages_key])
        return changed(before, offload_tool_messages(bound, before))

    async def anode(state: Mapping[str, Any]) -> dict[str, Any]:
        before = list(state[messages_key])
        return changed(before, await aoffload_tool_messages(bound, before))

    return RunnableLambda(node, afunc=anode, name="securepad_offload")


def _pending(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    """The ToolMessages to record: not recorded yet, and not scratchpad_read's own answers."""
    called = {
        call["id"]: call["name"]
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
        if call.get("id")
    }
    return [
        message
        for message in messages
        if isinstance(message, ToolMessage)
        and METADATA_KEY not in message.response_metadata
        and TOOL_NAME not in (message.name, called.get(message.tool_call_id))
    ]


def _recorded(message: ToolMessage) -> tuple[str, Any]:
    """The executor name and the observation a ToolMessage is recorded as."""
    content = message.content
    return message.name or "tool", as_observation(content) if isinstance(content, str) else list(content)


def _replaced(message: ToolMessage, step_num: int, shown: Any) -> ToolMessage:
    offloaded = isinstance(shown, dict) and shown.keys() >= _VIEW_KEYS and shown["step_num"] == step_num
    marker = {"step_num": step_num, "offloaded": offloaded}
    if offloaded:
        marker["scratchpad_id"] = shown["scratchpad_id"]
    return message.model_copy(
        update={
            "content": as_text(shown),
            "response_metadata": {**message.response_metadata, METADATA_KEY: marker},
        }
    )
