"""Crash safety: key operations killed (SIGKILL) at random points leave a store
that opens with the right key, has lost no entry, and can finish the job."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.errors import WrongKeyError

# Each test kills child processes again and again: long.
pytestmark = pytest.mark.slow

ALICE = Principal("alice", "a", "c")
BOB = Principal("bob", "a", "c")
ENTRIES = 2000

# Runs one operation on the store; prints "ready" once the store is open so the
# parent's kill lands inside the operation, not in interpreter start-up.
WORKER = """
import sys
from securepad import Keyring, Scratchpad
from securepad.maintenance.lifecycle import rotate_owner_key
from securepad.store import parts
db, key, op, arg = sys.argv[1:5]
pad = Scratchpad.open(db, keyring=Keyring.from_key_file(key))
print("ready", flush=True)
if op == "rotate-owner":
    rotate_owner_key(parts(pad).db, parts(pad).keys, arg, batch=25)
elif op == "rotate-master":
    pad.rotate_master_key(Keyring.from_key_file(arg))
elif op == "forget-owner":
    pad.forget_owner(arg)
print("done", flush=True)
"""


@pytest.fixture
def populated(tmp_path: Path) -> tuple[Path, Path, dict[str, str], dict[str, str]]:
    db, key = tmp_path / "s.db", tmp_path / "key"
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        alice = {pad.put(ALICE, "t", i, "x", f"alice {i}")["scratchpad_id"]: f"alice {i}" for i in range(ENTRIES)}
        bob = {pad.put(BOB, "t", i, "x", f"bob {i}")["scratchpad_id"]: f"bob {i}" for i in range(20)}
    return db, key, alice, bob


def _run_and_kill(db: Path, key: Path, op: str, arg: str, delay: float) -> bool:
    """Start the worker, kill it ``delay`` seconds after it is ready; True if it finished first."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), str(key), op, arg], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    proc.kill()
    out, _ = proc.communicate()
    return "done" in out


def _check(db: Path, key: Path, expected: dict[str, str], owner: Principal) -> None:
    """Every entry is listed (which unwraps its item key and opens its sealed
    metadata); a sample is read back whole."""
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        listed = {e["scratchpad_id"] for e in pad.list_for_turn(owner, "t")}
        assert listed == set(expected)
        for entry_id in random.sample(sorted(expected), min(100, len(expected))):
            assert pad.get(owner, entry_id).observation == expected[entry_id]


def test_owner_rotation_killed_at_random_points(populated: tuple[Path, Path, dict[str, str], dict[str, str]]) -> None:
    db, key, alice, bob = populated
    rng = random.Random(20261130)
    finished = 0
    for _ in range(12):
        # A full rotation of ENTRIES takes ~0.05 s: most delays must fall inside it (0.25 s let 9 or 10 of 12 finish).
        finished += _run_and_kill(db, key, "rotate-owner", "alice", rng.uniform(0.0, 0.06))
        _check(db, key, alice, ALICE)
    assert finished < 10, "too few kills landed inside a rotation: make the workload longer"
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        report = pad.rotate_owner_key("alice")
        assert report["complete"]
    _check(db, key, alice, ALICE)
    _check(db, key, bob, BOB)


def test_master_rotation_killed_at_random_points(
    populated: tuple[Path, Path, dict[str, str], dict[str, str]], tmp_path: Path
) -> None:
    db, key, alice, bob = populated
    keys = [key, tmp_path / "key2"]
    Keyring.create_key_file(keys[1])  # create the second key file up front
    rng = random.Random(7)
    current = 0
    for _ in range(6):
        _run_and_kill(db, keys[current], "rotate-master", str(keys[1 - current]), rng.uniform(0.0, 0.05))
        opens = []
        for index in (0, 1):
            try:
                Scratchpad.open(db, keyring=Keyring.from_key_file(keys[index])).close()
                opens.append(index)
            except WrongKeyError:
                pass
        assert len(opens) == 1, "exactly one master key opens the store"
        current = opens[0]
        _check(db, keys[current], alice, ALICE)
    _check(db, keys[current], bob, BOB)


def test_forget_owner_killed_at_random_points(populated: tuple[Path, Path, dict[str, str], dict[str, str]]) -> None:
    db, key, _, bob = populated
    rng = random.Random(3)
    for _ in range(6):
        if _run_and_kill(db, key, "forget-owner", "alice", rng.uniform(0.0, 0.05)):
            break
        with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
            assert len(pad.list_for_turn(ALICE, "t")) in (0, ENTRIES)
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        pad.forget_owner("alice")
        assert pad.list_for_turn(ALICE, "t") == []
    _check(db, key, bob, BOB)
