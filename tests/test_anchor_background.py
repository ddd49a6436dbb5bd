"""Issue 14: with ``anchor_sync = "interval"`` the sync (counter, fsyncs, anchor
file) runs in a background thread: the put that crosses the interval pays no
part of it, and the anchor still follows the store."""

from __future__ import annotations

import time
from pathlib import Path

import apsw
import pytest
from conftest import ALICE

from securepad import Keyring, Policy, Scratchpad
from securepad.bench.heads import turn_put_costs
from securepad.errors import IntegrityError

INTERVAL = Policy.from_dict({"storage": {"anchor_sync": "interval", "anchor_interval_seconds": 1}})


def _anchored(pad: Scratchpad, above: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = pad.stats()["anchor"]
        if status["anchored"] > above:
            return int(status["anchored"])
        time.sleep(0.02)
    raise AssertionError("the background sync did not anchor the writes")


def test_the_put_crossing_the_interval_runs_no_sync_of_its_own(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        pad.put(ALICE, "t", 1, "tool", "warm")
        quiet = turn_put_costs(pad, ALICE, "t", 2)  # inside the interval: no sync due
        before = pad.stats()["anchor"]["anchored"]
        time.sleep(1.1)
        crossing = turn_put_costs(pad, ALICE, "t", 3)  # wakes the syncer, runs nothing more itself
        assert crossing["statements"] == quiet["statements"]
        assert _anchored(pad, before) > before  # the syncer advanced the counter and the anchor
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:  # close anchored the rest
        assert len(pad.list_for_turn(ALICE, "t", now=1_000_000.0)) == 3


def test_a_rollback_the_syncer_finds_stops_the_next_write(db_path: Path, keyring: Keyring) -> None:
    pad = Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL)
    pad.put(ALICE, "t", 1, "tool", "one")
    conn = apsw.Connection(str(db_path))
    ((older,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    time.sleep(1.1)
    pad.put(ALICE, "t", 2, "tool", "two")
    _anchored(pad, 0)
    conn.execute("UPDATE store_meta SET value = ? WHERE key = 'write_counter'", (older,))
    conn.close()
    time.sleep(1.1)
    pad.put(ALICE, "t", 3, "tool", "three")  # wakes the syncer, which finds the counter below the anchor
    deadline, step = time.monotonic() + 10, 4
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        while time.monotonic() < deadline:
            pad.put(ALICE, "t", step, "tool", "more")  # the next write raises what the syncer found
            step += 1
            time.sleep(0.05)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        pad.close()  # and close, which syncs once more, refuses it too
