"""Read modes over an entry's segments: head, tail, range, full, lines, grep.

A read decrypts only the segments that hold the characters (bytes, for
binary entries) it returns: the per-segment counts come from the entry's
sealed index, so finding a position costs a bisect, not a scan. The same
index counts the line breaks in each segment, so ``lines`` starts decrypting
at the segment that holds its first line. ``lines`` and ``grep`` (in
``grep.py``) stream one segment at a time and never hold the whole entry.

Lines are the lines of ``str.splitlines``: the same breaks (``\\n``, ``\\r\\n``,
``\\r``, form feed, ``\\u2028``...), so line numbers agree with Python's.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError
from . import grep
from .read_bounds import DEFAULT_MAX_MATCHES, DEFAULT_N, MAX_CONTEXT, MODES

__all__ = [
    "DEFAULT_MAX_MATCHES",
    "DEFAULT_N",
    "MAX_CONTEXT",
    "MODES",
    "SegmentedContent",
    "iter_lines",
    "read",
]

# iter_lines keeps at most this much of a line's text by default.
LINE_LIMIT = 1 << 20

_BREAK_RE = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

# fetch(first, last) -> the decrypted segments first..last inclusive.
Fetch = Callable[[int, int], list[bytes]]


@dataclass(frozen=True)
class SegmentedContent:
    """An entry's content as seen by the read modes: sizes known, bytes on demand.

    ``breaks`` (text and json) holds the number of line breaks that end in
    each segment and ``line_count`` the number of lines; both come from
    ``line_index`` when the entry was stored. Without them ``lines`` and
    ``grep`` scan from the first segment.
    """

    kind: str  # "text" | "json" | "binary"
    counts: Sequence[int]  # characters (bytes for binary) in each segment
    fetch: Fetch
    breaks: Sequence[int] | None = None
    line_count: int | None = None
    _ends: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ends", list(itertools.accumulate(self.counts)))
        if self.breaks is not None and len(self.breaks) != len(self.counts):
            raise ValueError("breaks and counts must describe the same segments")

    @property
    def size(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def is_binary(self) -> bool:
        return self.kind == "binary"

    def offset(self, seq: int) -> int:
        """Position of segment ``seq``'s first character (byte) in the content."""
        return self._ends[seq - 1] if seq > 0 else 0

    def segment_text(self, seq: int) -> str:
        """Segment ``seq`` decrypted and decoded: one segment, never more."""
        return self.fetch(seq, seq)[0].decode("utf-8")

    def slice(self, start: int, end: int) -> str | bytes:
        """content[start:end], decrypting only the segments that hold it."""
        empty: str | bytes = b"" if self.is_binary else ""
        end = min(end, self.size)
        if start >= end:
            return empty
        ends = self._ends
        first = bisect.bisect_right(ends, start)
        last = bisect.bisect_left(ends, end)
        offset = ends[first - 1] if first else 0
        parts = self.fetch(first, last)
        if self.is_binary:
            return b"".join(parts)[start - offset : end - offset]
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) == ends[last] - offset:  # ASCII: a character a byte, so only the slice is decoded
            return str(memoryview(data)[start - offset : end - offset], "utf-8")
        return data.decode("utf-8")[start - offset : end - offset]


def check_count(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """A non-negative int argument, or InvalidArgumentError naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be a non-negative integer, not {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative integer, not {value}")
    return value


def _grep(
    content: SegmentedContent,
    pattern: str | None,
    max_matches: int,
    context: int,
    first: int,
    last: int | None,
    cap: int,
    budget_s: float | None,
) -> dict[str, Any]:
    regexes = grep.compile_pattern(pattern)
    wanted = check_count("max_matches", max_matches)
    if not wanted:
        raise InvalidArgumentError("max_matches must be at least 1")
    around = check_count("context", context) or 0
    if around > MAX_CONTEXT:
        raise InvalidArgumentError(f"context must be at most {MAX_CONTEXT} lines, not {around}")
    seq, number = _seek(content, first)
    return grep.grep(
        content,
        str(pattern),
        regexes,
        max_matches=wanted,
        context=around,
        first=first,
        last=last,
        cap=cap,
        start_segment=seq,
        start_number=number,
        budget_s=budget_s,
    )


def read(
    content: SegmentedContent,
    mode: str,
    *,
    n: int = DEFAULT_N,
    start: int = 0,
    end: int | None = None,
    pattern: str | None = None,
    max_matches: int = DEFAULT_MAX_MATCHES,
    context: int = 0,
    cap: int,
    grep_budget_s: float | None = None,
) -> dict[str, Any]:
    """Run one read mode, never returning more than ``cap`` characters.

    For binary entries positions count bytes and the result is base64; the
    cap then bounds the base64 text, so at most ``cap // 4 * 3`` bytes.
    ``lines`` takes 1-based inclusive line numbers in ``start``/``end``
    (0 means the first line); ``grep`` searches lines ``start``..``end``
    (the whole entry by default) for ``pattern`` (RE2 syntax), stopping with a
    partial result after ``grep_budget_s`` (``grep.GREP_TIME_BUDGET_S`` by default).

    Raises:
        InvalidArgumentError: unknown mode, negative or non-integer n/start/end,
            start > end, lines or grep on a binary entry, a missing or invalid
            pattern, max_matches < 1, or context out of range.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"unknown read mode {mode!r}; use one of {', '.join(MODES)}")
    if mode in ("lines", "grep"):
        if content.is_binary:
            raise InvalidArgumentError(
                f"mode {mode!r} works on text and json entries; this entry is binary: use head, tail or range"
            )
        first = check_count("start", start) or 1
        last = check_count("end", end, allow_none=True)
        if last is not None and first > last:
            raise InvalidArgumentError(f"start line ({first}) is after end line ({last})")
        if mode == "lines":
            return _read_lines(content, first, last, cap)
        return _grep(content, pattern, max_matches, context, first, last, cap, grep_budget_s)
    return _read_span(content, mode, n, start, end, cap)


def read_fitted(
    content: SegmentedContent, mode: str, *, cap: int, extra: dict[str, Any], **args: Any
) -> dict[str, Any]:
    """``read`` plus the ``extra`` fields, the whole result fitting ``cap``
    characters as the JSON the model sees: the content, its escapes and the
    result's own fields (positions, hint, the echoed pattern) all count, down
    to one character of content however small the cap.

    Raises:
        InvalidArgumentError: as ``read``.
    """

    def once(content_cap: int) -> dict[str, Any]:
        result = read(content, mode, cap=content_cap, **args)
        result.update(extra)
        return result

    # A grep sets room aside for its own fields up front (a second scan is not free);
    # the other modes see what their fields took and read again, smaller, when over.
    pattern = args.get("pattern")
    reserve = json_chars(pattern) + GREP_FIELDS_CHARS if mode == "grep" and isinstance(pattern, str) else 0
    content_cap = max(1, cap - reserve)
    result = once(content_cap)
    for _ in range(4):  # the fields' own digits may move by one on the way down
        if _fits_at_most(result, cap):
            break
        over = json_chars(result) - cap
        if over <= 0 or mode == "grep" or content_cap == 1:
            break
        content_cap = max(1, min(content_cap, json_chars(result["content"]) - 2) - over)
        result = once(content_cap)
    return result


# What a grep result's own fields take besides its lines and match_lines (mode,
# counts, positions, next_line, the longest hint, flags), with room to spare.
GREP_FIELDS_CHARS = 700


def json_chars(value: object) -> int:
    """Characters of ``value`` as JSON (ensure_ascii=False), as the model sees it."""
    return len(json.dumps(value, ensure_ascii=False))


# The most characters one character of a string takes as JSON (ensure_ascii=False
# escapes only the quote, the backslash and control characters, at most as \u001f).
_MOST_PER_CHAR = 6


def _fits_at_most(result: dict[str, Any], cap: int) -> bool:
    """Whether ``result`` fits ``cap`` as JSON whatever its text content's escapes
    (its fields encoded, the content counted at its longest): no need to encode the content."""
    content = result.get("content")
    if not isinstance(content, str):
        return False
    return json_chars({**result, "content": ""}) + _MOST_PER_CHAR * len(content) <= cap


# -- lines ----------------------------------------------------------------------------


def _read_span(content: SegmentedContent, mode: str, n: int, start: int, end: int | None, cap: int) -> dict[str, Any]:
    """``head``, ``tail``, ``range`` and ``all``: one span of characters (bytes for binary), capped."""
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
    if isinstance(data, str):
        # The cap counts the text as the model sees it: JSON, where a quote, a
        # line break or a control character costs its escape.
        fitted = _fit_json(data, limit, keep_end=mode == "tail")
        if len(fitted) < len(data):
            lo, hi = (hi - len(fitted), hi) if mode == "tail" else (lo, lo + len(fitted))
            data, capped = fitted, True
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


def _fit_json(text: str, limit: int, *, keep_end: bool) -> str:
    """``text``, or its longest prefix (suffix with ``keep_end``) whose JSON
    string form (ensure_ascii=False, quotes excluded) has at most ``limit`` characters."""
    if _MOST_PER_CHAR * len(text) <= limit or len(json.dumps(text, ensure_ascii=False)) - 2 <= limit:
        return text
    low, high = 0, min(len(text), limit)  # a character costs at least one

    def part(n: int) -> str:
        return text[len(text) - n :] if keep_end else text[:n]

    while low < high:
        middle = (low + high + 1) // 2
        if len(json.dumps(part(middle), ensure_ascii=False)) - 2 <= limit:
            low = middle
        else:
            high = middle - 1
    return part(low)


@dataclass(frozen=True, slots=True)
class Line:
    """One line of an entry, as ``iter_lines`` yields it."""

    number: int  # 1-based
    start: int  # offset of its first character in the entry
    text: str  # without the line break; cut to the reader's limit
    length: int  # the full length, without the line break
    ending: str  # the line break; "" for a last line without one


class _LineBuilder:
    __slots__ = ("kept", "length", "limit", "number", "parts", "start")

    def __init__(self, number: int, start: int, limit: int) -> None:
        self.number, self.start, self.limit = number, start, limit
        self.parts: list[str] = []
        self.kept = self.length = 0

    def add(self, piece: str) -> None:
        self.length += len(piece)
        room = self.limit - self.kept
        if piece and room > 0:
            piece = piece[:room]
            self.parts.append(piece)
            self.kept += len(piece)

    def finish(self, ending: str) -> Line:
        line = Line(self.number, self.start, "".join(self.parts), self.length, ending)
        self.number += 1
        self.start += self.length + len(ending)
        self.parts, self.kept, self.length = [], 0, 0
        return line


def _seek(content: SegmentedContent, first_line: int) -> tuple[int, int]:
    """The segment to start from for ``first_line`` and the number of the line
    that segment starts in (that line may begin in an earlier segment)."""
    if content.breaks is None or first_line <= 1:
        return 0, 1
    seen = 0
    for seq, count in enumerate(content.breaks):
        if seen + count >= first_line - 1:
            return seq, seen + 1
        seen += count
    return len(content.breaks), seen + 1


def iter_lines(
    content: SegmentedContent, first_line: int = 1, last_line: int | None = None, *, limit: int = LINE_LIMIT
) -> Iterator[Line]:
    """The lines ``first_line``..``last_line`` of a text or json entry, decrypting
    one segment at a time. A line's ``text`` keeps at most ``limit`` characters."""
    seq, number = _seek(content, first_line)
    lines = _lines_from(content, seq, number, limit)
    if seq > 0:
        # The segment starts inside (or right at the start of) a line before
        # first_line; the line break index guarantees that line is not wanted.
        next(lines, None)
    for line in lines:
        if last_line is not None and line.number > last_line:
            return
        if line.number >= first_line:
            yield line


def _lines_from(content: SegmentedContent, first_seq: int, number: int, limit: int) -> Iterator[Line]:
    builder = _LineBuilder(number, content.offset(first_seq), limit)
    total = len(content.counts)
    pending_cr = False  # the last segment ended with "\r": is it half of "\r\n"?
    for seq in range(first_seq, total):
        text = content.segment_text(seq)
        at = 0
        if pending_cr:
            pending_cr = False
            crlf = text.startswith("\n")
            at = 1 if crlf else 0
            yield builder.finish("\r\n" if crlf else "\r")
        for match in _BREAK_RE.finditer(text, at):
            builder.add(text[at : match.start()])
            at = match.end()
            if match.group() == "\r" and at == len(text) and seq < total - 1:
                pending_cr = True
            else:
                yield builder.finish(match.group())
        builder.add(text[at:])
    if pending_cr:
        yield builder.finish("\r")
    elif builder.length:
        yield builder.finish("")


def _total_lines(content: SegmentedContent, seen_last: int | None) -> int | None:
    """The line count from the index, else the last line number a scan reached."""
    return content.line_count if content.line_count is not None else seen_last


def _read_lines(content: SegmentedContent, first: int, last: int | None, cap: int) -> dict[str, Any]:
    parts: list[str] = []
    used = 0
    start_char: int | None = None
    end_line: int | None = None
    next_line: int | None = None
    seen = 0  # the cap counts the text as JSON, as the model sees it (escapes included)
    capped = False
    hint: str | None = None
    for line in iter_lines(content, first, None, limit=cap + 1):
        if last is not None and line.number > last:
            next_line = line.number
            break
        if start_char is None:
            start_char = line.start
        whole = line.length + len(line.ending)
        cost = len(json.dumps(line.text + line.ending, ensure_ascii=False)) - 2
        if seen + cost > cap:
            capped = True
            if parts:
                next_line = line.number
                hint = f"cut to the read cap of {cap} characters; continue with mode='lines', start={line.number}"
            else:  # the line alone is over the cap: return its first part
                part = _fit_json(line.text + line.ending, cap, keep_end=False)
                parts.append(part)
                used = len(part)
                next_line = line.number + 1
                hint = (
                    f"line {line.number} has {line.length} characters, more than the read cap of {cap};"
                    f" read the rest of it with mode='range', start={line.start + used},"
                    f" end={line.start + line.length}, or go on with mode='lines', start={line.number + 1}"
                )
            break
        parts.append(line.text + line.ending)
        used += whole
        seen += cost
        end_line = line.number
    # Without an index, a scan that ran to the end has counted the lines.
    seen_last = end_line if next_line is None else None
    first_char = start_char if start_char is not None else content.size
    metadata: dict[str, Any] = {
        "mode": "lines",
        "kind": content.kind,
        "unit": "characters",
        "size_full": content.size,
        "total_lines": _total_lines(content, seen_last),
        "start_line": first,
        "end_line": end_line,
        "lines_returned": 0 if end_line is None else end_line - first + 1,
        "size_returned": used,
        "start": first_char,
        "end": first_char + used,
        "truncated": used < content.size,
        "capped": capped,
        "next_line": next_line,
    }
    if hint is not None:
        metadata["hint"] = hint
    return {"ok": True, "content": "".join(parts), "metadata": metadata}
