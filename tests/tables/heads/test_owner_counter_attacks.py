"""The owner's turn counter under attack and under its own races.

Two stores (two processes' worth of connections) creating turns of one owner
at once count every turn once, with no false tamper alarm; and deleting the
usage head, which holds the counter the writes check, does not switch the
check off: a turn head that saw more turns than the owner head counts shows
the owner head was put back from an older copy.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import owner_heads, put_back, raw_edit, remove_turn

TURNS = 12


def _owner_counts(pad: Scratchpad) -> tuple[set[str], int | None]:
    """Alice's owner head: the turns it lists and its turn counter."""
    rows = parts(pad).db.query(
        "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
        " WHERE owner_user_id = 'alice' AND turn_id = ?",
        (OWNER_HEAD,),
        admin=True,
    )
    return parts(pad).heads.owner_turns(rows[0], "alice")


def test_two_stores_creating_turns_of_one_owner_at_once_count_each(store_location: Any, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        pad.put(ALICE, "first", 1, "tool", "x", now=NOW)  # the owner's key exists before the race
    pads = [Scratchpad.open(store_location, keyring=keyring) for _ in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            barrier.wait()
            for i in range(TURNS):
                pads[n].put(ALICE, f"w{n}-{i}", 1, "tool", f"{n}/{i}", now=NOW)  # a new turn each
                pads[n].put_many(ALICE, "first", [(10 + 100 * n + i, "tool", "y")], now=NOW)  # a shared turn
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for one in pads:
        one.close()
    assert errors == []
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        report = pad.verify(now=NOW)
        assert report["ok"], report["problems"]
        turns, created = _owner_counts(pad)
        assert len(turns) == created == 1 + 2 * TURNS


def test_a_deleted_usage_head_does_not_switch_the_counter_check_off(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD,))
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.turn(ALICE, "a", now=NOW).checkpoint(facts=["written after"], now=NOW)  # the owner's exclusive lock
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "new")
        put_back(raw, old)
        raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (USAGE_HEAD,))
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        problems = [p for p in again.verify(now=NOW)["problems"] if p["what"] == "owner head"]
        assert [p["turn_id"] for p in problems] == ["a"]  # the turn that saw the removed one created
        with pytest.raises(IntegrityError, match="older copy"):
            again.put_many(ALICE, "a", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)


def test_a_turn_emptied_while_another_store_puts_into_it_stays_listed_while_it_holds_rows(
    store_location: Any, keyring: Keyring
) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        pad.put(ALICE, "keep", 1, "tool", "x", now=NOW)
    pads = [Scratchpad.open(store_location, keyring=keyring) for _ in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def emptier() -> None:
        try:
            barrier.wait()
            for _ in range(TURNS):
                for item in pads[0].list_for_turn(ALICE, "shared", now=NOW):
                    pads[0].delete(ALICE, item["scratchpad_id"], now=NOW)  # the last one empties the turn
        except BaseException as exc:
            errors.append(exc)

    def putter() -> None:
        try:
            barrier.wait()
            for i in range(TURNS):
                pads[1].put(ALICE, "shared", 1 + i, "tool", f"p{i}", now=NOW)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=emptier), threading.Thread(target=putter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for one in pads:
        one.close()
    assert errors == []
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        report = pad.verify(now=NOW)
        assert report["ok"], report["problems"]
        held = bool(pad.list_for_turn(ALICE, "shared", now=NOW))
        assert ("shared" in _owner_counts(pad)[0]) == held


def test_heads_put_back_from_before_the_counter_do_not_switch_it_off(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "x", now=NOW)
    heads = parts(pad).heads
    row = parts(pad).db.query(
        "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        " AND turn_id = 'a'",
        admin=True,
    )[0]
    turn = {key: value for key, value in json.loads(heads.open_body(row, "alice", "a")).items() if key != "o"}
    with parts(pad).db.transaction(admin=True) as conn:  # the owner's heads as a version before the counter sealed them
        heads.write_body(conn, "alice", "a", json.dumps(turn).encode())
        heads.write_body(conn, "alice", OWNER_HEAD, json.dumps({"t": ["a"]}).encode())
        heads.write_body(conn, "alice", USAGE_HEAD, str(turn["r"]).encode())
    report = pad.verify(now=NOW)
    assert report["ok"], report["problems"]
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD, USAGE_HEAD))
    pad.put(ALICE, "new", 1, "tool", "the turn to hide", now=NOW)
    pad.turn(ALICE, "a", now=NOW).checkpoint(facts=["written after"], now=NOW)  # the owner's exclusive lock
    assert pad.verify(now=NOW)["ok"]
    with raw_edit(pad, store_location) as raw:
        remove_turn(raw, "new")
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as again:
        problems = [p for p in again.verify(now=NOW)["problems"] if p["what"] == "owner head"]
        assert [p["turn_id"] for p in problems] == ["a"]
        with pytest.raises(IntegrityError, match="older copy"):
            again.put_many(ALICE, "a", [(2, "tool", "y"), (3, "tool", "z")], now=NOW)
