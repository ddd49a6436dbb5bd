"""No false alarm from the turn heads on a genuine store, on SQLite and
PostgreSQL: expiry and gc, delete, owner-key rotation, forgetting
an owner, and concurrent writers leave every read working and ``verify`` ok.
The edits that must be refused are in tests/tables/heads/test_heads.py (SQLite) and
tests/tables/heads/test_tamper_postgres.py (PostgreSQL)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from securepad import Keyring, NotFoundError, Scratchpad
from tests.support.principals import ALICE, BOB
from tests.support.tamper_edits import NOW, TURN, record_turn


def test_expiry_and_gc_are_no_tampering(store_location: Any, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        short = pad.put(ALICE, TURN, 1, "x", "short", ttl_seconds=10, now=NOW)["scratchpad_id"]
        pad.put(ALICE, TURN, 2, "x", "long", ttl_seconds=3600, now=NOW)
        pad.turn(ALICE, TURN, now=NOW).checkpoint(facts=["a"], ttl_seconds=10, now=NOW)
        assert len(pad.list_for_turn(ALICE, TURN, now=NOW + 20)) == 1  # expired, not yet collected
        assert pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=NOW + 20) is None
        assert pad.gc(now=NOW + 20) == 1
        for when in (NOW + 5, NOW + 20):  # a read "before" the gc cutoff is no alarm either
            assert len(pad.list_for_turn(ALICE, TURN, now=when)) == 1
        with pytest.raises(NotFoundError):
            pad.get(ALICE, short, now=NOW + 20)
        assert pad.verify(now=NOW + 20)["ok"]
        assert pad.gc(now=NOW + 7200) == 1
        assert pad.list_for_turn(ALICE, TURN, now=NOW + 7200) == []
        assert pad.verify(now=NOW + 7200)["ok"]


def test_delete_rotation_and_forget_keep_heads_consistent(store_location: Any, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, TURN, 3)
        record_turn(pad, BOB, TURN, 2)
        pad.delete(ALICE, ids[1])
        assert [s["step_num"] for s in pad.list_for_turn(ALICE, TURN, now=NOW)] == [1, 3]
        assert pad.rotate_owner_key("alice")["complete"]
        assert pad.verify(now=NOW)["ok"]
        assert len(pad.turn(ALICE, TURN, now=NOW).history(now=NOW)) == 2
        pad.put(ALICE, TURN, 4, "x", "after rotation", now=NOW)
        assert pad.turn(ALICE, TURN, now=NOW).latest_checkpoint(now=NOW) is not None
        pad.forget_owner("bob")
        assert pad.list_for_turn(BOB, TURN, now=NOW) == []
        report = pad.verify(now=NOW)
    assert report["ok"] and report["owners"] == 1, report


def test_concurrent_writers_raise_no_false_alarm(store_location: Any, keyring: Keyring) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with Scratchpad.open(store_location, keyring=keyring) as pad:
                for i in range(10):
                    pad.turn(ALICE, f"w{n % 2}", now=NOW).record(n * 100 + i + 1, "x", f"{n}-{i}", now=NOW)
                    pad.turn(ALICE, f"w{(n + 1) % 2}", now=NOW).history(now=NOW)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with Scratchpad.open(store_location, keyring=keyring):
        pass  # the store exists before the writers race to create it
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        assert len(pad.turn(ALICE, "w0", now=NOW).history(now=NOW)) == 20
        assert pad.verify(now=NOW)["ok"]
