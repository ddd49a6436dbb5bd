"""Content cut into segments: the unit an entry's content is sealed in."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import InvalidArgumentError

__all__ = ["SEGMENT_BYTES", "split_bytes", "split_text"]

# The largest segment: a read opens only the segments its slice needs.
SEGMENT_BYTES = 64 * 1024


def split_text(text: str) -> tuple[list[bytes], list[str]]:
    """UTF-8 segments of at most SEGMENT_BYTES, cut on character boundaries,
    and the text of each (decoded once, for the character and line indexes).

    Raises:
        InvalidArgumentError: the text holds lone surrogates (not valid Unicode).
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("text content must be valid Unicode (no lone surrogates)") from None
    if len(data) <= SEGMENT_BYTES:  # one segment: the text is its own piece
        return [data], [text]
    segments = list(_utf8_chunks(data))
    return segments, [chunk.decode("utf-8") for chunk in segments]


def _utf8_chunks(data: bytes) -> Iterator[bytes]:
    if not data:
        yield b""
        return
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        end = min(pos + SEGMENT_BYTES, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1
        yield bytes(view[pos:end])
        pos = end


def split_bytes(data: bytes) -> list[bytes]:
    """Fixed-size segments of binary content (one empty segment for empty content)."""
    if not data:
        return [b""]
    return [data[i : i + SEGMENT_BYTES] for i in range(0, len(data), SEGMENT_BYTES)]
