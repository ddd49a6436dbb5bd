"""Steps chosen for the integrations: ``put_next`` (the step is taken inside the
write transaction, so concurrent writers never collide nor retry), and the keyed
names of their turns."""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from .errors import InvalidArgumentError, StoreBusyError
from .principal import Principal
from .store import Entry, Scratchpad, listed, parts, sqlite_of

__all__ = ["keyed_or_former", "keyed_turn_name", "newest_entry", "newest_first", "put_next", "writer_lock"]


# Per open store, the lock the integrations' writes take (``writer_lock``).
_WRITERS: weakref.WeakKeyDictionary[Scratchpad, _Writers] = weakref.WeakKeyDictionary()
_WRITERS_LOCK = threading.Lock()


class _Writers:
    """One store's writer lock, waited for as long as SQLite waits for its write lock:
    a write queued behind others raises StoreBusyError when that wait is over, as it
    would on SQLite's lock, rather than after every write ahead of it timed out."""

    def __init__(self, wait_s: float) -> None:
        self._lock = threading.Lock()
        self._wait_s = wait_s

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=self._wait_s):
            raise StoreBusyError("the store's other writers in this process kept it busy; try again")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def writer_lock(pad: Scratchpad) -> AbstractContextManager[Any]:
    """The lock the integrations' writes into ``pad`` take in this process (``put_next``
    and the saver's deletes), on SQLite, which has one writer at a time: LangGraph puts
    a step's checkpoint and writes from several threads, and the Agents SDK each
    session's items from a worker thread, each with a connection of its own, which
    would meet on the write lock and retry after sleeps (``BusyHandler``) where a lock
    hands over at once. PostgreSQL's writers of different owners go on side by side."""
    if parts(pad).db.dialect != "sqlite":
        return contextlib.nullcontext()
    with _WRITERS_LOCK:
        found = _WRITERS.get(pad)
        if found is None:
            found = _WRITERS[pad] = _Writers(sqlite_of(pad).busy_timeout_s)
        return found


def keyed_turn_name(pad: Scratchpad, principal: Principal, *ids: Any) -> str:
    """The keyed digest (hex) naming the turn of ``ids`` (JSON values) for the owner:
    unlike a hash, it cannot be recomputed from a guess of the ids without the store's key."""
    message = json.dumps(list(ids), separators=(",", ":")).encode()
    return parts(pad).keys.counter_seal.turn_name(principal.owner_user_id, message)


def newest_first(
    pad: Scratchpad, principal: Principal, turn_id: str, *, now: float | None = None
) -> Iterator[dict[str, Any]]:
    """The live entries of a turn, highest step first, as ``Scratchpad.list_for_turn``
    shows them, each opened when the iteration reaches it.

    Raises:
        InvalidArgumentError, IntegrityError: as for ``Scratchpad.list_for_turn``.
    """
    for opened in parts(pad).listings.turn_newest_first(principal, turn_id, now):
        yield listed(opened)


def newest_entry(pad: Scratchpad, principal: Principal, turn_id: str, *, now: float | None = None) -> Entry | None:
    """The turn's newest live entry that the principal may see, whole as ``Scratchpad.get``
    returns it (None: none); the turn's rows checked against its head as a listing's
    are, the newest alone opened.

    Raises:
        InvalidArgumentError, IntegrityError, StoreBusyError: as for ``Scratchpad.list_for_turn``.
    """
    opened = parts(pad).opener.newest(principal, turn_id, now)
    return None if opened is None else opened.entry()


def keyed_or_former(
    pad: Scratchpad, principal: Principal, keyed: str, former: str, *, now: float | None = None
) -> tuple[str, bool]:
    """The turn an integration's thread or session lives in, and whether its keyed turn
    holds entries. The former turn only when the keyed one is empty and it is not:
    a former turn never shadows a keyed one with entries (or with entries removed).

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
    identified: bool = True,
) -> dict[str, Any]:
    """``Scratchpad.put`` at the turn's next step; returns ``put``'s view, whose
    ``step_num`` is the step taken. ``identified`` False: the content gets no identity
    and binary content is not hashed (``Putter.put``).

    The step read before sealing (or ``guess``, from a caller that knows it) only
    spares sealing again under the write lock: the write transaction takes the
    step, so a read that fails never makes the put fail.

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
    with writer_lock(pad):
        return found.putter.put(
            principal,
            turn_id,
            guess,
            executor_name,
            observation,
            ttl_seconds,
            now=now,
            free_step=True,
            next_step=True,
            identified=identified,
        )
