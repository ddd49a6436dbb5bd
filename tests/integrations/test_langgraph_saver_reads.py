"""What ``SecurepadSaver`` reads to answer: ``get_tuple`` opens only the
checkpoint it returns and ``list(limit=...)`` only what it yields, however
long the thread (counted, not timed: ``Scratchpad.get`` calls and key
derivations); views cut before the fields that choose a checkpoint, and a
thread written before this rule (``tests/fixtures/langgraph_thread_v7.db``),
still read back whole."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad.crypto import primitives
from tests.support.paths import FIXTURES

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

OLD = json.loads((FIXTURES / "langgraph_thread_v7.json").read_text())
LENGTH = 50


class Opens:
    """Counts the entries a saver reads whole (``Scratchpad.get``, and a turn's newest
    entry read whole: ``_steps.newest_entry``) and the key derivations."""

    def __init__(self, pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
        from securepad.integrations import _saver_records

        self.count = 0
        real = pad.get
        real_newest = _saver_records.newest_entry

        def get(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        def newest_entry(*args: Any, **kwargs: Any) -> Any:
            found = real_newest(*args, **kwargs)
            self.count += found is not None
            return found

        monkeypatch.setattr(pad, "get", get)
        monkeypatch.setattr(_saver_records, "newest_entry", newest_entry)
        self.derivations = 0

    def __enter__(self) -> Opens:
        self.count = 0
        self.derivations = primitives.WORK.derivations
        return self

    def __exit__(self, *exc: object) -> None:
        self.derivations = primitives.WORK.derivations - self.derivations


def config(thread_id: str, ns: str = "", **extra: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, **extra}}


def fill(saver: SecurepadSaver, thread_id: str, count: int, size: int = 1024) -> list[RunnableConfig]:
    """``count`` checkpoints of one ``size``-character channel (metadata: step, run)."""
    from langgraph.checkpoint.base import empty_checkpoint

    configs = []
    parent = config(thread_id)
    version = None
    for step in range(count):
        version = saver.get_next_version(version, None)
        checkpoint = {
            **empty_checkpoint(),
            "id": f"1f000000-0000-6000-8000-{step:012d}",
            "channel_values": {"data": f"{step}:" + "d" * size, "step": step},
            "channel_versions": {"data": version, "step": version},
        }
        metadata = {"source": "loop", "step": step, "run_id": f"run-{step % 5}"}
        parent = saver.put(parent, checkpoint, metadata, {"data": version, "step": version})  # type: ignore[arg-type]
        configs.append(parent)
    return configs


def test_get_tuple_opens_only_the_checkpoint_it_returns(
    pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice)
    configs = fill(saver, "long", LENGTH)
    fill(saver, "short", 1)
    saver.put_writes(configs[-1], [("note", "small"), ("data", "w" * 3000)], "task-1")
    opens = Opens(pad, monkeypatch)
    with opens:
        latest = saver.get_tuple(config("long"))
    assert latest is not None and latest.checkpoint["channel_values"]["step"] == LENGTH - 1
    assert latest.pending_writes == [("task-1", "note", "small"), ("task-1", "data", "w" * 3000)]
    # The checkpoint and its one write entry (both too big for their views), not the 49 others.
    assert opens.count == 2
    # The listing authenticates each entry's metadata (one derivation each at most); the opens add one each.
    assert opens.derivations <= LENGTH + 1 + 2
    with opens:
        middle = saver.get_tuple(configs[20])
    assert middle is not None and middle.checkpoint["channel_values"]["step"] == 20 and opens.count == 1
    with opens:
        short = saver.get_tuple(config("short"))
    assert short is not None and short.checkpoint["channel_values"]["step"] == 0 and opens.count == 1


def test_list_opens_only_what_it_yields(pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice)
    configs = fill(saver, "long", LENGTH)
    opens = Opens(pad, monkeypatch)
    with opens:
        steps = [t.checkpoint["channel_values"]["step"] for t in saver.list(config("long"), limit=3)]
    assert steps == [49, 48, 47] and opens.count == 3
    with opens:
        found = list(saver.list(config("long"), before=configs[10], limit=2))
    assert [t.metadata["step"] for t in found] == [9, 8] and opens.count == 2
    with opens:
        found = list(saver.list(config("long"), filter={"run_id": "run-3"}, limit=4))
    assert [t.metadata["step"] for t in found] == [48, 43, 38, 33] and opens.count == 4
    with opens:
        assert len(list(saver.list(config("long")))) == LENGTH
    assert opens.count == LENGTH


def test_a_thread_of_small_checkpoints_is_read_from_its_listing(
    pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice)
    fill(saver, "tiny", 20, size=10)
    opens = Opens(pad, monkeypatch)
    with opens:
        latest = saver.get_tuple(config("tiny"))
        found = list(saver.list(config("tiny"), filter={"run_id": "run-1"}))
    assert latest is not None and latest.checkpoint["channel_values"]["step"] == 19
    assert [t.metadata["step"] for t in found] == [16, 11, 6, 1]
    # The latest is the thread's newest entry, read whole alone; the listing brings the rest.
    assert opens.count == 1


def test_a_saver_entrys_view_is_never_cut_at_the_default_policy(pad: Scratchpad, alice: Principal) -> None:
    """Data that its entry's view would not show whole is the entry's content, not its
    sealed metadata: no view is cut to fit (cutting measures each field again), and
    the listing still brings the data of those small enough to show."""
    from securepad.integrations._saver_records import keyed_turn
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(pad, alice)
    for size in (10, 400, 1024, 3000, 20_000):
        configs = fill(saver, f"s{size}", 2, size=size)
        saver.put_writes(configs[-1], [("note", "n" * size)], "task-1")
        listed = pad.list_for_turn(alice, keyed_turn(pad, alice, "thread", f"s{size}"))
        assert len(listed) == 3
        assert all("view_cut" not in item["view"] for item in listed)
        # (The 20,000-character channel is an entry of its own: its checkpoints are small.)
        shown = [(item["executor_name"], "data" in item["view"]["metadata"]) for item in listed]
        small = {10: True, 400: None, 1024: False, 3000: False, 20_000: True}[size]
        if small is not None:
            assert shown[:2] == [("langgraph.checkpoint", small)] * 2
        assert shown[2] == ("langgraph.write", size <= 400)
        found = saver.get_tuple(config(f"s{size}"))
        assert found is not None and found.checkpoint["channel_values"]["data"] == "1:" + "d" * size
        assert found.pending_writes == [("task-1", "note", "n" * size)]


@pytest.mark.parametrize("thread_id", ["cut-early", "t" * 2000])
def test_views_cut_before_the_fields_that_choose_are_read_whole(
    store_location: Any, keyring: Keyring, alice: Principal, monkeypatch: pytest.MonkeyPatch, thread_id: str
) -> None:
    """A policy whose views hold almost nothing (or a thread id longer than a
    view): the latest is the newest entry, read whole; every other checkpoint is
    read whole to choose; and every call still answers."""
    from securepad.integrations.langgraph import SecurepadSaver

    narrow = dataclasses.replace(Policy.default(), inline_max_chars=200)
    with Scratchpad.open(store_location, keyring=keyring, policy=narrow) as pad:
        saver = SecurepadSaver(pad, alice)
        configs = fill(saver, thread_id, 6)
        saver.put_writes(configs[-1], [("note", "n")], "task-1")
        opens = Opens(pad, monkeypatch)
        with opens:
            latest = saver.get_tuple(config(thread_id))
        assert latest is not None and latest.metadata["step"] == 5
        assert latest.pending_writes == [("task-1", "note", "n")]
        # The newest checkpoint and the write entry whose view was cut.
        assert opens.count == 2
        with opens:
            middle = saver.get_tuple(configs[2])
        assert middle is not None and middle.metadata["step"] == 2 and opens.count >= 4
        assert [t.metadata["step"] for t in saver.list(config(thread_id), filter={"run_id": "run-2"})] == [2]
        saver.delete_for_runs(["run-1"])
        assert [t.metadata["step"] for t in saver.list(config(thread_id))] == [5, 4, 3, 2, 0]
        saver.prune([thread_id])
        assert [t.metadata["step"] for t in saver.list(config(thread_id))] == [5]
        saver.copy_thread(thread_id, "copy")
        copied = saver.get_tuple(config("copy"))
        assert copied is not None and copied.checkpoint["channel_values"] == latest.checkpoint["channel_values"]
        saver.delete_thread(thread_id)
        assert saver.get_tuple(config(thread_id)) is None


# -- a thread written before listings stopped reading every checkpoint ---------------------------


@pytest.fixture
def old_saver(tmp_path: Path) -> Iterator[SecurepadSaver]:
    from securepad.integrations.langgraph import SecurepadSaver

    shutil.copy(FIXTURES / "langgraph_thread_v7.db", tmp_path / "store.db")
    # git keeps no file modes: a fresh clone checks the fixtures out 0644, which opening refuses.
    (tmp_path / "store.db").chmod(0o600)
    key = tmp_path / "key"
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    now = OLD["now"]
    keyring = Keyring.from_key_file(key)
    # A copy of a store whose anchor stayed behind, knowingly accepted as current.
    with Scratchpad.open(tmp_path / "store.db", keyring=keyring, clock=lambda: now, adopt_anchor=True) as pad:
        yield SecurepadSaver(pad, Principal("alice", "agent", "web"), ttl_seconds=3600, clock=lambda: now)


def test_a_thread_written_before_reads_back_opening_only_what_it_returns(
    old_saver: SecurepadSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_id = OLD["thread_id"]
    expected = OLD["latest"]
    opens = Opens(old_saver.pad, monkeypatch)
    with opens:
        latest = old_saver.get_tuple(config(thread_id))
    assert latest is not None
    assert latest.config == expected["config"] and latest.parent_config == expected["parent_config"]
    assert latest.metadata == expected["metadata"]
    assert latest.checkpoint["channel_values"] == {**expected["channel_values"], "big": "B" * 40_000}
    assert [list(w) for w in latest.pending_writes or []] == expected["pending_writes"]
    # The checkpoint, its big value and its one big write entry, of a thread of 12 (+2 in a
    # subgraph, the newest of which is read whole first: the latest is chosen on the views then).
    assert opens.count == 4
    everything = old_saver.list({"configurable": {"thread_id": thread_id}})
    listed = [[t.config["configurable"]["checkpoint_ns"], t.checkpoint["id"]] for t in everything]
    assert listed == OLD["listed"]


def test_a_thread_written_before_goes_on_and_is_deleted(old_saver: SecurepadSaver) -> None:
    thread_id = OLD["thread_id"]
    latest = old_saver.get_tuple(config(thread_id))
    assert latest is not None
    checkpoint = {**latest.checkpoint, "id": "1f000000-0000-6000-8000-000000000012"}
    checkpoint["channel_values"] = {**checkpoint["channel_values"], "step": 12}
    step_version = old_saver.get_next_version(checkpoint["channel_versions"]["step"], None)
    checkpoint["channel_versions"] = {**checkpoint["channel_versions"], "step": step_version}
    old_saver.put(latest.config, checkpoint, {"source": "loop", "step": 12}, {"step": step_version})
    newest = old_saver.get_tuple(config(thread_id))
    assert newest is not None and newest.checkpoint["channel_values"]["step"] == 12
    # The unchanged big value is the old thread's entry, found through its listing.
    assert newest.checkpoint["channel_values"]["big"] == "B" * 40_000
    old_saver.delete_for_runs(["run-a"])
    assert [t.metadata.get("run_id") for t in old_saver.list(config(thread_id, ""))] == [None] + ["run-b"] * 6
    old_saver.prune([thread_id])
    everything: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    assert [t.checkpoint["id"][-2:] for t in old_saver.list(everything)] == ["01", "12"]
    old_saver.delete_thread(thread_id)
    assert list(old_saver.list(everything)) == []
