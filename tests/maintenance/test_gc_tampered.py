"""gc never deletes what tampering exposed.

gc selects expired rows by their clear ``expires_at``, a column the attacker
can write. Moving a row's expiry into the past used to make gc itself delete
the row (and subtract it from the head): the turn's reads refused the turn
afterwards, but the row was gone. gc now collects from a turn only when the
turn's inventory matches its head (``Heads.prune``); a turn that fails keeps
every row and its head, the audit log names it, its reads and ``verify``
keep refusing it, and the other turns are collected as before. With the edit
undone, the next gc collects the turn normally.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.errors import IntegrityError
from tests.support.principals import ALICE, BOB
from tests.support.tamper_edits import (
    NOW,
    TURN,
    Raw,
    as_admin,
    expiry_moved_earlier,
    on_sqlite,
    owner_relabelled,
    restore,
    snapshot,
    turn_relabelled,
)

# After the edit's expiry (NOW + 10), before the genuine ones (NOW + 3600); the
# short-lived rows below (NOW + 20) are expired then.
LATER = NOW + 100


def _record(pad: Scratchpad, principal: Principal, turn: str, steps: int, ttl: int = 3600) -> list[str]:
    return [
        pad.put(principal, turn, step, "fetch", {"n": step}, ttl_seconds=ttl, now=NOW)["scratchpad_id"]
        for step in range(1, steps + 1)
    ]


@pytest.fixture
def store(store_location: Any, backend: str, keyring: Keyring) -> Iterator[dict[str, Any]]:
    """Alice's turn t1 (five steps), Bob's t1 (two genuine steps and one that
    expires at NOW + 20), and a way to edit the rows from outside."""
    raw: Callable[[], AbstractContextManager[Raw]] = (
        (lambda: on_sqlite(store_location)) if backend == "sqlite" else (lambda: as_admin(str(store_location)))
    )
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        s = {"ids": _record(pad, ALICE, TURN, 5), "bob": _record(pad, BOB, TURN, 2)}
        s["bob_short"] = pad.put(BOB, TURN, 3, "fetch", {"n": 3}, ttl_seconds=20, now=NOW)["scratchpad_id"]
        yield {**s, "pad": pad, "raw": raw}


def relabelled_and_expired(raw: Raw, s: dict[str, Any]) -> None:
    """Alice's step 2 moved to a turn of its own, its expiry moved into the past."""
    turn_relabelled(raw, s)
    raw.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (NOW + 10, s["ids"][1]))


def moved_to_mallory_and_expired(raw: Raw, s: dict[str, Any]) -> None:
    """Alice's step 2 relabelled to another owner, its expiry moved into the past."""
    owner_relabelled(raw, s)
    raw.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (NOW + 10, s["ids"][1]))


def _ids(raw: Raw, owner: str) -> set[str]:
    return {str(row[0]) for row in raw.execute("SELECT id FROM entries WHERE owner_user_id = ?", (owner,))}


@pytest.mark.parametrize(
    "edit", [expiry_moved_earlier, relabelled_and_expired, moved_to_mallory_and_expired], ids=lambda e: e.__name__
)
def test_gc_keeps_every_row_of_a_turn_whose_rows_differ_from_its_head(
    store: dict[str, Any], edit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pad = store["pad"]
    with store["raw"]() as raw:
        genuine = snapshot(raw)
        edit(raw, store)
        alice_before, mallory_before = _ids(raw, "alice"), _ids(raw, "mallory")
    with caplog.at_level(logging.WARNING, logger="securepad.audit"):
        collected = pad.gc(now=LATER)
    assert collected == 1  # Bob's short-lived row only
    assert any("uncollected" in record.getMessage() for record in caplog.records)
    with store["raw"]() as raw:
        assert _ids(raw, "alice") == alice_before  # nothing of the edited turn deleted
        assert _ids(raw, "mallory") == mallory_before
        assert store["bob_short"] not in _ids(raw, "bob")
    with pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
    assert TURN in {p["turn_id"] for p in pad.verify(now=LATER)["problems"] if p["owner_user_id"] == "alice"}
    assert [e["step_num"] for e in pad.turn(BOB, TURN, now=LATER).history(now=LATER)] == [1, 2]

    # The edit undone (the tables put back as they were, Bob's short-lived row
    # too): the turn reads and verifies again, and gc collects as before.
    with store["raw"]() as raw:
        restore(raw, genuine)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="securepad.audit"):
        assert pad.gc(now=LATER) == 1
    assert not [r for r in caplog.records if "uncollected" in r.getMessage()]
    assert len(pad.turn(ALICE, TURN, now=LATER).history(now=LATER)) == 5
    assert pad.verify(now=LATER)["ok"]


def test_gc_collects_a_genuine_turn_and_leaves_no_warning(
    store: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    pad = store["pad"]
    with caplog.at_level(logging.WARNING, logger="securepad.audit"):
        assert pad.gc(now=LATER) == 1
        assert pad.gc(now=NOW + 4000) == 7  # everything else has expired
    assert not [r for r in caplog.records if "uncollected" in r.getMessage()]
    assert pad.verify(now=NOW + 4000)["ok"]
