"""``SecurepadSaver`` beyond the conformance suite: a real graph with interrupts
and resumption, big values stored once, expiry, owner isolation, and bad input.
Edits of the file are in test_langgraph_saver_tamper.py."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import InvalidArgumentError, Keyring, Principal, Scratchpad

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

# -- a real graph: a plan, a human approval (interrupt), then the work ------------------------


class Job(TypedDict, total=False):
    request: str
    plan: str
    approved: str
    log: Annotated[list[str], operator.add]


def plan(state: Job) -> dict[str, Any]:
    return {"plan": f"steps for {state['request']}", "log": ["planned"]}


def approve(state: Job) -> dict[str, Any]:
    from langgraph.types import interrupt

    answer = interrupt({"question": "run this plan?", "plan": state["plan"]})
    return {"approved": answer, "log": [f"approval: {answer}"]}


def work(state: Job) -> dict[str, Any]:
    return {"log": [f"done: {state['plan']}" if state["approved"] == "yes" else "skipped"]}


def job_graph(saver: SecurepadSaver) -> Any:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Job)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_node("work", work)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "work")
    builder.add_edge("work", END)
    return builder.compile(checkpointer=saver)


def thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": name}}


def _plain(value: Any) -> Any:
    """A graph result with its Interrupt objects as their values, to compare runs."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return getattr(value, "value", value) if type(value).__name__ == "Interrupt" else value


def _session(open_saver: Any) -> list[Any]:
    """A human-in-the-loop session; each step opens the saver afresh (as a new
    process would). Returns everything it observed."""
    from langgraph.types import Command

    seen: list[Any] = []
    with open_saver() as saver:
        graph = job_graph(saver)
        seen.append(_plain(graph.invoke({"request": "backup"}, thread("job-1"))))
        state = graph.get_state(thread("job-1"))
        seen += [state.next, state.values]
    with open_saver() as saver:
        graph = job_graph(saver)
        seen.append(_plain(graph.invoke(Command(resume="yes"), thread("job-1"))))
        history = list(graph.get_state_history(thread("job-1")))
        seen.append([(snapshot.next, snapshot.values) for snapshot in history])
        # Time travel: run again from the interrupted checkpoint, and fork from the plan.
        seen.append(_plain(graph.invoke(None, history[2].config)))
        branch = graph.update_state(history[3].config, {"plan": "steps for restore"})
        seen.append(_plain(graph.invoke(None, branch)))
        seen.append(_plain(graph.invoke(Command(resume="no"), thread("job-1"))))
        seen.append(len(list(graph.get_state_history(thread("job-1")))))
    return seen


@pytest.mark.slow
def test_a_graph_with_interrupts_runs_as_on_langgraphs_own_saver(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from securepad.integrations.langgraph import SecurepadSaver

    memory = InMemorySaver()

    @contextlib.contextmanager
    def in_memory() -> Iterator[Any]:
        yield memory

    @contextlib.contextmanager
    def on_securepad() -> Iterator[Any]:
        with Scratchpad.open(store_location, keyring=keyring) as pad:
            yield SecurepadSaver(pad, alice)

    expected = _session(in_memory)
    assert expected[0]["__interrupt__"] == [{"question": "run this plan?", "plan": "steps for backup"}]
    assert expected[3]["log"] == ["planned", "approval: yes", "done: steps for backup"]
    assert expected[-2]["log"][-1] == "skipped"
    assert _session(on_securepad) == expected


def test_an_async_graph_runs_on_the_async_methods(pad: Scratchpad, alice: Principal) -> None:
    from langgraph.types import Command

    from securepad.integrations.langgraph import SecurepadSaver

    graph = job_graph(SecurepadSaver(pad, alice))

    async def main() -> dict[str, Any]:
        await graph.ainvoke({"request": "report"}, thread("job-2"))
        return dict(await graph.ainvoke(Command(resume="yes"), thread("job-2")))

    assert asyncio.run(main())["log"][-1] == "done: steps for report"


# -- big values are entries of their own, stored once while unchanged ------------------------


class Document(TypedDict, total=False):
    text: str
    count: int


def count_step(state: Document) -> dict[str, Any]:
    return {"count": state.get("count", 0) + 1}


def document_graph(saver: SecurepadSaver, steps: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Document)
    names = [f"step{n}" for n in range(steps)]
    for name in names:
        builder.add_node(name, count_step)
    builder.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=saver)


def test_an_unchanged_big_value_is_stored_once(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    text = "x" * 300_000
    graph = document_graph(SecurepadSaver(pad, alice), steps=10)
    result = graph.invoke({"text": text}, thread("doc"))
    assert result == {"text": text, "count": 10}
    stats = pad.stats(alice)
    # Twelve checkpoints, but the 300 KB text is sealed three times, as on LangGraph's own
    # savers: the graph's input (channel __start__), the input task's pending write, and
    # the channel "text" itself, once: the ten steps that left it unchanged referred to it.
    assert len(list(graph.get_state_history(thread("doc")))) == 12
    assert 3 * len(text) <= stats["bytes"] < 3 * len(text) + 100_000
    assert graph.get_state(thread("doc")).values["text"] == text


def test_a_value_in_use_outlives_its_ttl_and_a_checkpoint_never_outlives_its_values(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph import SecurepadSaver

    now = [1_000_000.0]
    with Scratchpad.open(store_location, keyring=keyring, clock=lambda: now[0]) as pad:
        saver = SecurepadSaver(pad, alice, ttl_seconds=100, clock=lambda: now[0], inline_max_bytes=10)
        big = "v" * 1000
        first = _put(saver, "t", None, {"big": big, "small": 1}, {"big": "1", "small": "1"})
        now[0] += 30
        second = _put(saver, "t", first, {"big": big, "small": 2}, {"small": "2"}, versions={"big": "1", "small": "2"})
        now[0] += 40  # 70 s after the value was stored: less than half its TTL is left
        third = _put(saver, "t", second, {"big": big, "small": 3}, {"small": "3"}, versions={"big": "1", "small": "3"})
        now[0] += 50  # 120 s: the value would have expired without the third checkpoint
        assert saver.get_tuple(first) is None  # expired with its TTL
        assert saver.get_tuple(second) is None
        assert saver.get_tuple(third).checkpoint["channel_values"] == {"big": big, "small": 3}  # type: ignore[union-attr]
        now[0] += 100
        assert saver.get_tuple(generate_config("t")) is None


def _put(
    saver: SecurepadSaver,
    thread_id: str,
    parent: RunnableConfig | None,
    values: dict[str, Any],
    new_versions: dict[str, Any],
    *,
    versions: dict[str, Any] | None = None,
    owner_config: dict[str, Any] | None = None,
) -> RunnableConfig:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    config = generate_config(thread_id)
    config["configurable"].update(owner_config or {})
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions or dict(new_versions))
    return saver.put(config, checkpoint, generate_metadata(), new_versions)


# -- owners -------------------------------------------------------------------------------------


def by_user(config: RunnableConfig) -> Principal:
    return Principal(str(config["configurable"].get("user_id", "nobody")), "graph", "api")


@pytest.mark.slow
@given(thread_id=st.text(min_size=1, max_size=40), value=st.text(max_size=50))
def test_another_owner_never_sees_or_changes_a_thread(
    pad: Scratchpad, alice: Principal, bob: Principal, thread_id: str, value: str
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph import SecurepadSaver

    mine, theirs = SecurepadSaver(pad, alice), SecurepadSaver(pad, bob)
    stored = _put(mine, thread_id, None, {"v": value}, {"v": "1"})
    mine.put_writes(stored, [("v", "pending")], "task")
    assert theirs.get_tuple(generate_config(thread_id)) is None
    assert theirs.get_tuple(stored) is None
    assert list(theirs.list(generate_config(thread_id))) == []
    assert list(theirs.list(None)) == []
    theirs.delete_thread(thread_id)
    theirs.prune([thread_id], strategy="delete")
    theirs.delete_for_runs(["run"])
    theirs.copy_thread(thread_id, "bob's copy")
    assert list(theirs.list(generate_config("bob's copy"))) == []
    _put(theirs, thread_id, None, {"v": "bob's"}, {"v": "1"})
    mine_now = mine.get_tuple(generate_config(thread_id))
    assert mine_now is not None
    assert mine_now.checkpoint["channel_values"] == {"v": value}
    assert mine_now.pending_writes == [("task", "v", "pending")]
    mine.delete_thread(thread_id)
    theirs.delete_thread(thread_id)


def test_the_principal_can_come_from_the_config(pad: Scratchpad) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, principal_from_config=by_user)
    _put(saver, "shared-name", None, {"v": "alice's"}, {"v": "1"}, owner_config={"user_id": "alice"})
    _put(saver, "shared-name", None, {"v": "bob's"}, {"v": "1"}, owner_config={"user_id": "bob"})
    for user in ("alice", "bob"):
        config = generate_config("shared-name")
        config["configurable"]["user_id"] = user
        found = list(saver.list(config))
        assert [t.checkpoint["channel_values"]["v"] for t in found] == [f"{user}'s"]
    config = generate_config("shared-name")
    assert saver.get_tuple(config) is None  # "nobody" has no threads


def test_list_without_a_config_covers_the_owners_threads_only(
    pad: Scratchpad, alice: Principal, bob: Principal
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    mine = SecurepadSaver(pad, alice)
    for name in ("a", "b"):
        _put(mine, name, None, {"v": name}, {"v": "1"})
    _put(SecurepadSaver(pad, bob), "c", None, {"v": "c"}, {"v": "1"})
    # A second saver (a new process) finds the threads from the store, not from memory.
    found = list(SecurepadSaver(pad, alice).list(None))
    assert sorted(t.config["configurable"]["thread_id"] for t in found) == ["a", "b"]
    assert len(list(SecurepadSaver(pad, alice).list(None, limit=1))) == 1
    mine.delete_thread("a")
    assert [t.config["configurable"]["thread_id"] for t in SecurepadSaver(pad, alice).list(None)] == ["b"]


# -- bad input ------------------------------------------------------------------------------------


def test_bad_construction_and_bad_calls_are_refused(pad: Scratchpad, alice: Principal) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from securepad.integrations.langgraph import SecurepadSaver

    with pytest.raises(InvalidArgumentError):
        SecurepadSaver(pad)
    with pytest.raises(InvalidArgumentError):
        SecurepadSaver(pad, alice, principal_from_config=by_user)
    with pytest.raises(InvalidArgumentError):
        SecurepadSaver("pad", alice)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SecurepadSaver(pad, "alice")  # type: ignore[arg-type]
    for ttl in (0, -1, True, pad.policy.max_ttl_seconds + 1):
        with pytest.raises(InvalidArgumentError):
            SecurepadSaver(pad, alice, ttl_seconds=ttl)
    for size in (-1, 1.5, None):
        with pytest.raises(InvalidArgumentError):
            SecurepadSaver(pad, alice, inline_max_bytes=size)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SecurepadSaver(pad, principal_from_config=lambda config: "alice").get_tuple(generate_config("t"))  # type: ignore[arg-type,return-value]
    saver = SecurepadSaver(pad, alice)
    with pytest.raises(InvalidArgumentError):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(InvalidArgumentError):
        saver.put_writes(generate_config("t"), [("ch", 1)], "task")  # no checkpoint id
    with pytest.raises(InvalidArgumentError):
        saver.prune(["t"], strategy="keep_some")
    with pytest.raises(InvalidArgumentError):
        saver.put(generate_config("t"), generate_checkpoint(), generate_metadata(odd=object()), {})
    assert saver.get_tuple(generate_config("t")) is None  # the refused put stored nothing


def test_a_thread_is_not_copied_to_another_owner(pad: Scratchpad) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph import SecurepadSaver

    def owner_by_thread(config: RunnableConfig) -> Principal:
        return Principal(str(config["configurable"].get("thread_id", "x")).split("/")[0], "graph", "api")

    saver = SecurepadSaver(pad, principal_from_config=owner_by_thread)
    _put(saver, "alice/t", None, {"v": 1}, {"v": "1"})
    with pytest.raises(InvalidArgumentError):
        saver.copy_thread("alice/t", "bob/t")
    assert saver.get_tuple(generate_config("bob/t")) is None


def test_a_thread_is_imported_from_another_saver_once(pad: Scratchpad, alice: Principal) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from securepad.integrations.langgraph import SecurepadSaver

    memory = InMemorySaver()
    old = job_graph(memory)  # type: ignore[arg-type]
    old.invoke({"request": "import"}, thread("moved"))
    saver = SecurepadSaver(pad, alice)
    assert saver.import_thread(memory, "moved") == 3
    assert saver.import_thread(memory, "nothing here") == 0
    graph = job_graph(saver)
    assert graph.get_state(thread("moved")).values == old.get_state(thread("moved")).values
    assert graph.invoke(Command(resume="yes"), thread("moved"))["log"][-1] == "done: steps for import"
    with pytest.raises(InvalidArgumentError):
        saver.import_thread(memory, "moved")  # it would double the thread
    assert len(list(saver.list(thread("moved")))) == 5


def test_an_unchanged_value_whose_entry_is_gone_is_stored_again(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.langgraph_saver import keyed_turn

    big = "g" * 40_000
    first = _put(SecurepadSaver(pad, alice), "t", None, {"big": big}, {"big": "1"})
    (value,) = pad.list_for_turn(alice, keyed_turn(pad, alice, "values", "t", "", "big"))
    pad.delete(alice, value["scratchpad_id"])  # as gc does once it has expired
    saver = SecurepadSaver(pad, alice)  # a new process: nothing cached
    second = _put(saver, "t", first, {"big": big, "n": 1}, {"n": "1"}, versions={"big": "1", "n": "1"})
    assert saver.get_tuple(second).checkpoint["channel_values"] == {"big": big, "n": 1}  # type: ignore[union-attr]
    assert len(pad.list_for_turn(alice, keyed_turn(pad, alice, "values", "t", "", "big"))) == 1


# -- one live entry per step (the store's rule) ----------------------------------------------


def test_writers_of_one_thread_in_two_stores_never_share_a_step(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.langgraph_saver import keyed_turn

    per_writer, errors = 5, []
    with (
        Scratchpad.open(store_location, keyring=keyring) as one,
        Scratchpad.open(store_location, keyring=keyring) as two,
    ):
        # Two processes' savers (their own store objects), each shared by two threads.
        savers = {"a": SecurepadSaver(one, alice), "b": SecurepadSaver(two, alice)}

        def writer(name: str) -> None:
            try:
                parent = None
                for i in range(per_writer):
                    parent = _put(savers[name[0]], "shared", parent, {"who": name, "i": i}, {"who": "1", "i": f"{i}"})
                    savers[name[0]].put_writes(parent, [("who", name)], task_id=f"{name}-{i}")
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(name,)) for name in ("a0", "a1", "b0", "b1")]
        for each in threads:
            each.start()
        for each in threads:
            each.join()
        assert errors == []
        listed = list(savers["b"].list(thread("shared")))
        assert len(listed) == 4 * per_writer
        assert all(len(item.pending_writes or []) == 1 for item in listed)
        # Each checkpoint and each task's writes took a step of the thread's turn.
        steps = [item["step_num"] for item in one.list_for_turn(alice, keyed_turn(one, alice, "thread", "shared"))]
        assert steps == list(range(1, 8 * per_writer + 1))


def test_after_the_newest_checkpoints_expire_the_next_takes_the_freed_step(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.langgraph_saver import keyed_turn

    now = [1_000_000.0]
    with Scratchpad.open(store_location, keyring=keyring, clock=lambda: now[0]) as pad:
        long = SecurepadSaver(pad, alice, ttl_seconds=1000, clock=lambda: now[0])
        short = SecurepadSaver(pad, alice, ttl_seconds=10, clock=lambda: now[0])
        first = _put(long, "t", None, {"n": 1}, {"n": "1"})
        second = _put(short, "t", first, {"n": 2}, {"n": "2"})
        _put(short, "t", second, {"n": 3}, {"n": "3"})
        assert [e["step_num"] for e in pad.list_for_turn(alice, keyed_turn(pad, alice, "thread", "t"))] == [1, 2, 3]
        now[0] += 10  # the two newest expire: their steps are free again
        fourth = _put(long, "t", first, {"n": 4}, {"n": "4"})
        assert [e["step_num"] for e in pad.list_for_turn(alice, keyed_turn(pad, alice, "thread", "t"))] == [1, 2]
        assert long.get_tuple(generate_config("t")).config == fourth  # type: ignore[union-attr]
        assert [t.checkpoint["channel_values"]["n"] for t in long.list(thread("t"))] == [4, 1]


def test_each_actor_finds_its_own_thread_of_a_shared_id_in_the_thread_list(
    store_location: Any, keyring: Keyring
) -> None:
    """Under a scope that names the actor, two actors of one owner write a
    thread of the same id through one saver: each is in its own actor's thread
    list (``list(None)``, ``delete_for_runs``), also for a saver that starts
    afresh, and deleting one actor's runs leaves the other's checkpoint."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from securepad import Policy
    from securepad.integrations.langgraph import SecurepadSaver

    first, other = Principal("alice", "agent", "web"), Principal("alice", "other", "web")
    policy = Policy.from_dict({"access": {"scope": "owner+channel+actor"}})

    def config(who: str) -> RunnableConfig:
        found = generate_config("shared")
        found["configurable"]["who"] = who
        return found

    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        both = SecurepadSaver(pad, principal_from_config=lambda c: other if c["configurable"].get("who") else first)
        for who, run in (("", "run-1"), ("other", "run-2")):
            checkpoint = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": "1"})
            both.put(config(who), checkpoint, generate_metadata(run_id=run), {"n": "1"})
        for principal in (first, other):
            assert len(list(SecurepadSaver(pad, principal).list(None))) == 1
        SecurepadSaver(pad, other).delete_for_runs(["run-2"])
        assert list(SecurepadSaver(pad, other).list(None)) == []
        assert len(list(SecurepadSaver(pad, first).list(None))) == 1


def test_an_unchanged_value_refers_to_its_own_actors_entry(store_location: Any, keyring: Keyring) -> None:
    """Under a scope that names the actor, two actors write a thread of the
    same id, a large channel value of the same version each, through one
    saver; one actor's next checkpoint, the channel unchanged, refers to its
    own value's entry (never the other actor's, which it cannot read)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from securepad import Policy
    from securepad.integrations.langgraph import SecurepadSaver

    first, other = Principal("alice", "agent", "web"), Principal("alice", "other", "web")
    policy = Policy.from_dict({"access": {"scope": "owner+channel+actor"}})
    big = "x" * 40_000

    def config(who: str, parent: RunnableConfig | None = None) -> RunnableConfig:
        found = generate_config("shared")
        found["configurable"]["who"] = who
        if parent is not None:
            found["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        return found

    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        saver = SecurepadSaver(pad, principal_from_config=lambda c: other if c["configurable"].get("who") else first)
        mine = saver.put(
            config(""),
            generate_checkpoint(channel_values={"n": big + "mine"}, channel_versions={"n": "1"}),
            generate_metadata(),
            {"n": "1"},
        )
        saver.put(
            config("other"),
            generate_checkpoint(channel_values={"n": big + "other"}, channel_versions={"n": "1"}),
            generate_metadata(),
            {"n": "1"},
        )
        saver.put(config("", mine), generate_checkpoint(channel_versions={"n": "1"}), generate_metadata(), {})
        for reader in (saver, SecurepadSaver(pad, first)):
            found = reader.get_tuple(config(""))
            assert found is not None and found.checkpoint["channel_values"]["n"] == big + "mine"
        found = saver.get_tuple(config("other"))
        assert found is not None and found.checkpoint["channel_values"]["n"] == big + "other"


# -- pending writes stored twice --------------------------------------------------------------


@pytest.fixture
def two_savers(store_location: Any, keyring: Keyring, alice: Principal) -> Iterator[tuple[Any, Any, Any]]:
    """Two processes' savers on one store (neither knows what the other stored for
    the checkpoint), and the config of a checkpoint the first put."""
    from securepad.integrations.langgraph import SecurepadSaver

    with (
        Scratchpad.open(store_location, keyring=keyring) as one,
        Scratchpad.open(store_location, keyring=keyring) as two,
    ):
        first = SecurepadSaver(one, alice)
        yield first, SecurepadSaver(two, alice), _put(first, "t", None, {"n": 1}, {"n": "1"})


def test_a_write_stored_by_two_writers_reads_as_put_writes_keeps_it(two_savers: tuple[Any, Any, Any]) -> None:
    from langgraph.checkpoint.base import ERROR, INTERRUPT

    first, second, stored = two_savers
    first.put_writes(stored, [("a", "first"), (ERROR, "first error")], "task")
    second.put_writes(stored, [("a", "second"), ("b", "second"), (ERROR, "second error")], "task")
    first.put_writes(stored, [("a", "third"), (INTERRUPT, "pause")], "task")
    for saver in (first, second):
        found = saver.get_tuple(stored)
        assert found is not None
        # An index stored first stays; a special write (error, interrupt) is the newest one.
        assert sorted(found.pending_writes or []) == sorted(
            [
                ("task", "a", "first"),
                ("task", "b", "second"),
                ("task", ERROR, "second error"),
                ("task", INTERRUPT, "pause"),
            ]
        )


def test_a_special_write_never_moves_an_ordinary_write_after_another_writers_copy(
    two_savers: tuple[Any, Any, Any], alice: Principal
) -> None:
    from langgraph.checkpoint.base import ERROR

    from securepad.integrations.langgraph import SecurepadSaver

    first, second, stored = two_savers
    first.put_writes(stored, [("a", "first"), (ERROR, "e1")], "task")
    second.put_writes(stored, [("a", "second")], "task")  # its copy comes after the first's
    first.put_writes(stored, [(ERROR, "e2")], "task")  # replaces e1 only
    for saver in (first, second, SecurepadSaver(first.pad, alice)):
        found = saver.get_tuple(stored)
        assert found is not None
        assert sorted(found.pending_writes or []) == sorted([("task", "a", "first"), ("task", ERROR, "e2")])


def test_a_resumed_thread_puts_its_next_checkpoint_without_reading(
    pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.langgraph_saver import turn_id

    earlier = SecurepadSaver(pad, alice)
    stored = _put(earlier, "t", None, {"n": 1, "m": "x"}, {"n": "1", "m": "1"})
    saver = SecurepadSaver(pad, alice)  # a new process's saver
    assert saver.get_tuple(thread("t")) is not None
    reads: list[str] = []
    real_list, real_get = pad.list_for_turn, pad.get
    monkeypatch.setattr(pad, "list_for_turn", lambda p, turn, **k: reads.append(turn) or real_list(p, turn, **k))
    monkeypatch.setattr(pad, "get", lambda p, sid, **k: reads.append(sid) or real_get(p, sid, **k))
    # Only "n" changed: "m" was inline at its version in the checkpoint just read, so its
    # value's turn is not looked up (the owner's thread list is: the saver is new).
    _put(saver, "t", stored, {"n": 2, "m": "x"}, {"n": "2"}, versions={"n": "2", "m": "1"})
    assert reads == [turn_id("threads")]
    found = saver.get_tuple(thread("t"))
    assert found is not None and found.checkpoint["channel_values"] == {"n": 2, "m": "x"}
