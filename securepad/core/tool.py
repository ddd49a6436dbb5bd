"""The ``scratchpad_read`` tool: its JSON schema (plain and OpenAI-strict) and
the checks of a model's arguments, which become ``Scratchpad.read``'s."""

from __future__ import annotations

import copy
import json
from typing import Any

from ..errors import InvalidArgumentError
from . import read_bounds

__all__ = [
    "MAX_TOOL_INT",
    "SCRATCHPAD_READ_TOOL",
    "SCRATCHPAD_READ_TOOL_STRICT",
    "TOOL_NAME",
    "tool_arguments",
    "tool_error",
]

TOOL_NAME = "scratchpad_read"

# Tool arguments arrive from a model: bound what we parse and accept.
MAX_ARGUMENT_CHARS = 64 * 1024
MAX_TOOL_INT = 2**31 - 1
_MODE_ARGUMENTS: dict[str, frozenset[str]] = {
    "head": frozenset({"n"}),
    "tail": frozenset({"n"}),
    "range": frozenset({"start", "end"}),
    "full": frozenset(),
    "lines": frozenset({"start", "end"}),
    "grep": frozenset({"pattern", "max_matches", "context", "start", "end"}),
}
_INT_ARGUMENTS = ("n", "start", "end", "max_matches", "context")
_ALL_ARGUMENTS = frozenset({"scratchpad_id", "mode", "pattern", *_INT_ARGUMENTS})

SCRATCHPAD_READ_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Read a stored observation that was too large for the conversation, by the scratchpad_id"
            " shown in its summary. Reads return at most a few thousand characters; the result's"
            " metadata says whether it was cut and where to continue."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "scratchpad_id": {
                    "type": "string",
                    "description": "The scratchpad_id from the observation's summary (16 hex characters).",
                },
                "mode": {
                    "type": "string",
                    "enum": list(read_bounds.MODES),
                    "description": (
                        "head/tail: first/last n characters; range: characters start..end (end exclusive);"
                        " full: everything up to the read cap; lines: lines start..end (1-based, inclusive);"
                        " grep: lines matching pattern, as 'N:line' (context lines as 'N-line')."
                        " Binary entries support head, tail, range and full (base64). Default: head."
                    ),
                },
                "n": {"type": "integer", "minimum": 0, "description": "head/tail: how many characters."},
                "start": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "range: first character (0-based); lines/grep: first line (1-based).",
                },
                "end": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "range: end character (exclusive); lines/grep: last line (inclusive).",
                },
                "pattern": {
                    "type": "string",
                    "description": (
                        "grep: an RE2 regular expression (no backreferences or look-around); (?i) ignores case."
                        " Each line is matched on its own. A grep that uses up its work budget returns the"
                        " lines found so far with metadata.budget_exhausted true; go on from metadata.next_line."
                    ),
                },
                "max_matches": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (
                        f"grep: stop after this many matching lines (default {read_bounds.DEFAULT_MAX_MATCHES})."
                    ),
                },
                "context": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": read_bounds.MAX_CONTEXT,
                    "description": "grep: lines of context before and after each match (default 0).",
                },
            },
            "required": ["scratchpad_id"],
            "additionalProperties": False,
        },
    },
}


def _strict_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool under OpenAI's strict function-calling rules: every property
    required, the optional ones nullable (the handler takes null as "not
    given"), and no range keywords (the handler checks ranges; their messages
    tell the model what to send instead)."""
    strict = copy.deepcopy(tool)
    function = strict["function"]
    params = function["parameters"]
    optional = [name for name in params["properties"] if name not in params["required"]]
    for name, spec in params["properties"].items():
        spec.pop("minimum", None)
        if "maximum" in spec:
            spec["description"] += f" At most {spec.pop('maximum')}."
        if name not in optional:
            continue
        if "enum" in spec:
            # A nullable enum as anyOf: the enum itself stays a list of strings.
            params["properties"][name] = {
                "anyOf": [{"type": spec["type"], "enum": spec["enum"]}, {"type": "null"}],
                "description": spec["description"],
            }
        else:
            spec["type"] = [spec["type"], "null"]
    params["required"] = list(params["properties"])
    function["description"] += " Pass null for every argument the mode does not use."
    function["strict"] = True
    return strict


# ``SCRATCHPAD_READ_TOOL`` for OpenAI's strict mode (``"strict": true``); the
# same handler answers both.
SCRATCHPAD_READ_TOOL_STRICT: dict[str, Any] = _strict_tool(SCRATCHPAD_READ_TOOL)


def tool_error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def tool_arguments(name: object, arguments: object) -> dict[str, Any]:
    """Validated keyword arguments for ``Scratchpad.read`` (plus ``scratchpad_id``).

    Raises:
        InvalidArgumentError: with a message for the model.
    """
    if name != TOOL_NAME:
        shown = repr(name)[:60]
        raise InvalidArgumentError(f"unknown tool {shown}; the only tool here is {TOOL_NAME!r}")
    if isinstance(arguments, str | bytes):
        if len(arguments) > MAX_ARGUMENT_CHARS:
            raise InvalidArgumentError(f"the arguments are longer than {MAX_ARGUMENT_CHARS} characters")
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(
                f"the arguments are not valid JSON ({exc.msg} at character {exc.pos});"
                ' send an object like {"scratchpad_id": "...", "mode": "head", "n": 2000}'
            ) from None
        except (RecursionError, UnicodeDecodeError, ValueError):
            raise InvalidArgumentError("the arguments are not valid JSON; send a JSON object") from None
    if not isinstance(arguments, dict):
        raise InvalidArgumentError(
            f"the arguments must be a JSON object, not {type(arguments).__name__};"
            ' send {"scratchpad_id": "...", "mode": "..."}'
        )
    # null is "not given": the strict schema makes the model send every argument.
    arguments = {key: value for key, value in arguments.items() if value is not None}
    unknown = sorted(str(key)[:40] for key in arguments if key not in _ALL_ARGUMENTS)
    if unknown:
        raise InvalidArgumentError(
            f"unknown argument(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_ALL_ARGUMENTS))}"
        )
    scratchpad_id = arguments.get("scratchpad_id")
    if not isinstance(scratchpad_id, str):
        raise InvalidArgumentError(
            "scratchpad_id is required: the 16-character id shown in the observation's summary, as a string"
        )
    mode = arguments.get("mode", "head")
    if not isinstance(mode, str) or mode not in _MODE_ARGUMENTS:
        raise InvalidArgumentError(f"mode must be one of {', '.join(read_bounds.MODES)}, not {str(mode)[:40]!r}")
    given = set(arguments) - {"scratchpad_id", "mode"}
    misplaced = sorted(given - _MODE_ARGUMENTS[mode])
    if misplaced:
        allowed = ", ".join(sorted(_MODE_ARGUMENTS[mode])) or "no other arguments"
        raise InvalidArgumentError(f"mode {mode!r} does not take {', '.join(misplaced)}; it takes {allowed}")
    args: dict[str, Any] = {"scratchpad_id": scratchpad_id, "mode": mode}
    for key in _INT_ARGUMENTS:
        if key in arguments:
            args[key] = _tool_int(key, arguments[key])
    if mode == "grep":
        pattern = arguments.get("pattern")
        if not isinstance(pattern, str):
            raise InvalidArgumentError("mode 'grep' needs pattern: a string (RE2 regular expression)")
        args["pattern"] = pattern
    return args


def _tool_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, not {repr(value)[:40]}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be 0 or more, not {value}")
    if value > MAX_TOOL_INT:
        raise InvalidArgumentError(f"{name} is too large: at most {MAX_TOOL_INT}")
    return value
