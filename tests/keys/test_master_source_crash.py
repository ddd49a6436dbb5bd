"""A master-key rotation between a key file and a PKCS#11 token key (SoftHSM2),
killed (SIGKILL) at points spread over its run in a real child process,
leaves a store that opens with the old key or the new one, never neither,
and has lost no owner's entries.

The children use tokens of their own (their own ``SOFTHSM2_CONF``): a child
killed while SoftHSM2 writes a new key's object file can leave that token
directory unreadable to SoftHSM2, which must not reach the other tests."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from securepad import Keyring, Principal, Scratchpad
from tests.support.softhsm import SoftHsm, find_softhsm

OWNERS = 150

KEYRING = """
from securepad import Keyring
def keyring(name):
    return Keyring.from_uri(name) if name.startswith("pkcs11:") else Keyring.from_key_file(name)
"""
# Opens the store with the key named by argv[2], prints "ready", rotates to argv[3].
WORKER = (
    KEYRING
    + """
import sys
from securepad import Scratchpad
pad = Scratchpad.open(sys.argv[1], keyring=keyring(sys.argv[2]), anchor=False)
print("ready", flush=True)
pad.rotate_master_key(keyring(sys.argv[3]))
print("done", flush=True)
"""
)
# Prints which of argv[2:4] opens the store, after reading back the entries of argv[4] (JSON).
CHECK = (
    KEYRING
    + """
import json, sys
from securepad import Principal, Scratchpad, WrongKeyError
opened = []
for name in sys.argv[2:4]:
    try:
        pad = Scratchpad.open(sys.argv[1], keyring=keyring(name), anchor=False)
    except WrongKeyError:
        continue
    with pad:
        for owner, entry_id in json.loads(sys.argv[4]).items():
            assert pad.get(Principal(owner, "a", "c"), entry_id).observation == f"entry of {owner}"
    opened.append(name)
print(json.dumps(opened))
"""
)


def _rotate_and_kill(hsm: SoftHsm, db: Path, old: str, new: str, delay: float) -> bool:
    """The worker rotating ``old`` to ``new``, killed ``delay`` s after it is ready; True if it finished first."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), old, new], stdout=subprocess.PIPE, text=True, env=hsm.environ()
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    proc.kill()
    out, _ = proc.communicate()
    return "done" in out


def _opens_with(hsm: SoftHsm, db: Path, old: str, new: str, sample: dict[str, str]) -> str:
    """Which of ``old`` and ``new`` opens the store: exactly one does, and serves ``sample``."""
    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(db), old, new, json.dumps(sample)],
        capture_output=True,
        text=True,
        env=hsm.environ(),
        check=True,
    )
    opened = json.loads(run.stdout)
    assert len(opened) == 1, f"opened with {opened}"
    return str(opened[0])


@pytest.mark.slow
def test_rotations_between_a_key_file_and_a_token_key_survive_sigkill(tmp_path: Path) -> None:
    found = find_softhsm()
    assert found is not None, "SoftHSM2 is needed (apt-get install softhsm2)"
    hsm = SoftHsm(tmp_path / "tokens", *found)
    db = tmp_path / "s.db"
    current = str(tmp_path / "key-0")
    with Scratchpad.open(db, keyring=Keyring.from_key_file(current), anchor=False) as pad:
        owners = [f"owner-{n}" for n in range(OWNERS)]
        expected = {o: pad.put(Principal(o, "a", "c"), "t", 1, "x", f"entry of {o}")["scratchpad_id"] for o in owners}
    rng = random.Random(20261202)
    for attempt in range(1, 7):  # three rotations each way
        # Alternate: from a key file to a fresh token key, from a token key to a fresh key file.
        target = hsm.uri() if not current.startswith("pkcs11:") else str(tmp_path / f"key-{attempt}")
        # Delays over the whole run: before the target key exists, during the re-wrap, after the commit.
        done = _rotate_and_kill(hsm, db, current, target, rng.uniform(0.0, 0.4))
        sample = dict(rng.sample(sorted(expected.items()), 12))
        now = _opens_with(hsm, db, current, target, sample)
        assert done <= (now == target)  # a finished rotation is committed
        current = now
