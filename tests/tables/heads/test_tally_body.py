"""A turn head's body is compact JSON with its keys sorted (msgspec's encoder, ``order="sorted"``),
however ``Tally.dumps`` builds it."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from securepad.tables.heads.tally import HEAD_FORMAT, KINDS, Tally

counts = st.integers(min_value=0, max_value=2**40)
digests = st.integers(min_value=0, max_value=2**256 - 1)
newest = st.one_of(
    st.none(),
    st.tuples(st.text(max_size=8), counts, st.floats(0, 1e10), st.text(max_size=8), st.text(max_size=8)).map(list),
)


@given(
    st.fixed_dictionaries({k: counts for k in KINDS}),
    st.fixed_dictionaries({k: digests for k in KINDS}),
    counts,
    newest,
    counts,
    counts,
    counts,
)
def test_the_body_is_sorted_compact_json(
    n: dict, d: dict, last: int, new: list | None, used: int, extra: int, owner: int
) -> None:
    tally = Tally(n, d, last, new, used, used + extra, owner)
    body = {"f": HEAD_FORMAT, "n": n, "d": {k: format(v, "064x") for k, v in d.items()}, "l": last, "w": new}
    body.update(b=used, r=used + extra, o=owner)
    expected = msgspec.json.Encoder(order="sorted").encode(body)
    assert tally.dumps() == expected
    assert list(json.loads(tally.dumps())) == sorted(body)
    assert Tally.loads(tally.dumps()) == tally
