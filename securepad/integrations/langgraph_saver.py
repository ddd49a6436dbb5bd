"""``SecurepadSaver``: a LangGraph checkpointer whose every checkpoint, pending
write and channel value is a sealed securepad entry of its owner, written and
read through ``Scratchpad``'s public API (authorization, sealing, tamper
evidence and expiry are the store's own).

- a thread is one turn of its owner, named by a keyed digest of the thread id
  (``_saver_records.keyed_turn``: never in clear, not recoverable by hashing
  guesses); each checkpoint (any namespace) is one entry of it, executor
  ``langgraph.checkpoint``, its sealed metadata carrying the format, thread,
  namespace, ids, ``writes_from``, LangGraph's metadata and the entries of
  its big values;
- a task's pending writes for a checkpoint are one entry of the same turn
  (format 2): those put once the checkpoint is stored take steps above it,
  those LangGraph's loop puts while it is on its way steps below it, the
  lowest of which the checkpoint seals as ``writes_from`` (``_saver_order``);
  a graph step thus puts into turns that exist and makes none. A checkpoint
  of format 1 (written before) has its writes in the turn of ``(thread,
  namespace, checkpoint id)``, where a write put for it still goes;
- a channel value serialized larger than ``inline_max_bytes`` is an entry of
  the turn of ``(thread, namespace, channel)`` (format 1: of its version),
  stored once per version; the owner's threads are listed in the turn
  ``securepad.langgraph:threads``.

``get_tuple`` chooses on the thread's views newest first and opens the views
down to the checkpoint it returns and its ``writes_from`` (the newest with no
write below it: none, it is read whole alone); ``list`` chooses on the whole
listing, which brings every checkpoint's writes; both open whole only what
they return. Each entry takes its turn's next step in the write transaction.
A checkpoint never outlives the values it references. ``_saver_records``
holds the sealed records, ``_saver_writes`` ``put_writes``, ``_saver_async``
the async face derived from this one; ``_saver_values`` the big values and ``copy_thread``.
"""

from __future__ import annotations

import builtins
import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.json_size import json_copy
from ..errors import InvalidArgumentError
from ..principal import Principal
from ..store import Scratchpad
from ._saver_async import ThreadedAsyncSaver
from ._saver_memory import ChannelValues
from ._saver_records import (
    FORMAT,
    TURN_PREFIX,
    WRITES_FROM,
    SaverRecords,
    Stored,
    highest,
    keyed_turn,
    sealed,
    turn_id,
    writes_of,
)
from ._saver_threads import ThreadList
from ._saver_values import ValueRecords, copy_checkpoints
from ._saver_writes import pending_writes, put_writes

__all__ = ["INLINE_MAX_BYTES", "TURN_PREFIX", "SecurepadSaver", "keyed_turn", "turn_id"]

# Channel values serialized larger than this get an entry of their own (see module doc).
INLINE_MAX_BYTES = 16 * 1024
# The counter's digits in a version (``get_next_version``).
VERSION_DIGITS = 16
# A channel version the saver has not seen (``SaverRecords.channel_values``).
_UNKNOWN = object()


class SecurepadSaver(ThreadedAsyncSaver):
    """A LangGraph checkpointer on an open ``Scratchpad`` (SQLite or PostgreSQL).

    ``principal`` binds every call to one owner; ``principal_from_config``
    (exactly one of the two) picks the principal from each call's ``config``
    (e.g. from ``config["configurable"]["user_id"]``). Calls without a config
    (``delete_thread``, ``copy_thread``, ``prune``) pass it
    ``{"configurable": {"thread_id": ...}}``, and ``delete_for_runs`` passes
    ``{"configurable": {}}``. A thread of one owner is invisible to another.

    Raises (from every method): ``IntegrityError`` when a stored entry fails
    authentication, is missing although a checkpoint refers to it, or does not
    belong where it was found; ``InvalidArgumentError`` for a config without
    ``thread_id`` or a resolver that returns no ``Principal``;
    ``QuotaExceededError`` and ``StoreBusyError`` as for ``Scratchpad.put``.
    """

    def __init__(
        self,
        pad: Scratchpad,
        principal: Principal | None = None,
        *,
        principal_from_config: Callable[[RunnableConfig], Principal] | None = None,
        ttl_seconds: int | None = None,
        inline_max_bytes: int = INLINE_MAX_BYTES,
        serde: SerializerProtocol | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(serde=serde)
        if not isinstance(pad, Scratchpad):
            raise InvalidArgumentError("SecurepadSaver needs an open securepad.Scratchpad")
        if (principal is None) == (principal_from_config is None):
            raise InvalidArgumentError("give exactly one of principal and principal_from_config")
        if principal is not None and not isinstance(principal, Principal):
            raise InvalidArgumentError("principal must be a securepad.Principal")
        self.pad = pad
        self._principal = principal
        self._resolver = principal_from_config
        self.ttl_seconds = pad.policy.max_ttl_seconds if ttl_seconds is None else ttl_seconds
        if isinstance(self.ttl_seconds, bool) or not isinstance(self.ttl_seconds, int) or self.ttl_seconds <= 0:
            raise InvalidArgumentError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        if self.ttl_seconds > pad.policy.max_ttl_seconds:
            raise InvalidArgumentError(
                f"ttl_seconds {ttl_seconds} exceeds the policy's max_ttl_seconds ({pad.policy.max_ttl_seconds})"
            )
        if isinstance(inline_max_bytes, bool) or not isinstance(inline_max_bytes, int) or inline_max_bytes < 0:
            raise InvalidArgumentError(f"inline_max_bytes must be a non-negative integer, not {inline_max_bytes!r}")
        self.inline_max_bytes = inline_max_bytes
        self._clock = clock
        self.records = SaverRecords(pad, self.ttl_seconds, clock)
        self.values = ValueRecords(self.records)
        self.threads = ThreadList(self.records)

    def _who(self, config: RunnableConfig) -> Principal:
        if self._principal is not None:
            return self._principal
        assert self._resolver is not None  # the constructor checked
        principal = self._resolver(config)
        if not isinstance(principal, Principal):
            raise InvalidArgumentError("principal_from_config must return a securepad.Principal")
        return principal

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """Versions unique per write (a counter and 53 random bits), as LangGraph's
        own savers make them (a channel value is stored once per version), in fewer
        characters: a checkpoint holds every channel's version and each node's seen
        ones. LangGraph compares versions as strings: the counter's 16 digits order
        these by count, and each after every version of the 32-digit form LangGraph's
        own savers write, so a thread's versions keep growing whichever saver wrote its last."""
        if current is None or isinstance(current, int):
            number = current or 0
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:0{VERSION_DIGITS}}.{random.getrandbits(53):014x}"  # a tie-breaker, not a secret

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's
        latest in its namespace) with its values and pending writes, or None."""
        principal = self._who(config)
        thread_id, ns = _thread_of(config)
        wanted = get_checkpoint_id(config)
        found = self.records.checkpoint(principal, thread_id, ns, wanted)
        if found is None:
            if wanted is None:
                self.records.arrivals.none_stored(principal, thread_id, ns)
            return None
        stored, writes = found
        where = self.records.arrivals.where(principal, thread_id, ns, stored.meta["checkpoint_id"])
        self.records.arrivals.stored(where, stored.meta["format"], newest=wanted is None)
        return _checkpoint_tuple(self, principal, thread_id, stored, writes)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (its namespace and ``checkpoint_id``
        when given; every thread of the principal for None), newest first;
        ``filter`` matches their metadata, ``before`` a checkpoint id, ``limit`` the count."""
        if config is None:
            principal = self._who({"configurable": {}})
            threads, ns, wanted = sorted(self.threads.of(principal)), None, None
        else:
            principal = self._who(config)
            thread_id, _ = _thread_of(config)
            threads = [thread_id]
            configurable = config.get("configurable") or {}
            ns = str(configurable["checkpoint_ns"] or "") if "checkpoint_ns" in configurable else None
            wanted = get_checkpoint_id(config)
        below = get_checkpoint_id(before) if before is not None else None
        if limit is not None and limit <= 0:
            return
        found: builtins.list[tuple[str, Stored, builtins.list[Stored]]] = []
        for thread_id in threads:
            checkpoints, writes = self.records.thread(principal, thread_id, *(["metadata"] if filter else []))
            for stored in checkpoints:
                if _selected(stored.meta, ns=ns, wanted=wanted, below=below, filter=filter):
                    found.append((thread_id, stored, writes))
        found.sort(key=lambda item: item[1].meta["checkpoint_id"], reverse=True)
        for thread_id, stored, writes in found[:limit]:
            yield _checkpoint_tuple(self, principal, thread_id, stored, writes_of(stored, writes))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: its new big channel values as entries of their own,
        the rest in the checkpoint's entry. Returns the checkpoint's config."""
        principal = self._who(config)
        thread_id, ns = _thread_of(config)
        where = self.records.arrivals.where(principal, thread_id, ns, checkpoint["id"])
        # The lowest step of the writes put before it (``_saver_order``), once they are in.
        writes_from = self.records.arrivals.begin_put(where)
        stored = None
        try:
            self._put(principal, (thread_id, ns, writes_from), config, checkpoint, metadata, new_versions)
            stored = FORMAT
        finally:
            self.records.arrivals.end_put(where, stored)
        return _config(thread_id, ns, checkpoint["id"])

    def _put(
        self,
        principal: Principal,
        where: tuple[str, str, int | None],
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> None:
        """``put`` of a checkpoint of thread and namespace ``where``, whose writes
        start at ``where``'s step (None: above it)."""
        thread_id, ns, writes_from = where
        now = self._clock()
        self.threads.register(principal, thread_id, now)
        inline, referenced, expiry = _channel_values(self, principal, thread_id, ns, checkpoint, new_versions, now)
        body = {**checkpoint, "channel_values": inline}
        kind, data = self.serde.dumps_typed(body)
        try:
            sealed_metadata = json_copy(get_serializable_checkpoint_metadata(config, metadata))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"the checkpoint's metadata is not JSON: {exc}") from None
        parent = (config.get("configurable") or {}).get("checkpoint_id")
        meta = {
            "format": FORMAT,
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint["id"],
            WRITES_FROM: writes_from,
            "parent_checkpoint_id": parent,
            "type": kind,
            "metadata": sealed_metadata,
            "values": referenced,
        }
        observation = sealed(meta, data, self.pad.policy.inline_max_chars)
        # The checkpoint dies no later than the values it refers to (see _value).
        ttl = max(1, min(self.ttl_seconds, int(expiry - now)))
        self.records.put_checkpoint(principal, thread_id, observation, ttl, now)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for ``config``'s checkpoint. A write that
        is already stored (same task and index) is kept, except the special
        ones (errors, interrupts, ...), which the newer one replaces. A write
        put before its checkpoint is read back with it when this saver puts
        the checkpoint (see the module doc)."""
        principal = self._who(config)
        thread_id, ns = _thread_of(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidArgumentError("put_writes needs a config with configurable.checkpoint_id")
        where = (thread_id, ns, checkpoint_id)
        put_writes(self.records, self.serde, principal, where, (task_id, task_path), writes, self._clock())

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and value of the thread."""
        principal = self._who({"configurable": {"thread_id": thread_id}})
        checkpoints, writes = self.records.thread(principal, thread_id)
        self.records.drop(principal, thread_id, checkpoints, [], writes)
        self.threads.unregister(principal, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) whose metadata names one of
        ``run_ids``, in every thread of the principal."""
        if not run_ids:
            return
        runs = set(run_ids)
        principal = self._who({"configurable": {}})
        for thread_id in sorted(self.threads.of(principal)):
            listed, writes = self.records.thread(principal, thread_id, "metadata")
            doomed = [s for s in listed if s.meta["metadata"].get("run_id") in runs]
            if doomed:
                kept = [s for s in listed if s not in doomed]
                self.records.drop(principal, thread_id, doomed, kept, writes)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint of each thread;
        ``delete``: delete the threads.

        Raises:
            InvalidArgumentError: another strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgumentError(f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            principal = self._who({"configurable": {"thread_id": thread_id}})
            listed, writes = self.records.thread(principal, thread_id)
            kept = [found for ns in {s.meta["ns"] for s in listed} if (found := highest(listed, ns, None))]
            self.records.drop(principal, thread_id, [s for s in listed if s not in kept], kept, writes)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of a thread, with its writes and values, to another
        thread of the same owner (sealed again under the target's turns)."""
        principal = self._who({"configurable": {"thread_id": source_thread_id}})
        target_principal = self._who({"configurable": {"thread_id": target_thread_id}})
        if target_principal.owner_user_id != principal.owner_user_id:
            raise InvalidArgumentError("copy_thread copies within one owner")
        listed, writes = self.records.thread(principal, source_thread_id)
        if not listed:
            return
        now = self._clock()
        self.threads.register(target_principal, target_thread_id, now)
        source = (source_thread_id, listed, writes)
        copy_checkpoints(self.values, principal, source, target_principal, target_thread_id, now)

    def import_thread(self, source: BaseCheckpointSaver[Any], thread_id: str) -> int:
        """Copy a thread out of another checkpointer (``SqliteSaver``, ``PostgresSaver``, ...):
        every checkpoint of every namespace, oldest first, with its metadata,
        parent and pending writes; returns how many. The source is not changed.

        Raises:
            InvalidArgumentError: the thread already has checkpoints in this saver.
        """
        principal = self._who({"configurable": {"thread_id": thread_id}})
        if self.records.checkpoints(principal, thread_id):
            raise InvalidArgumentError(f"thread {thread_id!r} already has checkpoints here")
        found = sorted(
            source.list({"configurable": {"thread_id": thread_id}}),
            key=lambda t: (t.config["configurable"].get("checkpoint_ns", ""), t.checkpoint["id"]),
        )
        for item in found:
            configurable = dict(item.config["configurable"])
            ns = str(configurable.get("checkpoint_ns") or "")
            config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
            if item.parent_config is not None:
                config["configurable"]["checkpoint_id"] = item.parent_config["configurable"]["checkpoint_id"]
            stored = self.put(config, item.checkpoint, item.metadata, item.checkpoint["channel_versions"])
            by_task: dict[str, builtins.list[tuple[str, Any]]] = {}
            for task_id, channel, value in item.pending_writes or []:
                by_task.setdefault(task_id, []).append((channel, value))
            for task_id, writes in by_task.items():
                self.put_writes(stored, writes, task_id)
        return len(found)


def _channel_values(
    saver: SecurepadSaver,
    principal: Principal,
    thread_id: str,
    ns: str,
    checkpoint: Checkpoint,
    new_versions: ChannelVersions,
    now: float,
) -> tuple[dict[str, Any], dict[str, builtins.list[Any]], float]:
    """The checkpoint's channel values that travel in its entry, the entries
    (``[version, id]``) of the big ones, each new one stored here, and the
    earliest expiry among those entries (or a TTL from now)."""
    values = checkpoint.get("channel_values") or {}
    memory = saver.records.memory
    known = memory.channel_values(principal, thread_id, ns)
    kept: ChannelValues = {}
    unchanged: builtins.list[tuple[str, str]] = []  # known inline (or without a value) at their versions
    inline: dict[str, Any] = {}
    referenced: dict[str, builtins.list[Any]] = {}
    expiry = now + saver.ttl_seconds
    # A graph's checkpoint versions every channel ever written (each node's trigger), most unchanged,
    # with no value, known inline so: one set look-up each (``_known_inline``), the others as below.
    versions, known_inline = checkpoint["channel_versions"], memory.inline_values(principal, thread_id, ns)
    rest = [item for item in versions.items() if item not in known_inline or item[0] in new_versions]
    for channel, version in rest:
        key = (channel, version if type(version) is str else str(version))
        value = values.get(channel, _UNKNOWN)
        entry: Stored | None = None
        # An unchanged channel refers to its value's entry again (a value that was inline
        # at its version still fits); one that has none (small, or its entry is gone) is
        # stored like a new value.
        if channel not in new_versions:
            found = known.get(key, _UNKNOWN)
            if found is None:
                if value is not _UNKNOWN:
                    inline[channel] = value
                unchanged.append(key)
                continue
            if isinstance(found, Stored):
                entry = saver.values.kept_alive(principal, thread_id, ns, channel, version, found, now)
            else:
                entry = saver.values.find(principal, thread_id, ns, channel, version, now)
        if entry is None:
            if value is _UNKNOWN:
                kept[key] = None
                continue
            kind, data = saver.serde.dumps_typed(value)
            if len(data) <= saver.inline_max_bytes:
                inline[channel] = value
                kept[key] = None
                continue
            entry = saver.values.put(principal, thread_id, ns, channel, version, kind, data, now)
        kept[key] = entry
        referenced[channel] = [version, entry.scratchpad_id]
        expiry = min(expiry, entry.expires_at)
    still: Iterable[tuple[str, Any]] = unchanged
    if len(rest) < len(versions):
        inline, still = _known_inline(inline, unchanged, checkpoint, (known_inline, new_versions))
    memory.keep_channel_values(principal, thread_id, ns, kept, still)
    return inline, referenced, expiry


def _known_inline(
    inline: dict[str, Any],
    unchanged: Iterable[tuple[str, Any]],
    checkpoint: Checkpoint,
    known: tuple[AbstractSet[tuple[str, str]], ChannelVersions],
) -> tuple[dict[str, Any], Iterable[tuple[str, Any]]]:
    """``inline`` with the values of the checkpoint's unchanged channels (not in
    ``new_versions``) known inline at their versions (``known_inline``), in the versions'
    order; ``unchanged`` with those channels' (channel, version), read only if the
    memory is full (``SaverMemory.keep_channel_values``)."""
    known_inline, new_versions = known
    versions, values = checkpoint["channel_versions"], checkpoint.get("channel_values") or {}
    taken = (item for item in versions.items() if item in known_inline and item[0] not in new_versions)
    found = {
        channel: value
        for channel, value in values.items()
        if (channel, versions.get(channel)) in known_inline and channel not in new_versions
    }
    if found:
        found.update(inline)
        inline = {channel: found[channel] for channel in versions if channel in found}
    return inline, itertools.chain(unchanged, taken)


def _thread_of(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidArgumentError("the config has no configurable.thread_id")
    return str(thread_id), str(configurable.get("checkpoint_ns") or "")


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _checkpoint_tuple(
    saver: SecurepadSaver, principal: Principal, thread_id: str, stored: Stored, writes: builtins.list[Stored] | None
) -> CheckpointTuple:
    """The checkpoint of ``stored`` as LangGraph wants it, with its big values and its
    pending ``writes`` (``writes_of``; None: a checkpoint of format 1, from its own turn)."""
    meta, content = saver.records.opened(principal, stored, f"checkpoint {stored.meta['checkpoint_id']}")
    ns, checkpoint_id = meta["ns"], meta["checkpoint_id"]
    checkpoint: Checkpoint = saver.serde.loads_typed((meta["type"], content))
    values = dict(checkpoint.get("channel_values") or {})
    for channel, (version, value_id) in meta["values"].items():
        value_meta, data = saver.values.content(principal, thread_id, ns, channel, version, value_id)
        values[channel] = saver.serde.loads_typed((value_meta["type"], data))
    checkpoint["channel_values"] = values
    # Its other channels were inline at their versions: the next put where they are unchanged knows so.
    inline: ChannelValues = {
        (ch, str(v)): None for ch, v in checkpoint["channel_versions"].items() if ch not in meta["values"]
    }
    saver.records.memory.keep_channel_values(principal, thread_id, ns, inline)
    parent = meta["parent_checkpoint_id"]
    entries = saver.records.writes_for(principal, thread_id, stored, writes)
    return CheckpointTuple(
        config=_config(thread_id, ns, checkpoint_id),
        checkpoint=checkpoint,
        metadata=meta["metadata"],
        parent_config=None if parent is None else _config(thread_id, ns, parent),
        pending_writes=pending_writes(saver.records, principal, entries, saver.serde.loads_typed),
    )


def _selected(
    meta: dict[str, Any], *, ns: str | None, wanted: str | None, below: str | None, filter: dict[str, Any] | None
) -> bool:
    """Whether a checkpoint's sealed metadata passes ``list``'s selection (None: any)."""
    if ns is not None and meta["ns"] != ns:
        return False
    if wanted is not None and meta["checkpoint_id"] != wanted:
        return False
    if below is not None and not meta["checkpoint_id"] < below:
        return False
    return not (filter and any(meta["metadata"].get(k) != v for k, v in filter.items()))
