"""With ``anchor_sync = "interval"`` the sync (fsyncs, anchor file) runs in a
background thread: the put that crosses the interval pays only the counter's
advance in its own transaction, and the anchor still follows the store. The thread does not
outlive its store: a store dropped without close ends it, and a store still
open at a normal exit is anchored by the exit, as by close."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import apsw
import pytest

from securepad import Keyring, Policy, Scratchpad
from tests.support.principals import ALICE
from tests.support.store_costs import turn_put_costs

INTERVAL = Policy.from_dict({"storage": {"anchor_sync": "interval", "anchor_interval_seconds": 1}})


def _anchored(pad: Scratchpad, above: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = pad.stats()["anchor"]
        if status["anchored"] > above:
            return int(status["anchored"])
        time.sleep(0.02)
    raise AssertionError("the background sync did not anchor the writes")


def test_the_put_crossing_the_interval_pays_no_sync(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        pad.put(ALICE, "t", 1, "tool", "warm")
        quiet = turn_put_costs(pad, ALICE, "t", 2)  # inside the interval: no advance due
        before = pad.stats()["anchor"]["anchored"]
        time.sleep(1.1)
        crossing = turn_put_costs(pad, ALICE, "t", 3)  # advances the counter and wakes the syncer
        assert crossing["statements"] == quiet["statements"] + 1  # the counter's UPDATE, no more
        assert _anchored(pad, before) > before  # the syncer made it durable and raised the anchor
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:  # close anchored the rest
        assert len(pad.list_for_turn(ALICE, "t", now=1_000_000.0)) == 3


# -- a store that is never closed ------------------------------------------------------------------

_NEVER_CLOSED = """
import json, sys, time
from securepad import Keyring, Policy, Principal, Scratchpad
policy = Policy.from_dict({"storage": {"anchor_sync": "interval", "anchor_interval_seconds": 3}})
pad = Scratchpad.open(sys.argv[1], keyring=Keyring.from_key_file(sys.argv[2]), policy=policy)
opened = pad.stats()["anchor"]["committed"]
alice = Principal("alice", "planner", "web")
pad.put(alice, "t", 1, "tool", "one")
time.sleep(3.1)
pad.put(alice, "t", 2, "tool", "two")  # crosses the interval: the background thread starts and syncs
deadline = time.monotonic() + 60
while pad.stats()["anchor"]["anchored"] <= opened and time.monotonic() < deadline:
    time.sleep(0.02)
synced = pad.stats()["anchor"]
pad.put(alice, "t", 3, "tool", "three")  # inside the new interval: the thread does not sync them
pad.put(alice, "t", 4, "tool", "four")
threads = sorted(t.name for t in __import__("threading").enumerate())
print(json.dumps({**synced, "opened": opened, "threads": threads}))
# no close: the interpreter exits with the store open
"""


def _store_counter(db_path: Path) -> int:
    conn = apsw.Connection(str(db_path))
    try:
        ((value,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    finally:
        conn.close()
    return int(str(value).split(":", 1)[0])


@pytest.mark.slow
def test_a_store_never_closed_is_anchored_at_exit(db_path: Path, key_file: Path, keyring: Keyring) -> None:
    """The process exits (the syncer, a daemon, does not hold it) and the exit
    anchors the writes made since the last sync, as close would: the store's
    counter moved past them and the anchor followed it. The next open sees no rollback."""
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL):
        pass  # the store and its key file exist
    child = subprocess.run(
        [sys.executable, "-c", _NEVER_CLOSED, str(db_path), str(key_file)],
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a hang, not a measure of speed
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert child.stderr == ""
    synced = json.loads(child.stdout)
    assert "securepad-anchor" in synced["threads"]
    assert synced["anchored"] == synced["committed"] > synced["opened"]  # the thread synced step 2
    counter = _store_counter(db_path)
    assert counter > synced["committed"]  # steps 3 and 4, after that sync, were anchored at exit
    assert json.loads(Path(synced["path"]).read_text())["counter"] == counter
    with Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL) as pad:
        assert len(pad.list_for_turn(ALICE, "t", now=1_000_000_000.0)) == 4


def test_the_syncer_of_a_dropped_store_ends(db_path: Path, keyring: Keyring) -> None:
    before = set(threading.enumerate())
    pad = Scratchpad.open(db_path, keyring=keyring, policy=INTERVAL)
    pad.put(ALICE, "t", 1, "tool", "one")
    time.sleep(1.1)
    pad.put(ALICE, "t", 2, "tool", "two")  # wakes the syncer
    _anchored(pad, 0)
    (syncer,) = [t for t in threading.enumerate() if t not in before and t.name == "securepad-anchor"]
    del pad  # never closed
    # The store is collected by the cycle collector, which runs from time to
    # time in a real program: a collection while the syncer still holds the
    # anchor (a sync under way) leaves it to the next one.
    deadline = time.monotonic() + 30
    while syncer.is_alive() and time.monotonic() < deadline:
        gc.collect()
        syncer.join(timeout=0.1)
    assert not syncer.is_alive()
