"""Issue 11, item 12: deleted rows leave no stale copy anywhere in the file.

SQLite's ``secure_delete`` zeroes a deleted cell, but a b-tree rebalance
rebuilds pages without zeroing their unused space: a row that moved to
another page leaves a copy in the old page's gap. With enough rows stored in
random key order (entry ids are random) such copies are certain; the audit
found one now and then. ``forget_owner`` and ``gc`` now rebuild the file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.store import sqlite_of

pytestmark = pytest.mark.sqlite_only

ROWS = 600


@pytest.fixture
def sqlite_pad(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        yield pad


def _files(db_path: Path) -> bytes:
    suffixes = ("", "-wal", "-shm", "-journal")
    return b"".join(Path(f"{db_path}{s}").read_bytes() for s in suffixes if Path(f"{db_path}{s}").exists())


def _pieces(pad: Scratchpad, where: str, params: tuple[object, ...]) -> list[bytes]:
    pieces: list[bytes] = []
    for row in sqlite_of(pad).query(f"SELECT wrapped_key, sealed_meta FROM entries WHERE {where}", params):
        pieces += [bytes(row["wrapped_key"])[12:44], bytes(row["sealed_meta"])[12:44]]
    return pieces


def test_forget_owner_leaves_no_stale_copy_of_its_rows(sqlite_pad: Scratchpad, db_path: Path) -> None:
    alice, bob = Principal("alice", "x", "web"), Principal("bob", "x", "web")
    for i in range(ROWS):
        sqlite_pad.put(alice, "t", i, "tool", {"v": i, "metadata": {"path": "/x" * 50}})
        sqlite_pad.put(bob, "t", i, "tool", {"v": i})
    pieces = _pieces(sqlite_pad, "owner_user_id = ?", ("alice",))
    keys = [bytes(r["wrapped"])[12:44] for r in sqlite_of(sqlite_pad).query("SELECT wrapped FROM owner_keys")]
    assert all(piece in _files(db_path) for piece in pieces)
    sqlite_pad.forget_owner("alice")
    left = _files(db_path)
    assert [p for p in pieces if p in left] == []
    assert sum(k in left for k in keys) == 1  # bob's owner key only
    assert sqlite_pad.get(bob, sqlite_pad.list_for_turn(bob, "t")[0]["scratchpad_id"]) is not None


def test_gc_leaves_no_stale_copy_of_expired_rows(sqlite_pad: Scratchpad, db_path: Path) -> None:
    alice = Principal("alice", "x", "web")
    past = time.time() - 7200
    for i in range(ROWS):
        sqlite_pad.put(alice, "t", 2 * i, "tool", {"v": i, "metadata": {"path": "/x" * 50}}, now=past)
        sqlite_pad.put(alice, "t", 2 * i + 1, "tool", {"v": i})
    pieces = _pieces(sqlite_pad, "expires_at < ?", (time.time(),))
    assert len(pieces) == 2 * ROWS
    assert sqlite_pad.gc() == ROWS
    left = _files(db_path)
    assert [p for p in pieces if p in left] == []


def test_scrub_keeps_every_live_entry(sqlite_pad: Scratchpad, db_path: Path) -> None:
    alice = Principal("alice", "x", "web")
    ids = [sqlite_pad.put(alice, "t", i, "tool", f"entry {i} " * 2000)["scratchpad_id"] for i in range(20)]
    sqlite_pad.delete(alice, ids[0])
    assert sqlite_pad.scrub() is True
    assert [sqlite_pad.get(alice, i).observation for i in ids[1:]] == [f"entry {i} " * 2000 for i in range(1, 20)]
    assert not Path(f"{db_path}-wal").exists() or Path(f"{db_path}-wal").stat().st_size == 0
