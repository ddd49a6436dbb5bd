"""A master key taken from the environment cannot be read back from the process
by its own children: not from their environment, not from the parent's
``/proc/<pid>/environ``; and the process is not dumpable unless asked."""

from __future__ import annotations

import base64
import ctypes
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad.keys import process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")

# Runs in a process that has the key in its initial environment; a shell it
# starts reads that process's /proc/<pid>/environ as a model's shell tool would.
CHILD = r"""
import ctypes, json, subprocess, sys
from securepad import Keyring, Principal, Scratchpad

options = json.loads(sys.argv[1])
keyring = Keyring.from_env("SECUREPAD_MASTER_KEY", **options)
shell = subprocess.run(["sh", "-c", "tr '\\0' '\\n' < /proc/$PPID/environ; echo; env"], capture_output=True)
dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
with Scratchpad.open(sys.argv[2], keyring=keyring) as pad:
    p = Principal("alice", "agent", "cli")
    entry = pad.put(p, "t", 1, "tool", "still readable")["scratchpad_id"]
    text = pad.get(p, entry).observation
seen = shell.stdout.decode("latin-1")
print(json.dumps({"seen": seen, "error": shell.stderr.decode(), "dumpable": dumpable, "text": text}))
"""


def run_child(tmp_path: Path, key: str, **options: bool) -> dict[str, object]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SECUREPAD")},
        "SECUREPAD_MASTER_KEY": key,
        "XSECUREPAD_MASTER_KEY": "a-longer-name-is-not-the-key",
        "SECUREPAD_NEIGHBOUR": "kept",
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(options), str(tmp_path / "store.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def test_a_child_does_not_find_the_key_in_its_parents_initial_environment(tmp_path: Path, key: str) -> None:
    # Left dumpable so that /proc/<ppid>/environ stays readable to any user:
    # what is read there is the scrubbed block itself.
    seen = run_child(tmp_path, key, keep_dumpable=True)
    assert seen["text"] == "still readable"
    assert key not in str(seen["seen"]), seen
    lines = str(seen["seen"]).split("\n")
    assert "SECUREPAD_NEIGHBOUR=kept" in lines  # the read worked, and other variables are intact
    assert "XSECUREPAD_MASTER_KEY=a-longer-name-is-not-the-key" in lines
    assert "SECUREPAD_MASTER_KEY=" in lines  # the name stays, its value is NUL bytes
    assert seen["dumpable"] == 1


def test_the_process_becomes_non_dumpable_and_still_hides_the_key(tmp_path: Path, key: str) -> None:
    seen = run_child(tmp_path, key)
    assert seen["dumpable"] == 0
    assert seen["text"] == "still readable"
    assert key not in str(seen["seen"])
    if os.geteuid() != 0:  # a non-dumpable process's /proc files are root's
        assert "Permission denied" in str(seen["error"])


def test_keep_in_env_leaves_the_key_for_children(tmp_path: Path, key: str) -> None:
    seen = run_child(tmp_path, key, keep_in_env=True, keep_dumpable=True)
    assert f"SECUREPAD_MASTER_KEY={key}" in str(seen["seen"]).split("\n")


def proc(name: str) -> bytes:
    return Path(f"/proc/self/{name}").read_bytes()


def with_area(stat: bytes, start: int, end: int) -> bytes:
    """``stat`` with its environment bounds (fields 50 and 51) replaced."""
    head, tail = stat[: stat.rfind(b")") + 2], stat[stat.rfind(b")") + 2 :].split()
    tail[47], tail[48] = str(start).encode(), str(end).encode()
    return head + b" ".join(tail)


def test_the_area_is_this_process_s_environment_inside_a_writable_mapping() -> None:
    area = process._environment_area(proc("stat"), proc("maps"))
    assert area is not None
    start, end = area
    assert b"PATH=" in ctypes.string_at(start, end - start)


def test_bounds_outside_a_writable_mapping_are_never_touched() -> None:
    maps, stat = proc("maps"), proc("stat")
    read_only = next(line for line in maps.splitlines() if line.split()[1].startswith(b"r-"))
    low = int(read_only.split(b"-")[0], 16)
    assert process._environment_area(with_area(stat, low, low + 16), maps) is None
    assert process._environment_area(with_area(stat, 16, 4096), maps) is None  # unmapped: a crash before
    assert process._environment_area(with_area(stat, 4096, 16), maps) is None
    assert process._environment_area(b"1 (python) R 0 0", maps) is None  # a kernel without the fields


def writable_mappings(maps: bytes) -> list[tuple[int, int]]:
    found = []
    for line in maps.splitlines():
        try:
            bounds, perms = line.split()[:2]
            low, high = (int(bound, 16) for bound in bounds.split(b"-"))
        except ValueError:
            continue
        if perms.startswith(b"rw"):
            found.append((low, high))
    return found


@given(stat=st.binary(max_size=400), maps=st.binary(max_size=400))
def test_no_stat_or_maps_text_gives_an_area_outside_its_mappings(stat: bytes, maps: bytes) -> None:
    area = process._environment_area(stat, maps)
    if area is not None:
        start, end = area
        assert any(low <= start < end <= high for low, high in writable_mappings(maps))
