"""Round-trips: what is put comes back unchanged, and every read is Python's slicing, capped.

Text reads count characters, binary reads count bytes (returned in base64),
json reads count characters of the observation's readable JSON text. Sizes
cross the 64 KiB segment boundaries, with multi-byte characters on them.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import InvalidArgumentError, Keyring, Policy, Principal, Scratchpad
from securepad.core.shaping import SEGMENT_BYTES

DEFAULT_CAP = 16000
# A cap above every content these tests build, so that reads are plain slices.
WIDE_CAP = 1 << 22

ID_RE = re.compile(r"[0-9a-f]{16}")

# -- strategies --------------------------------------------------------------------


@st.composite
def repeated_text(draw: st.DrawFn) -> str:
    """Text of a few segments, built by repeating a random (often multi-byte) chunk."""
    chunk = draw(st.text(min_size=1, max_size=40))
    target = draw(st.integers(min_value=SEGMENT_BYTES - 8, max_value=4 * SEGMENT_BYTES))
    return chunk * max(1, target // len(chunk.encode("utf-8")))


@st.composite
def repeated_bytes(draw: st.DrawFn) -> bytes:
    chunk = draw(st.binary(min_size=1, max_size=64))
    target = draw(st.integers(min_value=SEGMENT_BYTES - 8, max_value=4 * SEGMENT_BYTES))
    return chunk * max(1, target // len(chunk))


texts = st.one_of(st.text(), st.text(alphabet=st.characters(min_codepoint=0x80, codec="utf-8")), repeated_text())
binaries = st.one_of(st.binary(), repeated_bytes())
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=12), inner, max_size=6)),
    max_leaves=40,
)
side_fields = st.dictionaries(st.text(max_size=12).filter(lambda k: k != "content"), json_values, max_size=5)


@st.composite
def content_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A tool result shaped as the runtime gives it: ``content`` plus other fields."""
    fields = draw(side_fields)
    return {**fields, "content": draw(st.one_of(texts, binaries))}


observations = st.one_of(texts, binaries, json_values, content_dicts())


# -- fixtures and helpers ----------------------------------------------------------


@pytest.fixture
def wide_pad(tmp_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    policy = Policy.from_dict({"limits": {"max_read_chars": WIDE_CAP}}, name="wide")
    with Scratchpad.open(tmp_path / "wide" / "store.db", keyring=keyring, policy=policy) as store:
        yield store


def put(pad: Scratchpad, p: Principal, observation: Any, step: int | None = None) -> str:
    # Hypothesis runs many examples on one store: each gets a fresh turn unless it names a step.
    turn = "turn-1" if step is not None else f"turn-{secrets.token_hex(6)}"
    view = pad.put(p, turn, 1 if step is None else step, "fetch", observation)
    assert ID_RE.fullmatch(view["scratchpad_id"])
    return str(view["scratchpad_id"])


def returned(result: dict[str, Any]) -> str | bytes:
    """The content of a read result, base64-decoded for binary entries."""
    if result["metadata"]["kind"] == "binary":
        assert result["encoding"] == "base64"
        return base64.b64decode(result["content"], validate=True)
    assert isinstance(result["content"], str)
    return str(result["content"])


def readable(observation: Any) -> str | bytes | None:
    """What the read modes slice for this observation, where the test knows it."""
    if isinstance(observation, str | bytes):
        return observation
    if isinstance(observation, dict) and isinstance(observation.get("content"), str | bytes):
        return observation["content"]
    return None


def requested(original: str | bytes, mode: str, n: int, start: int, end: int | None) -> str | bytes:
    """Python's own slicing for a read request, before any cap."""
    if mode == "head":
        return original[:n]
    if mode == "tail":
        return original[max(0, len(original) - n) :]
    if mode == "range":
        return original[start:end]
    return original


def check_read(
    pad: Scratchpad, p: Principal, entry_id: str, original: str | bytes, mode: str, n: int, start: int, end: int | None
) -> dict[str, Any]:
    """Read, and check the result against slicing, the cap and the metadata."""
    result = pad.read(p, entry_id, mode=mode, n=n, start=start, end=end)
    cap = pad.policy.max_read_chars
    meta = result["metadata"]
    got = returned(result)
    want = requested(original, mode, n, start, end)
    assert result["ok"] is True
    assert len(result["content"]) <= cap
    if isinstance(original, str):  # the cap counts the JSON the model sees
        assert len(json.dumps(result["content"], ensure_ascii=False)) - 2 <= cap
    # ... and the whole result counts: content, escapes and the result's own fields.
    assert len(json.dumps(result, ensure_ascii=False)) <= cap
    if meta["capped"]:
        assert len(got) < len(want)
        # A tail keeps its end; every other mode keeps its start.
        assert got == (want[len(want) - len(got) :] if mode == "tail" else want[: len(got)])
        assert "range" in meta["hint"]
    else:
        assert got == want
        assert "hint" not in meta
    assert got == original[meta["start"] : meta["end"]]
    assert meta["mode"] == mode
    assert meta["size_full"] == len(original)
    assert meta["size_returned"] == len(got)
    assert meta["truncated"] is (len(got) < len(original))
    assert meta["next_start"] == (meta["end"] if meta["end"] < len(original) else None)
    assert meta["unit"] == ("bytes" if isinstance(original, bytes) else "characters")
    assert result["scratchpad_id"] == entry_id
    return result


# -- get: the observation comes back unchanged ------------------------------------


@pytest.mark.slow
@settings(max_examples=30)
@given(observation=observations)
def test_get_returns_exactly_what_was_put(pad: Scratchpad, alice: Principal, observation: Any) -> None:
    entry_id = put(pad, alice, observation)
    entry = pad.get(alice, entry_id)
    assert entry.observation == observation
    assert type(entry.observation) is type(observation)
    assert entry.scratchpad_id == entry_id
    content = readable(observation)
    if isinstance(content, bytes):
        assert entry.kind == "binary"
        assert entry.size_bytes == len(content)
    elif isinstance(content, str):
        assert entry.kind == "text"
        assert entry.size_bytes == len(content.encode("utf-8"))
        assert entry.size_chars == len(content)
    else:
        assert entry.kind == "json"


def test_entry_fields_come_back(pad: Scratchpad, alice: Principal) -> None:
    view = pad.put(alice, "turn-7", 3, "web_fetch", {"content": "body", "status": 200}, ttl_seconds=60, now=1000.0)
    entry = pad.get(alice, view["scratchpad_id"], now=1001.0)
    assert (entry.owner_user_id, entry.actor, entry.channel) == ("alice", "planner", "web")
    assert (entry.turn_id, entry.step_num, entry.executor_name) == ("turn-7", 3, "web_fetch")
    assert (entry.created_at, entry.expires_at) == (1000.0, 1060.0)
    assert entry.view["scratchpad_id"] == view["scratchpad_id"]
    assert view["status"] == 200
    assert view["kind"] == "text"
    assert view["size_bytes"] == 4
    assert view["step_num"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("observation", ["", b"", {"content": ""}, {"content": b""}, [], {}])
def test_empty_observations_round_trip(pad: Scratchpad, alice: Principal, observation: Any) -> None:
    entry_id = put(pad, alice, observation)
    assert pad.get(alice, entry_id).observation == observation
    result = pad.read(alice, entry_id, mode="full")
    assert result["metadata"]["truncated"] is False
    assert result["metadata"]["next_start"] is None


def test_json_readable_content_parses_back(wide_pad: Scratchpad, alice: Principal) -> None:
    observation = {"items": [{"id": i, "name": f"naïve-{i}", "tags": ["a", "ß"]} for i in range(3000)], "total": 3000}
    entry_id = put(wide_pad, alice, observation)
    full = wide_pad.read(alice, entry_id, mode="full")
    assert full["metadata"]["kind"] == "json"
    assert json.loads(full["content"]) == observation
    assert len(full["content"].encode("utf-8")) > 2 * SEGMENT_BYTES


@pytest.mark.slow
@settings(max_examples=30)
@given(observation=json_values)
def test_json_reads_slice_the_readable_json(wide_pad: Scratchpad, alice: Principal, observation: Any) -> None:
    entry_id = put(wide_pad, alice, observation)
    text = wide_pad.read(alice, entry_id, mode="full")["content"]
    if not isinstance(observation, str):
        assert json.loads(text) == observation
    for mode, n, start, end in (("head", 7, 0, None), ("tail", 5, 0, None), ("range", 0, 2, 9)):
        check_read(wide_pad, alice, entry_id, text, mode, n, start, end)


@pytest.mark.parametrize(
    "observation",
    [{"a": {1: "x"}}, {"content": "body", 1: "x"}, [{2: None}], {"a": [{True: 1}]}],
    ids=["nested-int-key", "side-field-int-key", "list-item-int-key", "bool-key"],
)
def test_non_string_keys_are_refused_or_kept(pad: Scratchpad, alice: Principal, observation: Any) -> None:
    """A put either refuses the observation or gives it back equal: never a silently
    different value (json.dumps turns 1 into "1"). Top-level non-string keys are
    already refused with InvalidArgumentError; nested ones must be too."""
    try:
        entry_id = put(pad, alice, observation)
    except InvalidArgumentError:
        return
    assert pad.get(alice, entry_id).observation == observation


# -- reads equal Python's slicing ---------------------------------------------------


@pytest.mark.slow
@settings(max_examples=30)
@given(content=st.one_of(texts, binaries), data=st.data())
def test_reads_equal_python_slicing(wide_pad: Scratchpad, alice: Principal, content: str | bytes, data: Any) -> None:
    entry_id = put(wide_pad, alice, content)
    size = len(content)
    positions = st.integers(min_value=0, max_value=size + 10)
    for _ in range(4):
        mode = data.draw(st.sampled_from(["head", "tail", "range", "full"]))
        n = data.draw(positions)
        start = data.draw(positions)
        end = data.draw(st.none() | st.integers(min_value=start, max_value=size + 10))
        result = check_read(wide_pad, alice, entry_id, content, mode, n, start, end)
        assert result["metadata"]["capped"] is False


def boundary_text() -> str:
    """Four segments or so, with 2-, 3- and 4-byte characters straddling every cut."""
    return "aé€😀" * (4 * SEGMENT_BYTES // 10)


@pytest.mark.slow
@pytest.mark.parametrize("pad_bytes", [0, 1, 2, 3])
def test_text_reads_across_segment_boundaries(wide_pad: Scratchpad, alice: Principal, pad_bytes: int) -> None:
    text = "x" * pad_bytes + boundary_text()
    assert len(text.encode("utf-8")) > 3 * SEGMENT_BYTES
    entry_id = put(wide_pad, alice, text)
    assert pad_get_text(wide_pad, alice, entry_id) == text
    # Windows across where segment cuts fall (about every 64 KiB / 2.5 bytes per char).
    for start in range(0, len(text), 6553):
        for width in (1, 2, 3, 97, 40000):
            check_read(wide_pad, alice, entry_id, text, "range", 0, start, start + width)
    for n in (0, 1, 2, 3, 26000, 26215, 26216, 26217, 52429, 60000, len(text) - 1, len(text), len(text) + 5):
        check_read(wide_pad, alice, entry_id, text, "head", n, 0, None)
        check_read(wide_pad, alice, entry_id, text, "tail", n, 0, None)


def pad_get_text(pad: Scratchpad, p: Principal, entry_id: str) -> str:
    observation = pad.get(p, entry_id).observation
    assert isinstance(observation, str)
    return observation


@pytest.mark.parametrize("size", [SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 1, 3 * SEGMENT_BYTES + 17])
def test_binary_reads_across_segment_boundaries(wide_pad: Scratchpad, alice: Principal, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    assert len(data) == size
    entry_id = put(wide_pad, alice, data)
    for cut in range(0, size + 1, SEGMENT_BYTES):
        for lo, hi in ((cut - 3, cut + 3), (cut - 1, cut), (cut, cut + 1), (cut - 100000, cut + 100000)):
            check_read(wide_pad, alice, entry_id, data, "range", 0, max(0, lo), max(0, hi))
    for n in (0, 1, SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 1, size, size + 1):
        check_read(wide_pad, alice, entry_id, data, "head", n, 0, None)
        check_read(wide_pad, alice, entry_id, data, "tail", n, 0, None)


# -- the read cap -------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=30)
@given(content=st.one_of(texts, binaries), data=st.data())
def test_no_read_exceeds_the_cap(pad: Scratchpad, alice: Principal, content: str | bytes, data: Any) -> None:
    entry_id = put(pad, alice, content)
    positions = st.integers(min_value=0, max_value=len(content) + 10)
    for mode in ("head", "tail", "range", "full"):
        n = data.draw(positions)
        start = data.draw(positions)
        end = data.draw(st.none() | st.integers(min_value=start, max_value=len(content) + 10))
        result = check_read(pad, alice, entry_id, content, mode, n, start, end)
        assert len(result["content"]) <= DEFAULT_CAP


def test_full_read_of_a_big_text_is_capped_and_says_where_to_continue(pad: Scratchpad, alice: Principal) -> None:
    text = "".join(f"line {i}: ünïcødé ✓\n" for i in range(20000))
    entry_id = put(pad, alice, text)
    result = check_read(pad, alice, entry_id, text, "full", 0, 0, None)
    meta = result["metadata"]
    # The cap counts the text as JSON, as the model sees it: each "\n" is two characters.
    shown = len(result["content"])
    assert result["content"] == text[:shown]
    assert len(json.dumps(result["content"], ensure_ascii=False)) - 2 <= DEFAULT_CAP
    # The whole result fits the cap; its own fields take what the content leaves (under 1,000).
    assert len(json.dumps(result, ensure_ascii=False)) <= DEFAULT_CAP
    assert len(json.dumps(text[: shown + 1], ensure_ascii=False)) - 2 > DEFAULT_CAP - 1000
    assert (meta["truncated"], meta["capped"], meta["next_start"]) == (True, True, shown)
    assert f"start={shown}" in meta["hint"]
    # Following next_start with range reads gives back the whole text, piece by piece.
    pieces, start = [result["content"]], meta["next_start"]
    while start is not None:
        step = check_read(pad, alice, entry_id, text, "range", 0, start, None)
        pieces.append(step["content"])
        start = step["metadata"]["next_start"]
    assert "".join(pieces) == text


def test_capped_tail_keeps_the_end(pad: Scratchpad, alice: Principal) -> None:
    text = "".join(chr(0x4E00 + i % 2000) for i in range(100000))
    entry_id = put(pad, alice, text)
    result = check_read(pad, alice, entry_id, text, "tail", 50000, 0, None)
    meta = result["metadata"]
    shown = len(result["content"])
    assert result["content"] == text[-shown:]
    assert DEFAULT_CAP - 1000 < shown < DEFAULT_CAP  # the result's own fields count in the cap too
    assert len(json.dumps(result, ensure_ascii=False)) <= DEFAULT_CAP
    assert (meta["capped"], meta["truncated"], meta["next_start"]) == (True, True, None)
    lo = len(text) - shown
    assert f"start={lo - shown}, end={lo}" in meta["hint"]


def test_binary_full_read_base64_fits_the_cap(pad: Scratchpad, alice: Principal) -> None:
    data = bytes(range(256)) * 1000
    entry_id = put(pad, alice, data)
    result = check_read(pad, alice, entry_id, data, "full", 0, 0, None)
    assert len(result["content"]) <= DEFAULT_CAP
    got = base64.b64decode(result["content"])
    assert got == data[: len(got)]
    assert (DEFAULT_CAP - 1000) // 4 * 3 < len(got) <= DEFAULT_CAP // 4 * 3
    assert len(json.dumps(result, ensure_ascii=False)) <= DEFAULT_CAP
    assert result["metadata"]["next_start"] == len(got)


def test_uncapped_small_reads_have_exact_metadata(pad: Scratchpad, alice: Principal) -> None:
    text = "héllo wörld"
    entry_id = put(pad, alice, text)
    meta = pad.read(alice, entry_id, mode="range", start=2, end=5)["metadata"]
    assert meta == {
        "mode": "range",
        "kind": "text",
        "unit": "characters",
        "size_full": 11,
        "size_returned": 3,
        "start": 2,
        "end": 5,
        "truncated": True,
        "capped": False,
        "next_start": 5,
    }
    whole = pad.read(alice, entry_id, mode="head", n=1000)
    assert whole["content"] == text
    assert (whole["metadata"]["truncated"], whole["metadata"]["next_start"]) == (False, None)


def test_default_head_reads_2000_characters(pad: Scratchpad, alice: Principal) -> None:
    text = "abc" * 1000
    entry_id = put(pad, alice, text)
    assert pad.read(alice, entry_id)["content"] == text[:2000]


def test_range_past_the_end_is_empty(pad: Scratchpad, alice: Principal) -> None:
    entry_id = put(pad, alice, "short")
    result = check_read(pad, alice, entry_id, "short", "range", 0, 50, 60)
    assert result["content"] == ""
    assert result["metadata"]["size_full"] == 5


def test_list_for_turn_lists_in_step_order(pad: Scratchpad, alice: Principal) -> None:
    ids = [put(pad, alice, f"step {step}", step=step) for step in (3, 1, 2)]
    listed = pad.list_for_turn(alice, "turn-1")
    assert [item["scratchpad_id"] for item in listed] == [ids[1], ids[2], ids[0]]
    assert [item["step_num"] for item in listed] == [1, 2, 3]
    assert all(item["kind"] == "text" for item in listed)
    assert listed[0]["summary"] == "step 1"
