"""A caller's ``now`` cannot run ahead of this host's clock by more than the
policy's ``max_clock_skew_seconds``: no put is stored already expired, and no
call expires or collects live entries ahead of time."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import Keyring, Policy, Scratchpad
from securepad.core.timeline import Timeline
from securepad.errors import ExpiredError, InvalidArgumentError, PolicyError
from tests.support.principals import ALICE, BOB

CLOCK = 1_700_000_000.0
SKEW = Policy.default().max_clock_skew_seconds
AHEAD = CLOCK + SKEW + 1


@pytest.fixture
def clocked(store_location: Any, keyring: Keyring) -> Iterator[Scratchpad]:
    """A store whose host clock stands at CLOCK, with one live entry of alice and of bob."""
    with Scratchpad.open(store_location, keyring=keyring, clock=lambda: CLOCK) as pad:
        for who in (ALICE, BOB):
            pad.put(who, "t", 1, "tool", f"{who.owner_user_id}'s live entry")
        yield pad


def live(pad: Scratchpad) -> list[str]:
    return [
        pad.get(who, item["scratchpad_id"]).observation for who in (ALICE, BOB) for item in pad.list_for_turn(who, "t")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("now", [1e300, AHEAD, CLOCK + 2 * 86400])
def test_a_put_ahead_of_the_clock_is_refused_and_stores_nothing(clocked: Scratchpad, now: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"past this host's clock.*max_clock_skew_seconds"):
        clocked.put(ALICE, "t", 2, "tool", "from the future", now=now)
    assert clocked.stats()["entries"] == 2
    assert [item["step_num"] for item in clocked.list_for_turn(ALICE, "t")] == [1]


def test_gc_ahead_of_the_clock_is_refused_and_collects_no_live_entry(clocked: Scratchpad) -> None:
    with pytest.raises(InvalidArgumentError, match="past this host's clock"):
        clocked.gc(now=CLOCK + 2 * 86400)
    assert clocked.gc() == 0
    assert live(clocked) == ["alice's live entry", "bob's live entry"]


def test_writes_ahead_of_the_clock_are_refused(clocked: Scratchpad) -> None:
    turn = clocked.turn(ALICE, "t")
    calls = [
        lambda: clocked.put_many(ALICE, "t", [(2, "x", "y")], now=AHEAD),
        lambda: clocked.turn(ALICE, "t", now=AHEAD),  # collects expired entries first
        lambda: clocked.extend_turn(ALICE, "t", 60, now=AHEAD),
        lambda: turn.record(2, "tool", "ahead", now=AHEAD),
        lambda: turn.checkpoint(facts=["ahead"], now=AHEAD),
        lambda: turn.mark_compaction(now=AHEAD),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="past this host's clock"):
            call()
    assert clocked.stats()["entries"] == 2 and live(clocked) == ["alice's live entry", "bob's live entry"]
    assert turn.checkpoint(facts=["now"])["created_at"] == CLOCK


def test_a_read_ahead_of_the_clock_only_hides_entries_from_its_caller(clocked: Scratchpad) -> None:
    (item,) = clocked.list_for_turn(ALICE, "t")
    later = item["expires_at"] + 1
    with pytest.raises(ExpiredError):
        clocked.get(ALICE, item["scratchpad_id"], now=later)
    assert clocked.list_for_turn(ALICE, "t", now=later) == []
    assert clocked.verify(now=later)["ok"]
    assert clocked.gc() == 0  # at the clock's time nothing has expired: nothing is collected
    assert live(clocked) == ["alice's live entry", "bob's live entry"]


def test_an_entry_found_expired_is_not_served_again_to_an_earlier_now(clocked: Scratchpad) -> None:
    entry = clocked.put(ALICE, "old", 1, "tool", "an hour old", now=CLOCK - 7200)["scratchpad_id"]
    assert clocked.get(ALICE, entry, now=CLOCK - 5000).observation == "an hour old"  # not found expired yet
    with pytest.raises(ExpiredError):
        clocked.get(ALICE, entry)  # at the clock: expired an hour ago
    for before in (CLOCK - 5000, CLOCK - 3601):
        with pytest.raises(ExpiredError):
            clocked.get(ALICE, entry, now=before)
        with pytest.raises(ExpiredError):
            clocked.read(ALICE, entry, mode="head", now=before)
        assert clocked.list_for_turn(ALICE, "old", now=before) == []
    assert live(clocked) == ["alice's live entry", "bob's live entry"]  # the others are untouched


def test_a_read_far_ahead_of_the_clock_does_not_expire_entries_for_later_reads(clocked: Scratchpad) -> None:
    (item,) = clocked.list_for_turn(ALICE, "t")
    with pytest.raises(ExpiredError):
        clocked.get(ALICE, item["scratchpad_id"], now=item["expires_at"] + 1)
    assert clocked.get(ALICE, item["scratchpad_id"]).observation == "alice's live entry"
    assert live(clocked) == ["alice's live entry", "bob's live entry"]


def test_a_now_within_the_skew_is_accepted(clocked: Scratchpad) -> None:
    stored = clocked.put(ALICE, "t", 2, "tool", "a host slightly ahead", now=CLOCK + SKEW)
    assert clocked.get(ALICE, stored["scratchpad_id"], now=CLOCK + SKEW).created_at == CLOCK + SKEW
    # A now behind the clock (a replay, a caller's own timeline) is the caller's to give.
    assert clocked.get(ALICE, stored["scratchpad_id"], now=CLOCK - 10**6).observation == "a host slightly ahead"


def test_the_policy_sets_the_skew(store_location: Any, keyring: Keyring) -> None:
    wide = Policy.from_dict({"limits": {"max_clock_skew_seconds": 86400}})
    with Scratchpad.open(store_location, keyring=keyring, policy=wide, clock=lambda: CLOCK) as pad:
        stored = pad.put(ALICE, "t", 1, "tool", "a day ahead", now=CLOCK + 86400)
        assert pad.get(ALICE, stored["scratchpad_id"], now=CLOCK + 86400).expires_at > CLOCK + 86400
        with pytest.raises(InvalidArgumentError, match=r"max_clock_skew_seconds \(86400\)"):
            pad.put(ALICE, "t", 2, "tool", "two days ahead", now=CLOCK + 2 * 86400)


@pytest.mark.parametrize("value", [0, -1, 86401, 1.5, "300", True])
def test_a_bad_skew_in_a_policy_is_refused(value: object) -> None:
    with pytest.raises(PolicyError, match=r"limits\.max_clock_skew_seconds"):
        Policy.from_dict({"limits": {"max_clock_skew_seconds": value}})


@given(
    clock=st.floats(min_value=-1e12, max_value=1e12),
    now=st.floats(allow_nan=True, allow_infinity=True),
    skew=st.integers(min_value=1, max_value=86400),
)
def test_a_write_time_is_accepted_exactly_when_finite_and_within_the_skew(clock: float, now: float, skew: int) -> None:
    timeline = Timeline(lambda: clock, skew)
    assert timeline.write_time(None) == timeline.read_time(None) == clock
    if math.isfinite(now) and now <= clock + skew:
        assert timeline.write_time(now) == now
    else:
        with pytest.raises(InvalidArgumentError):
            timeline.write_time(now)
    if math.isfinite(now):
        assert timeline.read_time(now) == now
    else:
        with pytest.raises(InvalidArgumentError):
            timeline.read_time(now)


def test_a_write_without_now_reads_the_host_clock_as_it_is_and_checks_any_other() -> None:
    assert Timeline(time.time, SKEW).write_clock is time.time  # a finite float: nothing to check
    assert Timeline(lambda: CLOCK, SKEW).write_clock() == CLOCK
    for bad in (math.nan, math.inf, "1700000000"):
        with pytest.raises(InvalidArgumentError):
            Timeline(lambda bad=bad: bad, SKEW).write_clock()


def test_a_read_ahead_of_the_clock_expires_nothing_early_for_another_owner(clocked: Scratchpad) -> None:
    mine = clocked.put(ALICE, "short", 1, "tool", "alice's minute", ttl_seconds=60)["scratchpad_id"]
    theirs = clocked.put(BOB, "short", 1, "tool", "bob's two minutes", ttl_seconds=120)["scratchpad_id"]
    with pytest.raises(ExpiredError):  # within the skew: alice asks about her own entry three minutes on
        clocked.get(ALICE, mine, now=CLOCK + 180)
    assert clocked.get(BOB, theirs).observation == "bob's two minutes"
    assert [item["scratchpad_id"] for item in clocked.list_for_turn(BOB, "short")] == [theirs]
    assert clocked.gc() == 0
    # The entry that raised is not served again, at the clock or any earlier time.
    for before in (None, CLOCK - 10):
        with pytest.raises(ExpiredError):
            clocked.get(ALICE, mine, now=before)
        with pytest.raises(ExpiredError):
            clocked.read(ALICE, mine, mode="head", now=before)


def test_an_entry_found_expired_ahead_of_the_clock_joins_the_floor_once_the_clock_gets_there() -> None:
    clock = [CLOCK]
    timeline = Timeline(lambda: clock[0], SKEW)
    timeline.found_expired("e1", CLOCK + 100)
    assert timeline.entry_time("e1", None) == CLOCK + 100
    assert timeline.read_time(None) == CLOCK  # no other entry moves
    timeline.found_expired("e2", CLOCK + SKEW + 1)  # past the skew: not remembered
    assert timeline.entry_time("e2", None) == CLOCK
    clock[0] = CLOCK + 200
    timeline.found_expired("e3", CLOCK + 150)  # the clock has passed both: the floor has them
    assert timeline.read_time(CLOCK) == timeline.entry_time("e1", CLOCK) == CLOCK + 150
