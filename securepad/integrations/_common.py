"""What every framework adapter does the same way: turn a tool's output into an
observation, and what the turn shows back into text for the model."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..aio import AsyncTurn

__all__ = ["as_observation", "as_text", "error_text", "resolve_json_arguments"]


def as_observation(output: Any) -> Any:
    """The observation to record for a tool's output.

    Text that holds a JSON object or array is recorded as that structure, so
    that ``{{stepN.field}}`` references and the structured summary work on it;
    other text is text, bytes are binary, and any other value is recorded as it
    is (``Turn.record`` refuses what JSON cannot hold).
    """
    if isinstance(output, str) and output.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(json.JSONDecodeError, RecursionError):
            return json.loads(output)
    elif callable(getattr(output, "model_dump", None)):
        return output.model_dump(mode="json")  # a pydantic model
    return output


def as_text(shown: Any) -> str:
    """What ``Turn.record`` returned for the history, as the text a tool result carries."""
    return shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)


def error_text(message: str) -> str:
    """A tool error for the model, shaped like the scratchpad_read handler's."""
    return json.dumps({"ok": False, "error": message}, ensure_ascii=False)


async def resolve_json_arguments(turn: AsyncTurn, arguments: str) -> str:
    """A tool call's JSON arguments with every ``{{stepN.path}}`` / ``${stepN.path}``
    filled from the turn's stored observations (``Turn.resolve``). Arguments
    without a reference, or that are not JSON, come back unchanged: the tool's
    own validation answers those.

    Raises:
        InvalidArgumentError: an unknown step or field, or binary content, which
            JSON arguments cannot carry.
        IntegrityError: a stored entry fails authentication.
    """
    if "{{" not in arguments and "${" not in arguments:
        return arguments
    try:
        parsed = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments
    resolved = await turn.resolve(parsed)
    try:
        return json.dumps(resolved, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            "a reference in the arguments names binary content, which a JSON tool argument cannot carry"
        ) from None
