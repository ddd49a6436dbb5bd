"""A plain text's view (``view``'s short way) is the one ``fit_view`` gives, at every limit;
a one-piece line index (``line_index``'s short way) counts as ``splitlines`` does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from securepad.core.shaping import fit_view, line_index, text_summary, view

texts = st.text(alphabet=st.sampled_from('ab \n"\\\x01\r\u00e9\u2028\U0001f600'), max_size=1300)


@given(texts, st.integers(min_value=0, max_value=10**15), st.integers(min_value=0, max_value=9000))
def test_a_plain_text_view_is_fit_views(text: str, step: int, limit: int) -> None:
    size = len(text.encode())
    general = {"step_num": step, "size_bytes": size, "kind": "text", "summary": text_summary(text), "metadata": {}}
    shown = view("text", step, size, text, None, text, limit)
    expected = fit_view(general, {}, limit)
    assert shown == expected
    assert list(shown) == list(expected)


@given(texts)
def test_one_piece_is_counted_as_splitlines_counts(text: str) -> None:
    breaks, count = line_index([text])
    assert count == len(text.splitlines())
    assert (breaks, count) == line_index(iter([text]))  # the loop's answer
