"""A put at the turn's next step (``put_next``, the LangGraph saver's puts) in one statement.

When this process sealed the turn's head last, the step is the one after that head's
newest entry, sealed before the statement, and the statement writes only while the
stored head is still that head: no other writer can have taken the step in between.
What a user relies on, guarded here: such a put costs what a plain put costs (four
statements on SQLite, no head opened), takes exactly the step the write transaction
would take (the highest live step of the turn in the caller's scope, plus one: a
deleted or expired top step is taken again, another scope's is not counted), and,
whatever another thread, another store or a rotation does in between, never stores
an entry twice nor two entries at one step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad._steps import put_next
from securepad.bench.costs import measure
from securepad.tables.heads.heads import Heads
from tests.support.next_steps import next_step_ops, run_next_step_ops
from tests.support.principals import ALICE

from .test_hot_path import PUT_STATEMENTS

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, one segment
T0 = 1_000_000.0


@pytest.fixture
def pad(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring) as opened:
        yield opened


def _steps(pad: Scratchpad, who: Principal, turn: str, now: float = T0) -> list[int]:
    return [entry["step_num"] for entry in pad.list_for_turn(who, turn, now=now)]


def _next(pad: Scratchpad, who: Principal, turn: str, now: float = T0, guess: int | None = 1, **kw: Any) -> int:
    return int(put_next(pad, who, turn, "tool", TEXT, now=now, guess=guess, **kw)["step_num"])


@pytest.mark.parametrize("guess", [0, 1, 5, 50])
def test_a_next_step_put_into_a_turn_this_store_wrote_last_runs_a_plain_puts_statements(
    pad: Scratchpad, guess: int
) -> None:
    """Four statements, no head opened, whatever the guess (0: the right one): a wrong one
    only seals the listing part again."""
    for _ in range(4):
        _next(pad, ALICE, "t1")
    for expected in range(5, 9):
        costs = measure(pad, lambda: _next(pad, ALICE, "t1", guess=guess or expected))  # noqa: B023
        assert costs["statements"] == PUT_STATEMENTS, costs
        assert costs["head_opens"] == 0, costs
    assert _steps(pad, ALICE, "t1") == list(range(1, 9))
    assert pad.verify()["ok"]


def test_a_deleted_top_step_is_taken_again_as_the_write_transaction_takes_it(pad: Scratchpad) -> None:
    ids = [put_next(pad, ALICE, "t1", "tool", TEXT, now=T0, guess=1)["scratchpad_id"] for _ in range(3)]
    pad.delete(ALICE, ids[-1])
    assert _next(pad, ALICE, "t1") == 3  # the head no longer knows its newest: the rows tell
    assert _next(pad, ALICE, "t1") == 4
    pad.delete(ALICE, ids[0])  # not the top: the newest stays known
    costs = measure(pad, lambda: _next(pad, ALICE, "t1"))
    assert costs["statements"] == PUT_STATEMENTS
    assert _steps(pad, ALICE, "t1") == [2, 3, 4, 5]
    assert pad.verify()["ok"]


def test_a_turn_emptied_starts_again_at_step_one(pad: Scratchpad) -> None:
    """A turn emptied leaves no head: step 1 again, as the transaction's look gives it, then 2 in one statement."""
    ids = [put_next(pad, ALICE, "t1", "tool", TEXT, now=T0, guess=1)["scratchpad_id"] for _ in range(3)]
    for entry in ids:
        pad.delete(ALICE, entry)
    assert _next(pad, ALICE, "t1") == 1
    costs = measure(pad, lambda: _next(pad, ALICE, "t1"))
    assert costs["statements"] == PUT_STATEMENTS
    assert _steps(pad, ALICE, "t1") == [1, 2]
    assert pad.verify()["ok"]


def test_an_expired_top_step_is_taken_again_and_a_longer_lived_one_is_not(pad: Scratchpad) -> None:
    _next(pad, ALICE, "t1")
    put_next(pad, ALICE, "t1", "tool", TEXT, 10, now=T0, guess=2)  # step 2, expires at T0 + 10
    assert _next(pad, ALICE, "t1", now=T0 + 5) == 3
    put_next(pad, ALICE, "t1", "tool", TEXT, 10, now=T0 + 6, guess=4)  # step 4, expires at T0 + 16
    assert _next(pad, ALICE, "t1", now=T0 + 20) == 4  # 4 and 2 expired, 3 (an hour) is live
    assert _steps(pad, ALICE, "t1", now=T0 + 20) == [1, 3, 4]
    assert pad.verify(now=T0 + 20)["ok"]


def test_another_scopes_newest_entry_is_not_counted(db_path: Path, keyring: Keyring) -> None:
    web, slack = Principal("alice", "planner", "web"), Principal("alice", "planner", "slack")
    policy = Policy.from_dict({"access": {"scope": "owner+channel"}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        assert [_next(pad, web, "t1") for _ in range(2)] == [1, 2]
        assert [_next(pad, slack, "t1") for _ in range(2)] == [1, 2]
        assert _next(pad, slack, "t1") == 3  # the newest is slack's own: one statement again
        assert _next(pad, web, "t1") == 3  # slack's step 3 is not web's to count
        assert _steps(pad, web, "t1") == [1, 2, 3] and _steps(pad, slack, "t1") == [1, 2, 3]
        assert pad.verify()["ok"]


def test_a_put_between_sealing_and_the_statement_moves_the_step_never_doubles_it(
    pad: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread writes the turn after this put sealed step 3 from the record: the record it
    sealed from is gone, so the put writes nothing in one statement and takes step 4 in the transaction."""
    _next(pad, ALICE, "t1")
    _next(pad, ALICE, "t1")
    change_once = Heads.change_once
    between: list[dict[str, Any]] = []
    started: list[bool] = []

    def another_put_first(self: Heads, *args: Any, **kwargs: Any) -> Any:
        if not started:
            started.append(True)
            between.append(pad.put(ALICE, "t1", 3, "tool", "the other thread's", now=T0))
        return change_once(self, *args, **kwargs)

    monkeypatch.setattr(Heads, "change_once", another_put_first)
    view = put_next(pad, ALICE, "t1", "tool", TEXT, now=T0, guess=3)
    assert between[0]["step_num"] == 3 and view["step_num"] == 4
    assert pad.get(ALICE, view["scratchpad_id"], now=T0).step_num == 4
    assert _steps(pad, ALICE, "t1") == [1, 2, 3, 4]
    assert pad.verify()["ok"]


def test_a_rotation_between_sealing_and_the_statement_stores_under_the_new_version(
    pad: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    _next(pad, ALICE, "t1")
    change_once = Heads.change_once
    rotated: list[dict[str, Any]] = []

    def after_a_rotation(self: Heads, *args: Any, **kwargs: Any) -> Any:
        if not rotated:
            rotated.append(pad.rotate_owner_key("alice"))
        return change_once(self, *args, **kwargs)

    monkeypatch.setattr(Heads, "change_once", after_a_rotation)
    view = put_next(pad, ALICE, "t1", "tool", TEXT, now=T0, guess=1)
    assert rotated and rotated[0]["version"] == 2 and view["step_num"] == 2
    assert pad.get(ALICE, view["scratchpad_id"], now=T0).observation == TEXT
    assert _steps(pad, ALICE, "t1") == [1, 2]
    assert pad.verify()["ok"]


def test_threads_of_one_store_take_unique_steps(pad: Scratchpad) -> None:
    _next(pad, ALICE, "t1")
    taken: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(10):
            step = _next(pad, ALICE, "t1")
            with lock:
                taken.append(step)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(2, 42))
    assert _steps(pad, ALICE, "t1") == list(range(1, 42))
    assert pad.verify()["ok"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=next_step_ops(max_size=25))
def test_next_step_puts_of_two_stores_with_deletes_and_plain_puts_take_the_transactions_step(
    db_path: Path, keyring: Keyring, ops: list[tuple[str, int, int, bool]]
) -> None:
    """Whatever two stores on one file put and delete, each next-step put takes the step the write
    transaction's look at the rows gives (the highest live step, plus one): steps rise above every
    live one, and no two live entries share a step."""
    with Scratchpad.open(db_path, keyring=keyring) as first, Scratchpad.open(db_path, keyring=keyring) as second:
        run_next_step_ops((first, second), ops, T0)  # one store file for every example: an owner each
