"""Turn inventories already verified against their heads, kept between reads.

A read of a turn checks what it returns against the turn's authenticated
inventory (``heads.Heads.checked``). Recounting the inventory costs time
linear in the turn; this cache keeps, per turn, the inventory last verified
(a ``Head``) with a **freshness token** read in the same snapshot: a later
read whose token is the same checks its rows against the cached ``Head`` and
fetches no inventory. What a token proves, and what it trusts, is the
business of ``heads`` and SECURITY.md ("Tampering: the turn heads"); this module only keeps
the entries: bounded (least recently used first out, by turns and by rows),
safe to share between threads, and emptied in a forked child.

Every entry belongs to a **scope**: the SQLite connection whose data version
its token holds (a data version compares only with one of the same
connection), or None on PostgreSQL (the token is the server's snapshot and
its own digest of the rows, the same for every connection to that server).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .head_tally import Head

__all__ = ["CACHE_ROWS", "CACHE_TURNS", "HeadCache", "Verified"]

# Turns kept at most, and inventory rows (entries, checkpoints, marks) over all of them:
# a 1,000-step turn's inventory is about 200 KB of Python objects.
CACHE_TURNS = 256
CACHE_ROWS = 200_000

_Key = tuple[int, str, str]


@dataclass(frozen=True)
class Verified:
    """A turn's inventory as verified, and the token of the snapshot it was verified in."""

    token: tuple[Any, ...]
    head: Head
    scope: Callable[[], object]

    @property
    def rows(self) -> int:
        return len(self.head.e) + len(self.head.c) + len(self.head.m)


class HeadCache:
    """Verified inventories by (scope, owner, turn): least recently used first out."""

    def __init__(self, turns: int = CACHE_TURNS, rows: int = CACHE_ROWS) -> None:
        self._turns = turns
        self._rows = rows
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        # A new lock in a forked child: one held by another thread at the fork would never be released.
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, Verified] = OrderedDict()
        self._by_owner: dict[tuple[int, str], set[str]] = {}
        self._held = 0

    def _forked(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def limit(self, turns: int, rows: int = CACHE_ROWS) -> None:
        """Keep at most ``turns`` turns and ``rows`` rows (0 turns: keep nothing, every read recounts)."""
        self._forked()
        with self._lock:
            self._turns, self._rows = turns, rows
            self._evict()

    @property
    def enabled(self) -> bool:
        """Whether anything is kept (``limit`` above 0 turns)."""
        return self._turns > 0

    def get(self, scope: object, owner: str, turn_id: str) -> Verified | None:
        """The turn's entry in ``scope``, if any (the caller compares its token)."""
        self._forked()
        key = (id(scope), owner, turn_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.scope() is not scope:  # another object that got the same id
                self._remove(key)
                return None
            self._entries.move_to_end(key)
            return entry

    def listing(self, scope: object, owner: str, entry_id: str) -> Verified | None:
        """The entry of one of the owner's turns in ``scope`` that lists the entry ``entry_id``, if any."""
        self._forked()
        with self._lock:
            turns = list(self._by_owner.get((id(scope), owner), ()))
        for turn_id in turns:
            entry = self.get(scope, owner, turn_id)
            if entry is not None and entry_id in entry.head.e:
                return entry
        return None

    def put(self, scope: object, owner: str, turn_id: str, token: tuple[Any, ...], head: Head) -> None:
        self._forked()
        if self._turns <= 0:
            return
        ref: Callable[[], object] = (lambda: None) if scope is None else weakref.ref(scope)
        entry = Verified(token, head, ref)
        key = (id(scope), owner, turn_id)
        with self._lock:
            self._remove(key)
            self._entries[key] = entry
            self._by_owner.setdefault((id(scope), owner), set()).add(turn_id)
            self._held += entry.rows
            self._evict()

    def drop(self, owner: str, turn_id: str) -> None:
        """Forget the turn in every scope (a write of this process changes it)."""
        self._forked()
        with self._lock:
            for key in [key for key in self._entries if key[1:] == (owner, turn_id)]:
                self._remove(key)

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._held -= entry.rows
        turns = self._by_owner.get(key[:2])
        if turns is not None:
            turns.discard(key[2])
            if not turns:
                del self._by_owner[key[:2]]

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self._turns or self._held > self._rows):
            self._remove(next(iter(self._entries)))
