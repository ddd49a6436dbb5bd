"""The asyncio API: AsyncScratchpad and AsyncTurn run the store off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import securepad
from securepad import AsyncScratchpad, AsyncTurn, Keyring, Scratchpad
from securepad.errors import InvalidArgumentError, NotFoundError, SecurepadError
from tests.support.principals import ALICE, BOB

BIG_LOG = "".join(f"line {i}: ok\n" for i in range(20_000)) + "line 20000: ERROR disk full\n"
# How long a test waits for something that must happen before it calls it a failure.
PATIENCE_S = 30.0


class GatedClock:
    """A clock that, once armed, holds each store call that asks for the time
    until the test lets it go: what the event loop does meanwhile shows whether
    the call blocked it."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.timed_out = False

    def __call__(self) -> float:
        if self.armed:
            self.entered.set()
            if not self.release.wait(PATIENCE_S):
                self.timed_out = True
        return time.time()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def open_pad(tmp_path: Path, **kwargs: Any) -> AsyncScratchpad:
    return await AsyncScratchpad.open(tmp_path / "store.db", keyring=Keyring.from_key_file(tmp_path / "key"), **kwargs)


def test_exported() -> None:
    assert {"AsyncScratchpad", "AsyncTurn"} <= set(securepad.__all__)


def test_fifty_concurrent_tasks_put_and_read_their_own_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_pad(tmp_path) as pad:

            async def task(i: int) -> tuple[int, str, dict[str, Any]]:
                who = ALICE if i % 2 else BOB
                text = f"task {i}\n" + "x" * (i * 997) + f"\nend of task {i}\n"
                view = await pad.put(who, f"turn-{i % 5}", i, "tool", text)
                tail = await pad.read(who, view["scratchpad_id"], mode="tail", n=20)
                entry = await pad.get(who, view["scratchpad_id"])
                assert entry.observation == text
                return i, view["scratchpad_id"], tail

            results = await asyncio.gather(*(task(i) for i in range(50)))
            assert len({sid for _, sid, _ in results}) == 50
            for i, sid, tail in results:
                assert tail["content"].endswith(f"end of task {i}\n")
                other = BOB if i % 2 else ALICE
                with pytest.raises(NotFoundError):
                    await pad.read(other, sid)
            listed = await asyncio.gather(*(pad.list_for_turn(ALICE, f"turn-{t}") for t in range(5)))
            assert sum(len(rows) for rows in listed) == 25
            stats = await pad.stats()
            assert stats["entries"] == 50 and stats["owners"] == 2

    run(main())


def test_the_loop_runs_other_tasks_while_a_store_call_is_in_progress(tmp_path: Path) -> None:
    """The put is held inside the store until a task on the loop lets it go: it
    can finish only if the loop kept running while the put was in progress."""
    clock = GatedClock()

    async def main() -> None:
        async with await open_pad(tmp_path, clock=clock) as pad:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while not clock.entered.is_set():
                    ticks += 1
                    await asyncio.sleep(0)
                clock.release.set()

            clock.armed = True
            put = asyncio.create_task(pad.put(ALICE, "t", 1, "read_log", BIG_LOG))
            await ticker()
            view = await put
            clock.armed = False
            assert not clock.timed_out
            assert ticks >= 1
            assert (await pad.get(ALICE, view["scratchpad_id"])).observation == BIG_LOG

    run(main())


def test_a_ticker_keeps_ticking_during_a_big_put(tmp_path: Path) -> None:
    big = BIG_LOG * 40  # about 10 MB: encryption and the write take a while

    async def main() -> None:
        async with await open_pad(tmp_path) as pad:
            in_progress = True
            ticks_during = 0

            async def ticker() -> None:
                nonlocal ticks_during
                while in_progress:
                    ticks_during += 1
                    await asyncio.sleep(0)

            ticking = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            ticks_before = ticks_during
            view = await pad.put(ALICE, "t", 1, "read_log", big)
            in_progress = False
            await ticking
            assert ticks_during > ticks_before
            assert view["size_bytes"] == len(big.encode())

    run(main())


def test_reads_of_concurrent_tasks_run_at_the_same_time(tmp_path: Path) -> None:
    """Four reads meet at a barrier inside the store: they pass it only if all
    four are in progress at once (none waits for another to finish)."""
    parties = 4
    barrier = threading.Barrier(parties, timeout=PATIENCE_S)
    waited: set[int] = set()
    armed = False

    def clock() -> float:
        if armed and threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            barrier.wait()
        return time.time()

    async def main() -> None:
        nonlocal armed
        async with await open_pad(tmp_path, clock=clock, max_workers=parties) as pad:
            ids = [(await pad.put(ALICE, "t", i, "tool", f"entry {i}"))["scratchpad_id"] for i in range(parties)]
            armed = True
            results = await asyncio.gather(*(pad.read(ALICE, sid) for sid in ids))
            armed = False
            assert [r["content"] for r in results] == [f"entry {i}" for i in range(parties)]
            assert len(waited) == parties

    run(main())


def test_a_cancelled_put_still_finishes_in_its_worker(tmp_path: Path) -> None:
    clock = GatedClock()

    async def main() -> None:
        async with await open_pad(tmp_path, clock=clock) as pad:
            clock.armed = True
            put = asyncio.create_task(pad.put(ALICE, "t", 1, "tool", "kept whole"))
            while not clock.entered.is_set():
                await asyncio.sleep(0)
            put.cancel()
            with pytest.raises(asyncio.CancelledError):
                await put
            clock.armed = False
            clock.release.set()
        # close() waited for the worker: the put is stored, whole.
        async with await open_pad(tmp_path) as again:
            rows = await again.list_for_turn(ALICE, "t")
            assert [r["step_num"] for r in rows] == [1]
            assert (await again.get(ALICE, rows[0]["scratchpad_id"])).observation == "kept whole"

    run(main())


def test_async_turn_is_the_runtime_surface(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_pad(tmp_path) as pad:
            turn = await pad.turn(ALICE, "turn-1")
            assert isinstance(turn, AsyncTurn) and turn.turn_id == "turn-1" and turn.principal == ALICE
            assert await turn.tools() == []
            shown = await turn.record(1, "read_log", {"content": BIG_LOG, "metadata": {"path": "/var/log/app"}})
            assert shown["scratchpad_id"] and "ERROR disk full" in shown["summary"]
            assert await turn.record(2, "echo", {"ok": True}) == {"ok": True}
            assert await turn.tools() == [securepad.SCRATCHPAD_READ_TOOL]
            assert await turn.tools(strict=True) == [securepad.SCRATCHPAD_READ_TOOL_STRICT]
            assert await turn.history() == [shown, {"ok": True}]
            assert [s["step_num"] for s in await turn.steps()] == [1, 2]
            found = await turn.call_tool("scratchpad_read", {"scratchpad_id": shown["scratchpad_id"], "mode": "tail"})
            assert found["content"].endswith("ERROR disk full\n")
            bad = await turn.call_tool("scratchpad_read", '{"mode": "grep"}')
            assert bad["ok"] is False
            assert await turn.resolve({"path": "{{step1.metadata.path}}", "ok": "${step2.ok}"}) == {
                "path": "/var/log/app",
                "ok": True,
            }
            saved = await turn.checkpoint(facts=["disk full"], budget={"calls_left": 3})
            assert (await turn.latest_checkpoint())["facts"] == saved["facts"] == ["disk full"]
            mark = await turn.mark_compaction()
            assert mark["entries_before"] == 2
            await turn.record(3, "read_log", {"content": BIG_LOG, "metadata": {"path": "/var/log/app"}})
            report = await turn.reread_report()
            assert report["reread_paths"] == ["/var/log/app"]
            resumed = await (await pad.turn(ALICE, "turn-1")).resume(extend_ttl=7200)
            assert resumed["steps"] == 3 and resumed["extended"] >= 3
            # Bob's view of the same turn id is an empty turn.
            bobs = await pad.turn(BOB, "turn-1")
            assert await bobs.history() == [] and await bobs.tools() == []
            refused = await bobs.call_tool("scratchpad_read", {"scratchpad_id": shown["scratchpad_id"]})
            assert refused["ok"] is False

    run(main())


def test_append_gives_concurrent_records_distinct_steps(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_pad(tmp_path) as pad:
            turn = await pad.turn(ALICE, "t")
            await turn.record(3, "tool", "before")
            appended = await asyncio.gather(*(turn.append("tool", f"output {i}") for i in range(20)))
            steps = sorted(step for step, _ in appended)
            assert steps == list(range(4, 24))
            assert {shown for _, shown in appended} == {f"output {i}" for i in range(20)}
            assert len(await turn.history()) == 21

    run(main())


def test_append_follows_the_highest_live_step(pad: Scratchpad) -> None:
    now = 1_000_000.0
    turn = pad.turn(ALICE, "t", now=now)
    for step in range(1, 21):  # steps 9-20 expire first: more than a page of 8 to look past
        turn.record(step, "tool", f"output {step}", ttl_seconds=10 if step > 8 else 1000, now=now)

    async def main() -> None:
        wrapped = AsyncTurn.wrap(turn)
        assert await wrapped.append("tool", "next", ttl_seconds=10, now=now) == (21, "next")
        assert await wrapped.append("tool", "after expiry", now=now + 10) == (9, "after expiry")

    run(main())
    assert [step["step_num"] for step in turn.steps(now=now + 10)] == list(range(1, 10))


def test_wrap_puts_a_sync_turn_behind_the_default_pool(pad: Scratchpad) -> None:
    turn = pad.turn(ALICE, "t")

    async def main() -> None:
        wrapped = AsyncTurn.wrap(turn)
        assert AsyncTurn.wrap(wrapped) is wrapped and wrapped.sync is turn
        step, shown = await wrapped.append("tool", "hello")
        assert (step, shown) == (1, "hello")
        assert await wrapped.history() == ["hello"]

    run(main())
    with pytest.raises(InvalidArgumentError):
        AsyncTurn("not a turn")  # type: ignore[arg-type]


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    async def main() -> None:
        pad = await open_pad(tmp_path)
        turn = await pad.turn(ALICE, "t")
        await pad.close()
        await pad.close()  # twice is fine
        with pytest.raises(SecurepadError, match="closed"):
            await pad.put(ALICE, "t", 1, "tool", "x")
        with pytest.raises(SecurepadError, match="closed"):
            await turn.history()

    run(main())


def test_wrapping_an_open_store_and_bad_arguments(db_path: Path, keyring: Keyring) -> None:
    sync = Scratchpad.open(db_path, keyring=keyring)

    async def main() -> None:
        async with AsyncScratchpad(sync, max_workers=2) as pad:
            assert pad.sync is sync and pad.policy is sync.policy and pad.path == sync.path
            view = await pad.put(ALICE, "t", 1, "tool", "hello")
            assert sync.get(ALICE, view["scratchpad_id"]).observation == "hello"
            await pad.delete(ALICE, view["scratchpad_id"])
            assert await pad.gc() == 0
            assert await pad.extend_turn(ALICE, "t", 60) == 0
            assert (await pad.stats(ALICE))["entries"] == 0
        with pytest.raises(SecurepadError):
            sync.put(ALICE, "t", 2, "tool", "closed with the async store")

    run(main())
    bad: list[Callable[[], Any]] = [
        lambda: AsyncScratchpad("store.db"),  # type: ignore[arg-type]
        lambda: AsyncScratchpad(Scratchpad.open(db_path, keyring=keyring), max_workers=0),
    ]
    for make in bad:
        with pytest.raises(InvalidArgumentError):
            make()


def test_open_with_a_bad_worker_count_closes_the_store(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(InvalidArgumentError):
            await open_pad(tmp_path, max_workers=True)

    run(main())
