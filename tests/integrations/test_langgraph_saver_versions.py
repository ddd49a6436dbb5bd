"""``SecurepadSaver.get_next_version``: versions order as their counts do, after every
version of the 32-digit form LangGraph's own savers write, and are unique per write."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import Principal, Scratchpad

if TYPE_CHECKING:
    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")


@pytest.fixture
def saver(pad: Scratchpad, alice: Principal) -> SecurepadSaver:
    from securepad.integrations.langgraph import SecurepadSaver

    return SecurepadSaver(pad, alice)


def former(number: int) -> str:
    """A version as this saver (and LangGraph's own savers) wrote them before: 32 digits."""
    return f"{number:032}.{0.5:016}"


@given(counts=st.lists(st.integers(0, 10**15 - 2), min_size=2, max_size=6), former_count=st.integers(0, 10**15))
def test_versions_order_as_their_counts_and_after_every_former_one(counts: list[int], former_count: int) -> None:
    """LangGraph compares a channel's versions as strings: a version made here orders
    as its count among those made here, and after every version of the former form
    (whose count has 16 digits at most), so a channel's versions still grow."""
    from securepad.integrations.langgraph import SecurepadSaver

    next_version = SecurepadSaver.get_next_version
    made = [(count + 1, next_version(None, count, None)) for count in counts]  # type: ignore[arg-type]
    made += [(count + 1, next_version(None, former(count), None)) for count in counts]  # type: ignore[arg-type]
    for count_a, version_a in made:
        assert version_a > former(former_count)
        for count_b, version_b in made:
            if count_a != count_b:
                assert (version_a < version_b) == (count_a < count_b)


def test_a_version_follows_the_one_it_is_made_from_and_is_unique(saver: SecurepadSaver) -> None:
    version = saver.get_next_version(None, None)
    seen = {version}
    for _ in range(200):
        following = saver.get_next_version(version, None)
        assert following > version
        assert int(following.split(".")[0]) == int(version.split(".")[0]) + 1
        version = following
        seen.add(version)
    assert len({saver.get_next_version(version, None) for _ in range(200)}) == 200
    assert len(seen) == 201
    assert saver.get_next_version(former(41), None) > former(41)
    assert saver.get_next_version(7, None) > saver.get_next_version(6, None)
