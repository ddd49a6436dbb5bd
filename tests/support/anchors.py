"""The anchor's state as a test reads it: the interval crossed (without guessing its
length), the background sync awaited, and the counters in the store and the anchor file."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import apsw

from securepad import Scratchpad
from securepad.storage.anchor import Anchor
from securepad.store import sqlite_of

__all__ = [
    "anchor_of_pad",
    "await_anchored",
    "copy_store",
    "cross_interval",
    "file_counter",
    "put_back",
    "store_counter",
]


def anchor_of_pad(pad: Scratchpad) -> Anchor:
    """The open store's anchor (its database's commit hooks)."""
    hooks = sqlite_of(pad).hooks
    assert isinstance(hooks, Anchor)
    return hooks


def cross_interval(pad: Scratchpad) -> None:
    """Make the next write transaction of ``pad`` the one that crosses the interval: its
    time to advance comes now (the tests' interval is long, so that no other write of
    theirs crosses it on a slow machine)."""
    anchor_of_pad(pad).advance_at = time.monotonic()


def await_anchored(pad: Scratchpad, counter: int, timeout: float = 30.0) -> None:
    """Wait until the background sync has raised the anchor, and its file, to ``counter`` (a bound on a hang)."""
    anchor = anchor_of_pad(pad)
    deadline = time.monotonic() + timeout
    while anchor.floor < counter or (_file_counter_or_none(pad) or -1) < counter:
        if time.monotonic() > deadline:
            raise AssertionError(f"the anchor stayed at {anchor.floor}, below {counter}")
        time.sleep(0.01)


def store_counter(db_path: Path) -> int:
    """The store's write counter, read from its file by another connection."""
    conn = apsw.Connection(str(db_path))
    try:
        ((value,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    finally:
        conn.close()
    return int(str(value).split(":", 1)[0])


def _file_counter_or_none(pad: Scratchpad) -> int | None:
    """``file_counter``, or None while the file is not there yet (or being replaced)."""
    try:
        return file_counter(pad)
    except (OSError, ValueError, KeyError):
        return None


def file_counter(pad: Scratchpad) -> int:
    """The counter the anchor file holds."""
    return int(json.loads(anchor_of_pad(pad).path.read_text())["counter"])


def copy_store(db_path: Path, dest: Path) -> None:
    """Copy the store's files (database, WAL, shared memory) into the new directory ``dest``."""
    dest.mkdir()
    for name in (db_path.name, f"{db_path.name}-wal", f"{db_path.name}-shm"):
        if (db_path.parent / name).exists():
            shutil.copy(db_path.parent / name, dest / name)


def put_back(copy: Path, db_path: Path) -> None:
    """Replace the store's files by those of ``copy`` (``copy_store``)."""
    for name in (db_path.name, f"{db_path.name}-wal", f"{db_path.name}-shm"):
        (db_path.parent / name).unlink(missing_ok=True)
        if (copy / name).exists():
            shutil.copy(copy / name, db_path.parent / name)
            (db_path.parent / name).chmod(0o600)
