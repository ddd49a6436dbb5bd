"""Expiry: an entry whose ``expires_at <= now`` is never served, before or after gc;
gc deletes it, its segments and (with secure_delete and a WAL checkpoint) its bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.core.shaping import SEGMENT_BYTES, SEGMENT_SLACK
from securepad.errors import ExpiredError, NotFoundError

T0 = 1_000_000.0
TTL = 60
EXPIRES = T0 + TTL


def put(pad: Scratchpad, p: Principal, observation: Any, ttl: int = TTL, step: int = 1, turn: str = "t") -> str:
    return str(pad.put(p, turn, step, "x", observation, ttl_seconds=ttl, now=T0)["scratchpad_id"])


def rows(db_path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(db_path))
    try:
        return list(conn.execute(sql, params).fetchall())
    finally:
        conn.close()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def timed_pad(db_path: Path, keyring: Keyring, clock: Clock) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring, clock=clock) as store:
        yield store


def assert_served(pad: Scratchpad, p: Principal, entry_id: str, content: Any, now: float) -> None:
    assert pad.get(p, entry_id, now=now).observation == content
    for mode in ("head", "tail", "range", "full"):
        pad.read(p, entry_id, mode=mode, now=now)
    assert entry_id in [item["scratchpad_id"] for item in pad.list_for_turn(p, "t", now=now)]


def assert_expired(pad: Scratchpad, p: Principal, entry_id: str, now: float) -> None:
    with pytest.raises(ExpiredError):
        pad.get(p, entry_id, now=now)
    for mode in ("head", "tail", "range", "full"):
        with pytest.raises(ExpiredError):
            pad.read(p, entry_id, mode=mode, now=now)
    assert entry_id not in [item["scratchpad_id"] for item in pad.list_for_turn(p, "t", now=now)]


def test_expiry_boundary(pad: Scratchpad, alice: Principal) -> None:
    entry_id = put(pad, alice, "fresh")
    assert pad.get(alice, entry_id, now=T0).expires_at == EXPIRES
    for now in (T0, EXPIRES - 1, EXPIRES - 0.001):
        assert_served(pad, alice, entry_id, "fresh", now)
        assert pad.stats(alice, now=now)["entries"] == 1
    for now in (EXPIRES, EXPIRES + 0.001, EXPIRES + 10**9):
        assert_expired(pad, alice, entry_id, now)
        assert pad.stats(alice, now=now)["entries"] == 0
        assert pad.stats(now=now)["expired_pending_gc"] == 1


def test_expired_entry_looks_absent_to_other_owners(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    entry_id = put(pad, alice, "fresh")
    with pytest.raises(NotFoundError) as expired:
        pad.get(bob, entry_id, now=EXPIRES)
    with pytest.raises(NotFoundError) as absent:
        pad.get(bob, "0123456789abcdef", now=EXPIRES)
    assert type(expired.value) is NotFoundError
    assert str(expired.value) == str(absent.value)


def test_default_ttl_and_clock(timed_pad: Scratchpad, clock: Clock, alice: Principal) -> None:
    entry_id = timed_pad.put(alice, "t", 1, "x", "on the clock")["scratchpad_id"]
    entry = timed_pad.get(alice, entry_id)
    assert entry.created_at == T0
    assert entry.expires_at == T0 + timed_pad.policy.default_ttl_seconds
    clock.now = entry.expires_at - 0.5
    assert timed_pad.get(alice, entry_id).observation == "on the clock"
    clock.now = entry.expires_at
    with pytest.raises(ExpiredError):
        timed_pad.get(alice, entry_id)
    assert timed_pad.list_for_turn(alice, "t") == []
    assert timed_pad.gc() == 1
    with pytest.raises(NotFoundError):
        timed_pad.get(alice, entry_id)


def test_gc_before_the_boundary_keeps_the_entry(pad: Scratchpad, alice: Principal) -> None:
    entry_id = put(pad, alice, "fresh")
    assert pad.gc(now=EXPIRES - 0.001) == 0
    assert_served(pad, alice, entry_id, "fresh", EXPIRES - 0.001)


def test_gc_at_the_boundary(db_path: Path, pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    big = "long-lived data ✓ " * (3 * SEGMENT_BYTES // 10)
    doomed = [put(pad, alice, big, step=1), put(pad, bob, b"\x00" * 100, step=2), put(pad, alice, {"k": [1]}, step=3)]
    keep = [put(pad, alice, big, ttl=TTL + 1, step=4), put(pad, bob, "bob keeps", ttl=3600, step=5)]
    assert rows(db_path, "SELECT COUNT(*) FROM segments WHERE entry_id = ?", (doomed[0],))[0][0] >= 3

    assert pad.gc(now=EXPIRES) == 3
    assert pad.gc(now=EXPIRES) == 0

    marks = ",".join("?" * len(doomed))
    assert rows(db_path, f"SELECT COUNT(*) FROM entries WHERE id IN ({marks})", tuple(doomed))[0][0] == 0
    assert rows(db_path, f"SELECT COUNT(*) FROM segments WHERE entry_id IN ({marks})", tuple(doomed))[0][0] == 0
    # After gc the entries are simply gone: not found for the owner too, before or after their expiry.
    for entry_id, owner in zip(doomed, (alice, bob, alice), strict=True):
        for now in (T0, EXPIRES, EXPIRES + 1):
            with pytest.raises(NotFoundError):
                pad.get(owner, entry_id, now=now)
    assert pad.get(alice, keep[0], now=EXPIRES).observation == big
    assert pad.get(bob, keep[1], now=EXPIRES).observation == "bob keeps"
    stats = pad.stats(now=EXPIRES)
    assert (stats["entries"], stats["expired_pending_gc"]) == (2, 0)


def test_gc_truncates_the_wal_and_scrubs_the_ciphertext(db_path: Path, pad: Scratchpad, alice: Principal) -> None:
    keep = put(pad, alice, "keep me " * 20000, ttl=3600)
    doomed = put(pad, alice, os.urandom(3 * SEGMENT_BYTES + SEGMENT_SLACK + 123), step=2)  # 4 segments
    pieces = [bytes(data) for (data,) in rows(db_path, "SELECT data FROM segments WHERE entry_id = ?", (doomed,))]
    (row,) = rows(db_path, "SELECT wrapped_key, commitment, sealed_meta FROM entries WHERE id = ?", (doomed,))
    pieces += [bytes(value) for value in row]
    assert len(pieces) == 4 + 3

    assert pad.gc(now=EXPIRES) == 1

    wal = Path(f"{db_path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    for path in (db_path, wal, Path(f"{db_path}-shm")):
        if path.exists():
            data = path.read_bytes()
            for piece in pieces:
                # 32 bytes from the middle of each sealed value: random-looking, so a hit is no accident.
                middle = len(piece) // 2
                assert piece[middle - 16 : middle + 16] not in data, path.name
    assert pad.get(alice, keep, now=EXPIRES).observation == "keep me " * 20000


def test_expired_entries_are_never_listed_or_counted(pad: Scratchpad, alice: Principal) -> None:
    ids = [put(pad, alice, f"entry {ttl}", ttl=ttl, step=ttl) for ttl in (10, 20, 30)]
    for now, live in ((T0, 3), (T0 + 10, 2), (T0 + 25, 1), (T0 + 30, 0)):
        listed = [item["scratchpad_id"] for item in pad.list_for_turn(alice, "t", now=now)]
        assert listed == ids[3 - live :]
        assert pad.stats(alice, now=now)["entries"] == live


def test_expired_entries_free_the_quota_before_gc(tmp_path: Path, keyring: Keyring, alice: Principal) -> None:
    from securepad import Policy
    from securepad.errors import QuotaExceededError

    # Room for one 100-byte entry as it costs on disk (content, sealed fields, row overhead).
    policy = Policy.from_dict({"limits": {"max_entry_bytes": 100, "owner_quota_bytes": 1500}})
    with Scratchpad.open(tmp_path / "q.db", keyring=keyring, policy=policy) as pad:
        put(pad, alice, "x" * 100)
        with pytest.raises(QuotaExceededError):
            pad.put(alice, "t", 2, "x", "y", now=EXPIRES - 1)
        pad.put(alice, "t", 2, "x", "y" * 100, now=EXPIRES)
