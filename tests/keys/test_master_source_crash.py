"""A master-key rotation between a key file and a PKCS#11 token key (SoftHSM2),
killed (SIGKILL) at points spread over its run in a real child process,
leaves a store that opens with the old key or the new one, never neither,
and has lost no owner's entries."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from securepad import Keyring, Principal, Scratchpad
from securepad.errors import WrongKeyError
from tests.support.softhsm import SoftHsm

OWNERS = 150

# Opens the store with the key named by argv[2], prints "ready", rotates to argv[3].
WORKER = """
import sys
from securepad import Keyring, Scratchpad
def keyring(name):
    return Keyring.from_uri(name) if name.startswith("pkcs11:") else Keyring.from_key_file(name)
pad = Scratchpad.open(sys.argv[1], keyring=keyring(sys.argv[2]), anchor=False)
print("ready", flush=True)
pad.rotate_master_key(keyring(sys.argv[3]))
print("done", flush=True)
"""


def _keyring(name: str) -> Keyring:
    return Keyring.from_uri(name) if name.startswith("pkcs11:") else Keyring.from_key_file(name)


def _rotate_and_kill(db: Path, old: str, new: str, delay: float) -> bool:
    """The worker rotating ``old`` to ``new``, killed ``delay`` s after it is ready; True if it finished first."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(db), old, new], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    proc.kill()
    out, _ = proc.communicate()
    return "done" in out


def _opens_with(db: Path, old: str, new: str, expected: dict[str, str]) -> str:
    """Which of ``old`` and ``new`` opens the store (exactly one does), after
    reading back one entry of a sample of owners."""
    opened = []
    for name in (old, new):
        try:
            pad = Scratchpad.open(db, keyring=_keyring(name), anchor=False)
        except WrongKeyError:
            continue
        with pad:
            for owner in random.Random(len(opened)).sample(sorted(expected), 12):
                entry_id = expected[owner]
                assert pad.get(Principal(owner, "a", "c"), entry_id).observation == f"entry of {owner}"
        opened.append(name)
    assert len(opened) == 1, f"opened with {opened}"
    return opened[0]


def test_rotations_between_a_key_file_and_a_token_key_survive_sigkill(softhsm: SoftHsm, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    current = str(tmp_path / "key-0")
    with Scratchpad.open(db, keyring=_keyring(current), anchor=False) as pad:
        expected = {
            f"owner-{n}": pad.put(Principal(f"owner-{n}", "a", "c"), "t", 1, "x", f"entry of owner-{n}")[
                "scratchpad_id"
            ]
            for n in range(OWNERS)
        }
    rng = random.Random(20261202)
    for attempt in range(1, 11):
        # Alternate: from a key file to a fresh token key, from a token key to a fresh key file.
        target = softhsm.uri() if not current.startswith("pkcs11:") else str(tmp_path / f"key-{attempt}")
        # Delays over the whole run: before the target key exists, during the re-wrap, after the commit.
        done = _rotate_and_kill(db, current, target, rng.uniform(0.0, 0.4))
        now = _opens_with(db, current, target, expected)
        assert done <= (now == target)  # a finished rotation is committed
        current = now
