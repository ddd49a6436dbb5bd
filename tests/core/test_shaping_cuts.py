"""How content is cut into the segments it is sealed in (``cut_text``, ``cut_bytes``):
the bytes and indexes a reader relies on, against the plain answers (the
encoding, ``str.splitlines``, ``line_index`` of the decoded pieces), with one
encoding of the content and no copy of it."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import InvalidArgumentError
from securepad.core import json_size, read_modes, shaping
from securepad.core.shaping import SEGMENT_BYTES, SEGMENT_SLACK, cut_bytes, cut_text

# Every line break splitlines knows, ASCII and not, among plain characters.
texts = (
    st.text(alphabet="ab \n", max_size=80)
    | st.text(alphabet="ab \n\r\x0b\x0c\x1c\x1d\x1e", max_size=80)
    | st.text(alphabet="ab\n\r\x85\u2028é€😀", max_size=80)
    | st.text(max_size=60)
).filter(lambda text: not any(0xD800 <= ord(c) <= 0xDFFF for c in text))
segments = st.integers(4, 12)  # a segment holds at least one character of four bytes
slacks = st.integers(0, 6)


@given(text=texts, segment=segments, slack=slacks)
def test_text_cuts_join_to_the_encoding_on_character_boundaries(text: str, segment: int, slack: int) -> None:
    pieces, counts, breaks, lines = cut_text(text, segment, slack)
    data = text.encode()
    assert b"".join(pieces) == data
    assert all(len(piece) <= segment for piece in pieces[:-1])
    assert len(pieces[-1]) <= segment + slack
    if len(data) > segment + slack:
        assert len(pieces[-1]) > slack  # a short tail joined the segment before it
    decoded = [bytes(piece).decode() for piece in pieces]  # each piece decodes alone
    assert counts == list(map(len, decoded))
    assert (breaks, lines) == shaping.line_index(decoded)
    assert lines == len(text.splitlines())


@given(
    line=st.integers(1, 120),
    lines=st.integers(0, 200),
    noise=st.binary(max_size=40),
    dense=st.integers(0, 100),
)
def test_newlines_counts_what_count_counts_whatever_the_lines_length(
    line: int, lines: int, noise: bytes, dense: int
) -> None:
    """Long lines (counted from break to break), short ones and runs of breaks (past the cap: ``count``)."""
    data = (b"x" * (line - 1) + b"\n") * lines + noise + b"\n" * dense
    assert shaping.newlines(data) == data.count(b"\n")
    assert shaping.newlines(data[: len(data) // 2]) == data[: len(data) // 2].count(b"\n")


@given(data=st.binary(max_size=80), segment=st.integers(1, 12), slack=slacks)
def test_binary_cuts_are_full_segments_but_the_last(data: bytes, segment: int, slack: int) -> None:
    pieces = cut_bytes(data, segment, slack)
    assert b"".join(pieces) == data
    assert all(len(piece) == segment for piece in pieces[:-1])
    assert len(pieces[-1]) <= segment + slack


@pytest.mark.parametrize(
    "size",
    [
        *(0, 1, SEGMENT_BYTES, SEGMENT_BYTES + 5, SEGMENT_BYTES + SEGMENT_SLACK, SEGMENT_BYTES + SEGMENT_SLACK + 1),
        *(3 * SEGMENT_BYTES + 17, 16 * SEGMENT_BYTES, 16 * SEGMENT_BYTES + SEGMENT_SLACK + 1),
    ],
)
def test_a_reader_finds_binary_segments_where_every_reader_looks(size: int) -> None:
    """A binary entry's sealed index holds no counts: readers, this version's and
    earlier ones, take every segment but the last as full (``binary_counts``)."""
    pieces = cut_bytes(bytes(size))
    assert [len(piece) for piece in pieces] == shaping.binary_counts(size, len(pieces))


def test_content_a_little_over_a_segment_is_one_segment() -> None:
    """A 64 KiB value with its encoding's few header bytes stays in its row (one segment)."""
    assert len(cut_bytes(bytes(SEGMENT_BYTES + 5))) == 1
    assert len(cut_text("x" * (SEGMENT_BYTES + SEGMENT_SLACK))[0]) == 1
    assert len(cut_text("x" * (SEGMENT_BYTES + SEGMENT_SLACK + 1))[0]) == 2
    assert len(cut_bytes(bytes(16 * SEGMENT_BYTES + 100))) == 16


@pytest.mark.parametrize(
    "content",
    [
        "".join(f"line {i}\n" for i in range(40_000)),  # ASCII, every break a newline
        "".join(f"line {i}\r\n" for i in range(40_000)),  # ASCII, other breaks
        "x" * (5 * SEGMENT_BYTES + 3),
        bytes(range(256)) * (5 * SEGMENT_BYTES // 256 + 1),
    ],
)
def test_large_content_is_encoded_once_and_cut_without_a_copy(content: str | bytes) -> None:
    """Every segment of ASCII text or binary content is a view of one buffer:
    no copy per segment, no decoding back to text."""
    pieces = cut_bytes(content) if isinstance(content, bytes) else cut_text(content)[0]
    assert len(pieces) > 1
    assert all(isinstance(piece, memoryview) for piece in pieces)
    buffers = {id(piece.obj) for piece in pieces if isinstance(piece, memoryview)}
    assert len(buffers) == 1
    if isinstance(content, bytes):
        assert pieces[0].obj is content  # type: ignore[union-attr]


def test_text_with_lone_surrogates_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="lone surrogates"):
        cut_text("a\ud800b")


# -- every read mode over content cut this way returns the plain slice --------------------


def content_of(value: str | bytes, segment: int, slack: int) -> read_modes.SegmentedContent:
    """``value`` as a read sees it after ``cut_text``/``cut_bytes`` (binary: ``binary_counts``, as a read has it)."""
    if isinstance(value, bytes):
        pieces = [bytes(piece) for piece in cut_bytes(value, segment, slack)]
        counts = [segment] * (len(pieces) - 1) + [len(pieces[-1])]
        return read_modes.SegmentedContent("binary", counts, lambda first, last: pieces[first : last + 1])
    cut, char_counts, breaks, lines = cut_text(value, segment, slack)
    stored = [bytes(piece) for piece in cut]
    return read_modes.SegmentedContent(
        "text", char_counts, lambda first, last: stored[first : last + 1], breaks=breaks, line_count=lines
    )


@given(
    value=texts | st.binary(max_size=80),
    segment=segments,
    slack=slacks,
    start=st.integers(0, 90),
    span=st.integers(0, 90),
)
def test_every_read_mode_returns_the_plain_slice(
    value: str | bytes, segment: int, slack: int, start: int, span: int
) -> None:
    content = content_of(value, segment, slack)
    size = len(value)
    assert content.size == size
    assert content.slice(0, size) == value
    assert content.slice(start, start + span) == value[start : start + span]
    cap = 10**6
    plain = {
        "head": value[:span],
        "tail": value[max(size - span, 0) :],
        "range": value[start : start + span],
        "full": value,
    }
    for mode, expected in plain.items():
        result = read_modes.read(content, mode, n=span, start=start, end=start + span, cap=cap)
        got = result["content"]
        if isinstance(value, bytes):
            got = base64.b64decode(got)
        assert got == expected, mode
    if isinstance(value, str):
        first = max(start, 1)
        lines = read_modes.read(content, "lines", start=start, end=first + span, cap=cap)
        assert lines["content"] == "".join(value.splitlines(keepends=True)[first - 1 : first + span])
        assert lines["metadata"]["total_lines"] == len(value.splitlines())
        found = read_modes.read(content, "grep", pattern="a", max_matches=1000, cap=cap)
        expected = [(n, line) for n, line in enumerate(value.splitlines(), 1) if "a" in line]
        assert found["metadata"]["match_lines"] == [n for n, _ in expected]
        assert found["content"] == "\n".join(f"{n}:{line}" for n, line in expected)


# -- classification: each part serialized once ---------------------------------------------


def test_classification_serializes_each_part_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A json observation's content is its indented JSON as text (encoded once, when
    cut); a dict's other fields are serialized once (by json, or by msgspec when they
    are plain JSON: ``core.json_size``), their size returned with them."""
    calls: list[object] = []
    real = shaping.json.dumps
    real_encode = json_size._ENCODE

    def counted(value: object, **kwargs: object) -> str:
        calls.append(value)
        return real(value, **kwargs)  # type: ignore[arg-type]

    def encoded(value: object) -> bytes:
        calls.append(value)
        return real_encode(value)

    monkeypatch.setattr(shaping.json, "dumps", counted)
    monkeypatch.setattr(json_size, "_ENCODE", encoded)
    structured = {"items": [{"a": i, "b": "é"} for i in range(50)]}
    kind, shape, content, rest, rest_bytes, _ = shaping.classify(structured, 20)
    assert (kind, shape, rest, rest_bytes) == ("json", "json", None, 0)
    assert content == real(structured, ensure_ascii=False, indent=2)
    assert len(calls) == 1
    calls.clear()
    fields = {"content": b"\x00" * 10, "metadata": {"path": "/tmp/ü"}, "status": 200}
    kind, shape, content, rest, rest_bytes, _ = shaping.classify(fields, 20)
    assert (kind, shape, content) == ("binary", "dict", b"\x00" * 10)
    assert len(calls) == 1
    assert rest_bytes == len(shaping.dumps({"metadata": {"path": "/tmp/ü"}, "status": 200}))
