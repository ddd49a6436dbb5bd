"""What ``SecurepadSaver`` costs per call, counted and not timed: SQLite
statements, listing parts opened (``ListingKey.open``), the saver's store
calls and the owner's turns. ``get_tuple`` of a thread's latest checkpoint
costs the same statements whatever the thread's length; a put is one write
transaction with no read before it; a graph step puts its checkpoint and its
writes into the thread's turn, lists nothing and makes no turn."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import apsw
import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.crypto.formats import ListingKey
from securepad.store import sqlite_of
from tests.support.meters import ReadMeter

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

# A put into the thread's turn whose head this process sealed last: BEGIN IMMEDIATE, the head's
# UPDATE while it is that head (the step the one after its newest entry), INSERT entries, COMMIT.
PUT_STATEMENTS = 4
# get_tuple of a 1 KiB checkpoint by id: the thread's rows beside its head, the
# checkpoint read whole (beside its head); its writes are among the thread's rows.
GET_TUPLE_STATEMENTS = 4
# get_tuple of the latest when it is the thread's newest entry (no write above it, as
# after a graph's run): that row alone, read whole beside its head's token.
NEWEST_STATEMENTS = 2
NEWEST_ROWS = 2
# get_tuple of the latest below its writes (put after it): as by id.
LATEST_STATEMENTS = 4


class Meter:
    """Counts the statements run on the store's connection, the listing parts
    opened and the calls of the saver's store faces while it is entered."""

    def __init__(self, saver: SecurepadSaver, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pad = saver.pad
        self.statements = self.views = 0
        self.calls: dict[str, int] = {}
        real_open = ListingKey.open

        def opened(key: ListingKey, row: dict[str, Any]) -> bytes:
            self.views += 1
            return real_open(key, row)

        monkeypatch.setattr(ListingKey, "open", opened)
        for face, name in ((self.pad, "list_for_turn"), (self.pad, "get"), (saver.records, "put")):
            self._observe(monkeypatch, face, name)

    def _observe(self, monkeypatch: pytest.MonkeyPatch, face: object, name: str) -> None:
        real = getattr(face, name)

        def observed(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(face, name, observed)

    def _trace(self, event: dict[str, Any]) -> None:
        if not event.get("trigger"):
            self.statements += 1

    def __enter__(self) -> Meter:
        self.statements = self.views = 0
        self.calls = {}
        sqlite_of(self.pad).conn.trace_v2(apsw.SQLITE_TRACE_STMT, self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sqlite_of(self.pad).conn.trace_v2(0, None)


@pytest.fixture
def sqlite_pad(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        yield pad


def config(thread_id: str, **extra: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **extra}}


def fill(saver: SecurepadSaver, thread_id: str, count: int) -> list[RunnableConfig]:
    """``count`` checkpoints of a 1 KiB channel, put in id order as LangGraph puts them."""
    configs, parent = [], config(thread_id)
    for step in range(count):
        parent = fill_one(saver, parent, step)
        configs.append(parent)
    return configs


def fill_one(saver: SecurepadSaver, parent: RunnableConfig, step: int) -> RunnableConfig:
    """The checkpoint of ``step`` (its id ends in it), child of ``parent``."""
    from langgraph.checkpoint.base import empty_checkpoint

    version = saver.get_next_version(step, None)
    checkpoint = {
        **empty_checkpoint(),
        "id": f"1f000000-0000-6000-8000-{step:012d}",
        "channel_values": {"data": "d" * 1024, "step": step},
        "channel_versions": {"data": version, "step": version},
    }
    return saver.put(parent, checkpoint, {"step": step}, {"data": version, "step": version})  # type: ignore[arg-type]


@pytest.mark.parametrize("writes", ["above", "below"])
def test_get_tuple_costs_the_same_on_a_thread_of_one_and_of_fifty(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch, writes: str
) -> None:
    """The latest's writes put after it (as an interrupt's) or before it (as LangGraph's
    loop puts a step's writes while the step's checkpoint is on its way)."""
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    for thread_id, length in (("short", 1), ("long", 50)):
        configs = fill(saver, thread_id, length - (writes == "below"))
        if writes == "above":
            saver.put_writes(configs[-1], [("note", "n")], "task-1")
        else:
            latest = config(thread_id, checkpoint_id=f"1f000000-0000-6000-8000-{length - 1:012d}")
            saver.put_writes(latest, [("note", "n")], "task-1")
            fill_one(saver, configs[-1] if configs else config(thread_id), length - 1)
    meter = Meter(saver, monkeypatch)
    counts = []
    for thread_id in ("short", "long"):
        saver.get_tuple(config(thread_id))  # the turns' inventories are verified and kept
        with meter:
            found = saver.get_tuple(config(thread_id))
        assert found is not None and found.pending_writes == [("task-1", "note", "n")]
        counts.append((meter.statements, meter.views, dict(meter.calls)))
    if writes == "above":
        # The thread's rows with its head, the views of the write and the checkpoint,
        # and the checkpoint read whole (its listing part opened with it).
        assert counts[0] == counts[1] == (LATEST_STATEMENTS, 3, {"get": 1})
    else:
        # The newest row read whole (its listing part opened with it), then the thread's
        # rows beside its head: the views of the checkpoint (not read again) and the write below it.
        assert counts[0] == counts[1] == (NEWEST_STATEMENTS + 2, 3, {})


def test_the_first_get_tuple_after_this_saver_put_the_thread_reads_no_inventory(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread's turns were created by this connection's puts, which keep their
    inventories verified: the first read costs what a warm one costs, whatever the
    length; the latest with no write above it fetches its own row and its head's token."""
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    meter, rows = Meter(saver, monkeypatch), ReadMeter(sqlite_pad)
    counts = []
    for thread_id, length in (("short", 1), ("long", 50)):
        configs = fill(saver, thread_id, length)
        for _ in range(2):  # the first read, then a warm one
            with meter:
                fetched = rows.counts(lambda thread_id=thread_id: saver.get_tuple(config(thread_id)))["rows"]
            counts.append((meter.statements, fetched))
        saver.put_writes(configs[-1], [("note", "n")], "task-1")
        with meter:
            fetched = rows.counts(lambda thread_id=thread_id: saver.get_tuple(config(thread_id)))["rows"]
        # The thread's rows (checkpoints and the write) and its head's, the checkpoint's
        # row and its head's token: no inventory read.
        assert (meter.statements, fetched) == (LATEST_STATEMENTS, length + 1 + 3)
    assert counts == [(NEWEST_STATEMENTS, NEWEST_ROWS)] * 4


def test_get_tuple_of_a_recent_checkpoint_opens_the_views_down_to_it(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    configs = fill(saver, "long", 50)
    meter = Meter(saver, monkeypatch)
    with meter:
        found = saver.get_tuple(configs[-3])
    assert found is not None and found.checkpoint["channel_values"]["step"] == 47
    # The views of checkpoints 49, 48 and 47, and 47 read whole (no pending writes).
    assert meter.views == 4 and meter.statements == GET_TUPLE_STATEMENTS


def test_a_put_is_one_write_transaction_and_reads_nothing_before_it(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    configs = fill(saver, "long", 50)
    meter = Meter(saver, monkeypatch)
    version = saver.get_next_version(None, None)
    checkpoint = {**empty_checkpoint(), "id": "1f000000-0000-6000-8000-000000000099", "channel_values": {"step": 50}}
    checkpoint["channel_versions"] = {"step": version}
    with meter:
        saver.put(configs[-1], checkpoint, {"step": 50}, {"step": version})  # type: ignore[arg-type]
    assert (meter.statements, meter.views, meter.calls) == (PUT_STATEMENTS, 0, {"put": 1})


class Chat(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    count: int


def note(state: Chat) -> dict[str, Any]:
    count = state.get("count", 0) + 1
    return {"notes": [f"step {count}"], "count": count}


def graph_costs(saver: SecurepadSaver, meter: Meter, thread_id: str, steps: int) -> tuple[int, int, dict[str, int]]:
    """The statements (of this thread), views opened and store calls of one run of a ``steps``-node chain."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Chat)
    names = [f"n{i}" for i in range(steps)]
    for name in names:
        builder.add_node(name, note)
    builder.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    graph = builder.compile(checkpointer=saver)
    with meter:
        assert graph.invoke({"count": 0}, {"configurable": {"thread_id": thread_id}})["count"] == steps
    return meter.statements, meter.views, dict(meter.calls)


def test_a_graph_step_costs_a_put_per_checkpoint_and_per_task_and_lists_nothing(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    meter = Meter(saver, monkeypatch)
    graph_costs(saver, meter, "warm-up", 2)  # the owner's keys and the thread list exist
    short = graph_costs(saver, meter, "short", 5)
    long = graph_costs(saver, meter, "long", 15)
    # Ten more steps: ten checkpoints and ten steps' writes put; no view opened, nothing
    # read whole, no turn listed (neither a checkpoint's writes, nor the thread, nor a
    # value's). (LangGraph puts from its worker threads, whose connections the statement
    # trace does not see.)
    assert long[1] - short[1] == 0
    assert {name: long[2][name] - short[2].get(name, 0) for name in long[2]} == {"put": 20}


def test_list_finds_every_checkpoints_writes_in_the_threads_listing(
    sqlite_pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes of the checkpoints ``list`` yields come with the thread's listing:
    ``list(limit=3)`` costs the same at 5 and at 15 checkpoints, each with writes."""
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(sqlite_pad, alice)
    meter = Meter(saver, monkeypatch)
    counts = []
    for thread_id, length in (("short", 5), ("long", 15)):
        for each in fill(saver, thread_id, length):
            saver.put_writes(each, [("note", each["configurable"]["checkpoint_id"][-2:])], "task-1")
        with meter:
            found = list(saver.list(config(thread_id), limit=3))
        assert [t.pending_writes for t in found] == [
            [("task-1", "note", f"{n:02d}")] for n in (length - 1, length - 2, length - 3)
        ]
        counts.append((meter.statements, dict(meter.calls)))
    # The thread's rows beside its head, and the three checkpoints read whole (their
    # views are cut), each beside its head's token: no turn listed for their writes.
    assert counts[0] == counts[1] == (2 + 3 * 2, {"list_for_turn": 1, "get": 3})


def test_a_big_value_is_not_hashed_nor_identified(
    pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's big channel value, which the saver alone reads back by id, is put
    unidentified: no pass of SHA-256 over its bytes (``shaping.binary_digest``) and no
    content identity in its listing part; it reads back whole."""
    from langgraph.checkpoint.base import empty_checkpoint

    from securepad.core import shaping
    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.store import parts

    saver = SecurepadSaver(pad, alice)
    hashed: list[int] = []
    real = shaping.binary_digest
    monkeypatch.setattr(shaping, "binary_digest", lambda data: hashed.append(len(data)) or real(data))
    value = "v" * (4 * saver.inline_max_bytes)
    version = saver.get_next_version(None, None)
    checkpoint = {
        **empty_checkpoint(),
        "id": "1f000000-0000-6000-8000-000000000001",
        "channel_values": {"data": value},
        "channel_versions": {"data": version},
    }
    stored = saver.put(config("big"), checkpoint, {"step": 1}, {"data": version})  # type: ignore[arg-type]
    assert all(size < len(value) for size in hashed), hashed
    found = saver.get_tuple(stored)
    assert found is not None and found.checkpoint["channel_values"]["data"] == value
    (checkpoint_entry,) = saver.records.checkpoints(alice, "big", "values")
    ((_, value_id),) = checkpoint_entry.meta["values"].values()
    opened = parts(pad).opener.open(alice, value_id, None)
    assert "content_id" not in opened.meta
    assert opened.meta["view"]["summary"] == f"binary, {opened.row['size_bytes']} bytes"
