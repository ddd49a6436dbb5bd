"""Recording at the next free step number, for runtimes that do not count steps.

Framework adapters (OpenAI Agents, LangGraph) see tool outputs, not step
numbers, and may run several tools of one turn at once. ``record_next``
picks the turn's next step number and records under a lock per store, turn
and principal, so concurrent callers in one process never collide; a step
taken meanwhile by another process is retried with the next number.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .store import Scratchpad
    from .turn import Turn

__all__ = ["record_next"]

# Another process may take the step we picked between our look and our write;
# each retry looks again. More collisions than this in a row is not a race.
_ATTEMPTS = 8

_registry_lock = threading.Lock()
_locks: weakref.WeakKeyDictionary[Scratchpad, dict[tuple[str, str, str, str], threading.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _turn_lock(turn: Turn) -> threading.Lock:
    principal = turn.principal
    key = (principal.owner_user_id, principal.actor, principal.channel, turn.turn_id)
    with _registry_lock:
        locks = _locks.setdefault(turn._pad, {})
        return locks.setdefault(key, threading.Lock())


def record_next(
    turn: Turn,
    executor_name: str,
    observation: Any,
    *,
    ttl_seconds: int | None = None,
    now: float | None = None,
) -> tuple[int, Any]:
    """Record ``observation`` as the turn's next step (one more than its highest
    live step, 1 for an empty turn); returns ``(step_num, shown)`` where
    ``shown`` is what ``Turn.record`` returned for the model's history.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
    """
    with _turn_lock(turn):
        for _ in range(_ATTEMPTS):
            taken = [step["step_num"] for step in turn.steps(now=now)]
            step_num = max(taken, default=0) + 1
            try:
                return step_num, turn.record(step_num, executor_name, observation, ttl_seconds=ttl_seconds, now=now)
            except InvalidArgumentError:
                # Only a step that another process recorded meanwhile is worth another try.
                if step_num not in {step["step_num"] for step in turn.steps(now=now)}:
                    raise
    raise InvalidArgumentError(f"could not find a free step in turn {turn.turn_id!r}: other writers keep taking it")
