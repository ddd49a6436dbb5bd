"""put_many and Turn.record_many: one transaction, all or nothing,
each entry checked as put checks it; the async faces do the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import (
    AsyncScratchpad,
    InvalidArgumentError,
    Policy,
    Principal,
    QuotaExceededError,
    Scratchpad,
)

OBSERVATIONS: list[Any] = ["text", b"\x00binary", {"content": "body", "metadata": {"path": "a.py"}}, [1, 2, 3], ""]


def _ids(pad: Scratchpad, principal: Principal, turn: str) -> list[int]:
    return [view["step_num"] for view in pad.list_for_turn(principal, turn)]


def test_put_many_stores_every_item_and_returns_the_views_in_order(pad: Scratchpad, alice: Principal) -> None:
    items = [(step, f"tool{step}", obs) for step, obs in enumerate(OBSERVATIONS, start=1)]
    views = pad.put_many(alice, "t", items)
    assert [view["step_num"] for view in views] == [1, 2, 3, 4, 5]
    for view, (_, _, observation) in zip(views, items, strict=True):
        assert pad.get(alice, view["scratchpad_id"]).observation == observation
    assert [listed["view"] for listed in pad.list_for_turn(alice, "t")] == views


def test_a_batch_larger_than_one_insert_stores_every_item(pad: Scratchpad, alice: Principal) -> None:
    views = pad.put_many(alice, "big", [(step, "tool", f"item {step}") for step in range(150)])
    assert [view["step_num"] for view in views] == list(range(150))
    assert _ids(pad, alice, "big") == list(range(150))
    assert pad.read(alice, views[149]["scratchpad_id"], "full")["content"] == "item 149"


def test_an_empty_batch_stores_nothing(pad: Scratchpad, alice: Principal) -> None:
    assert pad.put_many(alice, "t", []) == []
    assert pad.list_for_turn(alice, "t") == []


@pytest.mark.parametrize(
    "bad",
    [
        [(1, "tool", "a"), (1, "tool", "b")],  # a step twice
        [(1, "tool", "a"), (-1, "tool", "b")],  # a bad step
        [(1, "tool", "a"), (2, "", "b")],  # a bad executor
        [(1, "tool", "a"), (2, "tool", {"x": object()})],  # not JSON
        [(1, "tool", "a"), (2, "tool")],  # a short item
        [(1, "tool", "a"), "not a tuple"],
    ],
)
def test_one_bad_item_refuses_the_whole_batch(pad: Scratchpad, alice: Principal, bad: list[Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put_many(alice, "t", bad)
    assert pad.list_for_turn(alice, "t") == []


@pytest.mark.parametrize("items", ["a string", b"bytes", {"1": "a"}, 42])
def test_items_must_be_a_sequence_of_tuples(pad: Scratchpad, alice: Principal, items: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put_many(alice, "t", items)


def test_a_step_already_live_refuses_the_batch(pad: Scratchpad, alice: Principal) -> None:
    pad.put(alice, "t", 2, "tool", "first")
    with pytest.raises(InvalidArgumentError, match="step 2 is already recorded"):
        pad.put_many(alice, "t", [(1, "tool", "a"), (2, "tool", "b"), (3, "tool", "c")])
    assert _ids(pad, alice, "t") == [2]
    pad.put_many(alice, "t", [(1, "tool", "a"), (3, "tool", "c")])
    assert _ids(pad, alice, "t") == [1, 2, 3]


def test_the_quota_must_hold_the_whole_batch(store_location: Any, keyring: Any, alice: Principal) -> None:
    policy = Policy.from_dict(
        {"access": {"scope": "owner"}, "limits": {"owner_quota_bytes": 60_000, "max_entry_bytes": 30_000}}
    )
    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        with pytest.raises(QuotaExceededError):
            pad.put_many(alice, "t", [(step, "tool", "x" * 25_000) for step in range(3)])
        assert pad.list_for_turn(alice, "t") == []
        pad.put_many(alice, "t", [(step, "tool", "x" * 25_000) for step in range(2)])
        assert _ids(pad, alice, "t") == [0, 1]


def test_an_entry_over_max_entry_bytes_refuses_the_batch(store_location: Any, keyring: Any, alice: Principal) -> None:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": {"max_entry_bytes": 1000}})
    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        with pytest.raises(QuotaExceededError):
            pad.put_many(alice, "t", [(1, "tool", "small"), (2, "tool", "x" * 2000)])
        assert pad.list_for_turn(alice, "t") == []


def test_owners_stay_apart(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    views = pad.put_many(alice, "t", [(1, "tool", "alice's"), (2, "tool", "secrets")])
    pad.put_many(bob, "t", [(1, "tool", "bob's")])
    assert _ids(pad, bob, "t") == [1]
    with pytest.raises(Exception, match="no such entry"):
        pad.get(bob, views[0]["scratchpad_id"])


def test_record_many_takes_the_next_steps_and_returns_what_record_returns(pad: Scratchpad, alice: Principal) -> None:
    turn = pad.turn(alice, "t")
    turn.record(4, "tool", "before")
    big = "y" * (pad.policy.offload_threshold_bytes + 100)
    shown = turn.record_many([("search", "small"), ("fetch", big), ("calc", {"n": 1})])
    assert shown[0] == "small" and shown[2] == {"n": 1}
    assert shown[1]["step_num"] == 6 and shown[1]["scratchpad_id"]
    steps = turn.steps()
    assert [s["step_num"] for s in steps] == [4, 5, 6, 7]
    assert [s["executor_name"] for s in steps[1:]] == ["search", "fetch", "calc"]
    assert turn.history()[1:] == shown
    assert turn.record_many([]) == []


def test_record_many_refuses_a_bad_item_and_stores_nothing(pad: Scratchpad, alice: Principal) -> None:
    turn = pad.turn(alice, "t")
    with pytest.raises(InvalidArgumentError):
        turn.record_many([("tool", "fine"), (1, "tool", "three values")])  # type: ignore[list-item]
    assert turn.steps() == []


def test_the_async_faces_batch_too(pad: Scratchpad, alice: Principal) -> None:
    async def main() -> tuple[list[dict[str, Any]], list[Any]]:
        apad = AsyncScratchpad(pad)
        views = await apad.put_many(alice, "a", [(1, "tool", "one"), (2, "tool", "two")])
        turn = await apad.turn(alice, "b")
        return views, await turn.record_many([("tool", "x"), ("tool", "y")])

    views, shown = asyncio.run(main())
    assert [v["step_num"] for v in views] == [1, 2]
    assert shown == ["x", "y"]
    assert _ids(pad, alice, "b") == [1, 2]


@given(st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=300)), min_size=1, max_size=8))
def test_put_many_round_trips(pad: Scratchpad, alice: Principal, observations: list[Any]) -> None:
    turn = f"h{abs(hash(tuple(observations))) % 10**9}-{len(pad.list_for_turn(alice, 'count'))}"
    pad.put(alice, "count", len(_ids(pad, alice, "count")), "tick", "")
    views = pad.put_many(alice, turn, [(step, "tool", obs) for step, obs in enumerate(observations)])
    assert [pad.get(alice, view["scratchpad_id"]).observation for view in views] == observations
