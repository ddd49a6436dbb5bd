"""``SecurepadSaver.put_writes``: a task's pending writes as one entry, in the
turn its checkpoint's format names (format 2: the thread's turn, a step of
the thread like any other, never a turn of its own; format 1: the checkpoint's
own turn), placed as ``_saver_order.Arrivals`` says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..errors import IntegrityError
from ..principal import Principal
from ._saver_memory import KnownWrites, WritesKey
from ._saver_order import EARLY
from ._saver_records import FORMAT, WRITE, Loads, SaverRecords, Stored, sealed

__all__ = ["pending_writes", "put_writes", "write_items"]


def put_writes(
    records: SaverRecords,
    serde: SerializerProtocol,
    principal: Principal,
    where: tuple[str, str, str],
    task: tuple[str, str],
    writes: Sequence[tuple[str, Any]],
    now: float,
) -> None:
    """Store the writes of ``task`` (id, path) for the checkpoint ``where`` (thread,
    namespace, id) with ``serde``, as ``SecurepadSaver.put_writes`` documents."""
    thread_id, ns, checkpoint_id = where
    arrivals = records.arrivals
    key = arrivals.where(principal, thread_id, ns, checkpoint_id)
    place = arrivals.place(key)
    found = None
    if place is None:  # a checkpoint this saver has not met: looked for in the store
        found = records.checkpoint(principal, thread_id, ns, checkpoint_id)
        if found is not None:
            arrivals.stored(key, found[0].meta["format"])
        place = arrivals.place(key, absent=found is None)
    step = None
    try:
        if place == 1:
            turn = records.turn(principal, "writes", thread_id, ns, checkpoint_id)
            step = _put(records, serde, principal, (turn, turn, True), where, task, writes, now, listing=None)
        else:
            turn = records.turn(principal, "thread", thread_id)
            known_key = (turn, ns, checkpoint_id)
            listing = [] if place == EARLY else (found[1] if found is not None else None)
            step = _put(records, serde, principal, (turn, known_key, False), where, task, writes, now, listing=listing)
    finally:
        if place == EARLY:
            arrivals.early_done(key, step)


def _put(
    records: SaverRecords,
    serde: SerializerProtocol,
    principal: Principal,
    into: tuple[str, WritesKey, bool],
    where: tuple[str, str, str],
    task: tuple[str, str],
    writes: Sequence[tuple[str, Any]],
    now: float,
    *,
    listing: list[Stored] | None,
) -> int | None:
    """Put the task's fresh writes in ``into`` (the turn, the key of what is known
    there, whether the turn is the checkpoint's own); returns the step taken (None:
    nothing new). ``listing``: the checkpoint's write entries when already found."""
    turn, known_key, own_turn = into
    task_id = task[0]
    # A write stored twice counts once (``pending_writes`` resolves it as this does), so
    # the writes are listed only for a special write that may replace a stored one, to
    # remove an entry it wholly replaces. The writes this saver stored are known.
    known = records.memory.known_writes(principal, known_key, now)
    if known is not None or listing == [] or all(WRITES_IDX_MAP.get(channel, 0) >= 0 for channel, _ in writes):
        known = known or KnownWrites({}, 0, now)
        fresh = _fresh_writes(writes, known.tasks.get(task_id, frozenset()))
        if not fresh:
            return None
        if not fresh.keys() & known.tasks.get(task_id, frozenset()):
            items = [[idx, channel, value] for idx, (channel, value) in sorted(fresh.items())]
            return _store(records, serde, principal, (turn, known_key, own_turn), where, task, items, known, now)
    listed = listing if listing is not None else _listed(records, principal, where, own_turn)
    mine = [s for s in listed if s.meta["task_id"] == task_id]
    fresh = _fresh_writes(writes, frozenset(idx for s in mine for idx in s.meta["idxs"]))
    if not fresh:
        return None
    # A special write replaces a stored one by being newer (``pending_writes`` takes the
    # newest): it goes in an entry of its own, and an entry all of whose writes it
    # replaces is removed. A stored ordinary write never moves to a newer step, where
    # another writer's copy of its index could come before it.
    stale = [s for s in mine if set(s.meta["idxs"]) <= fresh.keys()]
    items = [[idx, channel, value] for idx, (channel, value) in sorted(fresh.items())]
    tasks: dict[str, frozenset[int]] = {}
    for entry in listed:
        if entry not in stale:
            tasks[entry.meta["task_id"]] = tasks.get(entry.meta["task_id"], frozenset()) | set(entry.meta["idxs"])
    # Every entry listed lives until its expiry: what is known of them holds a TTL before the first's.
    since = min((s.expires_at - records.ttl_seconds for s in listed), default=now)
    known = KnownWrites(tasks, max((s.step_num for s in listed), default=0), since)
    step = _store(records, serde, principal, (turn, known_key, own_turn), where, task, items, known, now)
    for entry in stale:
        records.delete(principal, entry.scratchpad_id)
    return step


def _listed(records: SaverRecords, principal: Principal, where: tuple[str, str, str], own_turn: bool) -> list[Stored]:
    """The checkpoint's write entries as they are stored now."""
    thread_id, ns, checkpoint_id = where
    if own_turn:
        return records.writes(principal, thread_id, ns, checkpoint_id)
    found = records.checkpoint(principal, thread_id, ns, checkpoint_id)
    return [] if found is None else records.writes_for(principal, thread_id, *found)


def _store(
    records: SaverRecords,
    serde: SerializerProtocol,
    principal: Principal,
    into: tuple[str, WritesKey, bool],
    where: tuple[str, str, str],
    task: tuple[str, str],
    items: list[list[Any]],
    known: KnownWrites,
    now: float,
) -> int:
    """Put one task's pending writes (``[idx, channel, value]``) for the checkpoint
    ``where`` (thread, namespace, id) in ``into``, and remember them with what was
    ``known`` there (see ``SaverMemory.known_writes``); returns the step taken."""
    turn, known_key, own_turn = into
    thread_id, ns, checkpoint_id = where
    kind, data = serde.dumps_typed(items)
    idxs = [idx for idx, _, _ in items]
    meta = {
        "format": 1 if own_turn else FORMAT,
        "thread_id": thread_id,
        "ns": ns,
        "checkpoint_id": checkpoint_id,
        "task_id": task[0],
        "task_path": task[1],
        "idxs": idxs,
        "type": kind,
    }
    # In the checkpoint's own turn, the turn's newest step is the guess; in the thread's,
    # the step this saver's last put there took. The saver alone reads the writes back:
    # they are put unidentified, as its checkpoints and big values are.
    guess = known.newest if own_turn else None
    observation = sealed(meta, data, records.pad.policy.inline_max_chars)
    view = records.put(principal, turn, WRITE, observation, records.ttl_seconds, now, guess, identified=False)
    step = int(view["step_num"])
    records.memory.note_writes(principal, known_key, KnownWrites(known.tasks, step, known.since), task[0], idxs)
    return step


def _fresh_writes(writes: Sequence[tuple[str, Any]], stored: frozenset[int]) -> dict[int, tuple[str, Any]]:
    """The writes (by index) that ``put_writes`` stores: those whose index is not
    ``stored`` yet, and every special one (negative index, which replaces)."""
    fresh: dict[int, tuple[str, Any]] = {}
    for index, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, index)
        if idx < 0 or idx not in stored:
            fresh[idx] = (channel, value)
    return fresh


def pending_writes(
    records: SaverRecords, principal: Principal, entries: list[Stored], loads: Loads
) -> list[tuple[str, str, Any]]:
    """A checkpoint's pending write ``entries`` (in step order) as LangGraph wants
    them: (task id, channel, value), in the order it applies them; ``loads`` is
    the saver's ``serde.loads_typed``."""
    found: dict[tuple[str, int], tuple[tuple[str, str, int], tuple[str, str, Any]]] = {}
    for stored in entries:
        meta = stored.meta
        for idx, channel, value in write_items(records, principal, stored, loads):
            # A write stored twice (by two writers) counts as put_writes keeps it: the
            # first, except a special write (negative index), which the newer replaces.
            task_id = meta["task_id"]
            if idx >= 0 and (task_id, idx) in found:
                continue
            found[task_id, idx] = ((meta["task_path"], task_id, idx), (task_id, channel, value))
    # LangGraph applies a step's writes in this order (see langgraph's writes_sort_key).
    return [write for _, write in sorted(found.values(), key=lambda pair: pair[0])]


def write_items(
    records: SaverRecords, principal: Principal, stored: Stored, loads: Loads
) -> list[tuple[int, str, Any]]:
    """The (idx, channel, value) writes of one put_writes entry."""
    meta, data = records.opened(principal, stored, "a pending write")
    found = [(int(idx), str(channel), value) for idx, channel, value in loads((meta["type"], data))]
    if [idx for idx, _, _ in found] != meta["idxs"]:
        raise IntegrityError("a pending write entry does not hold the writes its metadata names")
    return found
