"""A checkpoint's channel values as ``SecurepadSaver`` puts them: the unchanged ones
known inline taken at once (``SaverMemory.inline_values``), the others one by one,
every checkpoint reads back with exactly its values, from this saver and from a fresh
one; what the memory knows inline is what its channel values hold as inline."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import Principal, Scratchpad
from securepad.integrations import _saver_memory
from securepad.integrations._saver_memory import SaverMemory, Stored

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

pytestmark = pytest.mark.xdist_group("langgraph")

_THREADS = itertools.count()
CHANNELS = ("a", "b", "c", "d")
# Per step and channel: unchanged, a new small value, a new big one (its own entry), versioned with no value.
CHANGES = st.lists(
    st.fixed_dictionaries({channel: st.sampled_from(["same", "small", "big", "none"]) for channel in CHANNELS}),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25, deadline=None)
@given(steps=CHANGES)
def test_every_checkpoint_reads_back_with_its_values(pad: Scratchpad, alice: Principal, steps: list[Any]) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice, inline_max_bytes=64)
    thread_id = f"channels-{next(_THREADS)}"
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    values: dict[str, Any] = {}
    versions: dict[str, str] = {}
    put: list[tuple[RunnableConfig, dict[str, Any]]] = []
    for number, changes in enumerate(steps):
        new: dict[str, str] = {}
        for channel, change in changes.items():
            if change == "same" and channel in versions:
                continue
            new[channel] = versions[channel] = saver.get_next_version(versions.get(channel), None)
            if change in ("small", "same"):
                values[channel] = f"{channel}{number}"
            elif change == "big":
                values[channel] = f"{channel}{number}" * 40
            else:
                values.pop(channel, None)
        checkpoint = {
            **empty_checkpoint(),
            "id": f"1f000000-0000-6000-8000-{number:012d}",
            "channel_values": dict(values),
            "channel_versions": dict(versions),
        }
        config = saver.put(config, checkpoint, {"step": number}, new)  # type: ignore[arg-type]
        put.append((config, dict(values)))
        found = saver.get_tuple(config)
        assert found is not None and found.checkpoint["channel_values"] == values
    fresh = SecurepadSaver(pad, alice, inline_max_bytes=64)
    for stored, expected in put:
        for reader in (saver, fresh):
            found = reader.get_tuple(stored)
            assert found is not None and found.checkpoint["channel_values"] == expected


KEYS = st.tuples(st.sampled_from(CHANNELS), st.sampled_from(["1", "2", "3"]))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("keep"), st.dictionaries(KEYS, st.booleans(), max_size=4), st.lists(KEYS, max_size=3)),
        st.tuples(st.just("forget"), st.sets(st.sampled_from(["v1", "v2"]))),
    ),
    max_size=12,
)


@given(ops=OPS, kept_most=st.sampled_from([3, 6, 4096]))
def test_the_memory_knows_inline_what_its_channel_values_hold_inline(
    pad: Scratchpad, alice: Principal, ops: list[Any], kept_most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_saver_memory, "KEPT", kept_most)
    memory = SaverMemory(pad, 3600)
    ids = itertools.cycle(["v1", "v2"])
    for op in ops:
        if op[0] == "keep":
            kept = {key: (Stored(next(ids), 0.0, {}) if stored else None) for key, stored in op[1].items()}
            memory.keep_channel_values(alice, "t", "", kept, op[2])
        else:
            memory.forget(op[1])
        known = memory.channel_values(alice, "t", "")
        assert set(memory.inline_values(alice, "t", "")) == {key for key, value in known.items() if value is None}
