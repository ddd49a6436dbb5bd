"""Read modes over an entry's segments: head, tail, range, full.

A read decrypts only the segments that hold the characters (bytes, for
binary entries) it returns: the per-segment counts come from the entry's
sealed index, so finding a position costs a bisect, not a scan.
"""

from __future__ import annotations

import base64
import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["MODES", "SegmentedContent", "read"]

MODES = ("head", "tail", "range", "full")
DEFAULT_N = 2000

# fetch(first, last) -> the decrypted segments first..last inclusive.
Fetch = Callable[[int, int], list[bytes]]


@dataclass(frozen=True)
class SegmentedContent:
    """An entry's content as seen by the read modes: sizes known, bytes on demand."""

    kind: str  # "text" | "json" | "binary"
    counts: Sequence[int]  # characters (bytes for binary) in each segment
    fetch: Fetch

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ends", list(itertools.accumulate(self.counts)))

    @property
    def size(self) -> int:
        ends: list[int] = object.__getattribute__(self, "_ends")
        return ends[-1] if ends else 0

    @property
    def is_binary(self) -> bool:
        return self.kind == "binary"

    def slice(self, start: int, end: int) -> str | bytes:
        """content[start:end], decrypting only the segments that hold it."""
        empty: str | bytes = b"" if self.is_binary else ""
        if start >= end:
            return empty
        ends: list[int] = object.__getattribute__(self, "_ends")
        first = bisect.bisect_right(ends, start)
        last = bisect.bisect_left(ends, end)
        offset = ends[first - 1] if first else 0
        parts = self.fetch(first, last)
        if self.is_binary:
            return b"".join(parts)[start - offset : end - offset]
        return "".join(p.decode("utf-8") for p in parts)[start - offset : end - offset]


def check_count(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """A non-negative int argument, or InvalidArgumentError naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be a non-negative integer, not {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative integer, not {value}")
    return value


def read(
    content: SegmentedContent,
    mode: str,
    *,
    n: int = DEFAULT_N,
    start: int = 0,
    end: int | None = None,
    cap: int,
) -> dict[str, Any]:
    """Run one read mode, never returning more than ``cap`` characters.

    For binary entries positions count bytes and the result is base64; the
    cap then bounds the base64 text, so at most ``cap // 4 * 3`` bytes.

    Raises:
        InvalidArgumentError: unknown mode, negative or non-integer n/start/end,
            or start > end.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"unknown read mode {mode!r}; use one of {', '.join(MODES)}")
    size = content.size
    limit = cap // 4 * 3 if content.is_binary else cap
    if mode in ("head", "tail"):
        count = check_count("n", n)
        assert count is not None
        want = min(count, size)
        lo, hi = (0, want) if mode == "head" else (size - want, size)
    elif mode == "range":
        lo = check_count("start", start) or 0
        hi_arg = check_count("end", end, allow_none=True)
        if hi_arg is not None and lo > hi_arg:
            raise InvalidArgumentError(f"start ({lo}) is greater than end ({hi_arg})")
        hi = size if hi_arg is None else hi_arg
        lo, hi = min(lo, size), min(hi, size)
    else:
        lo, hi = 0, size
    capped = hi - lo > limit
    if capped:
        # A tail keeps its end; every other mode keeps its start.
        lo, hi = (hi - limit, hi) if mode == "tail" else (lo, lo + limit)
    data = content.slice(lo, hi)
    metadata: dict[str, Any] = {
        "mode": mode,
        "kind": content.kind,
        "unit": "bytes" if content.is_binary else "characters",
        "size_full": size,
        "size_returned": hi - lo,
        "start": lo,
        "end": hi,
        "truncated": hi - lo < size,
        "capped": capped,
        "next_start": hi if hi < size else None,
    }
    if capped:
        unit = metadata["unit"]
        if mode == "tail":
            where = f"mode='range', start={max(0, lo - limit)}, end={lo}"
        else:
            where = f"mode='range', start={hi}"
        metadata["hint"] = f"cut to the read cap of {limit} {unit}; continue with {where}"
    if isinstance(data, bytes):
        return {
            "ok": True,
            "content": base64.b64encode(data).decode("ascii"),
            "encoding": "base64",
            "metadata": metadata,
        }
    return {"ok": True, "content": data, "metadata": metadata}
