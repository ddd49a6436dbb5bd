"""``put_next``: ``Scratchpad.put`` at a turn's next free step, as the
integrations (``SecurepadSaver``, ``SecurepadSession``) store their entries
under the rule "one live entry per step of a turn": the step is chosen in the
write transaction. Both backends; another process is a second ``Scratchpad``
on the same store."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from securepad import InvalidArgumentError, Keyring, Policy, Principal, QuotaExceededError, Scratchpad
from securepad._steps import newest_first, put_next
from securepad.store import parts
from tests.support.principals import NOW


def steps(pad: Scratchpad, principal: Principal, turn: str, now: float = NOW) -> list[tuple[int, Any]]:
    return [(item["step_num"], item["summary"]) for item in pad.list_for_turn(principal, turn, now=now)]


def test_each_entry_takes_the_step_after_the_highest_live_one(pad: Scratchpad, alice: Principal) -> None:
    assert [put_next(pad, alice, "t", "tool", f"o{i}", now=NOW)["step_num"] for i in range(3)] == [1, 2, 3]
    pad.put(alice, "t", 10, "tool", "ten", ttl_seconds=5, now=NOW)
    assert put_next(pad, alice, "t", "tool", "eleven", ttl_seconds=5, now=NOW)["step_num"] == 11
    # Steps 10 and 11 expire: the next entry takes 4, still after every live one.
    assert put_next(pad, alice, "t", "tool", "after expiry", now=NOW + 5)["step_num"] == 4
    assert [step for step, _ in steps(pad, alice, "t", NOW + 5)] == [1, 2, 3, 4]
    # Another owner's turn of the same id is its own: it starts at 1.
    assert put_next(pad, Principal("bob", "agent", "web"), "t", "tool", "b", now=NOW)["step_num"] == 1


def test_a_stale_guess_takes_the_step_after_the_highest_live_one_sealed_anew(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    with (
        Scratchpad.open(store_location, keyring=keyring) as pad,
        Scratchpad.open(store_location, keyring=keyring) as other,
    ):
        put_next(pad, alice, "t", "tool", "first", now=NOW)
        # Another process writes steps 2 and 3 after this one guessed 2.
        other.put(alice, "t", 2, "tool", "theirs", now=NOW)
        put_next(other, alice, "t", "tool", "theirs too", now=NOW)
        view = parts(pad).putter.put(alice, "t", 2, "tool", {"rows": [1, 2]}, now=NOW, free_step=True, next_step=True)
        assert view["step_num"] == 4 and "step4" in view["ref_hint"]
        # A guess above the last live step (those entries since deleted) is brought down.
        late = parts(pad).putter.put(alice, "t", 9, "tool", "late", now=NOW, free_step=True, next_step=True)
        assert late["step_num"] == 5
        # What was sealed names the step taken: the store's own checks pass on read.
        listed = other.list_for_turn(alice, "t", now=NOW)
        assert [item["step_num"] for item in listed] == [1, 2, 3, 4, 5]
        assert listed[3]["view"] == view
        assert other.get(alice, view["scratchpad_id"], now=NOW).observation == {"rows": [1, 2]}
        assert other.turn(alice, "t", now=NOW).resolve("{{step4.rows}}", now=NOW) == [1, 2]


def test_a_callers_guess_spares_the_read_and_a_wrong_one_still_takes_the_next_step(
    pad: Scratchpad, alice: Principal
) -> None:
    assert put_next(pad, alice, "t", "tool", "first", now=NOW, guess=1)["step_num"] == 1
    # Too low (step 1 is taken) and too high (nothing lives above 1): the write decides.
    assert put_next(pad, alice, "t", "tool", "second", now=NOW, guess=1)["step_num"] == 2
    assert put_next(pad, alice, "t", "tool", "third", now=NOW, guess=40)["step_num"] == 3
    # Not a step: read, as without a guess.
    assert put_next(pad, alice, "t", "tool", "fourth", now=NOW, guess=0)["step_num"] == 4
    assert steps(pad, alice, "t") == [(1, "first"), (2, "second"), (3, "third"), (4, "fourth")]


def test_newest_first_opens_the_newest_first_and_checks_the_whole_turn(
    pad: Scratchpad, alice: Principal, bob: Principal
) -> None:
    for i in range(4):
        put_next(pad, alice, "t", "tool", f"o{i}", now=NOW)
    newest = newest_first(pad, alice, "t", now=NOW)
    assert [next(newest)["step_num"], next(newest)["step_num"]] == [4, 3]
    assert [item["view"]["summary"] for item in newest_first(pad, alice, "t", now=NOW)] == ["o3", "o2", "o1", "o0"]
    # Another owner's turn of the same id is empty for it.
    assert list(newest_first(pad, bob, "t", now=NOW)) == []


def test_other_refusals_are_not_retried_and_store_nothing(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": {"max_entry_bytes": 100}})
    with Scratchpad.open(store_location, keyring=keyring, policy=policy) as pad:
        with pytest.raises(InvalidArgumentError, match="executor_name"):
            put_next(pad, alice, "t", "", "x", now=NOW)
        with pytest.raises(InvalidArgumentError, match="ttl_seconds"):
            put_next(pad, alice, "t", "tool", "x", 0, now=NOW)
        with pytest.raises(QuotaExceededError):
            put_next(pad, alice, "t", "tool", "x" * 101, now=NOW)
        with pytest.raises(InvalidArgumentError, match="Principal"):
            put_next(pad, "alice", "t", "tool", "x", now=NOW)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            put_next(pad, alice, "", "tool", "x", now=NOW)
        with pytest.raises(InvalidArgumentError, match="next_step"):
            parts(pad).putter.put(alice, "t", 1, "tool", "x", now=NOW, next_step=True)
        assert steps(pad, alice, "t") == []


def test_concurrent_writers_in_two_stores_never_share_a_step(
    store_location: Any, keyring: Keyring, alice: Principal
) -> None:
    per_thread, errors = 10, []
    with (
        Scratchpad.open(store_location, keyring=keyring) as one,
        Scratchpad.open(store_location, keyring=keyring) as two,
    ):

        def writer(pad: Scratchpad, name: str) -> None:
            try:
                for i in range(per_thread):
                    put_next(pad, alice, "t", "tool", f"{name} {i}")
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=writer, args=(pad, f"{n}{k}"))
            for n, pad in (("a", one), ("b", two))
            for k in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        listed = one.list_for_turn(alice, "t")
        assert [item["step_num"] for item in listed] == list(range(1, 4 * per_thread + 1))
        # Each writer's entries list in the order it wrote them.
        for name in ("a0", "a1", "b0", "b1"):
            mine = [item["summary"] for item in listed if item["summary"].startswith(f"{name} ")]
            assert mine == [f"{name} {i}" for i in range(per_thread)]
