"""A turn this connection created is read warm from its first read (SQLite).

The write that creates a turn seals its whole inventory (the turn had neither
a head nor a row, which the write's first statement checks), and keeps it
verified with the connection's data version read in the write's transaction
(``tables.heads.reading.InventoryReads.seeded``); the writes after it edit it.
So the first read of a turn this process just wrote fetches the same rows as
any warm read, whatever the turn's length, and the guarantees hold as for any
kept inventory: a commit of another connection moves the data version (the
next read verifies the turn again), rows planted before the first write leave
nothing kept, and a write that rolls back leaves a head the store does not hold.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError
from securepad.store import parts
from tests.support.meters import ReadMeter
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import copy_row, on_sqlite

LATER = NOW + 10
# What a warm ``get`` fetches: the entry's row and the head statement's token row.
WARM_ROWS = 2
# The anchor advanced in each write's own commit: no background commit of
# another connection comes between a test's write and its read.
NO_BACKGROUND = Policy(anchor_sync="commit")


@pytest.fixture
def pad(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as opened:
        opened.put(ALICE, "first", 1, "fetch", "the owner's keys and heads exist", now=NOW)
        yield opened


def _rows(pad: Scratchpad, call: Any) -> int:
    return ReadMeter(pad).counts(call)["rows"]


@pytest.mark.parametrize("how", ["put", "put_many"])
def test_the_first_read_of_a_turn_this_connection_created_fetches_no_inventory(pad: Scratchpad, how: str) -> None:
    fetched = {}
    for length in (1, 60):
        turn = f"{how}-{length}"
        if how == "put":
            ids = [
                pad.put(ALICE, turn, step, "fetch", f"observation {step}", now=NOW)["scratchpad_id"]
                for step in range(1, length + 1)
            ]
        else:
            batch = [(step, "fetch", f"observation {step}") for step in range(1, length + 1)]
            ids = [view["scratchpad_id"] for view in pad.put_many(ALICE, turn, batch, now=NOW)]
        fetched[length] = (_rows(pad, lambda ids=ids: pad.get(ALICE, ids[0], now=LATER)), len(ids))
    assert fetched == {1: (WARM_ROWS, 1), 60: (WARM_ROWS, 60)}
    assert [view["step_num"] for view in pad.list_for_turn(ALICE, f"{how}-60", now=LATER)] == list(range(1, 61))


def test_the_first_read_after_another_connection_commits_verifies_the_new_turn_once(
    pad: Scratchpad, db_path: Path, keyring: Keyring
) -> None:
    ids = [pad.put(ALICE, "new", step, "fetch", f"o {step}", now=NOW)["scratchpad_id"] for step in range(1, 21)]
    with Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as other:
        other.put(BOB, "elsewhere", 1, "fetch", "another connection's", now=NOW)
    assert _rows(pad, lambda: pad.get(ALICE, ids[0], now=LATER)) > 20  # the inventory, verified
    assert _rows(pad, lambda: pad.get(ALICE, ids[0], now=LATER)) == WARM_ROWS


def test_another_connections_edit_of_a_new_turn_is_refused_by_its_first_read(pad: Scratchpad, db_path: Path) -> None:
    ids = [pad.put(ALICE, "new", step, "fetch", f"o {step}", now=NOW)["scratchpad_id"] for step in range(1, 6)]
    with on_sqlite(db_path) as raw:
        raw.execute("DELETE FROM entries WHERE id = ?", (ids[2],))
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)


@pytest.mark.parametrize("planted", ["entry", "expired entry"])
def test_rows_planted_in_a_turn_before_its_first_write_are_refused_by_its_first_read(
    pad: Scratchpad, db_path: Path, planted: str
) -> None:
    """The write finds the turn not empty: it keeps nothing, and the first read recounts the turn."""
    source = pad.put(ALICE, "source", 1, "fetch", "genuine sealed bytes", now=NOW)["scratchpad_id"]
    with on_sqlite(db_path) as raw:
        expiry = {"expires_at": NOW - 1} if planted == "expired entry" else {}
        copy_row(raw, source, secrets.token_hex(8), turn_id="new", step_num=1, **expiry)
    entry = pad.put(ALICE, "new", 2, "fetch", "the turn's first write", now=NOW)["scratchpad_id"]
    with pytest.raises(IntegrityError):
        pad.get(ALICE, entry, now=LATER)
    assert "new" in {problem["turn_id"] for problem in pad.verify(now=LATER)["problems"]}


def test_a_new_turns_write_that_rolls_back_keeps_nothing_the_store_does_not_hold(
    pad: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    heads = parts(pad).heads
    change = heads.change

    def failing(*args: Any, **kwargs: Any) -> int:
        change(*args, **kwargs)
        raise RuntimeError("the write fails after its head was sealed")

    monkeypatch.setattr(heads, "change", failing)
    with pytest.raises(RuntimeError):
        pad.put(ALICE, "new", 1, "fetch", "rolled back", now=NOW)
    monkeypatch.undo()
    assert pad.list_for_turn(ALICE, "new", now=LATER) == []
    entry = pad.put(ALICE, "new", 2, "fetch", "stored", now=NOW)["scratchpad_id"]
    assert [view["step_num"] for view in pad.list_for_turn(ALICE, "new", now=LATER)] == [2]
    assert _rows(pad, lambda: pad.get(ALICE, entry, now=LATER)) == WARM_ROWS


def test_without_the_cache_a_new_turn_keeps_nothing(pad: Scratchpad) -> None:
    parts(pad).heads.cache_limit(0)
    entry = pad.put(ALICE, "new", 1, "fetch", "o", now=NOW)["scratchpad_id"]
    assert _rows(pad, lambda: pad.get(ALICE, entry, now=LATER)) > WARM_ROWS
