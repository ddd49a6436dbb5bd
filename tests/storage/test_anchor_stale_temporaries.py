"""A writer killed while it wrote the anchor leaves its temporary file beside
the anchor; the next open removes it, under the anchor's lock, and nothing
else."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from securepad import Keyring, Policy, Scratchpad
from tests.support.principals import ALICE

EVERY_COMMIT = Policy.from_dict({"storage": {"anchor_sync": "commit"}})

# Opens the store, then dies by SIGKILL inside the anchor's write: its
# temporary file is written and synced, the rename never happens.
KILLED_MID_WRITE = r"""
import os, signal, sys
from securepad import Keyring, Policy, Principal, Scratchpad

pad = Scratchpad.open(sys.argv[2], keyring=Keyring.from_key_file(sys.argv[1]),
                      policy=Policy.from_dict({"storage": {"anchor_sync": "commit"}}))
replace = os.replace
def replace_or_die(src, dst):
    if os.path.basename(str(src)).startswith(".anchor-"):
        os.kill(os.getpid(), signal.SIGKILL)
    return replace(src, dst)
os.replace = replace_or_die
pad.put(Principal("alice", "planner", "web"), "t", int(sys.argv[3]), "shell", "the killed write")
"""


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".anchor-"))


def test_the_temporary_file_of_a_killed_anchor_write_is_removed_at_the_next_open(db_path: Path, key_file: Path) -> None:
    keyring = Keyring.from_key_file(key_file)
    with Scratchpad.open(db_path, keyring=keyring, policy=EVERY_COMMIT) as pad:
        pad.put(ALICE, "t", 1, "shell", "before")
        anchor = Path(pad.stats()["anchor"]["path"])
    for step in (2, 3, 4):
        child = subprocess.run(
            [sys.executable, "-c", KILLED_MID_WRITE, str(key_file), str(db_path), str(step)],
            capture_output=True,
            timeout=120,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        # Each open removed the one left before it: one is left, never more.
        (left,) = temporaries(key_file.parent)
        assert left.startswith(f".{anchor.name}.")
    with Scratchpad.open(db_path, keyring=keyring, policy=EVERY_COMMIT) as pad:
        assert temporaries(key_file.parent) == []
        assert pad.stats()["entries"] == 4  # the killed writes were committed before the anchor's write
    assert anchor.is_file() and anchor.with_name(anchor.name + ".lock").is_file() and key_file.is_file()


def test_only_files_of_the_anchors_temporary_pattern_are_removed(db_path: Path, key_file: Path) -> None:
    keyring = Keyring.from_key_file(key_file)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        name = Path(pad.stats()["anchor"]["path"]).name
    directory = key_file.parent
    stale = [f".{name}.abcd_123", f".{name}.zz99zz99"]
    kept = [
        f".{name}.abcd123",  # seven characters: not mkstemp's
        f".{name}.abcd12345",
        f".{name}.ABCD1234",
        f".{name}.abcd1234.tmp",
        f".{name}x.abcd1234",
        ".anchor-0000.abcd1234",  # another store's
        f"{name}.abcd1234",
        ".key.0123456789abcdef.tmp",
    ]
    for planted in stale + kept:
        (directory / planted).write_text("{}")
        (directory / planted).chmod(0o600)
    Scratchpad.open(db_path, keyring=keyring).close()
    assert not any((directory / planted).exists() for planted in stale)
    assert all((directory / planted).exists() for planted in kept)
