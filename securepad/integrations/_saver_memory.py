"""What ``SaverRecords`` remembers between calls, per principal scope (what a
principal finds depends on its scope, not on its owner alone): the threads
found in their keyed turns with their turns' names, the step each turn's last
put took, the entries of the channel values of checkpoints put or read, and
the pending writes known stored. Each is bounded (``KEPT``): past it, it is
forgotten and looked up again. None of it decides what a principal may see:
what is remembered spares a read or a sealing again, nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from ..principal import Principal
from ..store import Scratchpad

__all__ = ["KEPT", "ChannelValues", "KnownWrites", "SaverMemory", "Scope", "Stored", "WritesKey", "scope_of"]

# How many of each thing a saver remembers before it forgets them all.
KEPT = 4096
# A principal's scope (``Policy.scope_columns``: the owner, and the channel and
# actor the policy names): what the saver remembers is what a scope finds, so it
# is kept per scope, never per owner alone.
Scope = tuple[tuple[str, str], ...]


# The last scope found, with its policy and principal (both frozen: the same objects, the same
# scope): a saver's calls come from one principal mostly, and a call asks several times.
_LAST_SCOPE: list[tuple[Any, Any, Scope]] = [(None, None, ())]


def scope_of(pad: Scratchpad, principal: Principal) -> Scope:
    """The key of what the saver remembers for ``principal``."""
    policy, last = pad.policy, _LAST_SCOPE[0]
    if last[1] is principal and last[0] is policy:
        return last[2]
    scope = tuple(policy.scope_columns(principal))
    _LAST_SCOPE[0] = (policy, principal, scope)
    return scope


@dataclass(frozen=True)
class Stored:
    """An entry as ``list_for_turn`` shows it: id, expiry and the sealed metadata,
    whole or (``whole`` False) the leading fields the listing's view kept."""

    scratchpad_id: str
    expires_at: float
    meta: dict[str, Any]
    whole: bool = True
    step_num: int = 0
    # What the entry holds, when it was read whole with it (``SaverRecords.newest``).
    data: bytes | None = None


# Where pending writes are known (``SaverMemory.known_writes``): a checkpoint's own turn (format 1),
# or its thread's turn, namespace and id (format 2).
WritesKey = str | tuple[str, str, str]
# (channel, version) -> the entry of the channel's value, or None when the value was inline.
ChannelValues = dict[tuple[str, str], Stored | None]


@dataclass
class KnownWrites:
    """Pending writes known stored in one writes turn (``SaverMemory.known_writes``):
    each task's write indexes, the turn's newest step (the next put's guess),
    and a time that every one of them outlives by a TTL."""

    tasks: dict[str, frozenset[int]]
    newest: int
    since: float


class SaverMemory:
    """What one saver remembers, for any principal (see the module doc)."""

    def __init__(self, pad: Scratchpad, ttl_seconds: int) -> None:
        self.pad = pad
        self.ttl_seconds = ttl_seconds
        self._lock = threading.Lock()
        # (scope, thread) whose checkpoints were found in the thread's keyed turn.
        self._keyed: set[tuple[Scope, str]] = set()
        # (scope, kind, thread, parts...) -> the turn's name, for threads found keyed:
        # naming a turn is an HMAC, which every call of a graph step would otherwise pay.
        self._names: dict[tuple[Any, ...], str] = {}
        # (scope, turn) -> the step this saver's last put in it took: the next put's guess.
        self._last_steps: dict[tuple[Scope, str], int] = {}
        # (scope, turn) -> the highest step this saver's puts in it took, and that entry's
        # executor (puts from several threads end in any order).
        self._tops: dict[tuple[Scope, str], tuple[int, str]] = {}
        # (scope, thread, ns) -> the channel values of checkpoints put or read there, and
        # the (channel, version) among them that were inline (their value None), as a set.
        self._values: dict[tuple[Scope, str, str], ChannelValues] = {}
        self._inline: dict[tuple[Scope, str, str], set[tuple[str, str]]] = {}
        # (scope, where) -> the pending writes known stored there (``WritesKey``).
        self._writes: dict[tuple[Scope, WritesKey], KnownWrites] = {}

    # -- threads and turns -----------------------------------------------------------

    def keyed(self, principal: Principal, thread_id: str) -> bool:
        """Whether the thread was found in its keyed turn."""
        return (scope_of(self.pad, principal), thread_id) in self._keyed

    def found_keyed(self, principal: Principal, thread_id: str) -> None:
        """Remember that the thread was found in its keyed turn."""
        with self._lock:
            if len(self._keyed) >= KEPT:
                self._keyed.clear()
            self._keyed.add((scope_of(self.pad, principal), thread_id))

    def name(self, principal: Principal, kind: str, thread_id: str, parts: tuple[Any, ...]) -> str | None:
        """The remembered keyed name of a turn (None: not remembered)."""
        return self._names.get((scope_of(self.pad, principal), kind, thread_id, *parts))

    def named(self, principal: Principal, kind: str, thread_id: str, parts: tuple[Any, ...], name: str) -> None:
        """Remember a turn's keyed name, for a thread found keyed and parts that
        are strings (the name is of their JSON: 1 and "1" name two turns)."""
        if not all(type(part) is str for part in parts) or not self.keyed(principal, thread_id):
            return
        with self._lock:
            if len(self._names) >= KEPT:
                self._names.clear()
            self._names[(scope_of(self.pad, principal), kind, thread_id, *parts)] = name

    def last_step(self, principal: Principal, turn: str) -> int | None:
        """The step this saver's last put in ``turn`` took (None: none remembered)."""
        return self._last_steps.get((scope_of(self.pad, principal), turn))

    def top_executor(self, principal: Principal, turn: str) -> str | None:
        """The executor of the entry at the highest step this saver's puts in ``turn``
        took (None: none remembered): a hint of what the turn's newest entry is."""
        found = self._tops.get((scope_of(self.pad, principal), turn))
        return None if found is None else found[1]

    def took_step(self, principal: Principal, turn: str, step: int, executor: str) -> None:
        """Remember the step a put of an ``executor`` entry in ``turn`` took."""
        key = (scope_of(self.pad, principal), turn)
        with self._lock:
            if len(self._last_steps) >= KEPT:
                self._last_steps.clear()
                self._tops.clear()
            self._last_steps[key] = step
            if step >= self._tops.get(key, (0, ""))[0]:
                self._tops[key] = (step, executor)

    # -- channel values --------------------------------------------------------------

    def channel_values(self, principal: Principal, thread_id: str, ns: str) -> ChannelValues:
        """The thread's channel values in ``ns`` that the saver put or read:
        (channel, version) -> the value's entry, or None when the value was
        inline (it fits the checkpoint's entry). Versions are unique per write,
        so no writer stores another value under one."""
        key = (scope_of(self.pad, principal), thread_id, ns)
        found = self._values.get(key)
        if found is None:
            with self._lock:
                if len(self._values) >= KEPT:
                    self._values.clear()
                    self._inline.clear()
                found = self._values.setdefault(key, {})
        return found

    def inline_values(self, principal: Principal, thread_id: str, ns: str) -> AbstractSet[tuple[str, str]]:
        """The (channel, version) that ``channel_values`` knows inline (None), as a set."""
        return self._inline.get((scope_of(self.pad, principal), thread_id, ns)) or frozenset()

    def keep_channel_values(
        self, principal: Principal, thread_id: str, ns: str, kept: ChannelValues, still: Iterable[Any] = ()
    ) -> None:
        """Remember ``kept`` with the thread's channel values in ``ns``; past
        ``KEPT`` versions, only ``kept`` and ``still`` ((channel, version) known
        inline already, which a checkpoint put just now had unchanged)."""
        key = (scope_of(self.pad, principal), thread_id, ns)
        with self._lock:
            known = self._values.setdefault(key, {})
            inline = self._inline.setdefault(key, set())
            if len(known) + len(kept) > KEPT:
                still = list(still)
                known.clear()
                known.update(dict.fromkeys(still))
                inline.clear()
                inline.update(still)
            known.update(kept)
            inline.update(k for k, v in kept.items() if v is None)
            inline.difference_update(k for k, v in kept.items() if v is not None)

    def forget(self, gone: set[str]) -> None:
        """Forget the value entries ``gone`` (deleted), and every known write
        (a deleted checkpoint's writes are gone with it)."""
        with self._lock:
            for known in self._values.values():
                for key in [k for k, v in known.items() if v is not None and v.scratchpad_id in gone]:
                    del known[key]
            self._writes.clear()

    # -- pending writes --------------------------------------------------------------

    def known_writes(self, principal: Principal, turn: WritesKey, now: float) -> KnownWrites | None:
        """The pending writes this saver stored in a writes turn (with those it
        listed there), while each of them is surely live; None: none known.
        Another writer's may be missing: it only spares storing a write again,
        and ``SaverRecords.pending_writes`` resolves a write stored twice as
        ``put_writes`` would."""
        known = self._writes.get((scope_of(self.pad, principal), turn))
        return known if known is not None and now < known.since + self.ttl_seconds else None

    def note_writes(
        self, principal: Principal, turn: WritesKey, known: KnownWrites, task_id: str, idxs: list[int]
    ) -> None:
        """Remember the pending writes of a writes turn: ``known`` (what was known
        or listed before the put) and the task's ``idxs`` just put at step
        ``known.newest``, with what another thread of this saver noted meanwhile."""
        key = (scope_of(self.pad, principal), turn)
        with self._lock:
            if len(self._writes) >= KEPT:
                self._writes.clear()
            tasks = dict(known.tasks)
            newest, since = known.newest, known.since
            current = self._writes.get(key)
            if current is not None:
                for each, stored in current.tasks.items():
                    tasks[each] = tasks.get(each, frozenset()) | stored
                newest, since = max(newest, current.newest), min(since, current.since)
            tasks[task_id] = tasks.get(task_id, frozenset()) | frozenset(idxs)
            self._writes[key] = KnownWrites(tasks, newest, since)
