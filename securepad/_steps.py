"""Recording at the next free step number, for runtimes that do not count steps.

Framework adapters (OpenAI Agents, LangGraph) see tool outputs, not step
numbers, and may run several tools of one turn at once. ``record_next``
picks the turn's next step number and records under a lock per store, turn
and principal, so concurrent callers in one process never collide; a step
taken meanwhile by another process is retried with the next number.

``put_next`` is ``Scratchpad.put`` at the turn's next step, for the
integrations' own entries (``SecurepadSaver``, ``SecurepadSession``): the
step is chosen inside the write transaction, which serializes the owner's
writes on both backends, so writers in other threads or processes never
collide and never retry; each entry's step is above every live entry's of
its turn when it is written.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError
from .principal import Principal

if TYPE_CHECKING:
    from .store import Scratchpad
    from .turn import Turn

__all__ = ["put_next", "record_next"]

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


def _taken(turn: Turn, step_num: int, now: float | None) -> bool:
    if step_num >= 2**31:
        return False  # no such step: record refused the number itself
    try:
        turn._pad._check_step_free(turn.principal, turn.turn_id, step_num, now)
    except InvalidArgumentError:
        return True  # the principal, turn and step are valid: record_next checked them
    return False


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
    pad = turn._pad
    with _turn_lock(turn):
        for _ in range(_ATTEMPTS):
            step_num = pad._last_step(turn.principal, turn.turn_id, now) + 1
            try:
                return step_num, turn.record(step_num, executor_name, observation, ttl_seconds=ttl_seconds, now=now)
            except InvalidArgumentError:
                # Only a step that another process recorded meanwhile is worth another try.
                if not _taken(turn, step_num, now):
                    raise
    raise InvalidArgumentError(f"could not find a free step in turn {turn.turn_id!r}: other writers keep taking it")


def put_next(
    pad: Scratchpad,
    principal: Principal,
    turn_id: str,
    executor_name: str,
    observation: Any,
    ttl_seconds: int | None = None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """``Scratchpad.put`` at the turn's next step (one more than its highest
    live step in the principal's scope, 1 for an empty turn); returns
    ``put``'s view, whose ``step_num`` is the step taken.

    The step read before sealing is a guess that spares sealing the metadata
    again under the write lock when no other writer came in between.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Scratchpad.put``.
    """
    if not isinstance(principal, Principal):
        raise InvalidArgumentError("principal must be a securepad.Principal")
    guess = pad._last_step(principal, turn_id, now) + 1
    return pad._put(
        principal, turn_id, guess, executor_name, observation, ttl_seconds, now=now, free_step=True, next_step=True
    )
