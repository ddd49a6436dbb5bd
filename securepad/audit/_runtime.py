"""The audit's checks of the runtime surface (``pad.turn``): what one
principal's turn can reach of another's steps through references and the
scratchpad_read tool."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

from ..core import read_modes
from ..errors import InvalidArgumentError
from ..principal import Principal
from ..turn import Turn
from ._api import a_labels, read_args
from ._support import CheckFailed, Context, Steps, Tenants, describe

__all__ = ["RUNTIME"]

RUNTIME = Steps("runtime")


def _turn(ctx: Context, principal: Principal, turn_id: str) -> Turn:
    """``pad.turn`` for the audit. Beginning a turn collects expired entries: the
    cutoff given lies below every real entry's expiry and below the audit's
    own expired entry, so nothing is collected."""
    return ctx.pad.turn(principal, turn_id, now=ctx.tenants.expired_cutoff - 1.0)


def _normalized(message: str, *values: str) -> str:
    """A refusal's message with the asked-for id or step number taken out."""
    for value in values:
        message = message.replace(value[:40], "<id>")
    return re.sub(r"step ?\d+", "step<N>", message)


def _no_canary(t: Tenants, value: object, what: str) -> None:
    text = repr(value).encode("utf-8", "backslashreplace")
    leaked = [label for label, canary in t.canaries.items() if canary in text and label != "owner b content"]
    if leaked:
        raise CheckFailed(f"{what}: owner a's {', '.join(leaked)} came back")


@RUNTIME(
    "cross-owner resolve",
    "b's turn with a's turn id resolves {{stepN...}} / ${stepN...} references to a's steps",
)
def _cross_resolve(ctx: Context) -> str:
    t = ctx.tenants
    theirs, mine = _turn(ctx, t.b, t.turn), _turn(ctx, t.a, t.turn)
    if mine.resolve("{{step1.content}}") != t.puts["text"]["content"]:
        raise CheckFailed("a could not resolve its own {{step1.content}}")
    if theirs.resolve("{{step1.content}}") != t.puts["b_text"]:
        raise CheckFailed("b's {{step1.content}} did not resolve to b's own step 1")

    def refusal(reference: Any) -> str:
        try:
            value = theirs.resolve(reference)
        except InvalidArgumentError as exc:
            return _normalized(str(exc))
        _no_canary(t, value, f"b resolved {reference!r}")
        raise CheckFailed(f"b resolved {describe(reference)} to {describe(value)}")

    steps = sorted({t.steps[label] for label in a_labels(t)} - {t.steps["b_text"]})
    forms: list[Callable[[int], Any]] = [
        lambda n: f"{{{{step{n}}}}}",
        lambda n: f"${{step{n}.content}}",
        lambda n: f"{{{{step{n}.items.0.secret}}}}",
        lambda n: f"see {{{{step{n}.content}}}} here",
        lambda n: {"args": [f"${{step{n}}}"]},
    ]
    tried = 0
    for form in forms:
        absent = refusal(form(999_999))  # a step no one recorded
        for step in steps:
            if refusal(form(step)) != absent:
                raise CheckFailed(f"b's refusal of {form(step)!r} differs from that of a step never recorded")
            tried += 1
    return (
        f"a and b share a turn id; b resolved {tried} references to a's steps {steps} (whole, embedded, nested;"
        " both syntaxes): InvalidArgumentError naming an unknown step, as for a step never recorded;"
        " b's own {{step1.content}} is b's"
    )


@RUNTIME(
    "cross-owner tool calls",
    "scratchpad_read tool calls for a's ids from b's turn and from a's other turn; b's history",
)
def _cross_tool(ctx: Context) -> str:
    t = ctx.tenants
    theirs = _turn(ctx, t.b, t.turn)
    elsewhere = _turn(ctx, t.a, t.turn + "-other")
    mine = _turn(ctx, t.a, t.turn)
    own = mine.call_tool("scratchpad_read", {"scratchpad_id": t.ids["text"], "mode": "head", "n": 50})
    if not own.get("ok"):
        raise CheckFailed(f"a's own tool call failed: {describe(own)}")
    ghost = secrets.token_hex(8)
    absent = _normalized(theirs.call_tool("scratchpad_read", {"scratchpad_id": ghost})["error"], ghost)
    tried = 0
    for caller, name in ((theirs, "b"), (elsewhere, "a in another turn")):
        for label in a_labels(t):
            entry_id = t.ids[label]
            for mode in read_modes.MODES:
                arguments = {"scratchpad_id": entry_id, "mode": mode, **read_args(mode)}
                arguments.pop("max_matches", None)
                for form in (arguments, json.dumps(arguments)):
                    result = caller.call_tool("scratchpad_read", form)
                    _no_canary(t, result, f"{name}'s tool call for a's {label} entry")
                    if result.get("ok") is not False:
                        raise CheckFailed(f"{name} read a's {label} entry through the tool: {describe(result)}")
                    if _normalized(str(result.get("error")), entry_id) != absent:
                        raise CheckFailed(f"{name}'s refusal for a's {label} differs from an absent id's")
                    tried += 1
    history = json.dumps(theirs.history(), default=str)
    if any(t.ids[label] in history for label in a_labels(t)):
        raise CheckFailed("b's turn history shows a's entries")
    _no_canary(t, history, "b's turn history")
    return (
        f"{tried} scratchpad_read calls (every mode, dict and JSON arguments) for a's ids, by b in the same"
        " turn id and by a in another turn: ok false with the message an absent id gets; b's history holds"
        " only b's step"
    )
