"""Resumption: a turn suspended in one process picks up in another (same store,
same key file), and resuming can extend the turn's expiry."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import securepad
from securepad import IntegrityError, InvalidArgumentError, Keyring, Principal, Scratchpad, Turn
from tests.support.principals import ALICE

NOW = 2_000_000.0
TURN = "turn-resume"
LOG = "".join(f"2024-05-01 INFO request {i} ok\n" for i in range(5000)) + "2024-05-01 ERROR disk full\n"

# What the other process runs: open the store with the same key file, pick the
# turn up, and report (as JSON) or act, as told.
CHILD = r"""
import base64, json, sys
from securepad import Keyring, Principal, Scratchpad

db, key, action, now = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
args = json.loads(sys.stdin.read())

def jsonable(value):
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value

with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
    turn = pad.turn(Principal("alice", "planner", "web"), args["turn"], now=now)
    out = {}
    if action == "record":
        out["returned"] = [turn.record(s, e, o, now=now) for s, e, o in args["steps"]]
    if action == "resume" and args.get("extend_ttl"):
        out["resume"] = turn.resume(extend_ttl=args["extend_ttl"], now=now)
    out["history"] = turn.history(now=now)
    out["tools"] = turn.tools(now=now)
    out["calls"] = [turn.call_tool("scratchpad_read", call, now=now) for call in args.get("calls", [])]
    out["resolved"] = jsonable(turn.resolve(args.get("resolve", {}), now=now))
print(json.dumps(out))
"""


def run_child(db_path: Path, key_file: Path, action: str, now: float, **args: Any) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(securepad.__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(db_path), str(key_file), action, repr(now)],
        input=json.dumps({"turn": TURN, **args}),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def jsonable(value: Any) -> Any:
    """The child's JSON form of a resolved value (bytes travel as base64)."""
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def record_steps(turn: Turn, *, now: float = NOW, ttl_seconds: int | None = None) -> dict[str, Any]:
    views = {
        1: turn.record(
            1, "read_file", {"content": LOG, "metadata": {"path": "/var/log/app.log"}}, ttl_seconds=ttl_seconds, now=now
        ),
        2: turn.record(
            2, "search", {"results": [{"name": f"f{i}.py"} for i in range(300)]}, ttl_seconds=ttl_seconds, now=now
        ),
        3: turn.record(3, "download", b"\x89PNG\r\n" + bytes(5000), ttl_seconds=ttl_seconds, now=now),
        4: turn.record(4, "echo", {"status": "ok"}, ttl_seconds=ttl_seconds, now=now),
    }
    return views


def calls_for(views: dict[str, Any]) -> list[Any]:
    log_id = views[1]["scratchpad_id"]
    return [
        {"scratchpad_id": log_id, "mode": "grep", "pattern": "ERROR"},
        json.dumps({"scratchpad_id": log_id, "mode": "lines", "start": 5001, "end": 5001}),
        {"scratchpad_id": views[2]["scratchpad_id"], "mode": "head", "n": 50},
        {"scratchpad_id": views[3]["scratchpad_id"], "mode": "range", "start": 0, "end": 6},
        {"scratchpad_id": log_id, "mode": "lines", "start": 9, "end": 1},  # an error, the same in both
    ]


RESOLVE = {
    "content": "{{step1.content}}",
    "path": "${step1.metadata.path}",
    "first": "{{step2.results.0.name}}",
    "png": "{{step3.content}}",
    "note": "status is {{step4.status}}",
}


def test_a_turn_recorded_here_resumes_in_another_process(
    pad: Scratchpad, alice: Principal, db_path: Path, key_file: Path
) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    views = {str(k): v for k, v in record_steps(turn).items()}
    calls = calls_for({int(k): v for k, v in views.items()})
    expected = {
        "history": turn.history(now=NOW),
        "tools": turn.tools(now=NOW),
        "calls": [turn.call_tool("scratchpad_read", call, now=NOW) for call in calls],
        "resolved": jsonable(turn.resolve(RESOLVE, now=NOW)),
    }
    assert expected["tools"] and expected["calls"][0]["content"] == "5001:2024-05-01 ERROR disk full"
    assert expected["calls"][-1]["ok"] is False
    there = run_child(db_path, key_file, "resume", NOW + 60, calls=calls, resolve=RESOLVE)
    assert there == expected


def test_a_turn_recorded_in_another_process_resumes_here(
    pad: Scratchpad, alice: Principal, db_path: Path, key_file: Path
) -> None:
    steps = [
        [1, "read_file", {"content": LOG, "metadata": {"path": "/var/log/app.log"}}],
        [2, "ls", {"files": ["a", "b"]}],
    ]
    there = run_child(db_path, key_file, "record", NOW, steps=steps)
    assert there["history"] == there["returned"]
    turn = pad.turn(alice, TURN, now=NOW + 60)
    assert turn.history(now=NOW + 60) == there["returned"]
    assert turn.tools(now=NOW + 60) == there["tools"] == [securepad.SCRATCHPAD_READ_TOOL]
    log_id = there["returned"][0]["scratchpad_id"]
    found = turn.call_tool("scratchpad_read", {"scratchpad_id": log_id, "mode": "grep", "pattern": "ERROR"}, now=NOW)
    assert found["content"] == "5001:2024-05-01 ERROR disk full"
    assert turn.resolve({"files": "{{step2.files}}", "log": "{{step1.content}}"}, now=NOW) == {
        "files": ["a", "b"],
        "log": LOG,
    }
    # The turn goes on here: step 3 is new, step 1 is taken.
    assert turn.record(3, "echo", "done", now=NOW) == "done"
    with pytest.raises(InvalidArgumentError):
        turn.record(1, "echo", "again", now=NOW)


def test_resume_in_another_process_extends_the_expiry(
    pad: Scratchpad, alice: Principal, db_path: Path, key_file: Path
) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    views = record_steps(turn, ttl_seconds=100)
    turn.checkpoint(facts=["the log ends in an error"], ttl_seconds=100, now=NOW)
    turn.mark_compaction(ttl_seconds=100, now=NOW)
    there = run_child(db_path, key_file, "resume", NOW + 50, extend_ttl=3600)
    assert there["resume"] == {"turn_id": TURN, "steps": 4, "extended": 6}
    later = NOW + 500  # past the first expiry, within the new one
    resumed = pad.turn(alice, TURN, now=later)
    assert [item.get("scratchpad_id") for item in resumed.history(now=later)] == [
        views[1]["scratchpad_id"],
        views[2]["scratchpad_id"],
        views[3]["scratchpad_id"],
        None,
    ]
    log = resumed.call_tool(
        "scratchpad_read", {"scratchpad_id": views[1]["scratchpad_id"], "mode": "tail", "n": 10}, now=later
    )
    assert log["ok"] is True and log["content"] == LOG[-10:]
    assert resumed.resolve("{{step4.status}}", now=later) == "ok"
    assert resumed.latest_checkpoint(now=later) is not None
    assert resumed.reread_report(now=later)["mark"] is not None
    entries = pad.list_for_turn(alice, TURN, now=later)
    assert all(item["expires_at"] == NOW + 50 + 3600 for item in entries)


# -- resume in one process ---------------------------------------------------------------------


def test_resume_without_extension_reports_the_turn(pad: Scratchpad, alice: Principal) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    record_steps(turn)
    assert turn.resume(now=NOW) == {"turn_id": TURN, "steps": 4, "extended": 0}


def test_resume_never_shortens_expiry(pad: Scratchpad, alice: Principal) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    record_steps(turn, ttl_seconds=5000)
    assert turn.resume(extend_ttl=100, now=NOW)["extended"] == 0
    assert {item["expires_at"] for item in pad.list_for_turn(alice, TURN, now=NOW)} == {NOW + 5000}
    assert turn.resume(extend_ttl=6000, now=NOW)["extended"] == 4
    assert {item["expires_at"] for item in pad.list_for_turn(alice, TURN, now=NOW)} == {NOW + 6000}


def test_expired_entries_are_not_revived(pad: Scratchpad, alice: Principal) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    turn.record(1, "echo", "short-lived", ttl_seconds=10, now=NOW)
    turn.record(2, "echo", "long-lived", ttl_seconds=1000, now=NOW)
    assert turn.resume(extend_ttl=3600, now=NOW + 20)["extended"] == 1
    assert turn.history(now=NOW + 20) == ["long-lived"]


@pytest.mark.parametrize("ttl", [0, -5, 1.5, "60", True, 86_401])
def test_bad_extension_is_refused(pad: Scratchpad, alice: Principal, ttl: Any) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    record_steps(turn)
    with pytest.raises(InvalidArgumentError):
        turn.resume(extend_ttl=ttl, now=NOW)


def test_resume_touches_only_the_principals_entries(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    record_steps(pad.turn(alice, TURN, now=NOW), ttl_seconds=100)
    assert pad.turn(bob, TURN, now=NOW).resume(extend_ttl=3600, now=NOW)["extended"] == 0
    assert {item["expires_at"] for item in pad.list_for_turn(alice, TURN, now=NOW)} == {NOW + 100}


def test_extension_reseals_the_sealed_copy_of_the_expiry(pad: Scratchpad, alice: Principal, db_path: Path) -> None:
    """The clear expires_at has a sealed copy: extension updates both, and putting
    the old clear value back (a rollback by someone with file access) is detected."""
    import apsw

    turn = pad.turn(alice, TURN, now=NOW)
    view = turn.record(1, "read_file", {"content": LOG}, ttl_seconds=100, now=NOW)
    turn.resume(extend_ttl=1000, now=NOW)
    assert pad.get(alice, view["scratchpad_id"], now=NOW + 500).observation == {"content": LOG}
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (NOW + 100, view["scratchpad_id"]))
    conn.close()
    with pytest.raises(IntegrityError):
        pad.get(alice, view["scratchpad_id"], now=NOW + 50)


def test_a_store_reopened_with_another_key_cannot_resume(tmp_path: Path, db_path: Path, pad: Scratchpad) -> None:
    record_steps(pad.turn(ALICE, TURN, now=NOW))
    with pytest.raises(securepad.WrongKeyError):
        Scratchpad.open(db_path, keyring=Keyring.from_key_file(tmp_path / "other-key"))
