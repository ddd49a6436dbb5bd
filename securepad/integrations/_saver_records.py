"""The sealed records under ``SecurepadSaver``: checkpoints, pending writes,
channel values (blobs) and the owner's thread list as securepad entries.

This layer knows where each record lives (its turn, its executor, the
format that decides where a checkpoint's writes are), checks that what it
lists or opens is the saver's own record for the place it was found, and
deletes (``_saver_values`` keeps big values alive, ``_saver_threads`` the
thread list). It handles
bytes and sealed metadata only: the serializer (``serde``) belongs to the
saver's face, which LangGraph may clone with another one
(``BaseCheckpointSaver.with_allowlist``). See ``langgraph_saver`` for the
layout.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .._steps import keyed_or_former, keyed_turn_name, newest_entry, newest_first, put_next, writer_lock
from ..errors import ExpiredError, IntegrityError, NotFoundError
from ..principal import Principal
from ..store import Scratchpad
from ._saver_memory import SaverMemory, Scope, Stored, scope_of
from ._saver_order import Arrivals

__all__ = [
    "BLOB",
    "CHECKPOINT",
    "FORMAT",
    "FORMATS",
    "THREAD",
    "THREAD_CHOICE",
    "TURN_PREFIX",
    "VALUE_CHOICE",
    "WRITE",
    "WRITES_FROM",
    "Loads",
    "SaverRecords",
    "Scope",
    "Stored",
    "expect",
    "highest",
    "keyed_turn",
    "newest_of",
    "scope_of",
    "sealed",
    "turn_id",
    "writes_floor",
    "writes_of",
]

# Every turn the saver uses starts with this; see SECURITY.md for what it reserves.
TURN_PREFIX = "securepad.langgraph:"
# Checkpoints and writes serialized at most this large are kept in the entry's
# sealed metadata when its view shows them whole (see sealed); the others are its content.
META_DATA_BYTES = 4 * 1024
# What a saver entry's view shows besides its sealed metadata, at most, as JSON: the id
# the store adds, the step, size, kind and a binary summary (``core.shaping.view``).
VIEW_FRAME_CHARS = 256
CHECKPOINT = "langgraph.checkpoint"
WRITE = "langgraph.write"
BLOB = "langgraph.blob"
THREAD = "langgraph.thread"
# The format the saver writes (2: a checkpoint's pending writes are entries of its
# thread's turn, from its ``writes_from`` step up) and those it reads (1: a
# checkpoint's pending writes are the entries of its own turn, see ``writes_turn``).
FORMAT = 2
FORMATS = (1, 2)
# The leading sealed fields of each kind of entry that choose it (and check where
# it was found); the saver writes them before the rest, the data last (see listed).
CHECKPOINT_CHOICE = ("format", "thread_id", "ns", "checkpoint_id")
# A checkpoint of format 2 also needs this one to choose its writes.
WRITES_FROM = "writes_from"
WRITE_CHOICE = ("format", "thread_id", "ns", "checkpoint_id", "task_id", "task_path", "idxs", "type")
VALUE_CHOICE = ("format", "thread_id", "ns", "channel", "version")
THREAD_CHOICE = ("format", "thread_id")
_JSON_ENCODE = msgspec.json.Encoder().encode
# The saver's ``serde.loads_typed``: (type, serialized form) -> the value.
Loads = Callable[[tuple[str, bytes]], Any]


def turn_id(kind: str, *parts: Any) -> str:
    """The former (unkeyed) name of the turn that holds ``kind`` entries for
    ``parts`` (a thread, a checkpoint, a channel version): a SHA-256 anyone can
    recompute from a guess of the thread id. Threads written before keyed names
    keep it (``SaverRecords.turn``); the owner's thread list, which no caller's
    id names, has it."""
    digest = hashlib.sha256(json.dumps([kind, *parts], separators=(",", ":")).encode()).hexdigest()
    return f"{TURN_PREFIX}{kind}:{digest}"


def keyed_turn(pad: Scratchpad, principal: Principal, kind: str, *parts: Any) -> str:
    """The keyed name of the turn that holds ``kind`` entries for ``parts``, for
    the principal's owner (``_steps.keyed_turn_name``: HMAC under a key derived
    from the store's master key, so a guess of a thread id cannot be tested
    against the file without it)."""
    return f"{TURN_PREFIX}{kind}:keyed:{keyed_turn_name(pad, principal, kind, *parts)}"


def sealed(meta: dict[str, Any], data: bytes, view_chars: int) -> dict[str, Any]:
    """The observation to put: small data travels in the sealed metadata when the
    entry's view, of at most ``view_chars`` (the policy's ``inline_max_chars``), shows it
    whole (a turn's listing then brings it, with no read per entry); else it is the
    content, and the view shows the metadata whole, cut by nothing (cutting a view to
    fit measures each of its fields: the data would be cut from it anyway)."""
    if len(data) <= META_DATA_BYTES and (len(data) + 2) // 3 * 4 < view_chars:
        with_data = {**meta, "data": base64.b64encode(data).decode("ascii")}
        if _json_chars_at_most(with_data) + VIEW_FRAME_CHARS <= view_chars:
            return {"content": b"", "metadata": with_data}
    return {"content": data, "metadata": meta}


def _json_chars_at_most(value: dict[str, Any]) -> int:
    """``len(json.dumps(value, ensure_ascii=False))``, the size of a view's metadata, or
    more: msgspec's compact JSON (its UTF-8 bytes, at least its characters) and a space
    for each comma and colon in it (json's separators; those in strings count too).
    (A float may be written a character shorter: the view's frame leaves room.)"""
    try:
        encoded = _JSON_ENCODE(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return sys.maxsize  # not measured: the data goes in the content
    return len(encoded) + encoded.count(b",") + encoded.count(b":")


def highest(listed: list[Stored], ns: str, checkpoint_id: str | None) -> Stored | None:
    """The checkpoint of ``ns`` with the highest id among ``listed`` (that id alone when given)."""
    found = [s for s in listed if s.meta["ns"] == ns and checkpoint_id in (None, s.meta["checkpoint_id"])]
    return max(found, key=lambda s: s.meta["checkpoint_id"]) if found else None


def expect(meta: Mapping[str, Any], **fields: Any) -> None:
    """The sealed fields of an entry must name what it was looked up for: an
    entry found elsewhere was moved there, which its turn binding already
    refuses; this also catches the astronomically unlikely hash collision."""
    for name, value in fields.items():
        if name not in meta or meta[name] != value:
            raise IntegrityError(f"a stored entry's sealed {name} does not match where it was found")


def newest_of(
    pad: Scratchpad, principal: Principal, turn: str, executors: tuple[str, ...], now: float, **expected: Any
) -> tuple[str, Stored] | None:
    """The turn's newest live entry, whole (``_steps.newest_entry``: the turn checked
    against its head, the newest alone opened), with its executor, which must be one
    of the saver's ``executors``, its sealed fields ``expected``; None: the turn has none."""
    entry = newest_entry(pad, principal, turn, now=now)
    if entry is None:
        return None
    observation = entry.observation
    meta = observation.get("metadata") if isinstance(observation, dict) else None
    if (
        not isinstance(meta, dict)
        or not isinstance(observation.get("content"), bytes)
        or entry.executor_name not in executors
        or meta.get("format") not in FORMATS
    ):
        raise IntegrityError(f"an entry in the saver's turn {turn} is not one of its {executors} entries")
    expect(meta, **expected)
    data = base64.b64decode(meta["data"]) if "data" in meta else observation["content"]
    stored = Stored(entry.scratchpad_id, float(entry.expires_at), meta, True, int(entry.step_num), data)
    return entry.executor_name, stored


def writes_floor(checkpoint: Stored) -> int:
    """The lowest step of a format 2 checkpoint's pending writes in its thread's turn:
    its ``writes_from`` (the lowest of the writes put before it), else its own step."""
    floor = checkpoint.meta.get(WRITES_FROM)
    return checkpoint.step_num if floor is None else int(floor)


def writes_of(checkpoint: Stored, writes: list[Stored]) -> list[Stored] | None:
    """A checkpoint's pending write entries among its thread's ``writes``, in step
    order: those of its namespace and id from ``writes_floor`` up (a checkpoint of
    format 1: None, its writes are the entries of its own turn)."""
    meta = checkpoint.meta
    if meta["format"] == 1:
        return None
    if not writes:
        return []
    floor, ns, checkpoint_id = writes_floor(checkpoint), meta["ns"], meta["checkpoint_id"]
    mine = [w for w in writes if w.meta["ns"] == ns and w.meta["checkpoint_id"] == checkpoint_id]
    return sorted((w for w in mine if w.step_num >= floor), key=lambda w: w.step_num)


class SaverRecords:
    """Checkpoint, write and value entries of one ``Scratchpad``, for any owner.

    Raises (from every method): ``IntegrityError`` when an entry fails
    authentication, is missing although a checkpoint refers to it, or is not
    the saver's record for where it was found; ``QuotaExceededError`` and
    ``StoreBusyError`` from writes, as for ``Scratchpad.put``.
    """

    def __init__(self, pad: Scratchpad, ttl_seconds: int, clock: Callable[[], float]) -> None:
        self.pad = pad
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        # What the saver remembers between calls (turn names, steps, values, writes).
        self.memory = SaverMemory(pad, ttl_seconds)
        # Which checkpoints this saver knows stored, and their early writes.
        self.arrivals = Arrivals(pad)
        # One of this process's writes into the store at a time (``_steps.writer_lock``).
        self.writing = writer_lock(pad)

    # -- where each record lives ----------------------------------------------------

    def turn(self, principal: Principal, kind: str, thread_id: str, *parts: Any) -> str:
        """The turn of the thread's ``kind`` entries for ``parts``: its keyed name
        (``keyed_turn``), unless the thread was written before keyed names and
        its checkpoints are still in its former turn (``turn_id``): then all of
        the thread's turns keep their former names, so that it reads and takes
        writes as before. A thread found keyed is remembered; one that is not
        is looked for again at each call (a live entry in either turn: two
        small reads), so a thread deleted elsewhere and written again keyed is
        found there. A keyed name is remembered with the thread (parts that
        are strings only: the name is of their JSON)."""
        if (name := self.memory.name(principal, kind, thread_id, parts)) is not None:
            return name
        if self._former(principal, thread_id):
            return turn_id(kind, thread_id, *parts)
        name = keyed_turn(self.pad, principal, kind, thread_id, *parts)
        self.memory.named(principal, kind, thread_id, parts, name)
        return name

    def _former(self, principal: Principal, thread_id: str) -> bool:
        """Whether the thread's checkpoints are in its former (unkeyed) turn and
        not in its keyed one, as the principal's scope finds them (another
        actor's or channel's checkpoints in the keyed turn leave a principal
        outside their scope on the former turn, which holds its own)."""
        if self.memory.keyed(principal, thread_id):
            return False
        former = turn_id("thread", thread_id)
        keyed = keyed_turn(self.pad, principal, "thread", thread_id)
        turn, found_keyed = keyed_or_former(self.pad, principal, keyed, former, now=self.clock())
        if found_keyed:
            self.memory.found_keyed(principal, thread_id)
        return turn == former

    # -- reading -------------------------------------------------------------------

    def listed(
        self, principal: Principal, turn: str, executor: str, needs: tuple[str, ...], **expected: Any
    ) -> list[Stored]:
        """The live entries of ``turn``, all of which must be the saver's ``executor``
        entries with the sealed fields ``expected`` (``expect``).

        A listing's view fits the policy's ``inline_max_chars`` (it is what a
        model may see): sealed metadata longer than that is cut to its leading
        fields. The saver writes the fields that choose an entry first and the
        data last, so a cut view normally still holds ``needs``: the entry is
        then not read (``Stored.whole`` is False; ``having`` and ``opened`` read
        the rest when it is wanted). Only a view cut before one of ``needs`` is read here.
        """
        items = self.pad.list_for_turn(principal, turn, now=self.clock())
        found = [self._stored(principal, turn, executor, needs, item) for item in items]
        for stored in found:
            expect(stored.meta, **expected)
        return found

    def _stored(
        self, principal: Principal, turn: str, executor: str, needs: tuple[str, ...], item: dict[str, Any]
    ) -> Stored:
        """One listed entry of ``turn`` as ``listed`` returns it (read whole when
        its view was cut before one of ``needs``), checked to be a saver entry."""
        meta = item["view"].get("metadata") or {}
        whole = "metadata" not in item["view"].get("view_cut", ())
        if executor == CHECKPOINT and meta.get("format") != 1:
            needs = (*needs, WRITES_FROM)
        data = None
        if not whole and not all(name in meta for name in needs):
            meta, content = self.content(principal, item["scratchpad_id"], f"an entry of the saver's turn {turn}")
            whole = True
            data = base64.b64decode(meta["data"]) if "data" in meta else content
        if item["executor_name"] != executor or meta.get("format") not in FORMATS:
            raise IntegrityError(f"an entry in the saver's turn {turn} is not one of its {executor} entries")
        return Stored(item["scratchpad_id"], float(item["expires_at"]), meta, whole, int(item["step_num"]), data)

    def content(self, principal: Principal, scratchpad_id: str, what: str) -> tuple[dict[str, Any], bytes]:
        """An entry's sealed metadata and content. A live checkpoint's part that is
        gone was deleted under it: that is tampering, not absence."""
        try:
            entry = self.pad.get(principal, scratchpad_id, now=self.clock())
        except ExpiredError:
            raise IntegrityError(f"{what} expired before the checkpoint that refers to it") from None
        except NotFoundError:
            raise IntegrityError(f"{what} is missing from the store") from None
        observation = entry.observation
        if not isinstance(observation, dict) or not isinstance(observation.get("content"), bytes):
            raise IntegrityError(f"{what} is not an entry the saver wrote")
        return observation.get("metadata") or {}, observation["content"]

    def having(self, principal: Principal, stored: Stored, *names: str) -> Stored:
        """``stored``, with its whole sealed metadata read from the entry if the
        listing cut one of ``names`` (what the listing showed must be part of it)."""
        if all(name in stored.meta for name in names):
            return stored
        meta, _ = self.opened(principal, stored, f"entry {stored.scratchpad_id}")
        return Stored(stored.scratchpad_id, stored.expires_at, meta, True, stored.step_num)

    def opened(self, principal: Principal, stored: Stored, what: str) -> tuple[dict[str, Any], bytes]:
        """An entry's whole sealed metadata and what it holds: in its sealed
        metadata when small (when the listing brought that whole, nothing is
        read), else its content."""
        if stored.data is not None:
            return stored.meta, stored.data
        if stored.whole and "data" in stored.meta:
            return stored.meta, base64.b64decode(stored.meta["data"])
        meta, content = self.content(principal, stored.scratchpad_id, what)
        shown = all(name in meta and meta[name] == value for name, value in stored.meta.items())
        if not shown or (stored.whole and meta.keys() != stored.meta.keys()):
            raise IntegrityError(f"{what} changed while it was read")
        return meta, base64.b64decode(meta["data"]) if "data" in meta else content

    def thread(self, principal: Principal, thread_id: str, *needs: str) -> tuple[list[Stored], list[Stored]]:
        """The live checkpoint and pending-write entries of a thread's turn, their
        sealed metadata checked (a checkpoint's holding ``needs``, e.g. ``"metadata"``
        to match LangGraph's, see ``listed``), each in step order."""
        turn = self.turn(principal, "thread", thread_id)
        checkpoints: list[Stored] = []
        writes: list[Stored] = []
        for item in self.pad.list_for_turn(principal, turn, now=self.clock()):
            stored = self._either(principal, turn, item, CHECKPOINT_CHOICE + needs)
            expect(stored.meta, thread_id=thread_id)
            (checkpoints if item["executor_name"] == CHECKPOINT else writes).append(stored)
        return checkpoints, writes

    def _either(self, principal: Principal, turn: str, item: dict[str, Any], needs: tuple[str, ...]) -> Stored:
        """A listed entry of a thread's turn: a checkpoint (holding ``needs``) or a pending write."""
        if item["executor_name"] == WRITE:
            return self._stored(principal, turn, WRITE, WRITE_CHOICE, item)
        return self._stored(principal, turn, CHECKPOINT, needs, item)

    def checkpoints(self, principal: Principal, thread_id: str, *needs: str) -> list[Stored]:
        """The live checkpoint entries of a thread (see ``thread``)."""
        return self.thread(principal, thread_id, *needs)[0]

    def checkpoint(
        self, principal: Principal, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> tuple[Stored, list[Stored] | None] | None:
        """The thread's checkpoint ``checkpoint_id`` of ``ns``, else its newest of
        ``ns`` (None: none), with its pending write entries (``writes_of``),
        choosing on the views newest step first and opening them down to its
        ``writes_floor``, so that the newest opens few views (``_steps.newest_first``:
        the whole turn is still checked against its head). A thread's checkpoints
        take its steps in the order they are put, which is their ids' order:
        LangGraph's ids grow with time, and ``import_thread`` and ``copy_thread``
        put the oldest first. An entry whose view was cut before the fields that
        choose (a policy of very narrow views) is read whole when reached."""
        turn = self.turn(principal, "thread", thread_id)
        newest = None
        # The latest: the turn's newest entry, when it is of ``ns`` with no write below it
        # (unless this saver's highest step there holds a write: then it is not).
        if checkpoint_id is None and self.memory.top_executor(principal, turn) != WRITE:
            found = newest_of(self.pad, principal, turn, (CHECKPOINT, WRITE), self.clock(), thread_id=thread_id)
            if found is None:
                return None
            kind, newest = found
            if kind == CHECKPOINT and newest.meta["ns"] == ns and newest.meta.get(WRITES_FROM) is None:
                return newest, writes_of(newest, [])
        return self._scan(principal, thread_id, turn, (ns, checkpoint_id), whole=newest)

    def _scan(
        self, principal: Principal, thread_id: str, turn: str, wanted: tuple[str, str | None], whole: Stored | None
    ) -> tuple[Stored, list[Stored] | None] | None:
        """``checkpoint``'s choice on the views of the thread's turn, newest first;
        ``whole``: an entry of it already read whole (not read again)."""
        ns, checkpoint_id = wanted
        writes: list[Stored] = []
        chosen: Stored | None = None
        for item in newest_first(self.pad, principal, turn, now=self.clock()):
            if (
                whole is not None
                and item["scratchpad_id"] == whole.scratchpad_id
                and item["step_num"] == whole.step_num
            ):
                stored = whole
            else:
                stored = self._either(principal, turn, item, CHECKPOINT_CHOICE)
            expect(stored.meta, thread_id=thread_id)
            if item["executor_name"] == WRITE:
                writes.append(stored)
            elif chosen is None and stored.meta["ns"] == ns and checkpoint_id in (None, stored.meta["checkpoint_id"]):
                chosen = stored
            if chosen is not None and (chosen.meta["format"] == 1 or stored.step_num <= writes_floor(chosen)):
                break
        return None if chosen is None else (chosen, writes_of(chosen, writes))

    def writes(self, principal: Principal, thread_id: str, ns: str, checkpoint_id: str) -> list[Stored]:
        """The live pending-write entries of a checkpoint of format 1 (in its own
        turn, ``writes_turn``), their sealed metadata checked."""
        turn = self.turn(principal, "writes", thread_id, ns, checkpoint_id)
        where = {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id}
        return self.listed(principal, turn, WRITE, WRITE_CHOICE, **where)

    def writes_for(
        self, principal: Principal, thread_id: str, checkpoint: Stored, writes: list[Stored] | None
    ) -> list[Stored]:
        """A checkpoint's pending write entries in step order: ``writes`` (``writes_of``),
        or for a checkpoint of format 1 (None) the entries of its own turn."""
        if writes is not None:
            return writes
        return self.writes(principal, thread_id, checkpoint.meta["ns"], checkpoint.meta["checkpoint_id"])

    # -- writing -------------------------------------------------------------------

    def put(
        self,
        principal: Principal,
        turn: str,
        executor: str,
        observation: Any,
        ttl: int,
        now: float,
        newest: int | None = None,
        identified: bool = True,
    ) -> dict[str, Any]:
        """Put an entry at its turn's next step (``_steps.put_next``); returns its
        view. ``newest``: the turn's newest step as the caller just listed it
        (0: empty), else the step this saver's last put in the turn took, is the guess;
        ``identified`` False: no content identity, binary content not hashed."""
        last = self.memory.last_step(principal, turn) if newest is None else newest
        guess = None if last is None else last + 1
        view = put_next(
            self.pad, principal, turn, executor, observation, ttl, now=now, guess=guess, identified=identified
        )
        self.memory.took_step(principal, turn, int(view["step_num"]), executor)
        return view

    def put_checkpoint(self, principal: Principal, thread_id: str, observation: Any, ttl: int, now: float) -> None:
        """Put a checkpoint entry in the thread's turn; a thread put in its keyed turn
        is found keyed from then on (that turn holds a live checkpoint of the principal's
        scope, so the former turn never shadows it): no later call looks for it again."""
        turn = self.turn(principal, "thread", thread_id)
        self.put(principal, turn, CHECKPOINT, observation, ttl, now)
        if not self.memory.keyed(principal, thread_id) and turn != turn_id("thread", thread_id):
            self.memory.found_keyed(principal, thread_id)
            self.memory.named(principal, "thread", thread_id, (), turn)

    # -- deleting ------------------------------------------------------------------

    def delete(self, principal: Principal, scratchpad_id: str) -> None:
        """Delete an entry; gone already (expired and collected, or deleted by another call) is fine."""
        with self.writing, contextlib.suppress(NotFoundError):
            self.pad.delete(principal, scratchpad_id)

    def drop(
        self,
        principal: Principal,
        thread_id: str,
        doomed: list[Stored],
        kept: list[Stored],
        writes: list[Stored],
    ) -> None:
        """Delete checkpoints with their pending writes (of format 2: those among the
        thread's ``writes`` for their namespace and id) and the values no kept
        checkpoint refers to. ``kept`` empty: the whole thread goes, every write with it."""
        doomed = [self.having(principal, stored, "values") for stored in doomed]
        kept = [self.having(principal, stored, "values") for stored in kept]
        in_use = {value_id for stored in kept for _, value_id in stored.meta["values"].values()}
        going = {(s.meta["ns"], s.meta["checkpoint_id"]) for s in doomed}
        for write in writes:
            if not kept or (write.meta["ns"], write.meta["checkpoint_id"]) in going:
                self.delete(principal, write.scratchpad_id)
        for stored in doomed:
            meta = stored.meta
            if meta["format"] == 1:
                for write in self.writes(principal, thread_id, meta["ns"], meta["checkpoint_id"]):
                    self.delete(principal, write.scratchpad_id)
            for _, value_id in meta["values"].values():
                if value_id not in in_use:
                    self.delete(principal, value_id)
            self.delete(principal, stored.scratchpad_id)
        gone = {value_id for stored in doomed for _, value_id in stored.meta["values"].values()} - in_use
        self.memory.forget(gone)
        self.arrivals.forget()
