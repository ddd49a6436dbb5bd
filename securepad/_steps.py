"""Steps chosen for the integrations: ``put_next``, and the keyed names of
their turns (``keyed_turn_name``, ``keyed_or_former``).

``put_next`` is ``Scratchpad.put`` at the turn's next step, for the
integrations' own entries (``SecurepadSaver``, ``SecurepadSession``): the
step is chosen inside the write transaction, which serializes the owner's
writes on both backends, so writers in other threads or processes never
collide and never retry; each entry's step is above every live entry's of
its turn when it is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .errors import InvalidArgumentError, StoreBusyError
from .principal import Principal
from .store import Scratchpad, listed, parts

__all__ = ["keyed_or_former", "keyed_turn_name", "newest_first", "put_next"]


def keyed_turn_name(pad: Scratchpad, principal: Principal, *ids: Any) -> str:
    """The keyed digest (hex) that names the turn of ``ids`` (JSON values: a
    kind and the caller's own ids) for the principal's owner, for the
    integrations' turns (``crypto.CounterSeal.turn_name``): unlike a hash, it
    cannot be recomputed from a guess of the ids without the store's key."""
    message = json.dumps(list(ids), separators=(",", ":")).encode()
    return parts(pad).keys.counter_seal.turn_name(principal.owner_user_id, message)


def newest_first(
    pad: Scratchpad, principal: Principal, turn_id: str, *, now: float | None = None
) -> Iterator[dict[str, Any]]:
    """The live entries of a turn in the principal's scope, highest step first,
    each as ``Scratchpad.list_for_turn`` shows it (``store.listed``)
    and opened only when the iteration reaches it (``Listings.turn_newest_first``:
    the whole turn is checked against its head before the first).

    Raises:
        InvalidArgumentError, IntegrityError: as for ``Scratchpad.list_for_turn``.
    """
    for opened in parts(pad).listings.turn_newest_first(principal, turn_id, now):
        yield listed(opened)


def keyed_or_former(
    pad: Scratchpad, principal: Principal, keyed: str, former: str, *, now: float | None = None
) -> tuple[str, bool]:
    """The turn an integration's thread or session lives in, as the principal's
    scope finds it, and whether its keyed turn holds entries (then the caller
    may remember it). The keyed turn is looked at first, and its head decides
    (its newest live step, checked against its head: one small read): a
    former turn, holding entries (written before keyed names) or put back
    from an older copy, never shadows a keyed turn with entries, nor one
    whose entries were removed from the file (refused). The former turn only
    when the keyed one is empty and it is not; else the keyed one.

    Raises:
        IntegrityError, StoreBusyError: as for a read of either turn.
    """
    listings = parts(pad).listings
    if listings.last_step(principal, keyed, now) > 0:
        return keyed, True
    return (former if listings.last_step(principal, former, now) > 0 else keyed), False


def put_next(
    pad: Scratchpad,
    principal: Principal,
    turn_id: str,
    executor_name: str,
    observation: Any,
    ttl_seconds: int | None = None,
    *,
    now: float | None = None,
    guess: int | None = None,
) -> dict[str, Any]:
    """``Scratchpad.put`` at the turn's next step (one more than its highest
    live step in the principal's scope, 1 for an empty turn); returns
    ``put``'s view, whose ``step_num`` is the step taken.

    The step read before sealing is a guess that spares sealing the metadata
    again under the write lock when no other writer came in between; a caller
    that knows the step (``guess``: the one after the step it took last, or
    after the newest it just listed) spares the read. When
    writers kept changing the turn while it was read (``StoreBusyError`` from
    the consistent read), the guess is 1 and the write transaction, which
    reads the turn under the owner's serialization, takes the step: the read
    that is only a guess never makes the put fail.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Scratchpad.put``.
    """
    if not isinstance(principal, Principal):
        raise InvalidArgumentError("principal must be a securepad.Principal")
    found = parts(pad)
    if guess is None or isinstance(guess, bool) or not isinstance(guess, int) or guess < 1:
        try:
            guess = found.listings.last_step(principal, turn_id, now) + 1
        except StoreBusyError:  # only a guess: the write transaction takes the step
            guess = 1
    return found.putter.put(
        principal, turn_id, guess, executor_name, observation, ttl_seconds, now=now, free_step=True, next_step=True
    )
