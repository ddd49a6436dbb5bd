"""Several threads and several processes putting into one store at once: no error,
nothing lost, every returned id readable afterwards with the right content."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.core.shaping import SEGMENT_BYTES

PUTS = 40


def observation(writer: str, i: int) -> Any:
    """Deterministic content per (writer, i), of every kind and a few sizes."""
    seed = hashlib.sha256(f"{writer}/{i}".encode()).digest()
    match i % 4:
        case 0:
            return f"{writer} #{i} ✓ " * (1 + i * 7)
        case 1:
            return seed * (1 + (SEGMENT_BYTES // 16 if i % 8 == 1 else 1))  # sometimes multi-segment
        case 2:
            return {"content": f"{writer} result {i}", "status": 200, "writer": writer}
        case _:
            return {"items": [{"i": i, "writer": writer, "seed": seed.hex()}]}


def principal_for(writer: str, i: int) -> Principal:
    # A shared owner and one of the writer's own, so owner keys are created concurrently too.
    owner = "shared" if i % 2 == 0 else f"own-{writer}"
    return Principal(owner, writer, "web")


def put_many(pad: Scratchpad, writer: str, count: int = PUTS) -> list[tuple[str, str, int]]:
    done = []
    for i in range(count):
        p = principal_for(writer, i)
        view = pad.put(p, f"turn-{writer}", i, "tool", observation(writer, i))
        done.append((view["scratchpad_id"], writer, i))
    return done


def check_all(store_location: Any, keyring: Keyring, done: list[tuple[str, str, int]]) -> None:
    assert len({entry_id for entry_id, _, _ in done}) == len(done)
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        for entry_id, writer, i in done:
            assert pad.get(principal_for(writer, i), entry_id).observation == observation(writer, i)
        assert pad.stats()["entries"] == len(done)
        for writer in {w for _, w, _ in done}:
            listed = pad.list_for_turn(Principal("shared", writer, "web"), f"turn-{writer}")
            assert [item["step_num"] for item in listed] == [i for i in range(PUTS) if i % 2 == 0]


# -- threads ------------------------------------------------------------------------


def run_threads(pad: Scratchpad, writers: list[str]) -> list[Any]:
    barrier = threading.Barrier(len(writers))
    results: dict[str, list[tuple[str, str, int]]] = {}
    errors: list[BaseException] = []

    def work(writer: str) -> None:
        try:
            barrier.wait()
            results[writer] = put_many(pad, writer)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    return [item for writer in writers for item in results[writer]]


def test_two_threads_share_one_store(store_location: Any, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        done = run_threads(pad, ["t1", "t2"])
    check_all(store_location, keyring, done)


def test_threads_with_their_own_stores(store_location: Any, keyring: Keyring) -> None:
    pads = [Scratchpad.open(store_location, keyring=keyring) for _ in range(2)]
    barrier = threading.Barrier(2)
    results: list[list[tuple[str, str, int]]] = [[], []]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            barrier.wait()
            results[n] = put_many(pads[n], f"p{n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for pad in pads:
        pad.close()
    assert errors == []
    check_all(store_location, keyring, results[0] + results[1])


def test_readers_while_writers_write(store_location: Any, keyring: Keyring) -> None:
    alice = Principal("alice", "reader", "web")
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        text = "read me while they write ✓ " * 10000
        entry_id = pad.put(alice, "t", 0, "x", text)["scratchpad_id"]
        stop = threading.Event()
        reader_errors: list[BaseException] = []
        reads = [0]

        def read_loop() -> None:
            try:
                while not stop.is_set():
                    assert pad.read(alice, entry_id, mode="tail", n=50)["content"] == text[-50:]
                    reads[0] += 1
            except BaseException as exc:
                reader_errors.append(exc)

        reader = threading.Thread(target=read_loop)
        reader.start()
        try:
            done = run_threads(pad, ["w1", "w2"])
        finally:
            stop.set()
            reader.join(60)
        assert reader_errors == []
        assert reads[0] > 0
        assert pad.get(alice, entry_id).observation == text
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        for got_id, writer, i in done:
            assert pad.get(principal_for(writer, i), got_id).observation == observation(writer, i)


# -- processes ----------------------------------------------------------------------


def _spawned_writer(db_path: str, key_file: str, writer: str, barrier: Any, queue: Any) -> None:
    """A separate program: opens the store itself (keyrings are not picklable)."""
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)) as pad:
        barrier.wait()
        queue.put(put_many(pad, writer))


def _forked_writer(pad: Scratchpad, writer: str, barrier: Any, queue: Any) -> None:
    """A forked child using the parent's open store: it must get its own connection."""
    barrier.wait()
    queue.put(put_many(pad, writer))


def collect(procs: list[Any], queue: Any) -> list[tuple[str, str, int]]:
    for proc in procs:
        proc.start()
    done: list[tuple[str, str, int]] = []
    for _ in procs:
        done += queue.get(timeout=120)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    return done


def test_two_spawned_processes(store_location: Any, key_file: Path, keyring: Keyring) -> None:
    Scratchpad.open(store_location, keyring=keyring).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_spawned_writer, args=(str(store_location), str(key_file), writer, barrier, queue))
        for writer in ("s1", "s2")
    ]
    check_all(store_location, keyring, collect(procs, queue))


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="fork start method")
def test_two_forked_processes_and_the_parent(store_location: Any, keyring: Keyring) -> None:
    ctx = multiprocessing.get_context("fork")
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        # The parent has used its connection before forking: the children must not share it.
        parent_done = put_many(pad, "parent", 3)
        barrier, queue = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=_forked_writer, args=(pad, writer, barrier, queue)) for writer in ("f1", "f2")]
        for proc in procs:
            proc.start()
        barrier.wait()
        parent_done += put_many(pad, "parent2")
        done: list[tuple[str, str, int]] = []
        for _ in procs:
            done += queue.get(timeout=120)
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        # The parent's store still works after its children wrote.
        for entry_id, writer, i in parent_done:
            assert pad.get(principal_for(writer, i), entry_id).observation == observation(writer, i)
    all_done = parent_done + done
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        for entry_id, writer, i in all_done:
            assert pad.get(principal_for(writer, i), entry_id).observation == observation(writer, i)
        assert pad.stats()["entries"] == len(all_done)
