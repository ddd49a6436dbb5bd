"""The heads of a store written by main at e7494e0 (format 1: a listing
of every row) become constant-size tallies (format 2) on the first open with the
key after migration 10 (PostgreSQL 7), and what they refused before they still refuse."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from tests.support.fixture_v7 import EXPECTED, NOW, copy_v7
from tests.support.principals import AGENT_ALICE as ALICE


def _sql(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    conn = apsw.Connection(str(db))
    try:
        with conn:
            return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_format_1_heads_are_converted_and_the_store_verifies(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    listed = dict(_sql(db, "SELECT turn_id, length(sealed) FROM turn_heads WHERE turn_id != ''"))
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        assert pad.verify(now=NOW)["ok"]
        assert len(pad.turn(ALICE, "turn-records", now=NOW).history(now=NOW)) == len(EXPECTED["turn"]["history"])
        pad.put(ALICE, "turn-records", 99, "tool", "after the conversion", now=NOW)
        assert pad.verify(now=NOW)["ok"]
    tallies = dict(_sql(db, "SELECT turn_id, length(sealed) FROM turn_heads WHERE turn_id > char(1) || 'usage'"))
    # pad.turn's gc collected the fixture's expired entry, the only row of its turn: that turn has no head left.
    assert set(tallies) == set(listed) - {"turn-expired"} and max(tallies.values()) < 450  # type: ignore[type-var]
    assert max(listed.values()) > 450  # type: ignore[type-var]  # the listings were bigger
    flag = _sql(db, "SELECT value FROM store_meta WHERE key = 'turn_heads'")[0][0]
    assert str(flag).startswith("3:")
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:  # converted once
        assert pad.verify(now=NOW)["ok"]


def test_a_deletion_made_before_the_conversion_is_still_refused(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    entry_id = EXPECTED["entries"]["json"]["id"]
    _sql(db, "DELETE FROM segments WHERE entry_id = ?", (entry_id,))
    _sql(db, "DELETE FROM entries WHERE id = ?", (entry_id,))
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "turn-fixture", now=NOW).history(now=NOW)
        problems = pad.verify(now=NOW)["problems"]
    assert [(p["turn_id"], p["what"]) for p in problems] == [("turn-fixture", "turn")]


def test_a_format_1_head_put_back_after_the_conversion_is_refused(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    old = _sql(db, "SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'turn-fixture'")
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW):
        pass
    _sql(db, "UPDATE turn_heads SET sealed = ? WHERE owner_user_id = 'alice' AND turn_id = 'turn-fixture'", old[0])
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        with pytest.raises(IntegrityError, match="older format"):
            pad.turn(ALICE, "turn-fixture", now=NOW).history(now=NOW)
        assert not pad.verify(now=NOW)["ok"]


def test_a_head_swapped_before_the_conversion_fails_its_turn_not_the_open(tmp_path: Path) -> None:
    db, key = copy_v7(tmp_path)
    other = _sql(db, "SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 'turn-records'")
    _sql(db, "UPDATE turn_heads SET sealed = ? WHERE owner_user_id = 'alice' AND turn_id = 'turn-fixture'", other[0])
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "turn-fixture", now=NOW).history(now=NOW)
        assert len(pad.turn(ALICE, "turn-records", now=NOW).history(now=NOW)) == len(EXPECTED["turn"]["history"])
        assert {p["turn_id"] for p in pad.verify(now=NOW)["problems"]} == {"turn-fixture"}
