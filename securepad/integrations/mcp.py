"""``securepad mcp``: the turn's tools served over the Model Context Protocol (stdio).

The server is bound, when it starts, to one principal and one turn: the
operator's flags or environment say whose turn it is, never the model. The
model gets two tools:

- ``scratchpad_read``: the turn's tool, with its arguments and answers
  (``SCRATCHPAD_READ_TOOL``); an id of another turn or owner is refused
  exactly like an id that never existed;
- ``scratchpad_list``: the turn's live entries (id, step, tool, kind, size,
  summary), no arguments.

Bad arguments are answered as tool errors (``isError``) with the handler's
message, so the model can correct its call; an unknown tool name is a
protocol error, as the MCP specification asks. Store calls run in worker
threads (``AsyncScratchpad``), so one slow read does not hold up the others.

Needs the ``mcp`` extra (the official SDK, version 2).
"""

from __future__ import annotations

import asyncio
import json
from importlib import metadata
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from ..aio import AsyncScratchpad, AsyncTurn
from ..core.tool import SCRATCHPAD_READ_TOOL, TOOL_NAME
from ..principal import Principal
from ..store import Scratchpad

__all__ = ["LIST_TOOL_NAME", "build_server", "serve", "serve_stdio"]

LIST_TOOL_NAME = "scratchpad_list"
# What scratchpad_list shows of each entry.
_LISTED = ("scratchpad_id", "step_num", "executor_name", "kind", "size_bytes", "summary")

_INSTRUCTIONS = (
    "Large tool results of this conversation turn are kept in securepad: the conversation shows a"
    " summary and a scratchpad_id. Read the parts you need with scratchpad_read; scratchpad_list"
    " lists what is stored."
)


def _tools() -> list[types.Tool]:
    read = SCRATCHPAD_READ_TOOL["function"]
    reads_only = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    return [
        types.Tool(
            name=TOOL_NAME, description=read["description"], input_schema=read["parameters"], annotations=reads_only
        ),
        types.Tool(
            name=LIST_TOOL_NAME,
            description=(
                "List the observations stored for this conversation turn: scratchpad_id, step_num, tool"
                " (executor_name), kind, size_bytes and summary of each. Takes no arguments."
            ),
            input_schema={"type": "object", "properties": {}, "additionalProperties": False},
            annotations=reads_only,
        ),
    ]


def _result(value: dict[str, Any]) -> types.CallToolResult:
    if value.get("ok") is False:
        return types.CallToolResult(
            content=[types.TextContent(text=str(value["error"]))], structured_content=value, is_error=True
        )
    text = json.dumps(value, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=value)


async def _list_entries(pad: AsyncScratchpad, turn: AsyncTurn, arguments: dict[str, Any]) -> dict[str, Any]:
    if arguments:
        shown = ", ".join(repr(str(key)[:40]) for key in sorted(arguments, key=str))
        return {"ok": False, "error": f"{LIST_TOOL_NAME} takes no arguments, not {shown}"}
    rows = await pad.list_for_turn(turn.principal, turn.turn_id)
    entries = [{key: row[key] for key in _LISTED} for row in rows]
    return {"ok": True, "turn_id": turn.turn_id, "count": len(entries), "entries": entries}


def build_server(pad: AsyncScratchpad, turn: AsyncTurn) -> Server[Any]:
    """The MCP server (SDK ``Server``) for ``turn``, read through ``pad``. Run it
    on any transport; ``serve_stdio`` runs it on standard input and output.

    Tool calls never raise for bad arguments (they are ``isError`` results);
    ``IntegrityError`` and ``StoreBusyError`` reach the SDK, which answers the
    request with an error.
    """

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tools())

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == TOOL_NAME:
            return _result(await turn.call_tool(TOOL_NAME, arguments))
        if params.name == LIST_TOOL_NAME:
            return _result(await _list_entries(pad, turn, arguments))
        known = f"{TOOL_NAME}, {LIST_TOOL_NAME}"
        raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name[:60]!r}; the tools are {known}")

    return Server(
        "securepad",
        version=_version(),
        instructions=_INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(pad: Scratchpad, principal: Principal, turn_id: str, *, max_workers: int | None = None) -> None:
    """Serve ``turn_id`` of ``principal`` over standard input and output until the
    client closes it; closes ``pad`` afterwards.

    Raises:
        InvalidArgumentError: a bad principal, turn id or ``max_workers``.
    """
    try:
        store = AsyncScratchpad(pad, max_workers=max_workers)
    except BaseException:
        pad.close()
        raise
    async with store:
        turn = await store.turn(principal, turn_id)
        server = build_server(store, turn)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def serve(pad: Scratchpad, principal: Principal, turn_id: str, *, max_workers: int | None = None) -> None:
    """``serve_stdio`` in its own event loop (what ``securepad mcp`` runs).

    Raises:
        InvalidArgumentError: a bad principal, turn id or ``max_workers``.
    """
    asyncio.run(serve_stdio(pad, principal, turn_id, max_workers=max_workers))


def _version() -> str:
    try:
        return metadata.version("securepad")
    except metadata.PackageNotFoundError:
        return "unknown"
