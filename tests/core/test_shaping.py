"""A view fits its limit exactly as its JSON (``json.dumps(..., ensure_ascii=False)``) measures it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from securepad.core.shaping import fit_view

# What the store adds to a view ("ok" and the 16-hex id), as the limit counts it.
FRAME = len(json.dumps({"ok": True, "scratchpad_id": "0" * 16}))


def _size(view: dict[str, Any], scalars: dict[str, Any]) -> int:
    return len(json.dumps({**scalars, **view}, ensure_ascii=False)) + FRAME


def _fits_exactly(view: dict[str, Any], scalars: dict[str, Any]) -> None:
    """At its own size the view comes back whole; one character less, it is cut."""
    size = _size(view, scalars)
    assert fit_view(view, scalars, size) == {**scalars, **view}
    assert "view_cut" in fit_view(view, scalars, size - 1)


def test_every_character_is_measured_as_json_writes_it() -> None:
    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for first in range(0, len(characters), 8192):
        summary = "".join(characters[first : first + 8192])
        _fits_exactly({"step_num": 1, "size_bytes": len(summary), "kind": "text", "summary": summary}, {})


scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)


@given(
    summary=st.text(max_size=300),
    metadata=st.dictionaries(st.text(max_size=8), scalar, max_size=4),
    scalars=st.dictionaries(st.text(max_size=8), scalar, max_size=4),
    step=st.integers(min_value=0, max_value=2**40),
)
def test_a_view_fits_at_its_json_size_and_not_one_character_less(
    summary: str, metadata: dict[str, Any], scalars: dict[str, Any], step: int
) -> None:
    view = {"step_num": step, "size_bytes": 12, "kind": "text", "summary": summary, "metadata": metadata}
    _fits_exactly(view, scalars)
