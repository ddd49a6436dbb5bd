"""A bounded, thread-safe mapping that forgets the least recently used key first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["LRUCache"]

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """At most ``maxsize`` items; a ``get`` or a ``put`` makes its key the most recent.

    The store's owner-key caches use it (they kept every owner ever
    seen, ~2.7 KB each): an owner evicted here costs one unwrap (one indexed
    query and one AES-GCM open) on its next use.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        # No lock: each OrderedDict call is one step under the GIL, and nothing here
        # iterates the items while calling Python code (``discard_if`` copies the keys first).
        items = self._items
        value = items.get(key)
        if value is not None:
            try:  # noqa: SIM105 (suppress() is a context manager: more work than the get)
                items.move_to_end(key)
            except KeyError:  # another thread dropped it meanwhile: the value found stands
                pass
        return value

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._items.pop(key, None)

    def discard_if(self, doomed: Callable[[K], bool]) -> None:
        """Drop every key for which ``doomed(key)`` is true."""
        with self._lock:
            for key in list(self._items):
                if doomed(key):
                    self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)
