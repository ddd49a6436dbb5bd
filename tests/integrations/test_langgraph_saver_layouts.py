"""Where ``SecurepadSaver`` keeps a checkpoint's pending writes, and that every
layout reads back as LangGraph's own ``InMemorySaver`` answers.

Format 2 (written now): a checkpoint's writes are entries of its thread's turn,
from its sealed ``writes_from`` step up (a write put before its checkpoint, as
LangGraph's loop does, is below it); a graph step makes no turn. Format 1
(written before): a checkpoint's writes are the entries of its own turn; such
a thread still reads, takes writes and goes on."""

from __future__ import annotations

import itertools
import json
import operator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from securepad import Principal, Scratchpad

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver


pytestmark = pytest.mark.xdist_group("langgraph")

NAMESPACES = ("", "child:1")


def config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def checkpoint_of(number: int, value: Any) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    version = f"{number + 1:032}.0"
    return {
        **empty_checkpoint(),
        "id": f"1f000000-0000-6000-8000-{number:012d}",
        "channel_values": {"value": value},
        "channel_versions": {"value": version},
    }


def answers(saver: BaseCheckpointSaver[Any], thread_id: str, ids: list[tuple[str, str]]) -> Any:
    """What ``saver`` answers of the thread: get_tuple of each namespace's latest and
    of each id, and list (in one order), each checkpoint as (ns, id, parent, metadata,
    values, writes)."""

    def shown(found: Any) -> Any:
        if found is None:
            return None
        configurable = found.config["configurable"]
        parent = found.parent_config and found.parent_config["configurable"]["checkpoint_id"]
        writes = sorted(json.dumps(list(w), sort_keys=True, default=str) for w in found.pending_writes or [])
        values = found.checkpoint["channel_values"]
        return configurable["checkpoint_ns"], configurable["checkpoint_id"], parent, found.metadata, values, writes

    latest = [shown(saver.get_tuple(config(thread_id, ns))) for ns in NAMESPACES]
    by_id = [shown(saver.get_tuple(config(thread_id, ns, checkpoint_id))) for ns, checkpoint_id in ids]
    # Newest first within a namespace (InMemorySaver lists one namespace after another).
    listed = sorted((shown(found) for found in saver.list({"configurable": {"thread_id": thread_id}})), key=str)
    return latest, by_id, listed


# -- any interleaving reads back as InMemorySaver's ------------------------------------------

WRITES = st.lists(
    st.tuples(st.sampled_from(["a", "b", "__error__", "__interrupt__"]), st.integers(0, 9)), min_size=1, max_size=3
)
# ("put", namespace index), ("writes", namespace index, how far ahead of the namespace's
# next checkpoint (0: the newest put; 1: the next, not put yet), task, writes), or
# ("restart",): a new process's saver, the checkpoints the old one had on their way never put.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 1)),
        st.tuples(st.just("restart")),
        st.tuples(st.just("writes"), st.integers(0, 1), st.integers(-2, 1), st.sampled_from(["t1", "t2"]), WRITES),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_any_interleaving_of_puts_and_writes_reads_back_as_in_memory(
    pad: Scratchpad, alice: Principal, ops: list[Any]
) -> None:
    """Checkpoints put in id order per namespace, each task's writes put for an earlier
    checkpoint, the newest or the next one before it is put (as LangGraph's loop does),
    savers of new processes taking over; the last saver and a fresh one (nothing
    remembered) answer as ``InMemorySaver``."""
    from langgraph.checkpoint.memory import InMemorySaver

    from securepad.integrations.langgraph import SecurepadSaver

    thread_id = f"t-{next(_THREADS)}"
    ours, oracle = SecurepadSaver(pad, alice), InMemorySaver()
    put: dict[str, list[str]] = {ns: [] for ns in NAMESPACES}
    numbers = itertools.count()
    upcoming = {ns: next(numbers) for ns in NAMESPACES}
    for op in ops:
        if op[0] == "restart":
            ours = SecurepadSaver(pad, alice)
            upcoming = {ns: next(numbers) for ns in NAMESPACES}
            continue
        ns = NAMESPACES[op[1]]
        if op[0] == "put":
            number, upcoming[ns] = upcoming[ns], next(numbers)
            checkpoint = checkpoint_of(number, number)
            parent = config(thread_id, ns, put[ns][-1] if put[ns] else None)
            for saver in (ours, oracle):
                saver.put(parent, checkpoint, {"step": number}, {"value": checkpoint["channel_versions"]["value"]})
            put[ns].append(checkpoint["id"])
            continue
        _, _, ahead, task_id, writes = op
        known = put[ns] + [checkpoint_of(upcoming[ns], None)["id"]]
        target = known[max(0, len(known) - 2 + ahead)]
        for saver in (ours, oracle):
            saver.put_writes(config(thread_id, ns, target), [(c, f"{c}{v}") for c, v in writes], task_id)
    ids = [(ns, checkpoint_id) for ns in NAMESPACES for checkpoint_id in put[ns]]
    expected = answers(oracle, thread_id, ids)
    assert answers(ours, thread_id, ids) == expected
    assert answers(SecurepadSaver(pad, alice), thread_id, ids) == expected


_THREADS = itertools.count()


# -- a graph run: its writes, its turns ------------------------------------------------------


class Chat(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    count: int


def note(state: Chat) -> dict[str, Any]:
    count = state.get("count", 0) + 1
    return {"notes": [f"step {count}"], "count": count}


def chain(saver: BaseCheckpointSaver[Any], steps: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Chat)
    names = [f"n{i}" for i in range(steps)]
    for name in names:
        builder.add_node(name, note)
    builder.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=saver)


def run_shape(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[tuple[Any, list[tuple[str, Any]]]]:
    """Each checkpoint of the thread, oldest first: its step and its pending writes'
    channels and values (task ids are digests of checkpoint ids, which differ)."""
    found = list(saver.list({"configurable": {"thread_id": thread_id}}))[::-1]
    return [(t.metadata["step"], sorted((c, repr(v)) for _, c, v in t.pending_writes or [])) for t in found]


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_a_graph_run_reads_back_its_writes_and_makes_no_turn_per_step(
    pad: Scratchpad, alice: Principal, durability: str
) -> None:
    """LangGraph's loop puts a step's writes while the step's checkpoint is on its way
    (``async``) or after it (``sync``): every checkpoint reads back with its writes, as
    on ``InMemorySaver``; the run makes the thread's turn and no other."""
    from langgraph.checkpoint.memory import InMemorySaver

    from securepad.integrations.langgraph import SecurepadSaver

    saver, oracle = SecurepadSaver(pad, alice), InMemorySaver()
    chain(saver, 2).invoke({"count": 0}, {"configurable": {"thread_id": "warm-up"}})  # the owner's thread list
    turns = pad.verify()["turns"]
    for each in (saver, oracle):
        result = chain(each, 12).invoke({"count": 0}, {"configurable": {"thread_id": "run"}}, durability=durability)
        assert result["count"] == 12
    assert pad.verify()["turns"] == turns + 1
    assert run_shape(saver, "run") == run_shape(oracle, "run")
    assert run_shape(SecurepadSaver(pad, alice), "run") == run_shape(oracle, "run")


def test_a_graph_step_makes_no_turn_even_past_the_inline_size(pad: Scratchpad, alice: Principal) -> None:
    """A channel serialized past ``inline_max_bytes`` is an entry of its channel's turn,
    made once: the steps after it make none."""
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice, inline_max_bytes=64)
    chain(saver, 2).invoke({"count": 0}, {"configurable": {"thread_id": "warm-up"}})
    turns = pad.verify()["turns"]
    assert chain(saver, 15).invoke({"count": 0}, {"configurable": {"thread_id": "big"}})["count"] == 15
    # The thread's turn and the turn of its "notes" channel's values.
    assert pad.verify()["turns"] == turns + 2
    latest = saver.get_tuple(config("big"))
    assert latest is not None and latest.checkpoint["channel_values"]["notes"] == [f"step {i}" for i in range(1, 16)]


# -- format 1: a thread written before --------------------------------------------------------


def put_format_1(pad: Scratchpad, principal: Principal, thread_id: str, parent: str | None, number: int) -> str:
    """A checkpoint as the saver wrote it in format 1 (through the public API): its
    entry at the thread turn's next step, its writes (task ``old``) in its own turn."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from securepad.integrations.langgraph_saver import keyed_turn

    serde = JsonPlusSerializer()
    checkpoint = checkpoint_of(number, f"old {number}")
    kind, data = serde.dumps_typed(checkpoint)
    meta = {
        "format": 1,
        "thread_id": thread_id,
        "ns": "",
        "checkpoint_id": checkpoint["id"],
        "parent_checkpoint_id": parent,
        "type": kind,
        "metadata": {"step": number},
        "values": {},
    }
    thread_turn = keyed_turn(pad, principal, "thread", thread_id)
    step = len(pad.list_for_turn(principal, thread_turn)) + 1
    pad.put(principal, thread_turn, step, "langgraph.checkpoint", {"content": data, "metadata": meta})
    kind, data = serde.dumps_typed([[0, "note", f"old write {number}"]])
    write = {
        "format": 1,
        "thread_id": thread_id,
        "ns": "",
        "checkpoint_id": checkpoint["id"],
        "task_id": "old",
        "task_path": "",
        "idxs": [0],
        "type": kind,
    }
    writes_turn = keyed_turn(pad, principal, "writes", thread_id, "", checkpoint["id"])
    pad.put(principal, writes_turn, 1, "langgraph.write", {"content": data, "metadata": write})
    return str(checkpoint["id"])


def test_a_thread_written_in_format_1_reads_takes_writes_and_goes_on(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.langgraph_saver import keyed_turn

    first = put_format_1(pad, alice, "old", None, 0)
    second = put_format_1(pad, alice, "old", first, 1)
    saver = SecurepadSaver(pad, alice)
    latest = saver.get_tuple(config("old"))
    assert latest is not None and latest.checkpoint["id"] == second
    assert latest.pending_writes == [("old", "note", "old write 1")]
    by_id = saver.get_tuple(config("old", "", first))
    assert by_id is not None and by_id.pending_writes == [("old", "note", "old write 0")]
    # A resume's writes onto the format 1 checkpoint go to its own turn, and read back with the old ones.
    saver.put_writes(latest.config, [("__interrupt__", "resumed"), ("note", "new")], "new")
    old_turn = keyed_turn(pad, alice, "writes", "old", "", second)
    assert len(pad.list_for_turn(alice, old_turn)) == 2
    resumed = saver.get_tuple(config("old"))
    assert resumed is not None
    assert sorted(resumed.pending_writes or []) == [
        ("new", "__interrupt__", "resumed"),
        ("new", "note", "new"),
        ("old", "note", "old write 1"),
    ]
    # The thread goes on in format 2: a new checkpoint, its writes in the thread's turn.
    third = checkpoint_of(2, "new 2")
    stored = saver.put(latest.config, third, {"step": 2}, {"value": third["channel_versions"]["value"]})
    saver.put_writes(stored, [("note", "third")], "task")
    listed = list(saver.list(config("old")))
    assert [t.checkpoint["id"] for t in listed] == [third["id"], second, first]
    assert [len(t.pending_writes or []) for t in listed] == [1, 3, 1]
    assert listed[0].pending_writes == [("task", "note", "third")]
    # A fresh saver (nothing remembered) reads the same; a copy is all format 2.
    assert [t.pending_writes for t in SecurepadSaver(pad, alice).list(config("old"))] == [
        t.pending_writes for t in listed
    ]
    saver.copy_thread("old", "copy")
    copied = list(saver.list(config("copy")))
    assert [(t.checkpoint["id"], sorted(t.pending_writes or [])) for t in copied] == [
        (t.checkpoint["id"], sorted(t.pending_writes or [])) for t in listed
    ]
    saver.delete_thread("old")
    assert list(saver.list(config("old"))) == []
    assert pad.list_for_turn(alice, old_turn) == []
    assert pad.list_for_turn(alice, keyed_turn(pad, alice, "thread", "old")) == []


def test_a_checkpoint_put_again_keeps_the_writes_put_between(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice)
    checkpoint = checkpoint_of(0, "once")
    versions = {"value": checkpoint["channel_versions"]["value"]}
    stored = saver.put(config("again"), checkpoint, {"step": 0}, versions)
    saver.put_writes(stored, [("note", "between")], "task")
    saver.put(config("again"), checkpoint, {"step": 0}, versions)
    for reader in (saver, SecurepadSaver(pad, alice)):
        for wanted in (config("again"), stored):
            found = reader.get_tuple(wanted)
            assert found is not None and found.pending_writes == [("task", "note", "between")]


def fan_out(saver: BaseCheckpointSaver[Any], width: int) -> Any:
    """``width`` tasks in parallel at each of three steps, each writing the list channel."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Chat)
    for level in range(3):
        for i in range(width):
            builder.add_node(f"l{level}n{i}", lambda state, name=f"l{level}n{i}": {"notes": [name]})
            builder.add_edge(START if level == 0 else f"join{level - 1}", f"l{level}n{i}")
        builder.add_node(f"join{level}", lambda state: {})
        builder.add_edge([f"l{level}n{i}" for i in range(width)], f"join{level}")
    builder.add_edge("join2", END)
    return builder.compile(checkpointer=saver)


def test_parallel_tasks_writes_read_back_as_in_memory(pad: Scratchpad, alice: Principal) -> None:
    """Several tasks of a step put their writes from LangGraph's worker threads, while
    the step's checkpoint is on its way: each checkpoint reads back with all of them."""
    from langgraph.checkpoint.memory import InMemorySaver

    from securepad.integrations.langgraph import SecurepadSaver

    saver, oracle = SecurepadSaver(pad, alice), InMemorySaver()
    for each in (saver, oracle):
        fan_out(each, 4).invoke({"count": 0}, {"configurable": {"thread_id": "fan"}})
    expected = run_shape(oracle, "fan")
    assert sum(len(writes) for _, writes in expected) >= 3 * 4
    assert run_shape(saver, "fan") == expected
    assert run_shape(SecurepadSaver(pad, alice), "fan") == expected
