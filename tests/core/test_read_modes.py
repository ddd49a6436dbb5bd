"""Read modes ``lines`` and ``grep``: against Python's own splitlines and re,
segment by segment, capped, and refusing what they cannot do."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import InvalidArgumentError, Keyring, NotFoundError, Policy, Principal, Scratchpad
from securepad.core import grep, read_modes, shaping
from securepad.core.shaping import SEGMENT_BYTES

# -- in-memory content with tiny segments: many segment boundaries in little text ------


class Recorder:
    """A fetch over in-memory segments that records what was asked for."""

    def __init__(self, pieces: list[str]) -> None:
        self.segments = [p.encode("utf-8") for p in pieces]
        self.calls: list[tuple[int, int]] = []

    def __call__(self, first: int, last: int) -> list[bytes]:
        self.calls.append((first, last))
        return self.segments[first : last + 1]


def segmented(text: str, size: int = 7, *, index: bool = True) -> tuple[read_modes.SegmentedContent, Recorder]:
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    fetch = Recorder(pieces)
    breaks, line_count = shaping.line_index(pieces) if index else (None, None)
    content = read_modes.SegmentedContent("text", [len(p) for p in pieces], fetch, breaks, line_count)
    return content, fetch


BIG_CAP = 10**6
# Every line break str.splitlines knows, and text around them.
line_text = st.lists(
    st.sampled_from([*"ab é😀\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"]), max_size=60
).map("".join)


@given(text=line_text, size=st.integers(1, 9), index=st.booleans(), start=st.integers(0, 30), span=st.integers(0, 30))
def test_lines_equal_splitlines_slicing(text: str, size: int, index: bool, start: int, span: int) -> None:
    content, _ = segmented(text, size, index=index)
    end = max(start, 1) + span
    result = read_modes.read(content, "lines", start=start, end=end, cap=BIG_CAP)
    first = max(start, 1)
    assert result["content"] == "".join(text.splitlines(keepends=True)[first - 1 : end])
    meta = result["metadata"]
    assert meta["start_line"] == first
    assert text[meta["start"] : meta["end"]] == result["content"]
    if index:
        assert meta["total_lines"] == len(text.splitlines())


@given(text=line_text, size=st.integers(1, 9))
def test_line_index_counts_splitlines(text: str, size: int) -> None:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    breaks, count = shaping.line_index(pieces)
    assert count == len(text.splitlines())
    # A line break ends every line but maybe the last.
    assert sum(breaks) == sum(a != b for a, b in zip(text.splitlines(keepends=True), text.splitlines(), strict=True))


@given(
    text=st.text(alphabet="ab \n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029é", max_size=40) | st.text("ab\n", max_size=40),
    size=st.integers(1, 9),
)
def test_line_index_puts_each_break_in_the_piece_it_ends_in(text: str, size: int) -> None:
    """Per piece, newline-only ASCII pieces (counted without splitlines) and the others alike."""
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    expected = [0] * len(pieces)
    end = 0
    for line, bare in zip(text.splitlines(keepends=True), text.splitlines(), strict=True):
        end += len(line)
        if line != bare:  # a break ends this line: it ends in the piece holding its last character
            expected[(end - 1) // size] += 1
    assert shaping.line_index(pieces) == (expected, len(text.splitlines()))


@given(
    lines=st.lists(st.text(alphabet="abcXY é\t", max_size=12), max_size=40),
    needle=st.text(alphabet="abcXY", min_size=1, max_size=3),
    size=st.integers(1, 11),
    max_matches=st.integers(1, 50),
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_grep_equals_python_re_on_literals(
    lines: list[str], needle: str, size: int, max_matches: int, ending: str
) -> None:
    text = ending.join(lines)
    content, _ = segmented(text, size)
    result = read_modes.read(content, "grep", pattern=re.escape(needle), max_matches=max_matches, cap=BIG_CAP)
    expected = [(n, line) for n, line in enumerate(text.splitlines(), 1) if re.search(re.escape(needle), line)]
    shown = expected[:max_matches]
    assert result["metadata"]["match_lines"] == [n for n, _ in shown]
    assert result["content"] == "\n".join(f"{n}:{line}" for n, line in shown)
    meta = result["metadata"]
    # Like grep -m, the search stops after the max_matches-th match.
    total = len(text.splitlines())
    stopped = len(expected) >= max_matches and expected[max_matches - 1][0] < total
    assert meta["stopped_at_max_matches"] == meta["truncated"] == stopped
    assert meta["next_line"] == (expected[max_matches - 1][0] + 1 if stopped else None)


@given(
    lines=st.lists(st.sampled_from(["ERROR x", "ok", "", "error", "xERROR", "warn"]), max_size=30),
    pattern=st.sampled_from(
        ["^ERROR", "ERROR$", r"\bERROR\b", "^$", "(?i)error", "^ok$|^warn", "o.", r"\Aok", r"ok\z"]
    ),
    size=st.integers(1, 40),
    ending=st.sampled_from(["\n", "\r\n", "\r", "\u2028"]),
)
def test_grep_anchors_work_per_line(lines: list[str], pattern: str, size: int, ending: str) -> None:
    """Anchors and word boundaries mean the line's start and end, as grep does,
    whether the block search or the line-by-line search runs, whatever the segments."""
    text = ending.join(lines)
    content, _ = segmented(text, size)
    result = read_modes.read(content, "grep", pattern=pattern, max_matches=1000, cap=BIG_CAP)
    python = pattern.replace(r"\z", r"\Z")
    expected = [n for n, line in enumerate(text.splitlines(), 1) if re.search(python, line)]
    assert result["metadata"]["match_lines"] == expected


def test_grep_context_lines_like_grep() -> None:
    text = "\n".join(f"line {i}" + (" ERROR" if i in (5, 6, 12) else "") for i in range(1, 21))
    content, _ = segmented(text, 10)
    result = read_modes.read(content, "grep", pattern="ERROR", context=2, cap=BIG_CAP)
    assert result["content"].split("\n") == [
        "3-line 3",
        "4-line 4",
        "5:line 5 ERROR",
        "6:line 6 ERROR",
        "7-line 7",
        "8-line 8",
        "--",
        "10-line 10",
        "11-line 11",
        "12:line 12 ERROR",
        "13-line 13",
        "14-line 14",
    ]
    assert result["metadata"]["match_lines"] == [5, 6, 12]


def test_grep_decrypts_one_segment_at_a_time_and_stops_early() -> None:
    text = "".join(f"{i:05d} some log line\n" for i in range(2000))
    content, fetch = segmented(text, 100)
    result = read_modes.read(content, "grep", pattern="00010", max_matches=1, cap=BIG_CAP)
    assert result["metadata"]["match_lines"] == [11]
    assert all(first == last for first, last in fetch.calls)
    # It stopped with the segment after the first match, long before the last segment.
    assert max(first for first, _ in fetch.calls) <= 3


def test_lines_start_at_the_segment_holding_the_line() -> None:
    text = "".join(f"line {i}\n" for i in range(1, 1001))
    content, fetch = segmented(text, 50)
    result = read_modes.read(content, "lines", start=990, end=991, cap=BIG_CAP)
    assert result["content"] == "line 990\nline 991\n"
    assert all(first == last for first, last in fetch.calls)
    assert min(first for first, _ in fetch.calls) >= len(content.counts) - 5


def test_lines_without_an_index_scan_from_the_start() -> None:
    text = "a\nb\nc\n"
    content, _ = segmented(text, 2, index=False)
    result = read_modes.read(content, "lines", start=3, end=3, cap=BIG_CAP)
    assert result["content"] == "c\n"


# -- caps and hints ----------------------------------------------------------------------


@given(
    text=st.lists(st.sampled_from([*'a"\\\x01\x1f\né😀']), max_size=80).map("".join),
    cap=st.integers(400, 900),
    mode=st.sampled_from(["head", "tail"]),
)
def test_a_fitted_read_fits_the_cap_and_is_whole_when_its_json_is_far_within(text: str, cap: int, mode: str) -> None:
    """Whether it encodes the content or counts each character at its longest
    escape, a fitted read's JSON fits any cap that leaves room for a cut
    result's own fields (with the hint, about 330 characters; below that the
    read keeps one character of content and the fields overrun the cap); a
    text whose JSON leaves room for the result's fields comes back whole."""
    content, _ = segmented(text)
    result = read_modes.read_fitted(content, mode, cap=cap, extra={"scratchpad_id": "0" * 16}, n=len(text))
    assert len(json.dumps(result, ensure_ascii=False)) <= cap
    shown = result["content"]
    assert shown == (text[: len(shown)] if mode == "head" else text[len(text) - len(shown) :])
    if len(json.dumps(text, ensure_ascii=False)) + 300 <= cap:  # the fields take under 300
        assert shown == text


def test_a_cap_below_a_cut_results_fields_keeps_one_character_and_says_where_to_go_on() -> None:
    text = 'aaaaaaaaaaa""""""""\x01\x01\x01\x01'
    content, _ = segmented(text)
    result = read_modes.read_fitted(content, "head", cap=300, extra={"scratchpad_id": "0" * 16}, n=len(text))
    meta = result["metadata"]
    assert result["content"] == "a"
    assert meta["capped"] and meta["truncated"] and meta["next_start"] == 1


@given(text=line_text, cap=st.integers(16, 60), start=st.integers(0, 5))
def test_lines_never_exceed_the_cap(text: str, cap: int, start: int) -> None:
    content, _ = segmented(text, 5)
    result = read_modes.read(content, "lines", start=start, cap=cap)
    assert len(result["content"]) <= cap
    meta = result["metadata"]
    if meta["capped"]:
        assert meta["truncated"] and "hint" in meta and meta["next_line"] is not None


def test_lines_cut_by_the_cap_say_where_to_continue() -> None:
    text = "".join(f"line {i:03d}\n" for i in range(1, 101))  # 9 characters a line
    content, _ = segmented(text, 13)
    result = read_modes.read(content, "lines", start=1, end=100, cap=40)
    meta = result["metadata"]
    assert result["content"] == text[:36]  # four whole lines fit in 40
    assert meta["capped"] and meta["truncated"]
    assert meta["end_line"] == 4 and meta["next_line"] == 5
    assert "start=5" in meta["hint"]
    again = read_modes.read(content, "lines", start=meta["next_line"], end=100, cap=40)
    assert again["content"].startswith("line 005\n")


def test_a_line_longer_than_the_cap_comes_back_in_part_with_a_range_hint() -> None:
    text = "short\n" + "x" * 100 + "\nafter\n"
    content, _ = segmented(text, 8)
    result = read_modes.read(content, "lines", start=2, end=2, cap=30)
    meta = result["metadata"]
    assert result["content"] == "x" * 30
    assert meta["capped"] and meta["end_line"] is None and meta["next_line"] == 3
    assert "mode='range', start=36" in meta["hint"]


@given(count=st.integers(0, 60), cap=st.integers(16, 200), context=st.integers(0, 3))
def test_grep_never_exceeds_the_cap(count: int, cap: int, context: int) -> None:
    text = "".join(f"{i} ERROR something bad happened here\n" for i in range(count))
    content, _ = segmented(text, 17)
    result = read_modes.read(content, "grep", pattern="ERROR", context=context, max_matches=1000, cap=cap)
    assert len(result["content"]) <= cap
    meta = result["metadata"]
    assert meta["size_returned"] == len(result["content"])
    if meta["capped"]:
        assert meta["truncated"] and "start=" in meta["hint"]


def test_grep_cut_by_the_cap_continues_from_next_line() -> None:
    text = "".join(f"{i:02d} ERROR\n" for i in range(1, 41))  # rows "NN:NN ERROR", 11 characters
    content, _ = segmented(text, 9)
    found: list[int] = []
    start = 1
    while True:
        result = read_modes.read(content, "grep", pattern="ERROR", start=start, cap=50)
        found += result["metadata"]["match_lines"]
        if result["metadata"]["next_line"] is None:
            break
        start = result["metadata"]["next_line"]
    assert found == list(range(1, 41))


def test_grep_stops_at_max_matches() -> None:
    text = "".join("ERROR\n" for _ in range(10))
    content, _ = segmented(text, 4)
    result = read_modes.read(content, "grep", pattern="ERROR", max_matches=3, cap=BIG_CAP)
    meta = result["metadata"]
    assert meta["match_lines"] == [1, 2, 3]
    assert meta["stopped_at_max_matches"] and meta["truncated"] and meta["next_line"] == 4
    assert "max_matches=3" in meta["hint"]


def test_grep_shows_a_window_around_the_match_of_a_long_line() -> None:
    text = "a" * 5000 + "NEEDLE" + "b" * 5000
    content, _ = segmented(text, 1000)
    result = read_modes.read(content, "grep", pattern="NEEDLE", cap=BIG_CAP)
    row = result["content"]
    assert row.startswith("1:…") and row.endswith("…") and "NEEDLE" in row
    assert len(row) <= grep.GREP_SHOW_CHARS + 10
    assert result["metadata"]["lines_shortened"] == 1


def test_grep_says_when_a_huge_line_was_searched_only_in_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grep, "GREP_LINE_LIMIT", 100)
    text = "x" * 50 + "\n" + "y" * 300 + "TAIL\n"
    content, _ = segmented(text, 40)
    result = read_modes.read(content, "grep", pattern="TAIL", cap=BIG_CAP)
    assert result["metadata"]["match_lines"] == []
    assert result["metadata"]["long_lines"] == 1
    assert "mode='lines'" in result["metadata"]["hint"]


def test_a_model_pattern_cannot_hang_the_process() -> None:
    """(a+)+$ takes exponential time in a backtracking engine; RE2 is linear."""
    text = "a" * 200_000 + "!"
    content, _ = segmented(text, SEGMENT_BYTES)
    result = read_modes.read(content, "grep", pattern="(a+)+$", cap=BIG_CAP)
    assert result["metadata"]["match_lines"] == []
    result = read_modes.read(content, "grep", pattern="(x+x+)+y", cap=BIG_CAP)
    assert result["metadata"]["match_lines"] == []


# -- the cost of a grep call ----------------------------------------------------


def _grep_all(content: read_modes.SegmentedContent, pattern: str, **kwargs: Any) -> dict[str, Any]:
    return read_modes.read(content, "grep", pattern=pattern, cap=BIG_CAP, **kwargs)


@pytest.mark.parametrize("lines", [["a"] * 40_000, [json.dumps({"id": i, "t": "result title"}) for i in range(6000)]])
def test_a_pattern_that_crosses_lines_scans_each_byte_once(lines: list[str]) -> None:
    """It can match across lines but never within one: each search used to
    rescan the rest of the segment after every candidate (seconds per segment)."""
    text = "\n".join(lines) + "\n"
    content, _ = segmented(text, SEGMENT_BYTES)
    meta = _grep_all(content, r"\S[\s\S]*\n[\s\S]*\S")["metadata"]
    assert meta["match_lines"] == [] and not meta["truncated"]
    size = len(text.encode())
    assert meta["bytes_scanned"] <= size
    # One RE2 call per GREP_CHUNK_BYTES of whole lines, per segment.
    assert meta["re2_calls"] <= 2 * (size // grep.GREP_CHUNK_BYTES + len(content.counts))


def test_grep_work_is_linear_in_the_bytes_scanned_whatever_matches() -> None:
    text = "".join(f"line {i} x\n" for i in range(20_000))
    content, _ = segmented(text, SEGMENT_BYTES)
    meta = read_modes.read(content, "grep", pattern="x", max_matches=10**9, cap=16_000)["metadata"]
    # Every line matches: the cap stops the call, after one RE2 call per line shown.
    assert meta["capped"] and meta["re2_calls"] <= meta["matches"] + 1
    assert meta["bytes_scanned"] <= len(text.encode())


def test_capture_groups_cost_nothing_and_max_matches_stops_the_search() -> None:
    """Hundreds of groups made each search cost milliseconds, and every
    candidate of a segment was searched before max_matches applied."""
    text = ("y" * 400 + "\n") * 4000
    content, _ = segmented(text, SEGMENT_BYTES)
    pattern = "(.*)" * 240
    regex, block = grep.compile_pattern(pattern)
    assert regex.groups == 0 and block.groups == 0  # RE2 is never asked for submatches
    meta = _grep_all(content, pattern, max_matches=1)["metadata"]
    assert meta["match_lines"] == [1] and meta["stopped_at_max_matches"]
    assert meta["re2_calls"] <= 2 and meta["bytes_scanned"] <= 2 * 401


@given(
    lines=st.lists(st.sampled_from(["ab", "a", "b", "", "ba x", "a b"]), max_size=30),
    pattern=st.sampled_from([r"a[\s\S]*b", r"a\s*b", r"[^x]+", r"a\n", r"\S\s", r"(a)(b)?", r"$\n^"]),
    size=st.integers(1, 40),
)
def test_grep_matches_each_line_on_its_own(lines: list[str], pattern: str, size: int) -> None:
    """A pattern that could match across a line break matches lines one by one, like grep."""
    text = "\n".join(lines)
    content, _ = segmented(text, size)
    expected = [n for n, line in enumerate(text.splitlines(), 1) if re.search(pattern, line)]
    assert _grep_all(content, pattern, max_matches=1000)["metadata"]["match_lines"] == expected


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["ERR", r"\AERR"], ids=["block search", "line by line"])
def test_a_grep_out_of_budget_returns_a_partial_result_and_where_to_go_on(pattern: str) -> None:
    text = "".join(f"{'ERR' if i % 7 == 0 else 'ok'} {i}\n" for i in range(1, 10_001))
    content, _ = segmented(text, 4096)
    whole = _grep_all(content, pattern, max_matches=10**9, grep_budget_s=3600.0)["metadata"]
    found: list[int] = []
    start, calls = 1, 0
    while start is not None:
        meta = _grep_all(content, pattern, max_matches=10**9, start=start, grep_budget_s=0.0)["metadata"]
        calls += 1
        assert meta["budget_exhausted"] == (meta["next_line"] is not None)
        if meta["budget_exhausted"]:
            assert meta["truncated"] and f"start={meta['next_line']}" in meta["hint"]
            assert meta["next_line"] > start  # every call makes progress
        found += meta["match_lines"]
        start = meta["next_line"]
    assert calls > 1
    assert found == whole["match_lines"] and len(found) == 10_000 // 7


def test_a_grep_that_reached_max_matches_before_its_budget_says_so() -> None:
    """The budget running out after max_matches and its context were shown is a max_matches stop."""
    text = "".join(f"{'ERR' if i % 3 == 0 else 'ok'} {i}\n" for i in range(1, 30_001))
    content, _ = segmented(text, 4096)
    result = _grep_all(content, "ERR", max_matches=1, grep_budget_s=0.0)
    meta = result["metadata"]
    assert result["content"] == "3:ERR 3" and meta["next_line"] == 4
    assert meta["stopped_at_max_matches"] and not meta["budget_exhausted"] and "max_matches=1" in meta["hint"]


@pytest.mark.parametrize("line", ["x", '"x"\t\\', "\x01x\x02"], ids=["short", "escaped", "control"])
def test_a_grep_result_fits_the_cap_as_the_json_the_model_sees(line: str) -> None:
    """match_lines and JSON escapes count: 34,482 characters came back for a 16,000 cap."""
    text = (line + "\n") * 20_000
    content, _ = segmented(text, SEGMENT_BYTES)
    result = read_modes.read(content, "grep", pattern="x", max_matches=10**9, cap=16_000)
    meta = result["metadata"]
    assert meta["capped"] and meta["matches"] > 100
    seen = len(json.dumps(result["content"], ensure_ascii=False)) + len(json.dumps(meta["match_lines"]))
    assert seen <= 16_000 + 4
    assert meta["size_returned"] == len(result["content"])


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "grep"},
        {"mode": "grep", "pattern": None},
        {"mode": "grep", "pattern": 5},
        {"mode": "grep", "pattern": "(a"},
        {"mode": "grep", "pattern": r"(a)\1"},
        {"mode": "grep", "pattern": "(?=a)"},
        {"mode": "grep", "pattern": "x" * (grep.MAX_PATTERN_CHARS + 1)},
        {"mode": "grep", "pattern": "\ud800"},
        {"mode": "grep", "pattern": "a", "max_matches": 0},
        {"mode": "grep", "pattern": "a", "max_matches": -1},
        {"mode": "grep", "pattern": "a", "max_matches": True},
        {"mode": "grep", "pattern": "a", "context": -1},
        {"mode": "grep", "pattern": "a", "context": read_modes.MAX_CONTEXT + 1},
        {"mode": "grep", "pattern": "a", "context": 1.5},
        {"mode": "grep", "pattern": "a", "start": 5, "end": 4},
        {"mode": "lines", "start": 5, "end": 4},
        {"mode": "lines", "start": -1},
        {"mode": "lines", "start": 1, "end": -1},
        {"mode": "lines", "start": "1"},
        {"mode": "lines", "end": 2.0},
    ],
    ids=repr,
)
def test_bad_lines_and_grep_arguments(kwargs: dict[str, Any]) -> None:
    content, _ = segmented("a\nb\n")
    mode = kwargs.pop("mode")
    with pytest.raises(InvalidArgumentError):
        read_modes.read(content, mode, cap=BIG_CAP, **kwargs)


def test_invalid_pattern_message_names_the_rule() -> None:
    content, _ = segmented("a\n")
    with pytest.raises(InvalidArgumentError, match="RE2 syntax"):
        read_modes.read(content, "grep", pattern=r"(a)\1", cap=BIG_CAP)


# -- through the store: text and json entries, binary refused ---------------------------------


@pytest.fixture
def small_cap_pad(tmp_path: Path, keyring: Keyring) -> Any:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": {"max_read_chars": 200}})
    with Scratchpad.open(tmp_path / "cap.db", keyring=keyring, policy=policy) as store:
        yield store


def big_log(lines: int = 30_000) -> str:
    body = "".join(f"2024-05-01T10:00:{i % 60:02d} INFO request {i} served in {i % 97} ms\n" for i in range(lines))
    return body + "2024-05-01T10:59:58 ERROR disk full\n2024-05-01T10:59:59 ERROR giving up\n"


def test_grep_and_lines_on_a_multi_segment_text_entry(pad: Scratchpad, alice: Principal) -> None:
    log = big_log()
    assert len(log.encode()) > 10 * SEGMENT_BYTES
    entry = pad.put(alice, "t", 1, "read_file", {"content": log, "metadata": {"path": "/var/log/app.log"}})
    found = pad.read(alice, entry["scratchpad_id"], "grep", pattern="ERROR")
    total = len(log.splitlines())
    assert (
        found["content"]
        == f"{total - 1}:2024-05-01T10:59:58 ERROR disk full\n{total}:2024-05-01T10:59:59 ERROR giving up"
    )
    assert found["metadata"]["total_lines"] == total and not found["metadata"]["truncated"]
    tail = pad.read(alice, entry["scratchpad_id"], "lines", start=total - 2, end=total)
    assert tail["content"] == "".join(log.splitlines(keepends=True)[-3:])
    assert tail["scratchpad_id"] == entry["scratchpad_id"]


def test_grep_with_context_through_the_store(pad: Scratchpad, alice: Principal) -> None:
    entry = pad.put(alice, "t", 1, "x", "one\ntwo\nthree ERROR\nfour\nfive\n")
    result = pad.read(alice, entry["scratchpad_id"], "grep", pattern="ERROR", context=1, max_matches=5)
    assert result["content"] == "2-two\n3:three ERROR\n4-four"


def test_lines_and_grep_on_a_json_entry(pad: Scratchpad, alice: Principal) -> None:
    observation = {"items": [{"name": f"file{i}.py", "size": i} for i in range(50)]}
    entry = pad.put(alice, "t", 1, "ls", observation)
    indented = json.dumps(observation, indent=2, ensure_ascii=False)
    result = pad.read(alice, entry["scratchpad_id"], "grep", pattern=r'"file4\d?\.py"')
    expected = [n for n, line in enumerate(indented.splitlines(), 1) if re.search(r'"file4\d?\.py"', line)]
    assert result["metadata"]["match_lines"] == expected and len(expected) == 11
    lines = pad.read(alice, entry["scratchpad_id"], "lines", start=1, end=3)
    assert lines["content"] == "".join(indented.splitlines(keepends=True)[:3])


@pytest.mark.parametrize("mode", ["lines", "grep"])
def test_lines_and_grep_refuse_binary_entries(pad: Scratchpad, alice: Principal, mode: str) -> None:
    entry = pad.put(alice, "t", 1, "download", b"\x00\x01\n\x02" * 100)
    with pytest.raises(InvalidArgumentError, match="binary"):
        pad.read(alice, entry["scratchpad_id"], mode, pattern="a")
    # The other modes still serve it.
    head = pad.read(alice, entry["scratchpad_id"], "head", n=4)
    assert base64.b64decode(head["content"]) == b"\x00\x01\n\x02"


def test_reads_are_capped_by_the_policy(small_cap_pad: Scratchpad, alice: Principal) -> None:
    entry = small_cap_pad.put(alice, "t", 1, "x", big_log(500))
    lines = small_cap_pad.read(alice, entry["scratchpad_id"], "lines", start=1, end=400)
    grep = small_cap_pad.read(alice, entry["scratchpad_id"], "grep", pattern="INFO", max_matches=400)
    for result in (lines, grep):
        assert len(result["content"]) <= 200
        assert result["metadata"]["capped"] and result["metadata"]["truncated"] and "hint" in result["metadata"]


def test_another_owner_gets_not_found_before_any_argument_check(
    pad: Scratchpad, alice: Principal, bob: Principal
) -> None:
    entry = pad.put(alice, "t", 1, "x", b"binary")
    for mode in ("lines", "grep"):
        with pytest.raises(NotFoundError):
            pad.read(bob, entry["scratchpad_id"], mode, pattern="(")


def test_read_restricted_to_a_turn(pad: Scratchpad, alice: Principal) -> None:
    entry = pad.put(alice, "turn-a", 1, "x", "hello\n")
    assert pad.read(alice, entry["scratchpad_id"], "lines", turn_id="turn-a")["content"] == "hello\n"
    with pytest.raises(NotFoundError):
        pad.read(alice, entry["scratchpad_id"], "lines", turn_id="turn-b")
    with pytest.raises(NotFoundError):
        pad.get(alice, entry["scratchpad_id"], turn_id="turn-b")


# -- the command line ----------------------------------------------------------------------------


def cli(db_path: Path, key_file: Path, *args: str) -> Any:
    from click.testing import CliRunner

    from securepad.cli import main

    return CliRunner().invoke(main, ["--db", str(db_path), "--key-file", str(key_file), *args], catch_exceptions=False)


def test_cli_read_lines_and_grep(pad: Scratchpad, alice: Principal, db_path: Path, key_file: Path) -> None:
    entry = pad.put(alice, "t", 1, "x", big_log(2000))["scratchpad_id"]
    who = ["--owner", "alice", "--actor", "planner", "--channel", "web"]
    found = cli(
        db_path, key_file, "--json", "read", *who, entry, "--mode", "grep", "--pattern", "ERROR", "--context", "1"
    )
    assert found.exit_code == 0, found.output
    result = json.loads(found.stdout)
    assert result["metadata"]["match_lines"] == [2001, 2002]
    assert result["content"].splitlines()[0].startswith("2000-")
    lines = cli(db_path, key_file, "read", *who, entry, "--mode", "lines", "--start", "2001", "--end", "2002")
    assert lines.exit_code == 0 and lines.stdout == "".join(big_log(2000).splitlines(keepends=True)[2000:]) + "\n"
    stopped = cli(db_path, key_file, "read", *who, entry, "--mode", "grep", "--pattern", "INFO", "--max-matches", "2")
    assert stopped.exit_code == 0 and "max_matches=2" in stopped.stderr
    bad = cli(db_path, key_file, "read", *who, entry, "--mode", "grep", "--pattern", "(a")
    assert bad.exit_code == 1 and "InvalidArgumentError" in bad.stderr
    other = cli(db_path, key_file, "read", "--owner", "bob", entry, "--mode", "grep", "--pattern", "ERROR")
    assert other.exit_code == 1 and "NotFoundError" in other.stderr


def reference_grep(
    text: str, pattern: str, max_matches: int, context: int, first: int, last: int | None
) -> tuple[str, list[int], int | None]:
    """grep -n -m max_matches -C context over lines first..last, written plainly with Python's re."""
    lines = text.splitlines()
    top = len(lines) if last is None else min(last, len(lines))
    hits = [n for n in range(first, top + 1) if re.search(pattern, lines[n - 1])]
    rows: list[str] = []
    last_shown = after_until = 0

    def show(n: int, mark: str) -> None:
        nonlocal last_shown
        if context and last_shown and n > last_shown + 1:
            rows.append("--")
        rows.append(f"{n}{mark}{lines[n - 1]}")
        last_shown = n

    for m in hits[:max_matches]:
        for n in range(last_shown + 1, min(after_until, m - 1) + 1):
            show(n, "-")
        for n in range(max(last_shown + 1, m - context, first), m):
            show(n, "-")
        show(m, ":")
        after_until = m + context
    next_line: int | None = None
    if len(hits) > max_matches:
        next_line = min(hits[max_matches], after_until + 1)
    elif len(hits) == max_matches and after_until < top:
        next_line = after_until + 1
    # Like grep -m NUM -C N: the last match's trailing context is shown whole, a matching line in it as context.
    end = min(after_until, top)
    for n in range(last_shown + 1, end + 1):
        show(n, "-")
    return "\n".join(rows), hits[:max_matches], next_line


@given(
    lines=st.lists(st.sampled_from(["ERROR a", "ok", "", "warn ERROR", "xx", "é😀 ERROR"]), max_size=40),
    ending=st.sampled_from(["\n", "\r\n", "\r", "\x0c", "\u2029"]),
    size=st.integers(1, 30),
    pattern=st.sampled_from(["ERROR", "^ERROR", "ERROR$", "^$", "o", r"\Aok", "x{2}"]),
    max_matches=st.integers(1, 6),
    context=st.integers(0, 3),
    first=st.integers(0, 8),
    span=st.none() | st.integers(0, 30),
)
def test_grep_equals_a_plain_grep_with_context_and_ranges(
    lines: list[str],
    ending: str,
    size: int,
    pattern: str,
    max_matches: int,
    context: int,
    first: int,
    span: int | None,
) -> None:
    text = ending.join(lines) + (ending if lines and len(lines) % 2 else "")
    content, _ = segmented(text, size)
    start = max(first, 1)
    last = None if span is None else start + span
    result = read_modes.read(
        content, "grep", pattern=pattern, max_matches=max_matches, context=context, start=first, end=last, cap=BIG_CAP
    )
    expected_rows, expected_hits, expected_next = reference_grep(
        text, pattern.replace(r"\z", r"\Z"), max_matches, context, start, last
    )
    assert result["content"] == expected_rows
    assert result["metadata"]["match_lines"] == expected_hits
    assert result["metadata"]["next_line"] == expected_next


@given(
    lines=st.lists(st.text(alphabet="ab\n", min_size=0, max_size=30).map(lambda s: s.replace("\n", "")), max_size=12),
    size=st.integers(1, 12),
    limit=st.integers(1, 8),
)
def test_grep_over_long_lines_keeps_line_numbers(lines: list[str], size: int, limit: int) -> None:
    """Lines longer than the limit are searched only in their first part, but
    line numbering (and everything after them) stays exact."""
    text = "\n".join(lines)
    content, _ = segmented(text, size)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grep, "GREP_LINE_LIMIT", limit)
        result = read_modes.read(content, "grep", pattern="^a", max_matches=1000, cap=BIG_CAP)
    expected = [n for n, line in enumerate(text.splitlines(), 1) if line.startswith("a")]
    assert result["metadata"]["match_lines"] == expected
    # Only a line carried across segments is cut; one inside a segment is whole anyway.
    long_lines = sum(len(line) > limit for line in text.splitlines())
    assert result["metadata"].get("long_lines", 0) <= long_lines


@pytest.mark.parametrize("mode", ["head", "tail", "range", "full", "lines"])
@pytest.mark.parametrize("char", ["\x01", '"', "\n", "é"])
def test_a_read_fits_the_cap_as_the_json_the_model_sees(mode: str, char: str) -> None:
    """A control character is six characters in JSON: 16,000 of them were 96,000."""
    text = ("ab" + char) * 20_000
    content, _ = segmented(text, 4096)
    result = read_modes.read(content, mode, n=10**6, cap=16_000)
    meta = result["metadata"]
    assert len(json.dumps(result["content"], ensure_ascii=False)) - 2 <= 16_000
    assert meta["capped"] and meta["size_returned"] == len(result["content"]) == meta["end"] - meta["start"]
    assert result["content"] == text[meta["start"] : meta["end"]]
