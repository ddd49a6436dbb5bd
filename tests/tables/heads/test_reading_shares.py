"""Each owner's share of the verified-inventory cache (``tables.heads.reading.HeadCache``).

The cache is shared by every owner of the process. One owner reading many
turns (hundreds of tiny ones) must not evict the inventories of the others:
when the cache is full, an owner that holds more gives up its own least
recently used entries before an owner that holds less loses any. Counted:
the entries each owner keeps, and the rows a warm read fetches.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from securepad import Scratchpad
from securepad.tables.heads.reading import CACHE_TURNS, HeadCache
from securepad.tables.heads.tally import Head
from tests.support.meters import ReadMeter
from tests.support.principals import ALICE, BOB, NOW


class _Scope:
    """A stand-in for a connection: something a weak reference can point to."""


def _head(rows: int) -> Head:
    return Head(e={f"e{index}": [index, NOW, 1, "a", "c"] for index in range(rows)})


def _kept(cache: HeadCache, scope: object, owner: str, turns: list[str]) -> list[str]:
    return [turn for turn in turns if cache.get(scope, owner, turn) is not None]


def test_an_owner_flooding_the_cache_with_turns_evicts_only_its_own() -> None:
    cache = HeadCache(turns=256, rows=200_000)
    scope = _Scope()
    bobs = [f"b{index}" for index in range(10)]
    for turn in bobs:
        cache.put(scope, "bob", turn, (1,), _head(3))
    for index in range(300):
        cache.put(scope, "alice", f"a{index}", (1,), _head(1))
    assert _kept(cache, scope, "bob", bobs) == bobs  # evicted for another owner: 0
    assert cache.held("alice") == (246, 246)
    assert cache.held("bob") == (10, 30)
    # The newest of the flood are the ones kept.
    assert _kept(cache, scope, "alice", [f"a{index}" for index in range(300)]) == [
        f"a{index}" for index in range(54, 300)
    ]


def test_an_owner_flooding_the_cache_with_rows_evicts_only_its_own() -> None:
    cache = HeadCache(turns=256, rows=1_000)
    scope = _Scope()
    cache.put(scope, "bob", "b", (1,), _head(100))
    for index in range(40):
        cache.put(scope, "alice", f"a{index}", (1,), _head(50))
    assert _kept(cache, scope, "bob", ["b"]) == ["b"]
    turns, rows = cache.held("alice")
    assert rows <= 900 and turns == rows // 50


def test_an_owner_that_holds_less_still_gets_in_a_full_cache() -> None:
    cache = HeadCache(turns=8, rows=200_000)
    scope = _Scope()
    for index in range(8):
        cache.put(scope, "alice", f"a{index}", (1,), _head(1))
    cache.put(scope, "bob", "b", (1,), _head(1))
    assert _kept(cache, scope, "bob", ["b"]) == ["b"]
    assert cache.held("alice") == (7, 7)  # alice's least recently used went
    assert cache.get(scope, "alice", "a0") is None


def test_an_owner_that_holds_more_loses_its_least_recently_used_first() -> None:
    cache = HeadCache(turns=4, rows=200_000)
    scope = _Scope()
    for turn in ("b0", "b1", "b2"):
        cache.put(scope, "bob", turn, (1,), _head(1))
    cache.put(scope, "alice", "a0", (1,), _head(1))
    cache.put(scope, "alice", "a1", (1,), _head(1))  # bob holds more: his oldest goes
    assert _kept(cache, scope, "bob", ["b0", "b1", "b2"]) == ["b1", "b2"]
    assert _kept(cache, scope, "alice", ["a0", "a1"]) == ["a0", "a1"]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 30), st.integers(1, 40)), max_size=200))
def test_the_cache_stays_within_its_bounds_and_never_evicts_a_smaller_owner(
    puts: list[tuple[str, int, int]],
) -> None:
    cache = HeadCache(turns=16, rows=300)
    scope = _Scope()
    for owner, turn, rows in puts:
        before = {other: cache.held(other) for other in "abcd" if other != owner}
        cache.put(scope, owner, f"t{turn}", (1,), _head(rows))
        held = {each: cache.held(each) for each in "abcd"}
        assert sum(turns for turns, _ in held.values()) <= 16
        assert sum(rows for _, rows in held.values()) <= 300
        for other, (turns_before, rows_before) in before.items():
            if held[other] != (turns_before, rows_before):
                # Only an owner that held at least as much as the one putting lost entries.
                assert turns_before >= held[owner][0] or rows_before >= held[owner][1]


def test_one_owner_reading_hundreds_of_tiny_turns_leaves_another_owners_read_warm(pad: Scratchpad) -> None:
    bob_entry = pad.put(BOB, "bob-turn", 1, "fetch", "bob's", now=NOW)["scratchpad_id"]
    for step in range(2, 40):
        pad.put(BOB, "bob-turn", step, "fetch", f"bob {step}", now=NOW)
    pad.get(BOB, bob_entry, now=NOW + 1)
    meter = ReadMeter(pad)
    assert meter.counts(lambda: pad.get(BOB, bob_entry, now=NOW + 1))["rows"] == 2  # warm
    flood: list[Any] = [pad.put(ALICE, f"tiny-{index}", 1, "fetch", "x", now=NOW) for index in range(CACHE_TURNS + 44)]
    for view in flood:
        pad.get(ALICE, view["scratchpad_id"], now=NOW + 1)
    # Bob's inventory is still cached: his read fetches none.
    assert meter.counts(lambda: pad.get(BOB, bob_entry, now=NOW + 1))["rows"] == 2


def test_an_owner_that_holds_less_than_the_biggest_gets_in_when_the_oldest_entry_is_smaller_still() -> None:
    """The least recently used entry is of an owner that holds less than the
    newcomer's; the owner that holds the most gives up its own, not the
    newcomer, which would otherwise never stay while that owner holds the rest."""
    cache = HeadCache(turns=256, rows=100)
    scope = _Scope()
    cache.put(scope, "carol", "c", (1,), _head(5))
    cache.put(scope, "bob", "b", (1,), _head(90))
    cache.put(scope, "alice", "a", (1,), _head(10))
    assert _kept(cache, scope, "alice", ["a"]) == ["a"]
    assert _kept(cache, scope, "carol", ["c"]) == ["c"]
    assert cache.held("bob") == (0, 0)
