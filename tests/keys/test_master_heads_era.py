"""A heads flag reset to 'pending' where no anchor counter says the store had heads.

An attacker who can write the file deletes rows and every turn head and sets
``store_meta.turn_heads`` back to ``pending`` (a store migrated from before
heads) so that the next open builds heads over the edited rows. The anchor's
write counter refuses that; without an anchor (``anchor=False``, and on
PostgreSQL: tests/tables/heads/test_tamper_postgres.py) the owner keys do: once a store has
heads every owner key is wrapped with the heads era in its AAD, which only the
master key can do, and a 'pending' store holding such a key is refused.
A genuine store from before heads (store_v1, store_v7) opens, builds or
converts its heads and marks its keys; so does a store whose heads were built
before the era (its keys marked at the next open).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from securepad.crypto.primitives import HEADS_ERA, Wrapper, owner_key_aad
from securepad.keys.keyring import master_key
from securepad.store import parts
from tests.support.fixture_v7 import NOW as V7_NOW
from tests.support.fixture_v7 import copy_v7
from tests.support.older_heads import as_format_2
from tests.support.paths import FIXTURES
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import raw_file

TURN = "t1"


def _record(pad: Scratchpad, steps: int = 5, now: float = NOW) -> None:
    for principal in (ALICE, BOB):
        turn = pad.turn(principal, TURN, now=now)
        for step in range(1, steps + 1):
            turn.record(step, "fetch", f"observation {step} " + "x" * 3000, ttl_seconds=3600, now=now)


def _truncate_and_reset(db: Path) -> None:
    """Alice's newest steps deleted, every head deleted, the flag set back to 'pending'."""
    with raw_file(db) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM entries WHERE owner_user_id = 'alice' AND step_num > 3")]
        for entry_id in ids:
            conn.execute("DELETE FROM segments WHERE entry_id = ?", (entry_id,))
            conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,))
        conn.execute("DELETE FROM turn_heads")
        conn.execute("UPDATE store_meta SET value = 'pending' WHERE key = 'turn_heads'")


def _eras(db: Path, keyring: Keyring) -> list[bool]:
    """For each owner key: whether its wrapping carries the heads era."""
    master, _ = master_key(keyring, None)
    with raw_file(db) as conn:
        store_id = str(conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchall()[0][0])
        rows = conn.execute("SELECT owner_user_id, version, wrapped FROM owner_keys").fetchall()
    wrap = Wrapper.for_master(master, store_id)
    eras = []
    for owner, version, wrapped in rows:
        try:
            wrap.unwrap(bytes(wrapped), owner_key_aad(store_id, str(owner), int(version), HEADS_ERA))  # type: ignore[arg-type]
        except IntegrityError:
            wrap.unwrap(bytes(wrapped), owner_key_aad(store_id, str(owner), int(version)))  # type: ignore[arg-type]
            eras.append(False)
        else:
            eras.append(True)
    return eras


def test_a_reset_flag_is_refused_without_an_anchor(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        _record(pad)
    assert _eras(db_path, keyring) == [True, True]
    _truncate_and_reset(db_path)
    for _ in range(2):  # nothing written by the refused open
        with pytest.raises(IntegrityError, match="pending"):
            Scratchpad.open(db_path, keyring=keyring, anchor=False)


def test_a_reset_flag_is_refused_after_rotations(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    """An owner-key rotation and a master-key rotation keep the heads era."""
    new_keyring = Keyring.from_key_file(tmp_path / "config" / "new-key")
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        _record(pad)
        pad.rotate_owner_key("alice")
        pad.rotate_master_key(new_keyring)
    assert _eras(db_path, new_keyring) == [True, True]
    _truncate_and_reset(db_path)
    with pytest.raises(IntegrityError, match="pending"):
        Scratchpad.open(db_path, keyring=new_keyring, anchor=False)


def test_a_reset_flag_with_every_owner_key_deleted_serves_nothing(db_path: Path, keyring: Keyring) -> None:
    """No key left to say the store had heads: crypto-shredding, every old row refused, not served."""
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        _record(pad)
    _truncate_and_reset(db_path)
    with raw_file(db_path) as conn:
        conn.execute("DELETE FROM owner_keys")
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        for principal in (ALICE, BOB):
            with pytest.raises(IntegrityError):
                pad.turn(principal, TURN, now=NOW).history(now=NOW)
        assert not pad.verify(now=NOW)["ok"]


def _copy_v1(tmp_path: Path) -> tuple[Path, Keyring, float]:
    import json

    db, key = tmp_path / "store.db", tmp_path / "key"
    shutil.copy(FIXTURES / "store_v1.db", db)
    db.chmod(0o600)
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    return db, Keyring.from_key_file(key), json.loads((FIXTURES / "store_v1.json").read_text())["now"]


@pytest.mark.parametrize("fixture", ["v1", "v7"])
def test_a_store_from_before_heads_opens_and_its_keys_are_marked(tmp_path: Path, fixture: str) -> None:
    if fixture == "v1":
        db, keyring, now = _copy_v1(tmp_path)
    else:
        db, key = copy_v7(tmp_path)
        keyring, now = Keyring.from_key_file(key), V7_NOW
    assert not any(_eras(db, keyring))  # wrapped before heads
    with Scratchpad.open(db, keyring=keyring, anchor=False) as pad:  # no false alarm
        report = pad.verify(now=now)
    assert report["ok"], report["problems"]
    eras = _eras(db, keyring)
    assert eras and all(eras)
    with Scratchpad.open(db, keyring=keyring, anchor=False) as pad:  # marked once: opens again
        assert pad.verify(now=now)["ok"]
    with raw_file(db) as conn:
        conn.execute("DELETE FROM turn_heads")
        conn.execute("UPDATE store_meta SET value = 'pending' WHERE key = 'turn_heads'")
    with pytest.raises(IntegrityError, match="pending"):
        Scratchpad.open(db, keyring=keyring, anchor=False)


def test_heads_built_before_the_era_get_their_keys_marked(db_path: Path, keyring: Keyring) -> None:
    """A store whose heads were built before the era (its flag the token of then, its
    keys wrapped without the era) opens, its keys are marked, and a reset is then refused."""
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        _record(pad)
        as_format_2(pad, "turn-heads")  # the heads of then: format 2
        before_era = f"2:{parts(pad).keys.counter_seal.tag('turn-heads', 2)}"
    master, _ = master_key(keyring, None)
    with raw_file(db_path) as conn:
        store_id = str(conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchall()[0][0])
        wrap = Wrapper.for_master(master, store_id)
        for owner, version, wrapped in conn.execute(
            "SELECT owner_user_id, version, wrapped FROM owner_keys"
        ).fetchall():
            heads, before = (owner_key_aad(store_id, str(owner), int(version), era) for era in (HEADS_ERA, ""))  # type: ignore[arg-type]
            conn.execute(
                "UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = ? AND version = ?",
                (wrap.rewrap(bytes(wrapped), heads, wrap, before), owner, version),  # type: ignore[arg-type]
            )
        conn.execute("UPDATE store_meta SET value = ? WHERE key = 'turn_heads'", (before_era,))
    assert _eras(db_path, keyring) == [False, False]
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        assert len(pad.turn(ALICE, TURN, now=NOW).history(now=NOW)) == 5
        assert pad.verify(now=NOW)["ok"]
    assert _eras(db_path, keyring) == [True, True]
    _truncate_and_reset(db_path)
    with pytest.raises(IntegrityError, match="pending"):
        Scratchpad.open(db_path, keyring=keyring, anchor=False)
