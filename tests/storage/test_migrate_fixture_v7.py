"""A store written by main at e7494e0 (SQLite schema 7) opens, reads, verifies and takes writes.

``tests/fixtures/store_v7.db`` was written by ``tests/fixtures/make_store_v7.py``
with the code of that commit; ``store_v7.json`` holds what it returned then.
Later migrations (8 and up) are tested against a copy of it here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import ExpiredError, Keyring, NotFoundError, Scratchpad
from securepad.storage.sqlite import SCHEMA_VERSION
from tests.support.fixture_v7 import EXPECTED, NOW, copy_v7
from tests.support.paths import FIXTURES
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import SLACK_BOB as BOB

OBSERVATIONS: dict[str, Any] = {
    "text": "line one\nline two ünïcödé\n" + "x" * 70_000 + "\nlast line",
    "binary": bytes(range(256)) * 300,
    "small_text": "a one-segment text\nwith two lines",
    "small_binary": b"\x00\x01\x02 one segment \xff",
    "json": {"items": [{"n": i, "name": f"item-{i}"} for i in range(50)], "count": 50, "ok": True},
    "dict_text": {"content": "the file body\nsecond line", "metadata": {"path": "src/a.py"}, "exit": 0},
    "dict_binary": {"content": b"\x00\x01binary\xff", "metadata": {"mime": "application/x"}},
    "empty": "",
}
BATCH = ["first of a batch", {"rows": [1, 2, 3]}, b"\x07" * 10]


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _header_version(path: Path) -> int:
    """SQLite's user_version from the file header (offset 60), without opening the file."""
    return int.from_bytes(path.read_bytes()[60:64], "big")


def _user_version(path: Path) -> int:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
    finally:
        conn.close()


@pytest.fixture
def v7_pad(tmp_path: Path) -> Iterator[Scratchpad]:
    db, key = copy_v7(tmp_path)
    # The host's clock at the fixture's time: its writes may not run ahead of the clock.
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        yield pad


def test_the_fixture_is_a_schema_7_store_with_the_documented_key() -> None:
    assert _header_version(FIXTURES / "store_v7.db") == 7 == EXPECTED["schema_version"]
    assert base64.b64decode((FIXTURES / "store_v7.key").read_bytes().strip()) == bytes(range(32))


def test_opening_migrates_it_to_the_current_schema(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)):
        pass
    assert _user_version(db) == SCHEMA_VERSION


@pytest.mark.parametrize("name", sorted(OBSERVATIONS))
def test_every_kind_of_entry_reads_back(v7_pad: Scratchpad, name: str) -> None:
    expected = EXPECTED["entries"][name]
    entry = v7_pad.get(ALICE, expected["id"], now=NOW)
    assert entry.observation == OBSERVATIONS[name]
    assert entry.step_num == expected["step"] and entry.turn_id == "turn-fixture"
    assert _json(entry.view) == expected["view"]
    if isinstance(OBSERVATIONS[name], str):
        head = v7_pad.read(ALICE, expected["id"], "head", n=20, now=NOW)
        assert head["content"] == OBSERVATIONS[name][:20]
        tail = v7_pad.read(ALICE, expected["id"], "tail", n=9, now=NOW)
        assert tail["content"] == OBSERVATIONS[name][-9:]


def test_the_batch_reads_back(v7_pad: Scratchpad) -> None:
    for expected, observation in zip(EXPECTED["batch"], BATCH, strict=True):
        entry = v7_pad.get(ALICE, expected["id"], now=NOW)
        assert entry.observation == observation
        assert _json(entry.view) == expected["view"]


def test_lines_and_grep_use_the_stored_indexes(v7_pad: Scratchpad) -> None:
    entry_id = EXPECTED["entries"]["text"]["id"]
    lines = v7_pad.read(ALICE, entry_id, "lines", start=2, end=2, now=NOW)
    assert "line two ünïcödé" in lines["content"]
    grep = v7_pad.read(ALICE, entry_id, "grep", pattern="^last", now=NOW)
    assert "4:last line" in grep["content"]


def test_owners_stay_apart_and_the_expired_entry_stays_expired(v7_pad: Scratchpad) -> None:
    bob = EXPECTED["bob"]
    assert v7_pad.get(BOB, bob["id"], now=NOW).observation == "bob's private text"
    with pytest.raises(NotFoundError):
        v7_pad.get(ALICE, bob["id"], now=NOW)
    with pytest.raises(NotFoundError):
        v7_pad.get(BOB, EXPECTED["entries"]["text"]["id"], now=NOW)
    with pytest.raises(ExpiredError):
        v7_pad.get(ALICE, EXPECTED["expired"]["id"], now=NOW)


def test_the_turn_its_records_and_the_stats_read_back(v7_pad: Scratchpad) -> None:
    turn = v7_pad.turn(ALICE, "turn-records", now=NOW)
    expected = EXPECTED["turn"]
    assert _json(turn.steps(now=NOW)) == expected["steps"]
    assert _json(turn.history(now=NOW)) == expected["history"]
    assert _json(turn.latest_checkpoint(now=NOW)) == expected["latest_checkpoint"]
    assert _json(turn.reread_report(now=NOW)) == expected["reread_report"]
    assert _json(v7_pad.stats(ALICE, now=NOW)) == EXPECTED["stats"]["alice"]
    assert _json(v7_pad.stats(BOB, now=NOW)) == EXPECTED["stats"]["bob"]


def test_the_old_store_verifies(v7_pad: Scratchpad) -> None:
    report = v7_pad.verify(now=NOW)
    assert report["ok"], report["problems"]
    assert report["entries"] == 1 + len(OBSERVATIONS) + len(BATCH) + 1 + 5  # bob, alice's, batch, expired, turn


def test_the_old_store_takes_new_writes_rotations_and_gc(v7_pad: Scratchpad) -> None:
    assert v7_pad.gc(NOW) == 1  # the expired entry
    turn = v7_pad.turn(ALICE, "turn-records", now=NOW)
    turn.record(6, "new_tool", "written by the current code", now=NOW)
    assert turn.checkpoint(facts=["third"], now=NOW)["seq"] == 3
    rotated = v7_pad.rotate_owner_key("alice")
    assert rotated["complete"] and rotated["version"] == 3
    assert [s["step_num"] for s in turn.steps(now=NOW)] == [1, 2, 3, 4, 5, 6]
    assert v7_pad.get(ALICE, EXPECTED["entries"]["text"]["id"], now=NOW).observation == OBSERVATIONS["text"]
    assert (
        v7_pad.get(ALICE, EXPECTED["entries"]["small_text"]["id"], now=NOW).observation == (OBSERVATIONS["small_text"])
    )
    assert v7_pad.verify(now=NOW)["ok"]
