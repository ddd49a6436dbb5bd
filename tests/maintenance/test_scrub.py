"""Deleted rows leave no stale copy anywhere in the file.

SQLite's ``secure_delete`` zeroes a deleted cell, but a b-tree rebalance
rebuilds pages without zeroing their unused space: a row that moved to
another page leaves a copy in the old page's gap. With enough rows stored in
random key order (entry ids are random) such copies are certain; the audit
found one now and then. ``forget_owner`` and ``gc`` now rebuild the file.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from securepad import Keyring, Principal, Scratchpad, StorageFullError
from securepad.storage.sqlite import SCRUB_FREE_SHARE
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


@pytest.mark.slow
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


def _pragma(pad: Scratchpad, name: str) -> int:
    return int(sqlite_of(pad).query(f"PRAGMA {name}")[0][name])


def _written(pad: Scratchpad) -> int:
    return int(sqlite_of(pad).wal_status()["frames_written"])  # type: ignore[call-overload]


def _content_pieces(pad: Scratchpad, where: str, params: tuple[object, ...]) -> list[bytes]:
    """Pieces from the middle of each entry's sealed content: in overflow pages,
    which ``secure_delete`` zeroes when they are freed."""
    rows = sqlite_of(pad).query(f"SELECT only_segment FROM entries WHERE {where}", params)
    return [bytes(row["only_segment"])[6000:6032] for row in rows]


def test_gc_that_frees_a_small_share_zeroes_what_it_deleted_without_rebuilding(
    sqlite_pad: Scratchpad, db_path: Path
) -> None:
    alice = Principal("alice", "x", "web")
    past = time.time() - 7200
    for i in range(200):
        sqlite_pad.put(alice, "t", i, "tool", os.urandom(8000).hex(), now=past if i % 20 == 7 else None)
    pieces = _content_pieces(sqlite_pad, "expires_at < ?", (time.time(),))
    assert len(pieces) == 10 and all(p in _files(db_path) for p in pieces)
    pages, before = _pragma(sqlite_pad, "page_count"), _written(sqlite_pad)
    assert sqlite_pad.gc() == 10
    freed = _pragma(sqlite_pad, "freelist_count")
    assert 0 < freed < pages * SCRUB_FREE_SHARE
    # The deletes' own pages: the freed ones (zeroed) and the leaves and heads they changed; no rebuild.
    assert _written(sqlite_pad) - before <= freed + 40
    assert _pragma(sqlite_pad, "page_count") == pages
    assert sqlite_of(sqlite_pad).wal_status()["rebuilds"] == 0
    left = _files(db_path)
    assert [p for p in pieces if p in left] == []
    assert len(sqlite_pad.list_for_turn(alice, "t")) == 190


def test_gc_that_frees_a_large_share_rebuilds_writing_in_proportion_to_it(
    sqlite_pad: Scratchpad, db_path: Path
) -> None:
    alice = Principal("alice", "x", "web")
    past = time.time() - 7200
    for i in range(200):
        sqlite_pad.put(alice, "t", i, "tool", os.urandom(8000).hex(), now=past if i % 3 == 0 else None)
    pieces = _content_pieces(sqlite_pad, "expires_at < ?", (time.time(),))
    pieces += _pieces(sqlite_pad, "expires_at < ?", (time.time(),))
    pages, before = _pragma(sqlite_pad, "page_count"), _written(sqlite_pad)
    assert sqlite_pad.gc() == 67
    freed = pages - _pragma(sqlite_pad, "page_count")
    assert freed >= pages * SCRUB_FREE_SHARE
    # The deletes, then the rebuild of the live pages: at most 3 times what was freed.
    assert _written(sqlite_pad) - before <= freed + 3 * freed + 40
    assert sqlite_of(sqlite_pad).wal_status()["rebuilds"] == 1
    left = _files(db_path)
    assert [p for p in pieces if p in left] == []
    assert len(sqlite_pad.list_for_turn(alice, "t")) == 133


def test_gc_whose_scrub_finds_no_room_says_the_deletes_stand(small_disk: Path, keyring: Keyring) -> None:
    """The deletes fit on the disk, the rebuild after them (its WAL holds every
    live page) does not: gc says what happened, and gc again, with room, scrubs."""
    db = small_disk / "store.db"
    alice = Principal("alice", "x", "web")
    past = time.time() - 7200
    with Scratchpad.open(db, keyring=keyring) as pad:
        for i in range(42):
            pad.put(alice, "t", i, "tool", os.urandom(64 * 1024), now=past if i % 3 == 0 else None)
            assert sqlite_of(pad).checkpoint()  # the WAL emptied as the file grows: it fits
        with pytest.raises(StorageFullError) as failed:
            pad.gc()
        message = str(failed.value)
        assert "gc deleted 14 expired entries" in message and "committed" in message
        assert "the scrub" in message and "did not run" in message and "run gc again" in message
        assert "nothing was written" not in message
        assert len(pad.list_for_turn(alice, "t")) == 28  # the deletes stand, the live entries too
        assert sqlite_of(pad).query("SELECT COUNT(*) AS n FROM entries")[0]["n"] == 28
        with pytest.raises(StorageFullError) as again:
            pad.gc()  # still no room: nothing left to delete, the scrub is still due
        assert str(again.value).startswith("gc found nothing expired to delete; a quarter of the file's pages")
        assert "deleted 0" not in str(again.value) and "did not run" in str(again.value)
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    with Scratchpad.open(db, keyring=keyring) as pad:
        size = db.stat().st_size
        assert pad.gc() == 0  # nothing left to delete; the scrub runs now
        assert db.stat().st_size < size * 0.8
        assert len(pad.list_for_turn(alice, "t")) == 28


def test_gc_rebuilds_with_incremental_vacuum_too(db_path: Path, keyring: Keyring) -> None:
    """Incremental vacuum gives free pages back at the checkpoint: the share
    that decides the rebuild is read before it."""
    from securepad import Policy

    alice = Principal("alice", "x", "web")
    past = time.time() - 7200
    policy = Policy.from_dict({"storage": {"incremental_vacuum": True}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        for i in range(ROWS):
            pad.put(alice, "t", 2 * i, "tool", {"v": i, "metadata": {"path": "/x" * 50}}, now=past)
            pad.put(alice, "t", 2 * i + 1, "tool", {"v": i})
        pieces = _pieces(pad, "expires_at < ?", (time.time(),))
        assert pad.gc() == ROWS
        assert [p for p in pieces if p in _files(db_path)] == []
        assert sqlite_of(pad).wal_status()["rebuilds"] == 1
