"""The clear flags of ``store_meta`` never decide that heads may be built again.

An attacker who can write the store (the SQLite file with the store closed,
or PostgreSQL as ``securepad_admin``), without the master key, deletes an
owner's history (every row and head, its key kept; or one turn and the owner
head), then asks the next open to build or convert the heads from what is
left: ``store_meta.turn_heads`` set to ``convert`` or ``built`` (or ``built``
with the schema version set back, so that the migration writes ``convert``
itself), and a clear ``owner_usage`` seed row so that a usage head is sealed
too. Such an open must refuse (``IntegrityError``), write nothing, and keep
refusing: what decides is sealed or derived (the owner keys wrapped in the
heads era, heads of this format, usage heads), never a clear value.

Then each other value those flags can take: absent, garbage, ``pending``,
``built``/``convert`` on a store with heads, and the seed row on a store whose
heads are of this format (a deleted usage head stays named by ``verify``).
Stores written by older code (``tests/fixtures``) still convert:
``tests/tables/heads/test_heads_fixture_v7.py``, ``tests/keys/test_master_heads_era.py``,
``tests/storage/test_migrate_fixture_v*.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Scratchpad, SecurepadError
from securepad.storage.postgres.functions import pg_read_functions
from securepad.store import parts
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import Raw, as_admin, on_sqlite, record_turn

LATER = NOW + 100
_TABLES = ("entries", "checkpoints", "compaction_marks", "turn_heads")


class Store:
    """A store on either backend with alice's turns t1 (5 steps) and t2 (2), bob's t1 (2)."""

    def __init__(self, where: Any, keyring: Keyring, backend: str) -> None:
        self.where, self.keyring, self.backend = where, keyring, backend
        with self.open() as pad:
            self.ids = record_turn(pad, ALICE, "t1", 5)
            record_turn(pad, ALICE, "t2", 2)
            record_turn(pad, BOB, "t1", 2)

    def open(self) -> Scratchpad:
        return Scratchpad.open(self.where, keyring=self.keyring)

    def raw(self) -> AbstractContextManager[Raw]:
        """One transaction outside securepad: the file, or the admin role."""
        return on_sqlite(self.where) if self.backend == "sqlite" else as_admin(self.where)


@pytest.fixture
def store(new_store_location: Any, keyring: Keyring, backend: str) -> Iterator[Store]:
    yield Store(new_store_location, keyring, backend)


def _delete_owner_history(raw: Raw) -> None:
    """Every row and head of alice; her owner key stays."""
    raw.execute("DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = 'alice')")
    for table in _TABLES:
        raw.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice'")


def _delete_turn_and_owner_head(raw: Raw) -> None:
    """Alice's turn t1 (rows and head) and her owner head."""
    raw.execute(
        "DELETE FROM segments WHERE entry_id IN"
        " (SELECT id FROM entries WHERE owner_user_id = 'alice' AND turn_id = 't1')"
    )
    for table in _TABLES:
        raw.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice' AND turn_id = 't1'")
    raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ''")


def _set_meta(raw: Raw, key: str, value: str) -> None:
    raw.execute("DELETE FROM store_meta WHERE key = ?", (key,))
    raw.execute("INSERT INTO store_meta(key, value) VALUES (?, ?)", (key, value))


def _version_back(raw: Raw) -> None:
    """The schema version set back to before the heads' conversion migration
    (schema 11), so that the next open runs it and it writes ``convert``."""
    if raw.postgres:
        raw.execute("DELETE FROM schema_version WHERE version >= 11")
        for name in pg_read_functions():  # the migrations from 14 on create them again
            for arguments in ("text, text, bytea, text, text, text", "text, text, bytea, text, text, text, text, text"):
                raw.execute(f"DROP FUNCTION IF EXISTS {name}({arguments})")
    else:
        raw.execute("PRAGMA user_version = 10")


def _flag(value: str, version_back: bool = False) -> Callable[[Raw], None]:
    def set_flag(raw: Raw) -> None:
        _set_meta(raw, "turn_heads", value)
        _set_meta(raw, "owner_usage", "seed")
        if version_back:
            _version_back(raw)

    return set_flag


FLAGS = {
    "convert": _flag("convert"),
    "built": _flag("built"),
    "built-version-back": _flag("built", version_back=True),
}
DELETIONS = {"owner-history": _delete_owner_history, "turn-and-owner-head": _delete_turn_and_owner_head}


def _heads(store: Store) -> list[tuple[Any, ...]]:
    with store.raw() as raw:
        return sorted(raw.execute("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"))


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("deletion", DELETIONS)
def test_a_conversion_flag_never_rebuilds_an_owners_deleted_history(store: Store, deletion: str, flag: str) -> None:
    with store.raw() as raw:
        DELETIONS[deletion](raw)
        FLAGS[flag](raw)
    heads = _heads(store)
    for _ in range(2):  # refused again: the refused open wrote nothing
        with pytest.raises(IntegrityError, match=r"later format|heads era"):
            store.open()
    assert _heads(store) == heads


@pytest.mark.parametrize("flag", FLAGS)
def test_with_every_head_deleted_the_owner_keys_era_alone_refuses(store: Store, flag: str) -> None:
    """No head of this format left anywhere (every owner's deleted): the owner
    keys, wrapped in the heads era, still say that the store had heads."""
    with store.raw() as raw:
        _delete_owner_history(raw)
        raw.execute("DELETE FROM turn_heads")
        FLAGS[flag](raw)
    for _ in range(2):
        with pytest.raises(IntegrityError, match="heads era"):
            store.open()


@pytest.mark.parametrize("flag", ["convert", "built"])
def test_a_conversion_flag_on_an_untouched_store_is_refused(store: Store, flag: str) -> None:
    with store.raw() as raw:
        _set_meta(raw, "turn_heads", flag)
    with pytest.raises(IntegrityError):
        store.open()


@pytest.mark.parametrize("flag", ["convert", "built"])
@pytest.mark.parametrize("usage", [True, False], ids=["usage-heads-kept", "usage-heads-deleted"])
def test_heads_of_a_later_format_refuse_a_conversion_flag(store: Store, flag: str, usage: bool) -> None:
    """Alice's history deleted; then either every owner key deleted (nothing
    can be opened): bob's usage head, a row no store of format 1 has, says the
    store had later heads; or every usage head deleted, the keys kept: bob's
    turn heads, which open to this format, say it."""
    with store.raw() as raw:
        _delete_owner_history(raw)
        if not usage:
            raw.execute("DELETE FROM turn_heads WHERE turn_id = ?", ("\x01usage",))
        else:
            raw.execute("DELETE FROM owner_keys")
        _set_meta(raw, "turn_heads", flag)
    with pytest.raises(IntegrityError, match="later format"):
        store.open()


@pytest.mark.parametrize("purpose", ["turn-heads-era", "turn-heads"])
def test_a_format_2_token_put_back_on_a_store_of_this_format_is_refused(store: Store, purpose: str) -> None:
    """The token of format 2 (an older copy's flag: tokens are deterministic)
    would have the heads converted again from their inventories."""
    with store.open() as pad:
        old_token = f"2:{parts(pad).keys.counter_seal.tag(purpose, 2)}"
    with store.raw() as raw:
        _set_meta(raw, "turn_heads", old_token)
    with pytest.raises(IntegrityError, match="later format"):
        store.open()


def test_a_reset_flag_absent_or_forged_is_refused(store: Store) -> None:
    with store.raw() as raw:
        raw.execute("DELETE FROM store_meta WHERE key = 'turn_heads'")
    with pytest.raises(IntegrityError):  # absent: read as 'pending', on a store with heads
        store.open()
    for forged in ("3:" + "0" * 38, "done", ""):
        with store.raw() as raw:
            _set_meta(raw, "turn_heads", forged)
        with pytest.raises(IntegrityError, match="authenticate"):
            store.open()


def test_a_seed_flag_does_not_hide_a_deleted_usage_head(store: Store) -> None:
    with store.raw() as raw:
        raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", ("\x01usage",))
        _set_meta(raw, "owner_usage", "seed")
    for _ in range(2):
        with store.open() as pad:
            problems = [(p["owner_user_id"], p["what"]) for p in pad.verify(now=LATER)["problems"]]
            assert problems == [("alice", "owner usage")]
            assert len(pad.turn(ALICE, "t1", now=LATER).history(now=LATER)) == 5  # reads still served


def test_a_seed_flag_on_a_genuine_store_changes_nothing(store: Store) -> None:
    heads = _heads(store)
    with store.raw() as raw:
        _set_meta(raw, "owner_usage", "anything")
    with store.open() as pad:
        assert pad.verify(now=LATER)["ok"]
    assert _heads(store) == heads


def test_the_v7_fixture_converts_with_its_seed_in_the_same_open(tmp_path: Path) -> None:
    """A store from before usage heads (schema 7, format-1 heads) gets its usage
    heads in the open that converts it, and opens again without the flag."""
    from tests.support.fixture_v7 import NOW as V7_NOW
    from tests.support.fixture_v7 import copy_v7

    db, key = copy_v7(tmp_path)
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        assert pad.verify(now=V7_NOW)["ok"]
    with on_sqlite(db) as raw:
        assert raw.execute("SELECT key FROM store_meta WHERE key = 'owner_usage'") == []
        assert len(raw.execute("SELECT 1 FROM turn_heads WHERE turn_id = ?", ("\x01usage",))) == 2


# Every other clear value of store_meta, and what an attacker may write there:
# (key, value), None deleting the row. None of them may switch tamper evidence
# off: the open refuses (a typed error), or a removed turn is still refused.
OTHER_FLAGS = [
    ("store_id", None),
    ("store_id", "0" * 32),
    ("key_check", None),
    ("key_check", "00"),
    ("kdf", None),
    ("kdf", '{"salt": "AAAA", "time_cost": 1, "memory_cost": 8, "parallelism": 1}'),
    ("anchor_key", None),
    ("anchor_key", "00" * 60),
    ("format_version", None),
    ("format_version", "0"),
    ("master_wrap_count", None),
    ("master_wrap_count", "0"),
    ("write_counter", None),
    ("write_counter", "1:0"),
    ("owner_usage", "seed"),
    ("schema_numbering", None),
    ("schema_numbering", "x"),
]


@pytest.mark.parametrize(("key", "value"), OTHER_FLAGS, ids=lambda v: "deleted" if v is None else str(v)[:12])
def test_no_other_store_meta_value_hides_a_removed_turn(store: Store, key: str, value: str | None) -> None:
    with store.raw() as raw:
        raw.execute(
            "DELETE FROM segments WHERE entry_id IN"
            " (SELECT id FROM entries WHERE owner_user_id = 'alice' AND turn_id = 't2')"
        )
        for table in _TABLES:
            raw.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice' AND turn_id = 't2'")
        raw.execute("DELETE FROM store_meta WHERE key = ?", (key,))
        if value is not None:
            raw.execute("INSERT INTO store_meta(key, value) VALUES (?, ?)", (key, value))
    try:
        pad = store.open()
    except SecurepadError as exc:  # refused at open, with a typed error
        assert type(exc).__module__ == "securepad.errors", exc
        return
    with pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t2", now=LATER).history(now=LATER)
        assert ("alice", "t2") in {(p["owner_user_id"], p["turn_id"]) for p in pad.verify(now=LATER)["problems"]}
        assert len(pad.turn(BOB, "t1", now=LATER).history(now=LATER)) == 2
