"""SCRATCHPAD_READ_TOOL_STRICT follows OpenAI's strict function-calling rules,
and the tool handler takes its nulls as "not given"."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest

import securepad
from securepad import SCRATCHPAD_READ_TOOL, SCRATCHPAD_READ_TOOL_STRICT, Principal, Scratchpad, Turn

NOW = 1_700_000_000.0
LOG = "".join(f"{i}: ok\n" for i in range(1, 3000)) + "3000: ERROR disk full\n"

# What strict mode accepts in every schema node. Its documentation lists a few
# more for some models (pattern, format, numeric and array bounds); the tool
# needs none of them, and leaving them out keeps it valid wherever strict mode is.
ALLOWED_KEYWORDS = {
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "const",
    "anyOf",
    "items",
    "$ref",
    "$defs",
}
JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
MAX_DEPTH = 10
MAX_ENUM_VALUES = 1000


def strict_violations(params: dict[str, Any]) -> list[str]:
    """The documented strict-mode rules a function's parameters schema breaks."""
    problems: list[str] = []
    if params.get("type") != "object" or "anyOf" in params:
        problems.append("the root must be an object schema, not anyOf")

    def check(node: dict[str, Any], path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
        for keyword in sorted(set(node) - ALLOWED_KEYWORDS):
            problems.append(f"{path}: keyword {keyword!r} is not supported in strict mode")
        types = node.get("type")
        names = types if isinstance(types, list) else [types] if types is not None else []
        for name in names:
            if name not in JSON_TYPES:
                problems.append(f"{path}: unknown type {name!r}")
        if types is None and "anyOf" not in node and "$ref" not in node and "enum" not in node:
            problems.append(f"{path}: every schema needs a type (or anyOf/$ref/enum)")
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values or len(values) > MAX_ENUM_VALUES:
                problems.append(f"{path}: enum must be a list of 1 to {MAX_ENUM_VALUES} values")
            elif names and any(not _has_type(value, names) for value in values):
                problems.append(f"{path}: an enum value does not have the declared type")
        if "object" in names or "properties" in node:
            properties = node.get("properties", {})
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: objects need additionalProperties: false")
            if sorted(node.get("required", [])) != sorted(properties):
                problems.append(f"{path}: every property must be listed in required")
            for key, child in properties.items():
                check(child, f"{path}.{key}", depth + 1)
        if "items" in node:
            check(node["items"], f"{path}[]", depth + 1)
        for index, option in enumerate(node.get("anyOf", [])):
            check(option, f"{path}|{index}", depth + 1)

    check(params, "parameters", 1)
    return problems


def _has_type(value: Any, names: list[str]) -> bool:
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    return any(checks.get(name, lambda v: False)(value) for name in names)


def accepts_null(spec: dict[str, Any]) -> bool:
    types = spec.get("type")
    if types == "null" or (isinstance(types, list) and "null" in types):
        return True
    return any(accepts_null(option) for option in spec.get("anyOf", []))


def test_the_strict_tool_is_exported() -> None:
    assert "SCRATCHPAD_READ_TOOL_STRICT" in securepad.__all__


def test_the_strict_tool_follows_the_documented_rules() -> None:
    function = SCRATCHPAD_READ_TOOL_STRICT["function"]
    assert SCRATCHPAD_READ_TOOL_STRICT["type"] == "function"
    assert function["strict"] is True
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", function["name"])
    assert strict_violations(function["parameters"]) == []


def test_the_validator_catches_what_strict_mode_refuses() -> None:
    """The plain tool is not strict (optional arguments, numeric bounds): the
    validator says so, which shows that it checks something."""
    problems = strict_violations(SCRATCHPAD_READ_TOOL["function"]["parameters"])
    assert any("required" in p for p in problems)
    assert any("'minimum'" in p for p in problems)
    broken = copy.deepcopy(SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"])
    broken["additionalProperties"] = True
    broken["properties"]["n"]["default"] = 5
    broken["properties"]["mode"] = {"type": "string", "enum": ["head", 3]}
    found = strict_violations(broken)
    assert any("additionalProperties" in p for p in found)
    assert any("'default'" in p for p in found)
    assert any("enum value" in p for p in found)


@pytest.mark.xdist_group("openai_agents")
def test_the_agents_sdk_strict_helper_leaves_it_unchanged() -> None:
    from agents.strict_schema import ensure_strict_json_schema

    params = SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]
    assert ensure_strict_json_schema(copy.deepcopy(params)) == params


def test_the_strict_tool_is_the_plain_one_with_nullable_optionals() -> None:
    plain = SCRATCHPAD_READ_TOOL["function"]["parameters"]
    strict = SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]
    assert list(strict["properties"]) == list(plain["properties"]) == strict["required"]
    for name, spec in strict["properties"].items():
        assert accepts_null(spec) == (name not in plain["required"]), name
        assert spec["description"].startswith(plain["properties"][name]["description"])
    mode = strict["properties"]["mode"]["anyOf"][0]
    assert mode["enum"] == plain["properties"]["mode"]["enum"]
    assert "At most" in strict["properties"]["context"]["description"]


@pytest.fixture
def turn(pad: Scratchpad, alice: Principal) -> Turn:
    return pad.turn(alice, "turn-1", now=NOW)


def strict_call(scratchpad_id: str, **given: Any) -> dict[str, Any]:
    """Arguments as a model in strict mode sends them: every one, null when unused."""
    arguments: dict[str, Any] = dict.fromkeys(SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"]["properties"])
    arguments.update(scratchpad_id=scratchpad_id, **given)
    return arguments


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "1: ok\n2: ok"),
        ({"mode": "head", "n": 5}, "1: ok"),
        ({"mode": "tail", "n": 22}, "3000: ERROR disk full\n"),
        ({"mode": "range", "start": 0, "end": 5}, "1: ok"),
        ({"mode": "full"}, "1: ok\n"),
        ({"mode": "lines", "start": 3000, "end": 3000}, "3000: ERROR disk full"),
        ({"mode": "grep", "pattern": "ERROR"}, "3000:3000: ERROR disk full"),
        ({"mode": "grep", "pattern": "ERROR", "max_matches": 1, "context": 1}, "2999-2999: ok"),
    ],
)
def test_the_handler_takes_null_as_not_given(turn: Turn, given: dict[str, Any], expected: str) -> None:
    shown = turn.record(1, "read_log", LOG, now=NOW)
    arguments = strict_call(shown["scratchpad_id"], **given)
    jsonschema.validate(arguments, SCRATCHPAD_READ_TOOL_STRICT["function"]["parameters"])
    result = turn.call_tool("scratchpad_read", arguments, now=NOW)
    assert result.get("ok", True) is not False, result
    assert expected in result["content"]


def test_a_strict_call_still_gets_actionable_errors(turn: Turn) -> None:
    shown = turn.record(1, "read_log", LOG, now=NOW)
    missing = turn.call_tool("scratchpad_read", strict_call(shown["scratchpad_id"], mode="grep"), now=NOW)
    assert missing["ok"] is False and "needs pattern" in missing["error"]
    misplaced = turn.call_tool("scratchpad_read", strict_call(shown["scratchpad_id"], mode="head", start=3), now=NOW)
    assert misplaced["ok"] is False and "does not take start" in misplaced["error"]
    no_id = turn.call_tool("scratchpad_read", strict_call(None), now=NOW)  # type: ignore[arg-type]
    assert no_id["ok"] is False and "scratchpad_id is required" in no_id["error"]


def test_turn_offers_the_strict_tool_on_request(turn: Turn) -> None:
    turn.record(1, "read_log", LOG, now=NOW)
    assert turn.tools(now=NOW) == [SCRATCHPAD_READ_TOOL]
    strict = turn.tools(strict=True, now=NOW)
    assert strict == [SCRATCHPAD_READ_TOOL_STRICT]
    strict[0]["function"]["strict"] = False  # the runtime gets its own copy
    assert SCRATCHPAD_READ_TOOL_STRICT["function"]["strict"] is True
