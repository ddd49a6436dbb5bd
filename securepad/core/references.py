"""``{{stepN.field}}`` / ``${stepN.field}`` references: finding them in a
value and walking each path into a step's observation. Pure: the caller says
how to fetch a step's observation."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["REFERENCE", "cut", "resolve"]

# {{step3.items.0.name}} or ${step3.items.0.name}; a path part is anything but
# dots, braces and white space.
_PATH = r"((?:\.[^.{}\s]+)*)"
REFERENCE = re.compile(r"\{\{\s*step(\d{1,10})" + _PATH + r"\s*\}\}|\$\{\s*step(\d{1,10})" + _PATH + r"\s*\}")


def cut(value: Any, limit: int, path: str) -> Any:
    """Strings inside ``value`` cut to ``limit`` characters, saying how much was
    omitted and, when it can be written, the reference to the full text."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        ref = f"{{{{{path}}}}}"
        where = f"; {ref} is the full text" if REFERENCE.fullmatch(ref) else ""
        return f"{value[:limit]}[... {len(value) - limit} characters omitted{where} ...]"
    if isinstance(value, dict):
        return {key: cut(item, limit, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [cut(item, limit, f"{path}.{index}") for index, item in enumerate(value)]
    return value


def resolve(value: Any, observation: Callable[[int, str], Any]) -> Any:
    """``value`` with every reference in its strings (inside lists, tuples and
    dict values) replaced; ``observation(step, reference)`` gives a step's
    observation, asked at most once per step.

    Raises:
        InvalidArgumentError: an unknown field (the message names the
            reference), binary content inside a longer string, or what
            ``observation`` raises.
    """
    seen: dict[int, Any] = {}

    def value_of(match: re.Match[str]) -> Any:
        first = match.group(1) is not None
        step = int(match.group(1) if first else match.group(3))
        parts = [part for part in (match.group(2) if first else match.group(4)).split(".") if part]
        if step not in seen:
            seen[step] = observation(step, match.group(0))
        node = seen[step]
        if parts and parts[0] == "content" and isinstance(node, str | bytes):
            parts = parts[1:]  # a text or binary observation is its own content
        walked = f"step{step}"
        for part in parts:
            node = _field(node, part, walked, match.group(0))
            walked = f"{walked}.{part}"
        return node

    def embed(match: re.Match[str]) -> str:
        found = value_of(match)
        if isinstance(found, str):
            return found
        if isinstance(found, bytes):
            raise InvalidArgumentError(
                f"{match.group(0)} is binary content: it can only be a whole argument, not part of a string"
            )
        return json.dumps(found, ensure_ascii=False)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            whole = REFERENCE.fullmatch(node)
            return value_of(whole) if whole is not None else REFERENCE.sub(embed, node)
        if isinstance(node, dict):
            return {key: walk(item) for key, item in node.items()}
        if isinstance(node, list | tuple):
            walked = [walk(item) for item in node]
            return walked if isinstance(node, list) else tuple(walked)
        return node

    return walk(value)


def _field(node: Any, part: str, walked: str, reference: str) -> Any:
    """``node[part]`` for a dict key or a list index, or InvalidArgumentError naming the reference."""
    if isinstance(node, dict):
        if part in node:
            return node[part]
        keys = ", ".join(sorted(str(k) for k in node)[:20]) or "none"
        raise InvalidArgumentError(f"{reference}: {walked} has no field {part!r} (its fields: {keys})")
    if isinstance(node, list):
        if part.isascii() and part.isdigit() and int(part) < len(node):
            return node[int(part)]
        raise InvalidArgumentError(
            f"{reference}: {walked} is a list of {len(node)} items; {part!r} is not an index in it"
        )
    raise InvalidArgumentError(f"{reference}: {walked} is {_kind(node)}, it has no field {part!r}")


def _kind(node: Any) -> str:
    if isinstance(node, str):
        return "text"
    if isinstance(node, bytes):
        return "binary content"
    return "a number" if isinstance(node, int | float) and not isinstance(node, bool) else "a scalar"
