"""A thread's big channel values as entries of their own (``ValueRecords``),
and the copy of a thread's checkpoints with their writes and values
(``copy_checkpoints``), on ``SaverRecords``. See ``langgraph_saver`` for the layout."""

from __future__ import annotations

from typing import Any

from ..principal import Principal
from ._saver_records import (
    BLOB,
    CHECKPOINT,
    FORMAT,
    FORMATS,
    VALUE_CHOICE,
    WRITE,
    WRITES_FROM,
    SaverRecords,
    Stored,
    expect,
    writes_of,
)

__all__ = ["ValueRecords", "copy_checkpoints"]


class ValueRecords:
    """The big channel values of ``records``' threads, for any owner (raises as ``SaverRecords``)."""

    def __init__(self, records: SaverRecords) -> None:
        self.records = records

    def turn(self, principal: Principal, thread_id: str, ns: str, channel: str, version: Any, format_: int) -> str:
        """The turn of a big channel value's entry: of format 2, the turn of the
        channel's values (``thread_id``, ``ns``, ``channel``), which a thread's first
        big value of the channel makes; of format 1, the turn of its version alone."""
        if format_ == 1:
            return self.records.turn(principal, "value", thread_id, ns, channel, version)
        return self.records.turn(principal, "values", thread_id, ns, channel)

    def put(
        self,
        principal: Principal,
        thread_id: str,
        ns: str,
        channel: str,
        version: Any,
        kind: str,
        data: bytes,
        now: float,
    ) -> Stored:
        """Store a big channel value as an entry of its own in its channel's turn, and remember it.
        The saver alone reads it back, by id: it is put unidentified (no content identity, its
        bytes not hashed for a view's summary), a pass over them fewer."""
        meta = {
            "format": FORMAT,
            "thread_id": thread_id,
            "ns": ns,
            "channel": channel,
            "version": version,
            "type": kind,
        }
        turn = self.turn(principal, thread_id, ns, channel, version, FORMAT)
        observation = {"content": data, "metadata": meta}
        view = self.records.put(principal, turn, BLOB, observation, self.records.ttl_seconds, now, identified=False)
        stored = Stored(view["scratchpad_id"], now + self.records.ttl_seconds, meta)
        self.records.memory.keep_channel_values(principal, thread_id, ns, {(channel, str(version)): stored})
        return stored

    def find(
        self, principal: Principal, thread_id: str, ns: str, channel: str, version: Any, now: float
    ) -> Stored | None:
        """The entry of an unchanged channel's value that ``channel_values`` does
        not know (None: the value was inline, or its entry is gone), from its
        channel's turn or (format 1) its version's, kept alive (``kept_alive``)."""
        where = {"thread_id": thread_id, "ns": ns, "channel": channel}
        for format_ in FORMATS[::-1]:
            turn = self.turn(principal, thread_id, ns, channel, version, format_)
            listed = [
                s
                for s in self.records.listed(principal, turn, BLOB, VALUE_CHOICE, **where)
                if s.meta["version"] == version
            ]
            if listed:
                found = max(listed, key=lambda s: s.expires_at)
                return self.kept_alive(principal, thread_id, ns, channel, version, found, now)
        return None

    def kept_alive(
        self, principal: Principal, thread_id: str, ns: str, channel: str, version: Any, stored: Stored, now: float
    ) -> Stored:
        """A value's entry that a new checkpoint refers to again: one with less than
        half the TTL left gets the whole TTL again (with its turn: the channel's other
        values live as long, until a drop deletes those no checkpoint refers to)."""
        if stored.expires_at - now >= self.records.ttl_seconds / 2:
            return stored
        turn = self.turn(principal, thread_id, ns, channel, version, stored.meta.get("format", FORMAT))
        with self.records.writing:
            self.records.pad.extend_turn(principal, turn, self.records.ttl_seconds, now=now)
        return Stored(stored.scratchpad_id, now + self.records.ttl_seconds, stored.meta)

    def content(
        self, principal: Principal, thread_id: str, ns: str, channel: str, version: Any, value_id: str
    ) -> tuple[dict[str, Any], bytes]:
        """A big channel value's sealed metadata and serialized form, checked to be
        the value of ``(thread_id, ns, channel, version)``."""
        meta, data = self.records.content(principal, value_id, f"the value of channel {channel!r}")
        expect(meta, thread_id=thread_id, ns=ns, channel=channel, version=version)
        return meta, data


def copy_checkpoints(
    blobs: ValueRecords,
    principal: Principal,
    source: tuple[str, list[Stored], list[Stored]],
    target_principal: Principal,
    target: str,
    now: float,
) -> None:
    """Copy the checkpoints of thread ``source`` (its id, checkpoints and writes as
    ``SaverRecords.thread`` lists them), with their writes and values, to thread
    ``target`` of the same owner (sealed again under its turns, in format 2: each
    checkpoint, then its writes above it), through ``blobs``' records."""
    records = blobs.records
    source_id, listed, writes = source
    copied_values: dict[str, Stored] = {}
    turn = records.turn(target_principal, "thread", target)
    for stored in sorted(listed, key=lambda s: s.meta["checkpoint_id"]):
        meta, content = records.content(principal, stored.scratchpad_id, "a checkpoint")
        ns, checkpoint_id = meta["ns"], meta["checkpoint_id"]
        values = {}
        for channel, (version, value_id) in meta["values"].items():
            if value_id not in copied_values:
                value_meta, data = records.content(principal, value_id, f"the value of channel {channel!r}")
                copied_values[value_id] = blobs.put(
                    target_principal, target, ns, channel, version, value_meta["type"], data, now
                )
            values[channel] = [version, copied_values[value_id].scratchpad_id]
        head = {"format": FORMAT, "thread_id": target, "ns": ns, "checkpoint_id": checkpoint_id, WRITES_FROM: None}
        sealed_meta: dict[str, Any] = {**head, **{k: v for k, v in meta.items() if k not in head}}
        sealed_meta["values"] = values
        observation = {"content": content, "metadata": sealed_meta}
        records.put(target_principal, turn, CHECKPOINT, observation, records.ttl_seconds, now)
        for write in records.writes_for(principal, source_id, stored, writes_of(stored, writes)):
            write_meta, data = records.content(principal, write.scratchpad_id, "a pending write")
            copied = {"content": data, "metadata": {**write_meta, "format": FORMAT, "thread_id": target}}
            records.put(target_principal, turn, WRITE, copied, records.ttl_seconds, now)
