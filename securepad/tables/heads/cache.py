"""Turn inventories already verified against their heads, kept between reads.

Bounded (least recently used first out, by turns and by rows), safe to share
between threads, emptied in a forked child. Each owner has a bounded share:
an owner that holds more gives up its own entries before one that holds less,
so a tenant flooding the cache evicts only its own. An entry belongs to a
scope: the SQLite connection whose data version its token holds, or None.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .tally import Head

__all__ = ["CACHE_ROWS", "CACHE_TURNS", "HeadCache", "Verified"]

# Turns kept at most, and inventory rows over all of them.
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


@dataclass
class _Share:
    """One owner's entries, least recently used first, and what they hold."""

    keys: OrderedDict[_Key, None] = field(default_factory=OrderedDict)
    rows: int = 0


class HeadCache:
    """Verified inventories by (scope, owner, turn), bounded per owner."""

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
        self._shares: dict[str, _Share] = {}
        self._held = 0

    def _forked(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def limit(self, turns: int, rows: int = CACHE_ROWS) -> None:
        """Keep at most ``turns`` turns and ``rows`` rows (0 turns: keep nothing, every read recounts)."""
        self._forked()
        with self._lock:
            self._turns, self._rows = turns, rows
            self._evict(None)

    @property
    def enabled(self) -> bool:
        """Whether anything is kept (``limit`` above 0 turns)."""
        return self._turns > 0

    def held(self, owner: str) -> tuple[int, int]:
        """The turns and rows the owner's entries hold."""
        with self._lock:
            share = self._shares.get(owner)
            return (0, 0) if share is None else (len(share.keys), share.rows)

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
            self._shares[owner].keys.move_to_end(key)
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
            share = self._shares.setdefault(owner, _Share())
            share.keys[key] = None
            share.rows += entry.rows
            self._held += entry.rows
            self._evict(owner)

    def drop(self, owner: str, turn_id: str) -> None:
        """Forget the turn in every scope (a write of this process changes it)."""
        self.take(None, owner, turn_id)

    def take(self, scope: object, owner: str, turn_id: str) -> Verified | None:
        """Forget the turn in every scope; its entry in ``scope``, if any (for a write to edit and put back)."""
        self._forked()
        found = None
        with self._lock:
            share = self._shares.get(owner)
            for key in [key for key in share.keys if key[2] == turn_id] if share is not None else []:
                entry = self._entries[key]
                if key[0] == id(scope) and scope is not None and entry.scope() is scope:
                    found = entry
                self._remove(key)
        return found

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._held -= entry.rows
        share = self._shares[key[1]]
        del share.keys[key]
        share.rows -= entry.rows
        if not share.keys:
            del self._shares[key[1]]
        turns = self._by_owner.get(key[:2])
        if turns is not None:
            turns.discard(key[2])
            if not turns:
                del self._by_owner[key[:2]]

    def _evict(self, owner: str | None) -> None:
        """Within the bounds again after ``owner`` (None: nobody) added an entry."""
        share = None if owner is None else self._shares.get(owner)
        while self._entries:
            over_turns, over_rows = len(self._entries) > self._turns, self._held > self._rows
            if not (over_turns or over_rows):
                return
            oldest = next(iter(self._entries))
            if share is not None and share.keys and oldest[1] != owner:
                other = self._shares[oldest[1]]
                if (over_turns and len(other.keys) < len(share.keys)) or (over_rows and other.rows < share.rows):
                    # The newcomer's owner holds more: the owner that holds the most gives up its own
                    # least recently used entry (the newcomer's owner, or one holding more still).
                    biggest = max(self._shares.values(), key=lambda each: len(each.keys) if over_turns else each.rows)
                    oldest = next(iter(biggest.keys))
            self._remove(oldest)
