"""``SecurepadSaver``: a LangGraph checkpointer whose every checkpoint, pending
write and channel value is a sealed securepad entry of its owner.

Layout (every entry through ``Scratchpad``'s public API, so authorization,
sealing, tamper evidence and expiry are the store's own):

- a thread is the turn ``securepad.langgraph:thread:<sha256>`` of its owner;
  each checkpoint (any namespace) is one entry of it, executor
  ``langgraph.checkpoint``. The entry's content is the serialized checkpoint
  with its small channel values; its sealed ``metadata`` carries the thread,
  namespace, ids, LangGraph's metadata (for ``list`` filters) and the ids of
  the entries holding its big channel values;
- a channel value whose serialized form exceeds ``inline_max_bytes`` is an
  entry of its own, in the turn of ``(thread, namespace, channel, version)``.
  LangGraph gives an unchanged channel the same version, so a big value that
  did not change is referenced again, never re-encrypted;
- the pending writes of a checkpoint are entries of the turn of
  ``(thread, namespace, checkpoint id)``;
- the owner's threads are listed in the turn ``securepad.langgraph:threads``
  (for ``delete_for_runs`` and ``list(None)``).

Each entry takes its turn's next step number (one more than the highest live
one; the store keeps one live entry per step), chosen in the write
transaction that serializes the owner's writes: writers of one thread in
several threads or processes never share a step, and a turn lists its live
entries in the order they were written. Nothing here depends on that order:
checkpoints are ordered by id, pending writes by task and index.

Turn ids are hashes, so thread ids never appear in clear; step numbers do,
as for every entry, and show about how many entries a turn has had (e.g. a
thread's checkpoints). The header of each entry binds it to its turn and
owner, and the sealed metadata repeats the thread, namespace and ids,
checked on every read. Entries live
``ttl_seconds`` (default: the policy's ``max_ttl_seconds``); a checkpoint never
outlives the values it references (those are kept alive while in use).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import hashlib
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .._steps import put_next
from ..errors import ExpiredError, IntegrityError, InvalidArgumentError, NotFoundError
from ..principal import Principal
from ..store import Scratchpad

__all__ = ["INLINE_MAX_BYTES", "TURN_PREFIX", "SecurepadSaver", "turn_id"]

# Every turn the saver uses starts with this; see SECURITY.md for what it reserves.
TURN_PREFIX = "securepad.langgraph:"
# Channel values serialized larger than this get an entry of their own (see module doc).
INLINE_MAX_BYTES = 16 * 1024
# Checkpoints and writes serialized at most this large are kept in the entry's
# sealed metadata (see _sealed); larger ones are its content.
META_DATA_BYTES = 4 * 1024
_CHECKPOINT = "langgraph.checkpoint"
_WRITE = "langgraph.write"
_BLOB = "langgraph.blob"
_THREAD = "langgraph.thread"
_FORMAT = 1


def turn_id(kind: str, *parts: Any) -> str:
    """The turn that holds ``kind`` entries for ``parts`` (a thread, a checkpoint, a channel version)."""
    digest = hashlib.sha256(json.dumps([kind, *parts], separators=(",", ":")).encode()).hexdigest()
    return f"{TURN_PREFIX}{kind}:{digest}"


@dataclass(frozen=True)
class _Stored:
    """An entry as ``list_for_turn`` shows it: id, expiry and the sealed metadata."""

    scratchpad_id: str
    expires_at: float
    meta: dict[str, Any]


class SecurepadSaver(BaseCheckpointSaver[str]):
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
        self._lock = threading.Lock()
        # (owner, thread, ns, channel, version) -> the value's entry, or None when it is inline.
        self._values: dict[tuple[str, str, str, str, str], _Stored | None] = {}
        # owner -> {thread_id: expiry of its entry in the owner's thread list}
        self._threads: dict[str, dict[str, float]] = {}

    # -- principal and config ------------------------------------------------------

    def _who(self, config: RunnableConfig) -> Principal:
        if self._principal is not None:
            return self._principal
        assert self._resolver is not None  # the constructor checked
        principal = self._resolver(config)
        if not isinstance(principal, Principal):
            raise InvalidArgumentError("principal_from_config must return a securepad.Principal")
        return principal

    @staticmethod
    def _thread(config: RunnableConfig) -> tuple[str, str]:
        configurable = config.get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or thread_id == "":
            raise InvalidArgumentError("the config has no configurable.thread_id")
        return str(thread_id), str(configurable.get("checkpoint_ns") or "")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions unique per write (a counter and a random part), as LangGraph's
        own savers make them: a channel value is stored once per version."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # noqa: S311 (a tie-breaker, not a secret)

    # -- reading -------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's
        latest in its namespace) with its values and pending writes, or None."""
        principal = self._who(config)
        thread_id, ns = self._thread(config)
        wanted = get_checkpoint_id(config)
        found = [s for s in self._checkpoints(principal, thread_id) if s.meta["ns"] == ns]
        if wanted is not None:
            found = [s for s in found if s.meta["checkpoint_id"] == wanted]
        if not found:
            return None
        latest = max(found, key=lambda s: s.meta["checkpoint_id"])
        return self._load(principal, thread_id, latest)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (its namespace when given, its
        ``checkpoint_id`` when given), newest first; ``filter`` matches their
        metadata, ``before`` a checkpoint id, ``limit`` the count. With
        ``config=None``, every thread of the principal (``principal_from_config``
        gets ``{"configurable": {}}``)."""
        if config is None:
            principal = self._who({"configurable": {}})
            threads = sorted(self._thread_list(principal))
            ns = None
            wanted = None
        else:
            principal = self._who(config)
            thread_id, _ = self._thread(config)
            threads = [thread_id]
            configurable = config.get("configurable") or {}
            ns = str(configurable["checkpoint_ns"] or "") if "checkpoint_ns" in configurable else None
            wanted = get_checkpoint_id(config)
        below = get_checkpoint_id(before) if before is not None else None
        if limit is not None and limit <= 0:
            return
        found: builtins.list[tuple[str, _Stored]] = []
        for thread_id in threads:
            for stored in self._checkpoints(principal, thread_id):
                meta = stored.meta
                if ns is not None and meta["ns"] != ns:
                    continue
                if wanted is not None and meta["checkpoint_id"] != wanted:
                    continue
                if below is not None and not meta["checkpoint_id"] < below:
                    continue
                if filter and any(meta["metadata"].get(k) != v for k, v in filter.items()):
                    continue
                found.append((thread_id, stored))
        found.sort(key=lambda item: item[1].meta["checkpoint_id"], reverse=True)
        for thread_id, stored in found[:limit]:
            yield self._load(principal, thread_id, stored)

    def _checkpoints(self, principal: Principal, thread_id: str) -> builtins.list[_Stored]:
        """The live checkpoint entries of a thread, their sealed metadata checked."""
        listed = self._listed(principal, turn_id("thread", thread_id), _CHECKPOINT)
        for stored in listed:
            _expect(stored.meta, thread_id=thread_id)
        return listed

    def _listed(self, principal: Principal, turn: str, executor: str) -> builtins.list[_Stored]:
        """The live entries of ``turn``, all of which must be the saver's ``executor`` entries."""
        stored = []
        for item in self.pad.list_for_turn(principal, turn, now=self._clock()):
            meta = item["view"].get("metadata") or {}
            if "metadata" in item["view"].get("view_cut", ()):
                # The view fits the policy's inline_max_chars (what a model may see): the entry has it whole.
                meta, _ = self._content(principal, item["scratchpad_id"], f"an entry of the saver's turn {turn}")
            if item["executor_name"] != executor or meta.get("format") != _FORMAT:
                raise IntegrityError(f"an entry in the saver's turn {turn} is not one of its {executor} entries")
            stored.append(_Stored(item["scratchpad_id"], float(item["expires_at"]), meta))
        return stored

    def _content(self, principal: Principal, scratchpad_id: str, what: str) -> tuple[dict[str, Any], bytes]:
        """An entry's sealed metadata and content. A live checkpoint's part that is
        gone was deleted under it: that is tampering, not absence."""
        try:
            entry = self.pad.get(principal, scratchpad_id, now=self._clock())
        except ExpiredError:
            raise IntegrityError(f"{what} expired before the checkpoint that refers to it") from None
        except NotFoundError:
            raise IntegrityError(f"{what} is missing from the store") from None
        observation = entry.observation
        if not isinstance(observation, dict) or not isinstance(observation.get("content"), bytes):
            raise IntegrityError(f"{what} is not an entry the saver wrote")
        return observation.get("metadata") or {}, observation["content"]

    def _payload(self, principal: Principal, stored: _Stored, what: str) -> bytes:
        """What an entry holds: in its sealed metadata when small (listing the
        turn brought it already), else its content."""
        if "data" in stored.meta:
            return base64.b64decode(stored.meta["data"])
        sealed, content = self._content(principal, stored.scratchpad_id, what)
        if sealed != stored.meta:
            raise IntegrityError(f"{what} changed while it was read")
        return content

    def _load(self, principal: Principal, thread_id: str, stored: _Stored) -> CheckpointTuple:
        sealed = stored.meta
        ns, checkpoint_id = sealed["ns"], sealed["checkpoint_id"]
        content = self._payload(principal, stored, f"checkpoint {checkpoint_id}")
        checkpoint: Checkpoint = self.serde.loads_typed((sealed["type"], content))
        values = dict(checkpoint.get("channel_values") or {})
        for channel, (version, value_id) in sealed["values"].items():
            value_meta, data = self._content(principal, value_id, f"the value of channel {channel!r}")
            _expect(value_meta, thread_id=thread_id, ns=ns, channel=channel, version=version)
            values[channel] = self.serde.loads_typed((value_meta["type"], data))
        checkpoint["channel_values"] = values
        config: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        }
        parent = sealed["parent_checkpoint_id"]
        parent_config: RunnableConfig | None = (
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
            if parent is not None
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=sealed["metadata"],
            parent_config=parent_config,
            pending_writes=self._pending_writes(principal, thread_id, ns, checkpoint_id),
        )

    def _writes(self, principal: Principal, thread_id: str, ns: str, checkpoint_id: str) -> builtins.list[_Stored]:
        listed = self._listed(principal, turn_id("writes", thread_id, ns, checkpoint_id), _WRITE)
        for stored in listed:
            _expect(stored.meta, thread_id=thread_id, ns=ns, checkpoint_id=checkpoint_id)
        return listed

    def _pending_writes(
        self, principal: Principal, thread_id: str, ns: str, checkpoint_id: str
    ) -> builtins.list[tuple[str, str, Any]]:
        writes = []
        for stored in self._writes(principal, thread_id, ns, checkpoint_id):
            meta = stored.meta
            for idx, channel, value in self._write_items(principal, stored):
                writes.append(((meta["task_path"], meta["task_id"], idx), (meta["task_id"], channel, value)))
        # LangGraph applies a step's writes in this order (see langgraph's writes_sort_key).
        writes.sort(key=lambda pair: pair[0])
        return [write for _, write in writes]

    def _write_items(self, principal: Principal, stored: _Stored) -> builtins.list[tuple[int, str, Any]]:
        """The (idx, channel, value) writes of one put_writes entry."""
        items = self.serde.loads_typed((stored.meta["type"], self._payload(principal, stored, "a pending write")))
        found = [(int(idx), str(channel), value) for idx, channel, value in items]
        if [idx for idx, _, _ in found] != stored.meta["idxs"]:
            raise IntegrityError("a pending write entry does not hold the writes its metadata names")
        return found

    # -- writing -------------------------------------------------------------------

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
        thread_id, ns = self._thread(config)
        now = self._clock()
        self._register_thread(principal, thread_id, now)
        values = checkpoint.get("channel_values") or {}
        inline: dict[str, Any] = {}
        referenced: dict[str, builtins.list[Any]] = {}
        expiry = now + self.ttl_seconds
        for channel, version in checkpoint["channel_versions"].items():
            # An unchanged channel refers to its value's entry again; one that has
            # none (small, or its entry is gone) is stored like a new value.
            known = None if channel in new_versions else self._value(principal, thread_id, ns, channel, version, now)
            if known is None:
                if channel not in values:
                    continue
                kind, data = self.serde.dumps_typed(values[channel])
                if len(data) <= self.inline_max_bytes:
                    inline[channel] = values[channel]
                    continue
                known = self._put_value(principal, thread_id, ns, channel, version, kind, data, now)
            stored = known
            referenced[channel] = [version, stored.scratchpad_id]
            expiry = min(expiry, stored.expires_at)
        body = {**checkpoint, "channel_values": inline}
        kind, data = self.serde.dumps_typed(body)
        try:
            sealed_metadata = json.loads(json.dumps(get_serializable_checkpoint_metadata(config, metadata)))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"the checkpoint's metadata is not JSON: {exc}") from None
        parent = (config.get("configurable") or {}).get("checkpoint_id")
        meta = {
            "format": _FORMAT,
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": parent,
            "type": kind,
            "metadata": sealed_metadata,
            "values": referenced,
        }
        observation = _sealed(meta, data)
        # The checkpoint dies no later than the values it refers to (see _value).
        ttl = max(1, min(self.ttl_seconds, int(expiry - now)))
        put_next(self.pad, principal, turn_id("thread", thread_id), _CHECKPOINT, observation, ttl, now=now)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _put_value(
        self,
        principal: Principal,
        thread_id: str,
        ns: str,
        channel: str,
        version: Any,
        kind: str,
        data: bytes,
        now: float,
    ) -> _Stored:
        meta = {
            "format": _FORMAT,
            "thread_id": thread_id,
            "ns": ns,
            "channel": channel,
            "version": version,
            "type": kind,
        }
        turn = turn_id("value", thread_id, ns, channel, version)
        view = put_next(
            self.pad, principal, turn, _BLOB, {"content": data, "metadata": meta}, self.ttl_seconds, now=now
        )
        stored = _Stored(view["scratchpad_id"], now + self.ttl_seconds, meta)
        with self._lock:
            self._values[(principal.owner_user_id, thread_id, ns, channel, str(version))] = stored
        return stored

    def _value(
        self, principal: Principal, thread_id: str, ns: str, channel: str, version: Any, now: float
    ) -> _Stored | None:
        """The entry of an unchanged channel's value (None: the value was inline),
        kept alive: one with less than half the TTL left gets the whole TTL again."""
        key = (principal.owner_user_id, thread_id, ns, channel, str(version))
        with self._lock:
            known = key in self._values
            cached = self._values.get(key)
        if not known:
            turn = turn_id("value", thread_id, ns, channel, version)
            listed = self._listed(principal, turn, _BLOB)
            for stored in listed:
                _expect(stored.meta, thread_id=thread_id, ns=ns, channel=channel, version=version)
            cached = max(listed, key=lambda s: s.expires_at) if listed else None
        if isinstance(cached, _Stored) and cached.expires_at - now < self.ttl_seconds / 2:
            turn = turn_id("value", thread_id, ns, channel, version)
            self.pad.extend_turn(principal, turn, self.ttl_seconds, now=now)
            cached = _Stored(cached.scratchpad_id, now + self.ttl_seconds, cached.meta)
        with self._lock:
            self._values[key] = cached
        return cached

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for ``config``'s checkpoint. A write that
        is already stored (same task and index) is kept, except the special
        ones (errors, interrupts, ...), which the newer one replaces."""
        principal = self._who(config)
        thread_id, ns = self._thread(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidArgumentError("put_writes needs a config with configurable.checkpoint_id")
        now = self._clock()
        mine = [s for s in self._writes(principal, thread_id, ns, checkpoint_id) if s.meta["task_id"] == task_id]
        stored_idx = {idx for s in mine for idx in s.meta["idxs"]}
        fresh: dict[int, tuple[str, Any]] = {}
        for index, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            if idx < 0 or idx not in stored_idx:
                fresh[idx] = (channel, value)
        if not fresh:
            return
        # The special writes replace stored ones: their entries are written again without them.
        stale = [s for s in mine if set(s.meta["idxs"]) & fresh.keys()]
        kept = {idx: (ch, v) for s in stale for idx, ch, v in self._write_items(principal, s) if idx not in fresh}
        items = [[idx, channel, value] for idx, (channel, value) in sorted({**kept, **fresh}.items())]
        kind, data = self.serde.dumps_typed(items)
        meta = {
            "format": _FORMAT,
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "task_path": task_path,
            "idxs": [idx for idx, _, _ in items],
            "type": kind,
        }
        turn = turn_id("writes", thread_id, ns, checkpoint_id)
        put_next(self.pad, principal, turn, _WRITE, _sealed(meta, data), self.ttl_seconds, now=now)
        for entry in stale:
            self._delete(principal, entry.scratchpad_id)

    # -- the owner's thread list ---------------------------------------------------

    def _thread_list(self, principal: Principal) -> dict[str, float]:
        owner = principal.owner_user_id
        with self._lock:
            known = self._threads.get(owner)
        if known is None:
            known = {}
            for stored in self._listed(principal, turn_id("threads"), _THREAD):
                tid = stored.meta["thread_id"]
                known[tid] = max(known.get(tid, 0.0), stored.expires_at)
            with self._lock:
                self._threads[owner] = known
        return known

    def _register_thread(self, principal: Principal, thread_id: str, now: float) -> None:
        """Note the thread in the owner's list (once), and keep the list alive."""
        known = self._thread_list(principal)
        expires = known.get(thread_id)
        turn = turn_id("threads")
        if expires is None:
            meta = {"format": _FORMAT, "thread_id": thread_id}
            entry = {"content": thread_id.encode(), "metadata": meta}
            put_next(self.pad, principal, turn, _THREAD, entry, self.ttl_seconds, now=now)
            expires = now + self.ttl_seconds
        elif expires - now < self.ttl_seconds / 2:
            self.pad.extend_turn(principal, turn, self.ttl_seconds, now=now)
            with self._lock:
                for tid in known:
                    known[tid] = max(known[tid], now + self.ttl_seconds)
            expires = now + self.ttl_seconds
        with self._lock:
            known[thread_id] = expires

    def _unregister_thread(self, principal: Principal, thread_id: str) -> None:
        for stored in self._listed(principal, turn_id("threads"), _THREAD):
            if stored.meta["thread_id"] == thread_id:
                self._delete(principal, stored.scratchpad_id)
        with self._lock:
            self._threads.get(principal.owner_user_id, {}).pop(thread_id, None)

    # -- deleting and copying ------------------------------------------------------

    def _delete(self, principal: Principal, scratchpad_id: str) -> None:
        # Gone already (expired and collected, or deleted by another call) is fine.
        with contextlib.suppress(NotFoundError):
            self.pad.delete(principal, scratchpad_id)

    def _drop(
        self, principal: Principal, thread_id: str, doomed: builtins.list[_Stored], kept: builtins.list[_Stored]
    ) -> None:
        """Delete checkpoints with their pending writes and the values no kept checkpoint refers to."""
        in_use = {value_id for stored in kept for _, value_id in stored.meta["values"].values()}
        for stored in doomed:
            meta = stored.meta
            for write in self._writes(principal, thread_id, meta["ns"], meta["checkpoint_id"]):
                self._delete(principal, write.scratchpad_id)
            for _, value_id in meta["values"].values():
                if value_id not in in_use:
                    self._delete(principal, value_id)
            self._delete(principal, stored.scratchpad_id)
        with self._lock:
            gone = {value_id for stored in doomed for _, value_id in stored.meta["values"].values()} - in_use
            for key in [k for k, v in self._values.items() if v is not None and v.scratchpad_id in gone]:
                del self._values[key]

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and value of the thread."""
        principal = self._who({"configurable": {"thread_id": thread_id}})
        self._drop(principal, thread_id, self._checkpoints(principal, thread_id), [])
        self._unregister_thread(principal, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) whose metadata names one of
        ``run_ids``, in every thread of the principal."""
        if not run_ids:
            return
        runs = set(run_ids)
        principal = self._who({"configurable": {}})
        for thread_id in sorted(self._thread_list(principal)):
            listed = self._checkpoints(principal, thread_id)
            doomed = [s for s in listed if s.meta["metadata"].get("run_id") in runs]
            if doomed:
                kept = [s for s in listed if s not in doomed]
                self._drop(principal, thread_id, doomed, kept)

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
            listed = self._checkpoints(principal, thread_id)
            newest: dict[str, _Stored] = {}
            for stored in listed:
                current = newest.get(stored.meta["ns"])
                if current is None or stored.meta["checkpoint_id"] > current.meta["checkpoint_id"]:
                    newest[stored.meta["ns"]] = stored
            kept = list(newest.values())
            self._drop(principal, thread_id, [s for s in listed if s not in kept], kept)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint of a thread, with its writes and values, to another
        thread of the same owner (sealed again under the target's turns)."""
        principal = self._who({"configurable": {"thread_id": source_thread_id}})
        target_principal = self._who({"configurable": {"thread_id": target_thread_id}})
        if target_principal.owner_user_id != principal.owner_user_id:
            raise InvalidArgumentError("copy_thread copies within one owner")
        listed = self._checkpoints(principal, source_thread_id)
        if not listed:
            return
        now = self._clock()
        self._register_thread(target_principal, target_thread_id, now)
        copied_values: dict[str, _Stored] = {}
        for stored in sorted(listed, key=lambda s: s.meta["checkpoint_id"]):
            meta, content = self._content(principal, stored.scratchpad_id, "a checkpoint")
            ns, checkpoint_id = meta["ns"], meta["checkpoint_id"]
            values = {}
            for channel, (version, value_id) in meta["values"].items():
                if value_id not in copied_values:
                    value_meta, data = self._content(principal, value_id, f"the value of channel {channel!r}")
                    copied_values[value_id] = self._put_value(
                        target_principal, target_thread_id, ns, channel, version, value_meta["type"], data, now
                    )
                values[channel] = [version, copied_values[value_id].scratchpad_id]
            for write in self._writes(principal, source_thread_id, ns, checkpoint_id):
                write_meta, data = self._content(principal, write.scratchpad_id, "a pending write")
                put_next(
                    self.pad,
                    target_principal,
                    turn_id("writes", target_thread_id, ns, checkpoint_id),
                    _WRITE,
                    {"content": data, "metadata": {**write_meta, "thread_id": target_thread_id}},
                    self.ttl_seconds,
                    now=now,
                )
            put_next(
                self.pad,
                target_principal,
                turn_id("thread", target_thread_id),
                _CHECKPOINT,
                {"content": content, "metadata": {**meta, "thread_id": target_thread_id, "values": values}},
                self.ttl_seconds,
                now=now,
            )

    def import_thread(self, source: BaseCheckpointSaver[Any], thread_id: str) -> int:
        """Copy a thread out of another checkpointer (``SqliteSaver``,
        ``PostgresSaver``, ...) into this one: every checkpoint of every
        namespace, oldest first, with its metadata, parent and pending writes.
        Returns how many checkpoints were copied. The source is not changed;
        delete the thread there (``source.delete_thread``) once you are done.
        A thread that already has checkpoints here is refused (importing twice
        would double it).

        Raises:
            InvalidArgumentError: the thread already has checkpoints in this saver.
        """
        principal = self._who({"configurable": {"thread_id": thread_id}})
        if self._checkpoints(principal, thread_id):
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

    # -- async: the same calls in a worker thread -----------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: builtins.list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _sealed(meta: dict[str, Any], data: bytes) -> dict[str, Any]:
    """The observation to put: small data travels in the sealed metadata (a
    turn's listing then brings it, with no read per entry), the rest as content."""
    if len(data) <= META_DATA_BYTES:
        return {"content": b"", "metadata": {**meta, "data": base64.b64encode(data).decode("ascii")}}
    return {"content": data, "metadata": meta}


def _expect(meta: Mapping[str, Any], **fields: Any) -> None:
    """The sealed fields of an entry must name what it was looked up for: an
    entry found elsewhere was moved there, which its turn binding already
    refuses; this also catches the astronomically unlikely hash collision."""
    for name, value in fields.items():
        if name not in meta or meta[name] != value:
            raise IntegrityError(f"a stored entry's sealed {name} does not match where it was found")
