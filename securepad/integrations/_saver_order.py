"""Where a checkpoint's pending writes go, as one saver knows it (``Arrivals``).

A checkpoint of format 2 finds its pending writes in its thread's turn from
its ``writes_from`` step up (``_saver_records``). A write put once the
checkpoint is stored takes a step above it. LangGraph's loop also puts a
step's writes while that step's checkpoint is still on its way (its puts run
in background threads, the checkpoint's after its parent's): such an early
write takes a step below the checkpoint, and the saver's put of the
checkpoint seals the lowest of those steps as its ``writes_from``, after
waiting for the early writes still being put. The two meet here, per
principal scope: what is remembered only chooses where a write goes and
spares a read; what a principal may see is the store's decision.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..principal import Principal
from ..store import Scratchpad
from ._saver_memory import KEPT, Scope, scope_of

__all__ = ["EARLY", "Arrivals", "Where"]

# ``Arrivals.place``: the checkpoint is not stored yet; the write goes below it.
EARLY = 0
# (scope, thread, namespace, checkpoint id)
Where = tuple[Scope, str, str, str]


@dataclass
class _Early:
    """The early writes of one checkpoint: how many are being put, and the steps put."""

    putting: int = 0
    steps: list[int] = field(default_factory=list)


class Arrivals:
    """Which checkpoints one saver knows stored (with their format), which it is
    putting, and the early writes of those not stored yet."""

    def __init__(self, pad: Scratchpad) -> None:
        self.pad = pad
        self._changed = threading.Condition()
        self._stored: dict[Where, int] = {}
        # (scope, thread, namespace) -> the newest checkpoint id known stored there.
        self._newest: dict[tuple[Scope, str, str], str] = {}
        self._putting: set[Where] = set()
        self._early: dict[Where, _Early] = {}

    def where(self, principal: Principal, thread_id: str, ns: str, checkpoint_id: str) -> Where:
        return (scope_of(self.pad, principal), thread_id, ns, checkpoint_id)

    def stored(self, where: Where, format_: int, *, newest: bool = False) -> None:
        """Note a checkpoint found stored, with its format; ``newest``: it was read
        as its thread's latest in its namespace."""
        if self._stored.get(where) == format_ and (not newest or self._newest.get(where[:3]) == where[3]):
            return  # known so already
        with self._changed:
            self._note(where, format_, newest)

    def none_stored(self, principal: Principal, thread_id: str, ns: str) -> None:
        """Note that the thread had no checkpoint in ``ns`` when its latest was read:
        the checkpoints put there next are on their way."""
        with self._changed:
            self._newest.setdefault((scope_of(self.pad, principal), thread_id, ns), "")

    def _note(self, where: Where, format_: int, newest: bool) -> None:
        if len(self._stored) >= KEPT:
            self._stored.clear()
            self._newest.clear()
        self._stored[where] = format_
        known = self._newest.get(where[:3])
        if newest or (known is not None and where[3] > known):
            self._newest[where[:3]] = where[3]

    def place(self, where: Where, absent: bool = False) -> int | None:
        """The format of a stored checkpoint (its writes go where it says), or
        ``EARLY`` (the write is early: ``early_done`` must follow its put), or
        None: unknown, the caller looks in the store and asks again with
        ``absent`` when it is not there. A checkpoint this saver is putting is
        waited for. One newer than the newest this saver put or read as the
        latest of its thread and namespace is on its way: LangGraph's loop reads
        a thread's latest before it goes on, and puts its next checkpoints itself."""
        with self._changed:
            while where in self._putting:
                self._changed.wait()
            if (found := self._stored.get(where)) is not None:
                return found
            newest = self._newest.get(where[:3])
            if not absent and (newest is None or where[3] <= newest):
                return None
            if len(self._early) >= KEPT:
                for key in [k for k, e in self._early.items() if not e.putting]:
                    del self._early[key]
            self._early.setdefault(where, _Early()).putting += 1
            return EARLY

    def early_done(self, where: Where, step: int | None) -> None:
        """An early write of ``where`` was put at ``step`` (None: its put failed)."""
        with self._changed:
            early = self._early.setdefault(where, _Early())
            early.putting -= 1
            if step is not None:
                early.steps.append(step)
            self._changed.notify_all()

    def begin_put(self, where: Where) -> int | None:
        """Start putting the checkpoint ``where``: once its early writes being put
        are in, the lowest step of its early writes (None: none; 1 for a
        checkpoint this saver knows stored already), which its entry seals. A
        write for it from now on waits for ``end_put``."""
        with self._changed:
            while where in self._putting or self._early.get(where, _Early()).putting:
                self._changed.wait()
            self._putting.add(where)
            if where in self._stored:  # put again: its writes may be anywhere above the first
                return 1
            early = self._early.get(where)
            return min(early.steps) if early is not None and early.steps else None

    def end_put(self, where: Where, stored: Any) -> None:
        """The put of ``where`` is over: ``stored`` is its format (None: it failed,
        and its early writes stay early for another put of it)."""
        with self._changed:
            self._putting.discard(where)
            if stored is not None:
                self._early.pop(where, None)
                self._note(where, stored, True)
            self._changed.notify_all()

    def forget(self) -> None:
        """Forget the stored checkpoints (some were deleted)."""
        with self._changed:
            self._stored.clear()
            self._newest.clear()
