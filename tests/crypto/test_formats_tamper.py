"""Tampering with the real database file, as an attacker with write access would.

Every case edits the file through its own raw apsw connection while no store
is open, then opens a fresh store. Each tampered entry must fail with
IntegrityError or NotFoundError; nothing may come back that is another
owner's plaintext or differs from what was stored.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Principal, Scratchpad
from securepad.core.shaping import SEGMENT_BYTES
from securepad.errors import IntegrityError, NotFoundError
from tests.support.principals import ALICE, BOB
from tests.support.tamper_edits import raw_file

REFUSED = (IntegrityError, NotFoundError)


def flip(data: Any, at: int = -1) -> bytes:
    changed = bytearray(data)
    changed[at if at >= 0 else len(changed) // 2] ^= 0x01
    return bytes(changed)


@dataclass
class World:
    """Entries of two owners, with what each really holds."""

    db_path: Path
    keyring: Keyring
    ids: dict[str, str]  # name -> entry id
    truth: dict[str, tuple[Principal, str | bytes]]  # entry id -> (owner, content)

    def open(self) -> Scratchpad:
        return Scratchpad.open(self.db_path, keyring=self.keyring)

    def col(self, conn: apsw.Connection, name: str, column: str) -> Any:
        return conn.execute(f"SELECT {column} FROM entries WHERE id = ?", (self.ids[name],)).fetchall()[0][0]

    def set(self, conn: apsw.Connection, name: str, column: str, value: Any) -> None:
        conn.execute(f"UPDATE entries SET {column} = ? WHERE id = ?", (value, self.ids[name]))

    def segment(self, conn: apsw.Connection, name: str, seq: int) -> bytes:
        rows = conn.execute("SELECT data FROM segments WHERE entry_id = ? AND seq = ?", (self.ids[name], seq))
        return bytes(rows.fetchall()[0][0])  # type: ignore[arg-type]

    def set_segment(self, conn: apsw.Connection, name: str, seq: int, data: Any) -> None:
        conn.execute("UPDATE segments SET data = ? WHERE entry_id = ? AND seq = ?", (data, self.ids[name], seq))

    def segment_count(self, conn: apsw.Connection, name: str) -> int:
        return int(self.col(conn, name, "segment_count"))

    def swap(self, conn: apsw.Connection, a: str, b: str, column: str) -> None:
        va, vb = self.col(conn, a, column), self.col(conn, b, column)
        self.set(conn, a, column, vb)
        self.set(conn, b, column, va)


def text_of(size_bytes: int, seed: str) -> str:
    unit = f"{seed}:é€😀|"
    return unit * (size_bytes // len(unit.encode()) + 1)


@pytest.fixture
def world(db_path: Path, keyring: Keyring) -> World:
    contents: dict[str, tuple[Principal, str | bytes]] = {
        "a1": (ALICE, text_of(3 * SEGMENT_BYTES + 5000, "alice-one")),
        "a2": (ALICE, text_of(3 * SEGMENT_BYTES + 5000, "alice-two")),
        "abin": (ALICE, secrets.token_bytes(2 * SEGMENT_BYTES + 100)),
        "b1": (BOB, text_of(3 * SEGMENT_BYTES + 5000, "bob-one")),
    }
    ids: dict[str, str] = {}
    truth: dict[str, tuple[Principal, str | bytes]] = {}
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for step, (name, (owner, content)) in enumerate(contents.items()):
            entry_id = pad.put(owner, "turn-1", step, "fetch", content, ttl_seconds=3600, now=1000.0)["scratchpad_id"]
            ids[name] = entry_id
            truth[entry_id] = (owner, content)
    with raw_file(db_path) as conn:
        counts = dict(conn.execute("SELECT entry_id, COUNT(*) FROM segments GROUP BY entry_id").fetchall())
    assert all(counts[i] >= 2 for i in ids.values()), counts
    return World(db_path, keyring, ids, truth)


NOW = 1500.0  # inside every entry's lifetime


def check_reads(pad: Scratchpad, world: World, who: Principal, entry_id: str) -> None:
    """Whatever comes back is exactly the stored content of an entry that is ``who``'s."""
    owner, content = world.truth[entry_id]
    size = len(content)
    requests = [
        {"mode": "head", "n": 100},
        {"mode": "tail", "n": 100},
        {"mode": "full"},
        {"mode": "range", "start": size // 2, "end": size // 2 + 100},
    ]
    for request in requests:
        try:
            result = pad.read(who, entry_id, now=NOW, **request)
        except REFUSED:
            continue
        assert who.owner_user_id == owner.owner_user_id, "served an entry to another owner"
        meta = result["metadata"]
        got = base64.b64decode(result["content"]) if isinstance(content, bytes) else result["content"]
        assert got == content[meta["start"] : meta["end"]], f"wrong answer for {request}"


def check_everything(world: World, broken: list[str], principals: tuple[Principal, ...] = (ALICE, BOB)) -> None:
    """``get`` of each broken entry fails for everyone; no read returns a wrong answer."""
    with world.open() as pad:
        for name in broken:
            for who in principals:
                with pytest.raises(REFUSED):
                    pad.get(who, world.ids[name], now=NOW)
        for entry_id in world.truth:
            for who in principals:
                check_reads(pad, world, who, entry_id)
                try:
                    entry = pad.get(who, entry_id, now=NOW)
                except REFUSED:
                    continue
                assert (who.owner_user_id, entry.observation) == (
                    world.truth[entry_id][0].owner_user_id,
                    world.truth[entry_id][1],
                )
        for who in principals:
            try:
                listed = pad.list_for_turn(who, "turn-1", now=NOW)
            except IntegrityError:
                continue
            for item in listed:
                assert world.truth[item["scratchpad_id"]][0].owner_user_id == who.owner_user_id


# -- the cases ----------------------------------------------------------------------

Tamper = Callable[[World, apsw.Connection], list[str]]


def flip_segment(w: World, c: apsw.Connection) -> list[str]:
    w.set_segment(c, "a1", 1, flip(w.segment(c, "a1", 1)))
    return ["a1"]


def flip_segment_tag(w: World, c: apsw.Connection) -> list[str]:
    data = w.segment(c, "abin", 0)
    w.set_segment(c, "abin", 0, flip(data, len(data) - 1))
    return ["abin"]


def flip_column(column: str, name: str = "a1") -> Tamper:
    def tamper(w: World, c: apsw.Connection) -> list[str]:
        w.set(c, name, column, flip(w.col(c, name, column)))
        return [name]

    tamper.__name__ = f"flip_{column}"
    return tamper


def swap_segments_between_entries(w: World, c: apsw.Connection) -> list[str]:
    a, b = w.segment(c, "a1", 0), w.segment(c, "a2", 0)
    w.set_segment(c, "a1", 0, b)
    w.set_segment(c, "a2", 0, a)
    return ["a1", "a2"]


def swap_segments_between_owners(w: World, c: apsw.Connection) -> list[str]:
    a, b = w.segment(c, "a1", 1), w.segment(c, "b1", 1)
    w.set_segment(c, "a1", 1, b)
    w.set_segment(c, "b1", 1, a)
    return ["a1", "b1"]


def transplant_all_segments(w: World, c: apsw.Connection) -> list[str]:
    """Bob's entry gets every segment of alice's (same count), in order."""
    for seq in range(min(w.segment_count(c, "a1"), w.segment_count(c, "b1"))):
        w.set_segment(c, "b1", seq, w.segment(c, "a1", seq))
    return ["b1"]


def reorder_segments(w: World, c: apsw.Connection) -> list[str]:
    s0, s1 = w.segment(c, "a1", 0), w.segment(c, "a1", 1)
    w.set_segment(c, "a1", 0, s1)
    w.set_segment(c, "a1", 1, s0)
    return ["a1"]


def delete_last_segment(w: World, c: apsw.Connection) -> list[str]:
    last = w.segment_count(c, "a1") - 1
    c.execute("DELETE FROM segments WHERE entry_id = ? AND seq = ?", (w.ids["a1"], last))
    return ["a1"]


def truncate_consistently(w: World, c: apsw.Connection) -> list[str]:
    """Drop the last segment and make the clear header agree with the shorter entry."""
    last = w.segment_count(c, "a1") - 1
    dropped = len(w.segment(c, "a1", last))
    c.execute("DELETE FROM segments WHERE entry_id = ? AND seq = ?", (w.ids["a1"], last))
    w.set(c, "a1", "segment_count", last)
    w.set(c, "a1", "size_bytes", w.col(c, "a1", "size_bytes") - dropped)
    return ["a1"]


def delete_middle_segment(w: World, c: apsw.Connection) -> list[str]:
    c.execute("DELETE FROM segments WHERE entry_id = ? AND seq = 1", (w.ids["a1"],))
    for seq in range(2, w.segment_count(c, "a1")):
        c.execute("UPDATE segments SET seq = ? WHERE entry_id = ? AND seq = ?", (seq - 1, w.ids["a1"], seq))
    w.set(c, "a1", "segment_count", w.segment_count(c, "a1") - 1)
    return ["a1"]


def move_row_to_bob(w: World, c: apsw.Connection) -> list[str]:
    w.set(c, "a1", "owner_user_id", "bob")
    return ["a1"]


def move_row_to_new_owner(w: World, c: apsw.Connection) -> list[str]:
    w.set(c, "a1", "owner_user_id", "mallory")
    return ["a1"]


def rename_entry(w: World, c: apsw.Connection) -> list[str]:
    """Give an entry another id (segments follow): its crypto is bound to the old one."""
    new = secrets.token_hex(8)
    old = w.ids["a1"]
    c.execute("UPDATE entries SET id = ? WHERE id = ?", (new, old))
    c.execute("UPDATE segments SET entry_id = ? WHERE entry_id = ?", (new, old))
    w.ids["a1"] = new
    w.truth[new] = w.truth.pop(old)
    return ["a1"]


def swap_ids_between_owners(w: World, c: apsw.Connection) -> list[str]:
    """Bob's row takes alice's id and alice's row bob's (segments stay with their ids)."""
    a, b = w.ids["a1"], w.ids["b1"]
    c.execute("UPDATE entries SET id = 'tmp-a' WHERE id = ?", (a,))
    c.execute("UPDATE entries SET id = ? WHERE id = ?", (a, b))
    c.execute("UPDATE entries SET id = ? WHERE id = 'tmp-a'", (b,))
    return ["a1", "b1"]


def swap_crypto_between_entries(w: World, c: apsw.Connection) -> list[str]:
    """Swap an entry's whole key material (wrapped item key, nonce prefix, commitment, metadata)."""
    for column in ("wrapped_key", "nonce_prefix", "commitment", "sealed_meta"):
        w.swap(c, "a1", "a2", column)
    return ["a1", "a2"]


def swap_column(column: str, a: str = "a1", b: str = "a2") -> Tamper:
    def tamper(w: World, c: apsw.Connection) -> list[str]:
        w.swap(c, a, b, column)
        return [a, b]

    tamper.__name__ = f"swap_{column}_{a}_{b}"
    return tamper


def edit(column: str, change: Callable[[Any], Any], name: str = "a1") -> Tamper:
    def tamper(w: World, c: apsw.Connection) -> list[str]:
        w.set(c, name, column, change(w.col(c, name, column)))
        return [name]

    tamper.__name__ = f"edit_{column}_{name}"
    return tamper


def swap_owner_keys(w: World, c: apsw.Connection) -> list[str]:
    rows = dict(c.execute("SELECT owner_user_id, wrapped FROM owner_keys WHERE version = 1").fetchall())
    c.execute("UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = 'alice'", (rows["bob"],))
    c.execute("UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = 'bob'", (rows["alice"],))
    return ["a1", "a2", "abin", "b1"]


def relabel_owner_key(w: World, c: apsw.Connection) -> list[str]:
    """Bob's key row is relabelled as alice's (and alice's dropped)."""
    c.execute("DELETE FROM owner_keys WHERE owner_user_id = 'alice'")
    c.execute("UPDATE owner_keys SET owner_user_id = 'alice' WHERE owner_user_id = 'bob'")
    return ["a1", "a2", "abin", "b1"]


def flip_owner_key(w: World, c: apsw.Connection) -> list[str]:
    (wrapped,) = c.execute("SELECT wrapped FROM owner_keys WHERE owner_user_id = 'alice'").fetchall()[0]
    c.execute("UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = 'alice'", (flip(wrapped),))
    return ["a1", "a2", "abin"]


def text_segment(w: World, c: apsw.Connection) -> list[str]:
    """A segment rewritten as TEXT rather than BLOB (a corrupted or hostile file)."""
    w.set_segment(c, "a1", 0, "not a ciphertext")
    return ["a1"]


def text_expiry(w: World, c: apsw.Connection) -> list[str]:
    """expires_at rewritten as TEXT: SQLite keeps it, and it must not crash the reader."""
    w.set(c, "a1", "expires_at", "never")
    return ["a1"]


CASES: list[Tamper] = [
    flip_segment,
    flip_segment_tag,
    flip_column("wrapped_key"),
    flip_column("sealed_meta"),
    flip_column("commitment"),
    flip_column("nonce_prefix"),
    flip_column("wrapped_key", "b1"),
    swap_segments_between_entries,
    swap_segments_between_owners,
    transplant_all_segments,
    reorder_segments,
    delete_last_segment,
    truncate_consistently,
    delete_middle_segment,
    move_row_to_bob,
    move_row_to_new_owner,
    rename_entry,
    swap_ids_between_owners,
    swap_column("wrapped_key"),
    swap_column("wrapped_key", "a1", "b1"),
    swap_column("commitment"),
    swap_column("sealed_meta"),
    swap_column("sealed_meta", "a1", "b1"),
    swap_column("nonce_prefix"),
    swap_crypto_between_entries,
    edit("size_bytes", lambda v: v - 1),
    edit("size_bytes", lambda v: v + 1, "abin"),
    edit("size_chars", lambda v: v + 1),
    edit("content_kind", lambda v: "binary"),
    edit("content_kind", lambda v: "json"),
    edit("content_kind", lambda v: "text", "abin"),
    edit("turn_id", lambda v: "turn-2"),
    edit("segment_count", lambda v: v - 1),
    edit("segment_count", lambda v: v + 1),
    edit("key_version", lambda v: v + 1),
    edit("actor", lambda v: "coder"),
    edit("channel", lambda v: "slack"),
    edit("step_num", lambda v: v + 1),
    edit("executor_name", lambda v: "other"),
    edit("created_at", lambda v: v - 100),
    edit("expires_at", lambda v: v + 86400),
    swap_owner_keys,
    relabel_owner_key,
    flip_owner_key,
    text_segment,
    text_expiry,
]


@pytest.mark.slow
@pytest.mark.parametrize("tamper", CASES, ids=lambda t: t.__name__)
def test_tampering_is_detected(world: World, tamper: Tamper) -> None:
    with raw_file(world.db_path) as conn:
        broken = tamper(world, conn)
    check_everything(world, broken)


def test_untouched_world_reads_back(world: World) -> None:
    """The control: without tampering, every owner reads exactly their own entries."""
    with world.open() as pad:
        for entry_id, (owner, content) in world.truth.items():
            assert pad.get(owner, entry_id, now=NOW).observation == content
    check_everything(world, [])


def test_extended_expiry_does_not_revive_an_expired_entry(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry_id = pad.put(ALICE, "t", 1, "x", "short-lived", ttl_seconds=10, now=1000.0)["scratchpad_id"]
    with raw_file(db_path) as conn:
        conn.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (1e12, entry_id))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for who in (ALICE, BOB):
            with pytest.raises(REFUSED):
                pad.get(who, entry_id, now=2000.0)
            with pytest.raises(REFUSED):
                pad.read(who, entry_id, mode="full", now=2000.0)
        with pytest.raises(IntegrityError):
            pad.list_for_turn(ALICE, "t", now=2000.0)


def test_shortened_expiry_is_refused_by_the_turn_head(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry_id = pad.put(ALICE, "t", 1, "x", "data", ttl_seconds=3600, now=1000.0)["scratchpad_id"]
    with raw_file(db_path) as conn:
        conn.execute("UPDATE entries SET expires_at = 1001.0 WHERE id = ?", (entry_id,))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, entry_id, now=1500.0)
        with pytest.raises(IntegrityError):
            pad.list_for_turn(ALICE, "t", now=1500.0)


def test_moved_row_is_refused_to_both_owners(world: World) -> None:
    with raw_file(world.db_path) as conn:
        move_row_to_bob(world, conn)
    with world.open() as pad:
        with pytest.raises(NotFoundError):
            pad.get(ALICE, world.ids["a1"], now=NOW)
        with pytest.raises(IntegrityError):
            pad.get(BOB, world.ids["a1"], now=NOW)
        with pytest.raises(IntegrityError):
            pad.list_for_turn(BOB, "turn-1", now=NOW)


# -- no plaintext at rest -----------------------------------------------------------


def store_files(db_path: Path) -> dict[str, bytes]:
    files = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(f"{db_path}{suffix}")
        if path.exists():
            files[path.name] = path.read_bytes()
    return files


def test_canary_never_reaches_the_files(db_path: Path, keyring: Keyring) -> None:
    canary = f"CANARY-{secrets.token_hex(12)}"
    binary_canary = secrets.token_bytes(24)
    observations: list[Any] = [
        canary,
        f"prefix {canary} " * 5000,  # several segments, canary repeated in each
        f"ünïcødé {canary} ✓",
        binary_canary * 10,
        {"content": "body", "secret_field": canary, "metadata": {"token": canary}},
        {"content": f"body {canary}", "status": 200},
        {"items": [{"value": canary}, {"value": f"x{canary}x"}], "note": canary},
        [canary],
    ]
    pad = Scratchpad.open(db_path, keyring=keyring)
    try:
        for step, observation in enumerate(observations):
            entry_id = pad.put(ALICE, "turn-1", step, "fetch", observation)["scratchpad_id"]
            pad.read(ALICE, entry_id, mode="full")
        pad.list_for_turn(ALICE, "turn-1")
        # While the store is open (the WAL holds the newest pages) ...
        files = store_files(db_path)
        assert f"{db_path.name}-wal" in files
        for name, data in files.items():
            assert canary.encode() not in data, name
            assert binary_canary not in data, name
    finally:
        pad.close()
    # ... and after closing (everything checkpointed into the main file).
    for name, data in store_files(db_path).items():
        assert canary.encode() not in data, name
        assert binary_canary not in data, name
        assert canary.encode("utf-16-le") not in data, name
