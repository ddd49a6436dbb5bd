"""A store written by the code before the engine was rebuilt opens and reads.

``tests/fixtures/store_v1.db`` was written by ``tests/fixtures/make_store_v1.py``
with the code of that time; ``store_v1.json`` holds what it returned then.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from securepad import Keyring, NotFoundError, Scratchpad
from tests.support.paths import FIXTURES
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import SLACK_BOB as BOB

EXPECTED = json.loads((FIXTURES / "store_v1.json").read_text())
NOW = EXPECTED["now"]

OBSERVATIONS: dict[str, Any] = {
    "text": "line one\nline two ünïcödé\n" + "x" * 70_000 + "\nlast line",
    "binary": bytes(range(256)) * 300,
    "json": {"items": [{"n": i, "name": f"item-{i}"} for i in range(50)], "count": 50, "ok": True},
    "dict_text": {"content": "the file body\nsecond line", "metadata": {"path": "src/a.py"}, "exit": 0},
    "dict_binary": {"content": b"\x00\x01binary\xff", "metadata": {"mime": "application/x"}},
    "empty": "",
}


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


@pytest.fixture
def old_pad(tmp_path: Path) -> Any:
    shutil.copy(FIXTURES / "store_v1.db", tmp_path / "store.db")
    # git keeps no file modes but the executable bit: a fresh clone checks the fixture
    # out 0644, which opening a store refuses; a store of one's own is 0600.
    (tmp_path / "store.db").chmod(0o600)
    key = tmp_path / "key"
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    # The host's clock at the fixture's time: its writes may not run ahead of the clock.
    with Scratchpad.open(tmp_path / "store.db", keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        yield pad


def test_the_fixture_key_is_the_documented_test_key() -> None:
    assert base64.b64decode((FIXTURES / "store_v1.key").read_bytes().strip()) == bytes(range(32))


@pytest.mark.parametrize("name", sorted(OBSERVATIONS))
def test_every_kind_of_entry_reads_back(old_pad: Scratchpad, name: str) -> None:
    expected = EXPECTED["entries"][name]
    entry = old_pad.get(ALICE, expected["id"], now=NOW)
    assert entry.observation == OBSERVATIONS[name]
    assert entry.step_num == expected["step"] and entry.turn_id == "turn-fixture"
    assert _json(entry.view) == expected["view"]
    if name in ("text", "empty"):
        head = old_pad.read(ALICE, expected["id"], "head", n=20, now=NOW)
        assert head["content"] == OBSERVATIONS[name][:20]


def test_lines_and_grep_use_the_stored_indexes(old_pad: Scratchpad) -> None:
    entry_id = EXPECTED["entries"]["text"]["id"]
    lines = old_pad.read(ALICE, entry_id, "lines", start=2, end=2, now=NOW)
    assert "line two ünïcödé" in lines["content"]
    grep = old_pad.read(ALICE, entry_id, "grep", pattern="^last", now=NOW)
    assert "4:last line" in grep["content"]


def test_owners_stay_apart(old_pad: Scratchpad) -> None:
    bob = EXPECTED["bob"]
    assert old_pad.get(BOB, bob["id"], now=NOW).observation == "bob's private text"
    with pytest.raises(NotFoundError):
        old_pad.get(ALICE, bob["id"], now=NOW)
    with pytest.raises(NotFoundError):
        old_pad.get(BOB, EXPECTED["entries"]["text"]["id"], now=NOW)


def test_the_turn_and_its_records_read_back(old_pad: Scratchpad) -> None:
    turn = old_pad.turn(ALICE, "turn-records", now=NOW)
    expected = EXPECTED["turn"]
    assert _json(turn.steps(now=NOW)) == expected["steps"]
    assert _json(turn.history(now=NOW)) == expected["history"]
    assert _json(turn.latest_checkpoint(now=NOW)) == expected["latest_checkpoint"]
    assert _json(turn.reread_report(now=NOW)) == expected["reread_report"]


def test_the_old_store_takes_new_writes_and_rotations(old_pad: Scratchpad) -> None:
    turn = old_pad.turn(ALICE, "turn-records", now=NOW)
    turn.record(4, "new_tool", "written by the current code", now=NOW)
    assert turn.checkpoint(facts=["third"], now=NOW)["seq"] == 3
    rotated = old_pad.rotate_owner_key("alice")
    assert rotated["complete"] and rotated["version"] == 3
    assert [s["step_num"] for s in turn.steps(now=NOW)] == [1, 2, 3, 4]
    latest = turn.latest_checkpoint(now=NOW)
    assert latest is not None and latest["facts"] == ["third"]
    text = EXPECTED["entries"]["text"]
    assert old_pad.get(ALICE, text["id"], now=NOW).observation == OBSERVATIONS["text"]
