"""The owner's threads, listed for ``SecurepadSaver.list(None)`` and
``delete_for_runs`` (``ThreadList``): one entry per thread in the owner's turn
``securepad.langgraph:threads``."""

from __future__ import annotations

import threading

from ..principal import Principal
from ._saver_records import FORMAT, THREAD, THREAD_CHOICE, SaverRecords, Scope, scope_of, turn_id

__all__ = ["ThreadList"]

# The owner's thread list's turn (the same for every owner: each owner's turns are its own).
THREADS_TURN = turn_id("threads")


class ThreadList:
    """Each owner's threads, in the turn ``securepad.langgraph:threads`` (for
    ``delete_for_runs`` and ``list(None)``), cached with each entry's expiry
    per principal scope (an actor or channel the policy's scope names lists
    its own entries of the list only)."""

    def __init__(self, records: SaverRecords) -> None:
        self.records = records
        self._lock = threading.Lock()
        # the principal's scope -> {thread_id: expiry of its entry in the owner's thread list}:
        # what a principal finds in the list depends on its scope, not on its owner alone.
        self._threads: dict[Scope, dict[str, float]] = {}

    def of(self, principal: Principal) -> dict[str, float]:
        """The owner's threads in the principal's scope, each with the expiry of its entry in the list."""
        scope = scope_of(self.records.pad, principal)
        with self._lock:
            known = self._threads.get(scope)
        if known is None:
            known = {}
            for stored in self.records.listed(principal, THREADS_TURN, THREAD, THREAD_CHOICE):
                tid = stored.meta["thread_id"]
                known[tid] = max(known.get(tid, 0.0), stored.expires_at)
            with self._lock:
                self._threads[scope] = known
        return known

    def register(self, principal: Principal, thread_id: str, now: float) -> None:
        """Note the thread in the owner's list (once), and keep the list alive."""
        known = self.of(principal)
        expires = known.get(thread_id)
        ttl = self.records.ttl_seconds
        if expires is not None and expires - now >= ttl / 2:
            return  # listed, and alive for a while yet
        if expires is None:
            entry = {"content": thread_id.encode(), "metadata": {"format": FORMAT, "thread_id": thread_id}}
            self.records.put(principal, THREADS_TURN, THREAD, entry, ttl, now)
            expires = now + ttl
        else:
            with self.records.writing:
                self.records.pad.extend_turn(principal, THREADS_TURN, ttl, now=now)
            with self._lock:
                for tid in known:
                    known[tid] = max(known[tid], now + ttl)
            expires = now + ttl
        with self._lock:
            known[thread_id] = expires

    def unregister(self, principal: Principal, thread_id: str) -> None:
        """Take the thread out of the owner's list."""
        for stored in self.records.listed(principal, THREADS_TURN, THREAD, THREAD_CHOICE):
            if stored.meta["thread_id"] == thread_id:
                self.records.delete(principal, stored.scratchpad_id)
        with self._lock:
            self._threads.get(scope_of(self.records.pad, principal), {}).pop(thread_id, None)
