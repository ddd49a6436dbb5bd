"""The runtime surface: record, history, tools, the tool handler and references."""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

import securepad
from securepad import (
    SCRATCHPAD_READ_TOOL,
    InvalidArgumentError,
    Keyring,
    Policy,
    Principal,
    Scratchpad,
    Turn,
)
from securepad.core.read_modes import MODES
from tests.conftest import stable_repr
from tests.support.principals import NOW

BIG_TEXT = "".join(f"line {i}: the quick brown fox\n" for i in range(3000))


@pytest.fixture
def turn(pad: Scratchpad, alice: Principal) -> Turn:
    return pad.turn(alice, "turn-1", now=NOW)


@pytest.fixture
def small_pad(tmp_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    policy = Policy.from_dict(
        {
            "access": {"scope": "owner"},
            "limits": {"offload_threshold_bytes": 100, "inline_max_chars": 20, "max_read_chars": 300},
        }
    )
    with Scratchpad.open(tmp_path / "small.db", keyring=keyring, policy=policy) as store:
        yield store


def offload(turn: Turn, step: int = 1, text: str = BIG_TEXT) -> str:
    view = turn.record(step, "read_file", {"content": text, "metadata": {"path": f"/logs/{step}.log"}}, now=NOW)
    return str(view["scratchpad_id"])


# -- record ------------------------------------------------------------------------------


def test_small_observation_goes_into_history_itself(turn: Turn) -> None:
    observation = {"status": 200, "files": ["a.py", "b.py"], "metadata": {"path": "/repo"}}
    assert turn.record(1, "ls", observation, now=NOW) == observation
    assert turn.tools(now=NOW) == []


def test_threshold_is_on_the_observations_json_size(small_pad: Scratchpad, alice: Principal) -> None:
    turn = small_pad.turn(alice, "t", now=NOW)
    at = {"k": "x" * (100 - len(json.dumps({"k": ""})))}
    assert len(json.dumps(at).encode()) == 100
    assert turn.record(1, "x", at, now=NOW) == {
        "k": at["k"][:20] + f"[... {len(at['k']) - 20} characters omitted; {{{{step1.k}}}} is the full text ...]"
    }
    over = {"k": at["k"] + "y"}
    view = turn.record(2, "x", over, now=NOW)
    assert view["ok"] is True and "scratchpad_id" in view


def test_inline_text_is_cut_to_inline_max_chars_with_exact_count(small_pad: Scratchpad, alice: Principal) -> None:
    turn = small_pad.turn(alice, "t", now=NOW)
    item = turn.record(1, "echo", "z" * 50, now=NOW)
    assert item == "z" * 20 + "[... 30 characters omitted; {{step1}} is the full text ...]"
    nested = turn.record(2, "x", {"a": ["q" * 25]}, now=NOW)
    assert nested == {"a": ["q" * 20 + "[... 5 characters omitted; {{step2.a.0}} is the full text ...]"]}
    # The full value stays reachable.
    assert turn.resolve("{{step1}}", now=NOW) == "z" * 50


def test_large_text_gets_the_synthetic_view(turn: Turn) -> None:
    view = turn.record(
        1,
        "read_file",
        {"content": BIG_TEXT, "metadata": {"path": "/var/log/app.log", "encoding": "utf-8"}, "truncated": False},
        now=NOW,
    )
    assert set(view) >= {"ok", "scratchpad_id", "step_num", "size_bytes", "kind", "summary", "metadata"}
    assert view["ok"] is True and view["step_num"] == 1 and view["kind"] == "text"
    assert view["size_bytes"] == len(BIG_TEXT.encode())
    assert view["metadata"] == {"path": "/var/log/app.log", "encoding": "utf-8"}
    assert view["truncated"] is False
    omitted = len(BIG_TEXT) - 1000
    assert view["summary"] == BIG_TEXT[:500] + f"[... {omitted} characters omitted ...]" + BIG_TEXT[-500:]
    assert re.fullmatch(r"[0-9a-f]{16}", view["scratchpad_id"])


def test_structured_view_has_count_and_schema_never_items(turn: Turn) -> None:
    rows = [{"id": i, "name": f"secret-name-{i}", "size": i * 10} for i in range(400)]
    view = turn.record(2, "search", {"results": rows, "total": 400, "message": "ok"}, now=NOW)
    assert view["kind"] == "json" and view["list_field"] == "results" and view["count"] == 400
    assert view["schema"] == ["id", "name", "size"]
    assert view["total"] == 400 and view["message"] == "ok"
    assert "{{step2.results}}" in view["ref_hint"]
    assert "secret-name" not in json.dumps(view)


def test_binary_view_has_size_and_sha256_prefix_only(turn: Turn) -> None:
    data = bytes(range(256)) * 4
    view = turn.record(3, "download", data, now=NOW)
    assert view["kind"] == "binary" and view["size_bytes"] == 1024
    assert hashlib.sha256(data).hexdigest()[:16] in view["summary"]
    assert turn.tools(now=NOW) == [SCRATCHPAD_READ_TOOL]


def test_a_step_is_recorded_once(turn: Turn) -> None:
    turn.record(1, "x", "a", now=NOW)
    with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
        turn.record(1, "x", "b", now=NOW)


def test_a_step_taken_by_another_writer_meanwhile_is_refused(
    pad: Scratchpad, store_location: Any, keyring: Keyring, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process records step 1 after this one found it free and before it writes:
    # the write transaction looks again.
    turn_module = importlib.import_module("securepad.turn")
    inline = turn_module._inline
    turn = pad.turn(alice, "turn-1", now=NOW)
    with Scratchpad.open(store_location, keyring=keyring) as other:
        raced: list[bool] = []

        def racing(*args: Any) -> Any:
            if not raced:
                raced.append(True)
                other.turn(alice, "turn-1", now=NOW).record(1, "x", "theirs", now=NOW)
            return inline(*args)

        monkeypatch.setattr(turn_module, "_inline", racing)
        with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
            turn.record(1, "x", "ours", now=NOW)
    assert raced and turn.history(now=NOW) == ["theirs"]


def test_an_expired_step_can_be_recorded_again(turn: Turn) -> None:
    turn.record(1, "x", "old", ttl_seconds=10, now=NOW)
    with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
        turn.record(1, "x", "new", now=NOW + 9)
    assert turn.record(1, "x", "new", now=NOW + 10) == "new"
    assert turn.history(now=NOW + 10) == ["new"]


@pytest.mark.parametrize("observation", [{1, 2}, {"a": object()}, float("nan")], ids=stable_repr)
def test_observation_that_is_not_json_is_refused(turn: Turn, observation: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        turn.record(1, "x", observation, now=NOW)
    assert turn.history(now=NOW) == []


# -- history and tools ---------------------------------------------------------------------


def test_history_is_what_record_returned_in_step_order(pad: Scratchpad, turn: Turn, alice: Principal) -> None:
    returned = {
        2: turn.record(2, "ls", {"files": ["x"]}, now=NOW),
        1: turn.record(1, "read_file", {"content": BIG_TEXT}, now=NOW),
        3: turn.record(3, "echo", "hi", now=NOW),
    }
    expected = [returned[1], returned[2], returned[3]]
    assert turn.history(now=NOW) == expected
    assert pad.turn(alice, "turn-1", now=NOW).history(now=NOW) == expected


def test_tools_only_when_something_was_offloaded(turn: Turn) -> None:
    assert turn.tools(now=NOW) == []
    turn.record(1, "echo", "small", now=NOW)
    assert turn.tools(now=NOW) == []
    offload(turn, 2)
    tools = turn.tools(now=NOW)
    assert tools == [SCRATCHPAD_READ_TOOL]
    tools[0]["function"]["name"] = "changed"  # the runtime gets its own copy
    assert SCRATCHPAD_READ_TOOL["function"]["name"] == "scratchpad_read"


def test_tools_finds_an_offloaded_step_behind_many_inline_ones(turn: Turn) -> None:
    # Only the offloaded step 1 (oldest, expiring first) makes the tool worth offering.
    turn.record(1, "read_file", {"content": BIG_TEXT}, ttl_seconds=10, now=NOW)
    for step in range(2, 32):
        turn.record(step, "echo", f"small {step}", now=NOW)
    assert turn.tools(now=NOW + 9) == [SCRATCHPAD_READ_TOOL]
    assert turn.tools(now=NOW + 10) == []


def test_tools_decides_on_authenticated_metadata(small_pad: Scratchpad, alice: Principal) -> None:
    turn = small_pad.turn(alice, "t", now=NOW)
    entry = offload(turn, 1)
    conn = apsw.Connection(str(small_pad.path))
    try:
        # What tools() reads: the listing part (the sealed metadata before it).
        conn.execute("UPDATE entries SET sealed_listing = ? WHERE id = ?", (bytes(64), entry))
    finally:
        conn.close()
    with pytest.raises(securepad.IntegrityError):
        turn.tools(now=NOW)


def test_tool_schema_is_an_openai_function() -> None:
    assert "SCRATCHPAD_READ_TOOL" in securepad.__all__ and "Turn" in securepad.__all__
    tool = json.loads(json.dumps(SCRATCHPAD_READ_TOOL))
    assert tool["type"] == "function"
    function = tool["function"]
    assert function["name"] == "scratchpad_read" and function["description"]
    params = function["parameters"]
    assert params["type"] == "object" and params["required"] == ["scratchpad_id"]
    assert params["additionalProperties"] is False
    assert params["properties"]["mode"]["enum"] == list(MODES)
    assert {"lines", "grep"} <= set(params["properties"]["mode"]["enum"])
    assert {"pattern", "max_matches", "context", "start", "end", "n"} <= set(params["properties"])


# -- call_tool -------------------------------------------------------------------------------


def test_call_tool_reads_with_every_mode(turn: Turn) -> None:
    entry = offload(turn)
    calls: list[dict[str, Any]] = [
        {"mode": "head", "n": 10},
        {"mode": "tail", "n": 10},
        {"mode": "range", "start": 5, "end": 15},
        {"mode": "full"},
        {"mode": "lines", "start": 2, "end": 3},
        {"mode": "grep", "pattern": "line 299\\d:", "max_matches": 3, "context": 1},
        {},
    ]
    for args in calls:
        result = turn.call_tool("scratchpad_read", {"scratchpad_id": entry, **args}, now=NOW)
        assert result["ok"] is True, result
        as_string = turn.call_tool("scratchpad_read", json.dumps({"scratchpad_id": entry, **args}), now=NOW)
        assert as_string == result
        json.dumps(result)  # JSON-safe
    grep = turn.call_tool(
        "scratchpad_read", {"scratchpad_id": entry, "mode": "grep", "pattern": "^line 2999:"}, now=NOW
    )
    assert grep["content"] == "3000:line 2999: the quick brown fox"
    lines = turn.call_tool("scratchpad_read", {"scratchpad_id": entry, "mode": "lines", "start": 2, "end": 3}, now=NOW)
    assert lines["content"] == "line 1: the quick brown fox\nline 2: the quick brown fox\n"


def test_call_tool_never_exceeds_the_read_cap(small_pad: Scratchpad, alice: Principal) -> None:
    turn = small_pad.turn(alice, "t", now=NOW)
    entry = offload(turn)
    for args in (
        {"mode": "full"},
        {"mode": "head", "n": 10**6},
        {"mode": "tail", "n": 10**6},
        {"mode": "range", "start": 0, "end": 10**6},
        {"mode": "lines", "start": 1, "end": 10**6},
        {"mode": "grep", "pattern": "fox", "max_matches": 10**6, "context": 5},
    ):
        result = turn.call_tool("scratchpad_read", {"scratchpad_id": entry, **args}, now=NOW)
        assert result["ok"] is True and len(result["content"]) <= 300, args
        assert result["metadata"]["truncated"] is True and "hint" in result["metadata"]


BAD_CALLS: list[tuple[Any, Any, str]] = [
    ("other_tool", {"scratchpad_id": "ID"}, "unknown tool"),
    (None, {"scratchpad_id": "ID"}, "unknown tool"),
    ("scratchpad_read", "{not json", "not valid JSON"),
    ("scratchpad_read", "", "not valid JSON"),
    ("scratchpad_read", "[1, 2]", "must be a JSON object"),
    ("scratchpad_read", 42, "must be a JSON object"),
    ("scratchpad_read", None, "must be a JSON object"),
    ("scratchpad_read", "x" * 100_000, "longer than"),
    ("scratchpad_read", {}, "scratchpad_id is required"),
    ("scratchpad_read", {"scratchpad_id": 12}, "scratchpad_id is required"),
    ("scratchpad_read", {"scratchpad_id": "ID", "bogus": 1}, "unknown argument"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "everything"}, "mode must be one of"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": ["head"]}, "mode must be one of"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "n": "10"}, "n must be an integer"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "n": 2.0}, "n must be an integer"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "n": True}, "n must be an integer"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "n": -1}, "n must be 0 or more"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "n": 10**40}, "too large"),
    ("scratchpad_read", '{"scratchpad_id": "ID", "n": 1e400}', "n must be an integer"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "range", "start": 9, "end": 3}, "greater than end"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "lines", "start": 9, "end": 3}, "after end line"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "head", "pattern": "x"}, "does not take pattern"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "range", "n": 5}, "does not take n"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "grep"}, "needs pattern"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "grep", "pattern": "(a"}, "invalid pattern"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "grep", "pattern": "a", "max_matches": 0}, "at least 1"),
    ("scratchpad_read", {"scratchpad_id": "ID", "mode": "grep", "pattern": "a", "context": 10**3}, "at most"),
]


@pytest.mark.parametrize(("name", "arguments", "message"), BAD_CALLS, ids=lambda v: repr(v)[:40])
def test_call_tool_answers_bad_calls_with_an_actionable_error(
    turn: Turn, name: Any, arguments: Any, message: str
) -> None:
    entry = offload(turn)
    if isinstance(arguments, dict):
        arguments = {k: (entry if v == "ID" else v) for k, v in arguments.items()}
    elif isinstance(arguments, str):
        arguments = arguments.replace('"ID"', json.dumps(entry))
    result = turn.call_tool(name, arguments, now=NOW)
    assert result["ok"] is False
    assert message in result["error"], result["error"]
    assert set(result) == {"ok", "error"}


def test_lines_and_grep_on_binary_say_what_works(turn: Turn) -> None:
    view = turn.record(1, "download", b"\x00" * 10_000, now=NOW)
    for mode in ("lines", "grep"):
        args = {"scratchpad_id": view["scratchpad_id"], "mode": mode, **({"pattern": "a"} if mode == "grep" else {})}
        result = turn.call_tool("scratchpad_read", args, now=NOW)
        assert result["ok"] is False and "binary" in result["error"] and "head" in result["error"]


def test_ids_outside_the_turn_all_get_the_same_answer(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    turn = pad.turn(alice, "turn-1", now=NOW)
    offload(turn)
    other_turn = offload(pad.turn(alice, "turn-2", now=NOW))
    other_owner = offload(pad.turn(bob, "turn-1", now=NOW))
    answers = []
    for entry in (other_turn, other_owner, "0123456789abcdef"):
        result = turn.call_tool("scratchpad_read", {"scratchpad_id": entry}, now=NOW)
        assert result["ok"] is False
        answers.append(result["error"].replace(entry, "ID"))
    assert len(set(answers)) == 1
    malformed = turn.call_tool("scratchpad_read", {"scratchpad_id": "' OR 1=1 --"}, now=NOW)
    assert malformed["ok"] is False and "no entry" in malformed["error"]


def test_expired_entry_is_an_error_not_an_exception(turn: Turn) -> None:
    view = turn.record(1, "read_file", {"content": BIG_TEXT}, ttl_seconds=60, now=NOW)
    result = turn.call_tool("scratchpad_read", {"scratchpad_id": view["scratchpad_id"]}, now=NOW + 61)
    assert result["ok"] is False and "expired" in result["error"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
argument_keys = st.sampled_from(["scratchpad_id", "mode", "n", "start", "end", "pattern", "max_matches", "context"])


@given(
    arguments=st.dictionaries(argument_keys, json_values | st.sampled_from(list(MODES)), max_size=6)
    | json_values
    | st.text(max_size=60)
)
def test_call_tool_never_raises_on_junk(turn: Turn, arguments: Any) -> None:
    result = turn.call_tool("scratchpad_read", arguments, now=NOW)
    assert isinstance(result["ok"], bool)
    if not result["ok"]:
        assert isinstance(result["error"], str) and result["error"]
    json.dumps(result)


# -- resolve ---------------------------------------------------------------------------------------


@pytest.fixture
def steps(turn: Turn) -> Turn:
    turn.record(1, "read_file", {"content": BIG_TEXT, "metadata": {"path": "/var/log/app.log"}}, now=NOW)
    turn.record(
        2,
        "search",
        {"results": [{"name": "a.py", "size": 10, "tags": ["x", "y"]}, {"name": "b.py", "size": None}], "total": 2},
        now=NOW,
    )
    turn.record(3, "echo", "plain text", now=NOW)
    turn.record(4, "download", b"\x00\xffbinary", now=NOW)
    return turn


def test_whole_string_reference_keeps_the_type(steps: Turn) -> None:
    assert steps.resolve("{{step1.content}}", now=NOW) == BIG_TEXT  # the full text, never the summary
    assert steps.resolve("${step1.metadata.path}", now=NOW) == "/var/log/app.log"
    assert steps.resolve("{{step2.total}}", now=NOW) == 2
    assert steps.resolve("{{step2.results.0.size}}", now=NOW) == 10
    assert steps.resolve("{{step2.results.1.size}}", now=NOW) is None
    assert steps.resolve("{{step2.results.0.tags}}", now=NOW) == ["x", "y"]
    assert steps.resolve("${step2.results.0}", now=NOW) == {"name": "a.py", "size": 10, "tags": ["x", "y"]}
    assert steps.resolve("{{ step2.results.0.tags.1 }}", now=NOW) == "y"
    assert steps.resolve("{{step3}}", now=NOW) == "plain text"
    assert steps.resolve("{{step3.content}}", now=NOW) == "plain text"
    assert steps.resolve("{{step4.content}}", now=NOW) == b"\x00\xffbinary"
    assert steps.resolve("{{step4}}", now=NOW) == b"\x00\xffbinary"


def test_references_inside_strings_lists_and_dicts(steps: Turn) -> None:
    arguments = {
        "path": "/out/${step1.metadata.path}.copy",
        "names": ["{{step2.results.0.name}}", "{{step2.results.1.name}}", 7, None],
        "note": "found {{step2.total}} files: {{step2.results.0.tags}}",
        "pair": ("{{step3}}", "literal {{ not a reference }}"),
        "nested": {"deep": {"content": "{{step1.content}}"}},
    }
    resolved = steps.resolve(arguments, now=NOW)
    assert resolved == {
        "path": "/out//var/log/app.log.copy",
        "names": ["a.py", "b.py", 7, None],
        "note": 'found 2 files: ["x", "y"]',
        "pair": ("plain text", "literal {{ not a reference }}"),
        "nested": {"deep": {"content": BIG_TEXT}},
    }
    assert arguments["names"][0] == "{{step2.results.0.name}}"  # the input is not changed


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("{{step9.content}}", "unknown step 9"),
        ("${step9}", "unknown step 9"),
        ("{{step1.nope}}", "has no field 'nope'"),
        ("{{step2.results.5.name}}", "'5' is not an index"),
        ("{{step2.results.x}}", "'x' is not an index"),
        ("{{step2.total.digits}}", "step2.total is a number"),
        ("{{step3.content.more}}", "is text"),
        ("copy {{step4.content}} here", "binary content"),
    ],
)
def test_unknown_step_or_field_names_the_reference(steps: Turn, value: str, named: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        steps.resolve({"argument": value}, now=NOW)
    message = str(raised.value)
    assert named in message
    reference = re.search(r"(\{\{.*?\}\}|\$\{.*?\})", value)
    assert reference is not None and reference.group(0) in message


def test_resolve_leaves_values_without_references_alone(steps: Turn) -> None:
    value = {"a": [1, 2.5, True, None, "text {with} braces", "${notastep}", "{{stepX}}"]}
    assert steps.resolve(value, now=NOW) == value


# -- another owner's turn id is an empty turn --------------------------------------------------


def test_another_owners_turn_id_is_an_empty_turn(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    alices = pad.turn(alice, "shared-turn", now=NOW)
    entry = offload(alices)
    alices.checkpoint(facts=["alice's fact"], now=NOW)
    alices.mark_compaction(now=NOW)
    bobs = pad.turn(bob, "shared-turn", now=NOW)
    assert bobs.history(now=NOW) == [] and bobs.tools(now=NOW) == []
    assert bobs.latest_checkpoint(now=NOW) is None
    assert bobs.reread_report(now=NOW)["mark"] is None
    assert bobs.call_tool("scratchpad_read", {"scratchpad_id": entry}, now=NOW)["ok"] is False
    with pytest.raises(InvalidArgumentError, match=r"unknown step 1 .*its steps: none"):
        bobs.resolve("{{step1.content}}", now=NOW)
    assert bobs.resume(extend_ttl=7200, now=NOW) == {"turn_id": "shared-turn", "steps": 0, "extended": 0}
    # Bob uses the id as if it were new: step 1, checkpoint seq 1; Alice's turn is unchanged.
    assert bobs.record(1, "echo", "bob's", now=NOW) == "bob's"
    assert bobs.checkpoint(facts=["bob's fact"], now=NOW)["seq"] == 1
    assert bobs.history(now=NOW) == ["bob's"]
    assert [item["scratchpad_id"] for item in alices.history(now=NOW)] == [entry]
    assert alices.latest_checkpoint(now=NOW)["facts"] == ["alice's fact"]  # type: ignore[index]


def test_scope_narrows_a_turn_within_an_owner(tmp_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(tmp_path / "c.db", keyring=keyring, policy=Policy.load("policies/channel.toml")) as pad:
        web, slack = Principal("alice", "agent", "web"), Principal("alice", "agent", "slack")
        entry = offload(pad.turn(web, "t", now=NOW))
        other = pad.turn(slack, "t", now=NOW)
        assert other.history(now=NOW) == []
        assert other.call_tool("scratchpad_read", {"scratchpad_id": entry}, now=NOW)["ok"] is False


# -- beginning a turn ----------------------------------------------------------------------------


def test_beginning_a_turn_collects_expired_entries(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    pad.put(bob, "old", 1, "x", "expired soon", ttl_seconds=10, now=NOW)
    pad.put(alice, "old", 1, "x", "lives on", ttl_seconds=1000, now=NOW)
    assert pad.stats(now=NOW + 20)["expired_pending_gc"] == 1
    pad.turn(alice, "new", now=NOW + 20)
    stats = pad.stats(now=NOW + 20)
    assert stats["expired_pending_gc"] == 0 and stats["entries"] == 1


@pytest.mark.parametrize("turn_id", ["", "x" * 300, "bad\x00id", 5, None])
def test_bad_turn_id_is_refused(pad: Scratchpad, alice: Principal, turn_id: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.turn(alice, turn_id)


def test_bad_principal_is_refused(pad: Scratchpad) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.turn(copy.copy("alice"), "t")  # type: ignore[arg-type]


def test_turn_repr_shows_no_content(turn: Turn) -> None:
    offload(turn)
    assert repr(turn) == "<Turn 'turn-1' of 'alice'>"


# -- steps and the command line ----------------------------------------------------------------


def test_steps_label_the_history(turn: Turn) -> None:
    small = turn.record(2, "echo", "hi", now=NOW)
    view = turn.record(1, "read_file", {"content": BIG_TEXT}, now=NOW)
    steps = turn.steps(now=NOW)
    assert [(s["step_num"], s["executor_name"], s["offloaded"]) for s in steps] == [
        (1, "read_file", True),
        (2, "echo", False),
    ]
    assert [s["shown"] for s in steps] == turn.history(now=NOW) == [view, small]
    assert steps[0]["scratchpad_id"] == view["scratchpad_id"]


def test_cli_turn_show(pad: Scratchpad, alice: Principal, db_path: Path, key_file: Path) -> None:
    from click.testing import CliRunner

    from securepad.cli import main

    turn = pad.turn(alice, "turn-cli")
    view = turn.record(1, "read_file", {"content": BIG_TEXT, "metadata": {"path": "/x.log"}})
    turn.record(2, "echo", {"said": "hello"})

    def run(*args: str) -> Any:
        base = ["--db", str(db_path), "--key-file", str(key_file)]
        return CliRunner().invoke(main, [*base, *args], catch_exceptions=False)

    who = ["--owner", "alice", "--actor", "planner", "--channel", "web"]
    shown = run("--json", "turn", "show", *who, "--turn", "turn-cli")
    assert shown.exit_code == 0, shown.output
    assert [step["shown"] for step in json.loads(shown.stdout)] == turn.history()
    table = run("turn", "show", *who, "--turn", "turn-cli")
    assert table.exit_code == 0
    assert f"step 1 read_file (offloaded as {view['scratchpad_id']})" in table.stdout
    assert "step 2 echo (inline)" in table.stdout and "hello" in table.stdout
    assert BIG_TEXT[600:700] not in table.stdout  # only the summary, never the whole observation
    empty = run("turn", "show", "--owner", "bob", "--turn", "turn-cli")
    assert empty.exit_code == 0 and "no live steps" in empty.stdout
    missing = run("turn", "show", *who)
    assert missing.exit_code == 2


def test_beginning_a_turn_does_not_wait_for_readers(pad: Scratchpad, alice: Principal, db_path: Path) -> None:
    """gc at the start of a turn checkpoints the WAL without waiting: a reader
    holding an old snapshot (another process, say) does not hold the turn up."""
    import apsw

    pad.put(alice, "t", 1, "x", "before the reader", ttl_seconds=10, now=NOW)
    reader = apsw.Connection(str(db_path))
    reader.execute("BEGIN")
    assert reader.execute("SELECT COUNT(*) FROM entries").fetchall() == [(1,)]
    try:
        pad.put(alice, "t", 2, "x", "after the reader", now=NOW)
        turn = pad.turn(alice, "t", now=NOW + 20)  # collects step 1 while the reader is open
        assert [item["summary"] for item in turn.history(now=NOW + 20)] == ["after the reader"]
    finally:
        reader.execute("COMMIT")
        reader.close()
