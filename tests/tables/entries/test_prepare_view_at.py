"""An entry given another step inside its write (``Prepared.restep``) gets the view a put
at that step gives: ``Prepared.view_at`` against ``Prepared.of`` at the other step."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from securepad import Policy
from securepad.tables.entries.prepare import Prepared

scalars = st.none() | st.booleans() | st.integers(-1000, 10**6) | st.text(max_size=30)
metadata = st.dictionaries(st.text(max_size=8), scalars | st.lists(scalars, max_size=3), max_size=5)
observations = st.one_of(
    st.text(max_size=1500),
    st.binary(max_size=200),
    st.builds(lambda c, m: {"content": c, "metadata": m}, st.binary(max_size=50) | st.text(max_size=300), metadata),
    st.builds(
        lambda c, m, s: {"content": c, "metadata": m, **s},
        st.text(max_size=50),
        metadata,
        st.dictionaries(st.sampled_from(["status", "view_cut", "step_num", "note"]), scalars, max_size=3),
    ),
    st.dictionaries(st.text(max_size=5), st.lists(metadata, max_size=3) | scalars, max_size=3),
)
steps = st.integers(0, 10**5) | st.sampled_from([9, 10, 99, 100, 999])


@given(observation=observations, first=steps, second=steps, limit=st.integers(60, 700))
def test_the_view_at_another_step_is_the_view_a_put_there_makes(
    observation: Any, first: int, second: int, limit: int
) -> None:
    policy = Policy.from_dict({"limits": {"inline_max_chars": limit}})
    prepared = Prepared.of(observation, first, policy, identified=False)
    there = Prepared.of(observation, second, policy, identified=False)
    assert prepared.view_at(prepared.view, second, observation) == there.view
    assert list(prepared.view_at(prepared.view, second, observation)) == list(there.view)
