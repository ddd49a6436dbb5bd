"""The grep read mode: lines matching a model's pattern, one segment at a time.

Patterns run on RE2, whose matching time is linear in the text whatever the
pattern: a pattern from a model cannot hang the process.

Lines are those of ``str.splitlines``. Each segment's complete lines are
searched as one block in which every line break is a ``\\n`` (``\\r\\n`` is
one), with ``(?m)`` so that ``^``, ``$`` and ``\\b`` see a line's own edges.
The block regex is compiled with RE2's ``never_nl``, so no match can contain a
line break: a match lies inside one line, the line it starts in is a matching
line, and the next search starts at the next line. It is also compiled with
``never_capture``: a line match needs no submatches, and capture groups
would make each search cost more than the text it reads. Each RE2 call reads
at most ``GREP_CHUNK_BYTES`` plus the rest of one line, and a grep call
stops, with a partial result that says where to go on, once it has run
``GREP_TIME_BUDGET_S``: its cost is linear in the bytes it scans and bounded
in time, whatever the pattern. Patterns with text anchors (``\\A``, ``\\z``)
or flags that might switch multi-line mode off are checked line by line.
Nothing is held but one segment, the line that straddles segments (cut to
``GREP_LINE_LIMIT`` characters) and the context lines.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ..errors import InvalidArgumentError


class SegmentedContent(Protocol):
    """What grep reads of an entry's content (``reads.SegmentedContent``, which
    imports this module: a protocol here keeps the import one-way)."""

    @property
    def kind(self) -> str: ...

    @property
    def counts(self) -> Sequence[int]: ...

    @property
    def line_count(self) -> int | None: ...

    @property
    def size(self) -> int: ...

    def segment_text(self, seq: int) -> str: ...


__all__ = [
    "GREP_CHUNK_BYTES",
    "GREP_LINE_LIMIT",
    "GREP_SHOW_CHARS",
    "GREP_TIME_BUDGET_S",
    "MAX_PATTERN_CHARS",
    "compile_pattern",
    "grep",
]

MAX_PATTERN_CHARS = 1000
# A longer line is searched (and kept in memory) only up to here, so that a
# single-line entry is never held whole.
GREP_LINE_LIMIT = 1 << 20
# A longer line is shown as a window around its match.
GREP_SHOW_CHARS = 1000
# One RE2 call reads at most this many bytes (plus the rest of the line it ends in).
GREP_CHUNK_BYTES = 1 << 16
# A grep call that has run this long returns what it found so far, with where to go on.
GREP_TIME_BUDGET_S = 2.0
# The line-by-line search (text anchors) looks at the clock after this many lines.
_LINES_PER_CLOCK = 256

# The breaks of str.splitlines; "\r\n" is one break.
BREAK_CHARS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_TO_NEWLINE = str.maketrans(dict.fromkeys(BREAK_CHARS, "\n"))
_FIRST_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_WHOLE_TEXT_SYNTAX = re.compile(r"\(\?[a-zA-Z-]*m|\\[Az]")


def compile_pattern(pattern: object) -> tuple[Any, Any]:
    """The RE2 regex for ``pattern`` and, when it is safe, its multi-line twin
    for the block search (None when lines must be checked one by one).

    Raises:
        InvalidArgumentError: the pattern is missing, too long, or not valid RE2 syntax.
    """
    if not isinstance(pattern, str):
        raise InvalidArgumentError("mode 'grep' needs a pattern (a string, RE2 regular expression syntax)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArgumentError(f"the pattern has {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    # Imported here: a program (or a command) that never greps never loads RE2.
    import re2  # type: ignore[import-untyped]

    options = re2.Options()
    options.log_errors = False
    options.never_capture = True  # a line match needs no submatches: groups only cost
    lines_only = re2.Options()
    lines_only.log_errors = False
    lines_only.never_capture = True
    lines_only.never_nl = True  # no match crosses a line break: a block match is a line match
    try:
        regex = re2.compile(pattern, options)
        block = None if _WHOLE_TEXT_SYNTAX.search(pattern) else re2.compile("(?m)" + pattern, lines_only)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidArgumentError(
            f"invalid pattern {pattern[:80]!r}: {reason} (RE2 syntax: no backreferences or look-around)"
        ) from None
    except UnicodeEncodeError:
        raise InvalidArgumentError("the pattern must be valid Unicode (no lone surrogates)") from None
    return regex, block


class _Output:
    """The rows shown (``N:line`` for matches, ``N-line`` for context), within the cap.

    The cap counts what the model sees: each row as JSON-escaped text (a
    quote or a control character costs its escape), and for each match its
    number in ``match_lines`` too.
    """

    def __init__(self, cap: int, context: int) -> None:
        self.cap, self.context = cap, context
        self.rows: list[str] = []
        self.used = -2  # rows are joined by "\n", two characters in JSON: n rows cost their lengths + 2(n - 1)
        self.last_shown = 0
        self.shortened = 0

    def show(self, number: int, text: str, full_length: int, mark: str, span: tuple[int, int] | None) -> bool:
        """Add a row; False (and nothing added) when it does not fit the cap."""
        shown = _window(text, full_length, span)
        row = f"{number}{mark}{shown}"
        # Like grep, "--" separates groups of context lines that are not adjacent.
        gap = ["--"] if self.context and self.last_shown and number > self.last_shown + 1 else []
        listed = len(str(number)) + 2 if mark == ":" else 0  # its entry in match_lines, with ", "
        cost = sum(_json_length(r) + 2 for r in [*gap, row]) + listed
        cut = False
        if self.used + cost > self.cap:
            if self.rows:
                return False
            # Nothing shown yet: show what fits, so a retry makes progress.
            row, cut = _json_prefix(row, max(1, self.cap - listed)), True
            gap, cost = [], _json_length(row) + 2 + listed
        self.rows.extend([*gap, row])
        self.used += cost
        self.last_shown = number
        if cut or shown != text or full_length > len(text):
            self.shortened += 1
        return True


def _json_length(text: str) -> int:
    """Characters of ``text`` inside a JSON string (ensure_ascii=False), quotes excluded."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _json_prefix(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose JSON form fits in ``limit`` characters."""
    cut = min(len(text), limit)
    while cut > 0 and _json_length(text[:cut]) > limit:
        cut = max(0, min(cut - 1, cut - (_json_length(text[:cut]) - limit)))
    return text[:cut]


def _window(text: str, full_length: int, span: tuple[int, int] | None) -> str:
    """A line as shown: whole, or a window around its match if it is long."""
    if full_length <= GREP_SHOW_CHARS:
        return text
    lo = 0 if span is None else max(0, span[0] - GREP_SHOW_CHARS // 4)
    hi = min(len(text), lo + GREP_SHOW_CHARS)
    lo = max(0, hi - GREP_SHOW_CHARS)
    return ("…" if lo else "") + text[lo:hi] + ("…" if hi < full_length else "")


class _Grep:
    """The state of one grep across the blocks of complete lines fed to it."""

    def __init__(
        self,
        regex: Any,
        block_regex: Any,
        max_matches: int,
        context: int,
        first: int,
        last: int | None,
        cap: int,
        budget_s: float,
    ) -> None:
        self.regex, self.block_regex = regex, block_regex
        self.max_matches, self.context = max_matches, context
        self.first, self.last = first, last
        self.out = _Output(cap, context)
        self.matches: list[int] = []
        self.lengths: dict[int, int] = {}  # full lengths of lines kept only in part
        self.tail: deque[tuple[int, str]] = deque(maxlen=context)  # the lines before the block
        self.after_until = 0  # show lines up to this number as trailing context
        self.resume_at = 0  # the first match past max_matches, shown only as context: a later grep starts there
        self.searched_to = first - 1
        self.next_line: int | None = None
        self.capped = self.reached = self.done = False
        # The work done: bytes handed to RE2 (each read at most once) and RE2 calls.
        self.bytes_scanned = self.re2_calls = 0
        self.deadline = time.monotonic() + budget_s
        self.out_of_budget = False
        self.budget_line: int | None = None  # the first line not searched when the budget ran out

    def feed(self, block: str, base: int) -> None:
        """Search ``block``: complete lines, each ended by "\\n", the first numbered ``base``."""
        count = block.count("\n")
        top = base + count - 1 if self.last is None else min(base + count - 1, self.last)
        lines: list[str] | None = None

        def line(number: int) -> str:
            nonlocal lines
            if lines is None:
                lines = block.split("\n")
            return lines[number - base]

        for number, span in self._hits(block, base, top):
            if not self._context_until(number - 1, base, line):
                return
            if self.reached:  # like grep -m: no match past max_matches, only its trailing context,
                if number <= self.after_until:  # which shows a matching line as context ("N-line")
                    self.resume_at = self.resume_at or number
                    continue
                self.stop(min(self.resume_at or number, self.after_until + 1))
                return
            for before in range(max(self.out.last_shown + 1, number - self.context, self.first), number):
                text = line(before) if before >= base else dict(self.tail)[before]
                if not self._show(before, text, "-", None):
                    return
            if not self._show(number, line(number), ":", span):
                return
            self.matches.append(number)
            self.after_until = number + self.context
            self.reached = len(self.matches) == self.max_matches
        if self.budget_line is not None:  # out of budget: lines from budget_line on were not searched
            stop = self.budget_line
            if self.reached and self.after_until < stop:  # max_matches and its context were shown: not the budget
                if self._context_until(stop - 1, base, line):
                    self.stop(min(self.resume_at or stop, self.after_until + 1))
                return
            if self._context_until(stop - 1, base, line):
                self.out_of_budget = True
                self.stop(min(self.resume_at or stop, stop))
            return
        if not self._context_until(top, base, line):
            return
        if self.reached and self.after_until < top:
            self.stop(min(self.resume_at or top, self.after_until + 1))
            return
        self.searched_to = top
        if self.last is not None and top >= self.last:
            self.done = True
        if self.context:
            start = max(base, top - self.context + 1)
            self.tail.extend((n, line(n)) for n in range(start, top + 1))

    def _spent(self) -> bool:
        return time.monotonic() >= self.deadline

    def _hits(self, block: str, base: int, top: int) -> Iterator[tuple[int, tuple[int, int]]]:
        """(line number, span) of each line from ``first`` to ``top`` that matches,
        found lazily: the search goes no further than the caller pulls. Sets
        ``budget_line`` and ends when the work budget runs out."""
        if top < max(base, self.first):
            return
        if self.block_regex is None:
            for index, text in enumerate(block.split("\n")[: top - base + 1]):
                number = base + index
                if number < self.first:
                    continue
                if index % _LINES_PER_CLOCK == 0 and self.re2_calls and self._spent():
                    self.budget_line = number
                    return
                self.re2_calls += 1
                self.bytes_scanned += len(text)
                found = self.regex.search(text)
                if found is not None:
                    yield number, found.span()
            return
        data = block.encode("utf-8")
        size = len(data)
        pos, number = 0, base
        if self.first > base:  # skip the lines before ``first`` without searching them
            for _ in range(self.first - base):
                pos = data.index(b"\n", pos) + 1
            number = self.first
        end_of_top = size
        if top < base + block.count("\n") - 1:  # ``last`` ends the search inside the block
            end_of_top = pos
            for _ in range(top - number + 1):
                end_of_top = data.index(b"\n", end_of_top) + 1
        while pos < end_of_top:
            if self.re2_calls and self._spent():
                self.budget_line = number
                return
            # One bounded call: a chunk of whole lines (a match never crosses a line break).
            limit = data.find(b"\n", min(pos + GREP_CHUNK_BYTES, end_of_top - 1))
            limit = end_of_top if limit < 0 else min(limit + 1, end_of_top)
            self.re2_calls += 1
            # Up to the last line's break, not past it: there the next line would begin.
            found = self.block_regex.search(data, pos, limit - 1)
            if found is None:
                self.bytes_scanned += limit - pos
                number += data.count(b"\n", pos, limit)
                pos = limit
                continue
            at = found.start()
            number += data.count(b"\n", pos, at)
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            end = size if end < 0 else end
            self.bytes_scanned += end + 1 - pos
            pos = end + 1
            prefix = len(data[start:at].decode("utf-8"))
            matched = len(data[at : found.end()].decode("utf-8"))
            yield number, (prefix, prefix + matched)
            number += 1

    def _context_until(self, until: int, base: int, line: Any) -> bool:
        """Show the trailing context lines of the last match, up to ``until``."""
        for number in range(max(self.out.last_shown + 1, base), min(self.after_until, until) + 1):
            if not self._show(number, line(number), "-", None):
                return False
        return True

    def _show(self, number: int, text: str, mark: str, span: tuple[int, int] | None) -> bool:
        if self.out.show(number, text, self.lengths.get(number, len(text)), mark, span):
            return True
        self.capped = True
        self.stop(number)
        return False

    def stop(self, next_line: int) -> None:
        self.next_line, self.done = next_line, True
        self.searched_to = max(self.searched_to, next_line - 1)


def grep(
    content: SegmentedContent,
    pattern: str,
    regexes: tuple[Any, Any],
    *,
    max_matches: int,
    context: int,
    first: int,
    last: int | None,
    cap: int,
    start_segment: int,
    start_number: int,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Run grep over ``content`` from segment ``start_segment``, whose first
    line is line ``start_number`` (a line that began in an earlier segment:
    it is skipped, and it is before ``first`` anyway). The call stops once it
    has run ``budget_s`` (``GREP_TIME_BUDGET_S`` by default) with a partial
    result: ``budget_exhausted`` true and ``next_line`` where to go on."""
    budget = GREP_TIME_BUDGET_S if budget_s is None else budget_s
    state = _Grep(*regexes, max_matches, context, first, last, cap, budget)
    long_lines = _search_segments(content, state, start_segment, start_number)
    if state.resume_at and state.next_line is None:
        state.stop(state.resume_at)  # the content ended inside the last match's trailing context
    shown = "\n".join(state.out.rows)
    metadata = _metadata(content, state, pattern, shown)
    hint = _hint(state, budget, max_matches, cap, long_lines)
    if hint is not None:
        metadata["hint"] = hint
    if long_lines:
        metadata["long_lines"] = long_lines
    if state.out.shortened:
        metadata["lines_shortened"] = state.out.shortened
    return {"ok": True, "content": shown, "metadata": metadata}


def _search_segments(content: SegmentedContent, state: _Grep, start_segment: int, start_number: int) -> int:
    """Feed ``state`` the content's lines, segment by segment, as blocks of whole
    lines (a line that straddles segments is carried over, cut to
    ``GREP_LINE_LIMIT`` characters); returns how many lines in the searched
    range were longer than that limit (searched only in their first part)."""
    number = start_number
    carry = ""  # the kept part of the line that goes on into the next segment
    extra = 0  # characters of that line beyond GREP_LINE_LIMIT, dropped
    skipping = False  # the carried line is over the limit: drop text until its break
    long_lines = 0
    total = len(content.counts)
    for seq in range(start_segment, total):
        text = content.segment_text(seq)
        if seq == start_segment and seq > 0:
            found = _FIRST_BREAK.search(text)
            text = text[found.end() :] if found else ""
            number += 1
        if skipping:
            found = _FIRST_BREAK.search(text)
            if found is None:
                extra += len(text)
                continue
            extra += found.start()
            text, skipping = text[found.start() :], False
        chunk = carry + text
        end = len(chunk) - 1 if seq < total - 1 and chunk.endswith("\r") else len(chunk)  # maybe half of "\r\n"
        cut = max(chunk.rfind(c, 0, end) for c in BREAK_CHARS) + 1
        if cut:
            if extra:
                state.lengths[number] = len(carry.rstrip("\r")) + extra
                long_lines += state.first <= number <= (state.last or number)
                extra = 0
            block = chunk[:cut].replace("\r\n", "\n").translate(_TO_NEWLINE)
            state.feed(block, number)
            if state.done:
                return long_lines
            number += block.count("\n")
        carry = chunk[cut:]
        pending_cr = seq < total - 1 and carry.endswith("\r")
        body = carry[:-1] if pending_cr else carry
        if len(body) > GREP_LINE_LIMIT:
            extra += len(body) - GREP_LINE_LIMIT
            carry = body[:GREP_LINE_LIMIT] + ("\r" if pending_cr else "")
            skipping = not pending_cr
    if carry:  # the last line, without a line break
        if extra:
            state.lengths[number] = len(carry) + extra
            long_lines += state.first <= number <= (state.last or number)
        state.feed(carry.translate(_TO_NEWLINE) + "\n", number)
    return long_lines


def _metadata(content: SegmentedContent, state: _Grep, pattern: str, shown: str) -> dict[str, Any]:
    """The result's metadata: what was searched, what matched, where to go on."""
    complete = state.next_line is None
    total_lines: int | None = content.line_count
    if total_lines is None:
        total_lines = state.searched_to if complete and state.last is None else None
    return {
        "mode": "grep",
        "kind": content.kind,
        "unit": "characters",
        "pattern": pattern,
        "size_full": content.size,
        "total_lines": total_lines,
        "start_line": state.first,
        "searched_to_line": state.searched_to,
        "matches": len(state.matches),
        "match_lines": state.matches,
        "size_returned": len(shown),
        "truncated": not complete,
        "capped": state.capped,
        "stopped_at_max_matches": _stopped(state),
        "next_line": state.next_line,
        "budget_exhausted": state.out_of_budget,
        "bytes_scanned": state.bytes_scanned,
        "re2_calls": state.re2_calls,
    }


def _stopped(state: _Grep) -> bool:
    """The search stopped at ``max_matches`` (not at the end, the cap or the budget)."""
    return state.reached and state.next_line is not None and not state.capped


def _hint(state: _Grep, budget: float, max_matches: int, cap: int, long_lines: int) -> str | None:
    """What the model should do next, the first that applies: go on after the
    budget, the match limit or the cap, or read long or shortened lines whole."""
    if state.out_of_budget:
        return (
            f"stopped after the grep work budget of {budget:g} s, having searched lines {state.first}"
            f" to {state.searched_to}; search on with mode='grep', start={state.next_line}"
        )
    if _stopped(state):
        return (
            f"stopped after max_matches={max_matches} matching lines;"
            f" search on with mode='grep', start={state.next_line}"
        )
    if state.capped:
        return f"cut to the read cap of {cap} characters; continue with mode='grep', start={state.next_line}"
    if long_lines:
        return (
            f"{long_lines} line(s) longer than {GREP_LINE_LIMIT} characters were searched only in their first"
            f" {GREP_LINE_LIMIT} characters; read them with mode='lines' or mode='range'"
        )
    if state.out.shortened:
        return "long lines are shown as a window around the match; read them whole with mode='lines'"
    return None
