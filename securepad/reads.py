"""Read modes over an entry's segments: head, tail, range, full, lines, grep.

A read decrypts only the segments that hold the characters (bytes, for
binary entries) it returns: the per-segment counts come from the entry's
sealed index, so finding a position costs a bisect, not a scan. The same
index counts the line breaks in each segment, so ``lines`` starts decrypting
at the segment that holds its first line. ``lines`` and ``grep`` stream one
segment at a time and never hold the whole entry.

Lines are the lines of ``str.splitlines``: the same breaks (``\\n``, ``\\r\\n``,
``\\r``, form feed, ``\\u2028``...), so line numbers agree with Python's.
"""

from __future__ import annotations

import base64
import bisect
import collections
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import re2  # type: ignore[import-untyped]

from .errors import InvalidArgumentError

__all__ = ["MODES", "SegmentedContent", "iter_lines", "line_index", "read"]

MODES = ("head", "tail", "range", "full", "lines", "grep")
DEFAULT_N = 2000
DEFAULT_MAX_MATCHES = 50
# Context lines around each grep match, before and after.
MAX_CONTEXT = 50
MAX_PATTERN_CHARS = 1000
# A longer line is searched (and kept in memory) only up to here, so that a
# single-line entry is never held whole.
GREP_LINE_LIMIT = 1 << 20
# A longer matching line is shown as a window around its match.
GREP_SHOW_CHARS = 1000
# Lines are searched in blocks of about this many characters (see _search).
GREP_BLOCK_CHARS = 256 * 1024

# The breaks of str.splitlines; "\r\n" is one break.
_BREAK_CHARS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK_RE = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Flag groups that could turn multi-line mode off, and the text anchors; a
# pattern with either is searched line by line (see _search).
_WHOLE_TEXT_SYNTAX = re.compile(r"\(\?[a-zA-Z-]*m|\\[Az]")

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
        if start >= end:
            return empty
        ends = self._ends
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
    pattern: str | None = None,
    max_matches: int = DEFAULT_MAX_MATCHES,
    context: int = 0,
    cap: int,
) -> dict[str, Any]:
    """Run one read mode, never returning more than ``cap`` characters.

    For binary entries positions count bytes and the result is base64; the
    cap then bounds the base64 text, so at most ``cap // 4 * 3`` bytes.
    ``lines`` takes 1-based inclusive line numbers in ``start``/``end``
    (0 means the first line); ``grep`` searches lines ``start``..``end``
    (the whole entry by default) for ``pattern`` (RE2 syntax).

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
        regex, block_regex = compile_pattern(pattern)
        wanted = check_count("max_matches", max_matches)
        if not wanted:
            raise InvalidArgumentError("max_matches must be at least 1")
        around = check_count("context", context) or 0
        if around > MAX_CONTEXT:
            raise InvalidArgumentError(f"context must be at most {MAX_CONTEXT} lines, not {around}")
        return _grep(content, pattern or "", regex, block_regex, wanted, around, first, last, cap)
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


# -- lines ----------------------------------------------------------------------------


def line_index(texts: Iterable[str]) -> tuple[list[int], int]:
    """For text cut into ``texts``: the line breaks ending in each piece, and the line count.

    A ``"\\r\\n"`` split between two pieces ends in the second one.
    """
    breaks: list[int] = []
    last_char = ""
    last_filled = -1
    for seq, text in enumerate(texts):
        # splitlines() breaks on exactly _BREAK_CHARS ("\r\n" once) in one pass:
        # five times faster than counting each character (11 ms of a 1 MiB put).
        lines = len(text.splitlines())
        breaks.append(lines - 1 if text and text[-1] not in _BREAK_CHARS else lines)
        if text and text[0] == "\n" and last_char == "\r":
            breaks[last_filled] -= 1
        if text:
            last_char, last_filled = text[-1], seq
    trailing = 1 if last_char and last_char not in _BREAK_CHARS else 0
    return breaks, sum(breaks) + trailing


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
    content: SegmentedContent, first_line: int = 1, last_line: int | None = None, *, limit: int = GREP_LINE_LIMIT
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
    capped = False
    hint: str | None = None
    for line in iter_lines(content, first, None, limit=cap + 1):
        if last is not None and line.number > last:
            next_line = line.number
            break
        if start_char is None:
            start_char = line.start
        whole = line.length + len(line.ending)
        if used + whole > cap:
            capped = True
            if parts:
                next_line = line.number
                hint = f"cut to the read cap of {cap} characters; continue with mode='lines', start={line.number}"
            else:  # the line alone is over the cap: return its first part
                parts.append((line.text + line.ending)[:cap])
                used = cap
                next_line = line.number + 1
                hint = (
                    f"line {line.number} has {line.length} characters, more than the read cap of {cap};"
                    f" read the rest of it with mode='range', start={line.start + cap},"
                    f" end={line.start + line.length}, or go on with mode='lines', start={line.number + 1}"
                )
            break
        parts.append(line.text + line.ending)
        used += whole
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


# -- grep -----------------------------------------------------------------------------


def compile_pattern(pattern: object) -> tuple[Any, Any]:
    """The RE2 regex for ``pattern`` and, when it is safe, its multi-line twin
    used to search many lines at once (see ``_search``).

    RE2 runs in time linear in the text, whatever the pattern: a pattern from
    a model cannot hang the process.

    Raises:
        InvalidArgumentError: the pattern is missing, too long, or not valid RE2 syntax.
    """
    if not isinstance(pattern, str):
        raise InvalidArgumentError("mode 'grep' needs a pattern (a string, RE2 regular expression syntax)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArgumentError(f"the pattern has {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    options = re2.Options()
    options.log_errors = False
    try:
        regex = re2.compile(pattern, options)
        block = None if _WHOLE_TEXT_SYNTAX.search(pattern) else re2.compile("(?m)" + pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidArgumentError(
            f"invalid pattern {pattern[:80]!r}: {reason} (RE2 syntax: no backreferences or look-around)"
        ) from None
    except UnicodeEncodeError:
        raise InvalidArgumentError("the pattern must be valid Unicode (no lone surrogates)") from None
    return regex, block


Hit = tuple[Line, tuple[int, int] | None]


def _search(regex: Any, block_regex: Any, lines: Iterator[Line]) -> Iterator[Hit]:
    """Each line with the span of the pattern's first match in it (or None).

    Searching line by line costs a call per line. When the pattern has no
    text anchors (``\\A``, ``\\z``) and cannot switch multi-line mode off, a
    line matches on its own only if ``(?m)pattern`` matches somewhere in the
    lines joined by ``\\n`` (``^``, ``$`` and ``\\b`` see the same neighbours),
    so a block is searched once and only the lines where a block match starts
    are checked on their own.
    """
    batch: list[Line] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line.text) + 1
        if size >= GREP_BLOCK_CHARS:
            yield from _search_batch(regex, block_regex, batch)
            batch, size = [], 0
    yield from _search_batch(regex, block_regex, batch)


def _search_batch(regex: Any, block_regex: Any, batch: list[Line]) -> Iterator[Hit]:
    if not batch:
        return
    if block_regex is None:
        for line in batch:
            found = regex.search(line.text)
            yield line, (found.span() if found else None)
        return
    encoded = [line.text.encode("utf-8") for line in batch]
    block = b"\n".join(encoded)
    starts = [0, *itertools.accumulate(len(e) + 1 for e in encoded)]
    spans: dict[int, tuple[int, int]] = {}
    pos = 0
    while pos <= len(block):
        candidate = block_regex.search(block, pos)
        if candidate is None:
            break
        index = bisect.bisect_right(starts, candidate.start()) - 1
        found = regex.search(batch[index].text)
        if found is not None:
            spans[index] = found.span()
        pos = starts[index + 1]
    for index, line in enumerate(batch):
        yield line, spans.get(index)


def _show(line: Line, span: tuple[int, int] | None) -> str:
    """A line as grep shows it: whole, or a window around its match if it is long."""
    if line.length <= GREP_SHOW_CHARS:
        return line.text
    lo = 0 if span is None else max(0, span[0] - GREP_SHOW_CHARS // 4)
    hi = min(len(line.text), lo + GREP_SHOW_CHARS)
    lo = max(0, hi - GREP_SHOW_CHARS)
    return ("…" if lo else "") + line.text[lo:hi] + ("…" if hi < line.length else "")


def _grep(
    content: SegmentedContent,
    pattern: str,
    regex: Any,
    block_regex: Any,
    max_matches: int,
    context: int,
    first: int,
    last: int | None,
    cap: int,
) -> dict[str, Any]:
    rows: list[str] = []
    used = -1  # rows are joined by "\n": n rows cost their lengths + n - 1
    matches: list[int] = []
    before: collections.deque[Line] = collections.deque(maxlen=context)
    after_left = 0
    last_shown = 0
    shortened = 0
    searched_to = first - 1
    next_line: int | None = None
    capped = reached = False
    long_lines = 0

    def show(line: Line, mark: str, span: tuple[int, int] | None) -> bool:
        nonlocal used, last_shown, shortened
        text = _show(line, span)
        row = f"{line.number}{mark}{text}"
        # Like grep, "--" separates groups of context lines that are not adjacent.
        gap = ["--"] if context and last_shown and line.number > last_shown + 1 else []
        cost = sum(len(r) + 1 for r in [*gap, row])
        cut = False
        if used + cost > cap:
            if rows:
                return False
            row, cut = row[:cap], True  # nothing shown yet: show what fits, so that a retry makes progress
            gap, cost = [], len(row) + 1
        rows.extend([*gap, row])
        used += cost
        last_shown = line.number
        if cut or text != line.text or line.length > len(line.text):
            shortened += 1
        return True

    for line, span in _search(regex, block_regex, iter_lines(content, first, last, limit=GREP_LINE_LIMIT)):
        if span is not None:
            if reached:  # like grep -m: stop at the first match past max_matches
                next_line = line.number
                break
            shown = all(show(b, "-", None) for b in before if b.number > last_shown) and show(line, ":", span)
            if not shown:
                capped, next_line = True, line.number
                break
            matches.append(line.number)
            before.clear()
            after_left = context
            reached = len(matches) == max_matches
        elif after_left:
            after_left -= 1
            if not show(line, "-", None):
                capped, next_line = True, line.number
                break
        elif reached:  # max_matches and its trailing context are shown
            next_line = line.number
            break
        elif context:
            before.append(line)
        searched_to = line.number
        if line.length > len(line.text):
            long_lines += 1
    complete = next_line is None
    stopped = reached and not complete and not capped
    seen_last = searched_to if complete and last is None else None
    metadata: dict[str, Any] = {
        "mode": "grep",
        "kind": content.kind,
        "unit": "characters",
        "pattern": pattern,
        "size_full": content.size,
        "total_lines": _total_lines(content, seen_last),
        "start_line": first,
        "searched_to_line": searched_to,
        "matches": len(matches),
        "match_lines": matches,
        "size_returned": max(used, 0),
        "truncated": not complete,
        "capped": capped,
        "stopped_at_max_matches": stopped,
        "next_line": next_line,
    }
    if stopped:
        metadata["hint"] = (
            f"stopped after max_matches={max_matches} matching lines; search on with mode='grep', start={next_line}"
        )
    elif capped:
        metadata["hint"] = f"cut to the read cap of {cap} characters; continue with mode='grep', start={next_line}"
    if long_lines:
        metadata["long_lines"] = long_lines
        metadata.setdefault(
            "hint",
            f"{long_lines} line(s) longer than {GREP_LINE_LIMIT} characters were searched only in their first"
            f" {GREP_LINE_LIMIT} characters; read them with mode='lines' or mode='range'",
        )
    if shortened:
        metadata["lines_shortened"] = shortened
        metadata.setdefault(
            "hint", "long lines are shown as a window around the match; read them whole with mode='lines'"
        )
    return {"ok": True, "content": "\n".join(rows), "metadata": metadata}
