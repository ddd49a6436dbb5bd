"""File-level attacks by someone who can write the database file (or holds a
copy of it): rolling an entry back to an older ciphertext of itself, moving
owner keys between owners and stores, copying rows into another owner, and
editing the clear metadata. Each ends in IntegrityError or NotFoundError:
never another owner's plaintext, never a wrong answer.

The damage is done with ``securepad.audit.drills`` (the same drills ``securepad
audit`` runs on scratch copies), rollbacks to rows taken earlier with
``tests/support/rollbacks.py``, while no store is open; then a fresh store
opens the file. tests/crypto/test_formats_tamper.py covers bit flips and segment swaps.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, NotFoundError, Principal, Scratchpad, WrongKeyError
from securepad.audit import drills
from securepad.store import parts
from tests.support import rollbacks
from tests.support.principals import ALICE, BOB

pytestmark = pytest.mark.slow

REFUSED = (IntegrityError, NotFoundError)
NOW = 10_000.0
TEXT = "".join(f"{i:06d} alice's private log line\n" for i in range(6_000))  # three segments


@dataclass
class Store:
    db_path: Path
    keyring: Keyring
    ids: dict[str, str]
    truth: dict[str, tuple[Principal, Any]]

    def open(self) -> Scratchpad:
        return Scratchpad.open(self.db_path, keyring=self.keyring)

    def ask(self, name: str, readers: tuple[Principal, ...] = (ALICE, BOB)) -> list[str]:
        """Every way of asking for entry ``name`` (get, head, full, list) as each
        reader: ``served``, ``listed``, ``unlisted`` or the error's class name, in order.

        Anything served or listed must be the entry's true content or metadata, to
        its true owner. (A list checks the sealed metadata, not the segments: damage
        to the content alone, a flipped nonce prefix say, shows on the first read.)
        """
        entry_id = self.ids[name]
        owner, observation = self.truth[entry_id]
        seen = []
        with self.open() as pad:
            for reader in readers:
                for mode in ("get", "head", "full"):
                    try:
                        if mode == "get":
                            got: Any = pad.get(reader, entry_id, now=NOW).observation
                            assert got == observation
                        else:
                            got = pad.read(reader, entry_id, mode=mode, n=50, now=NOW)["content"]
                            assert readable(observation).startswith(got)
                    except REFUSED as exc:
                        seen.append(type(exc).__name__)
                        continue
                    assert reader.owner_user_id == owner.owner_user_id, f"{reader} was served {owner}'s entry"
                    seen.append("served")
                try:
                    listed = {item["scratchpad_id"] for item in pad.list_for_turn(reader, "turn-1", now=NOW)}
                except REFUSED as exc:
                    seen.append(type(exc).__name__)
                    continue
                if entry_id in listed:
                    assert reader.owner_user_id == owner.owner_user_id, f"{reader} listed {owner}'s entry"
                    seen.append("listed")
                else:
                    seen.append("unlisted")
        return seen


def readable(observation: Any) -> str:
    """The text that reads slice: a text entry's content, or a json entry's indented JSON."""
    if isinstance(observation, dict) and isinstance(observation.get("content"), str):
        content: str = observation["content"]
        return content
    return json.dumps(observation, indent=2, ensure_ascii=False)


def refused_everywhere(seen: list[str]) -> None:
    assert seen and "served" not in seen, seen


@pytest.fixture
def store(db_path: Path, keyring: Keyring) -> Store:
    entries = {
        "a_text": (ALICE, {"content": TEXT, "metadata": {"path": "/var/log/alice.log"}}),
        "a_json": (ALICE, {"items": [{"secret": f"alice-{i}"} for i in range(50)]}),
        "b_text": (BOB, {"content": "bob's private notes\n" * 4_000, "metadata": {}}),
    }
    ids, truth = {}, {}
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for step, (name, (owner, observation)) in enumerate(entries.items(), 1):
            entry_id = pad.put(owner, "turn-1", step, "tool", observation, ttl_seconds=3_600, now=NOW - 60)
            ids[name] = entry_id["scratchpad_id"]
            truth[ids[name]] = (owner, observation)
    result = Store(db_path, keyring, ids, truth)
    assert result.ask("a_text", (ALICE,)) == ["served"] * 3 + [
        "listed"
    ]  # the control: untouched, alice reads her entry
    return result


@pytest.fixture
def backup(store: Store, tmp_path: Path) -> Iterator[Path]:
    """A consistent copy of the store taken now, as a backup would be."""
    path = tmp_path / "backup" / "store.db"
    path.parent.mkdir(mode=0o700)
    with store.open() as pad:
        parts(pad).db.copy_to(path)
    yield path


# -- rolling an entry back to an older ciphertext of itself ------------------------------


@pytest.mark.parametrize(
    "columns", [("wrapped_key",), ("key_version",), ("wrapped_key", "key_version")], ids=lambda c: "+".join(c)
)
def test_rollback_to_the_item_key_wrapped_before_an_owner_key_rotation(store: Store, columns: tuple[str, ...]) -> None:
    entry_id = store.ids["a_text"]
    old_row, _ = drills.entry_row(store.db_path, entry_id)
    with store.open() as pad:
        assert pad.rotate_owner_key("alice")["retired_versions"] == [1]
    new_row, _ = drills.entry_row(store.db_path, entry_id)
    assert new_row["wrapped_key"] != old_row["wrapped_key"] and new_row["key_version"] == 2
    for column in columns:
        drills.set_column(store.db_path, entry_id, column, old_row[column])
    refused_everywhere(store.ask("a_text"))


def test_rollback_of_an_owner_key_to_its_wrapping_under_the_old_master_key(store: Store, tmp_path: Path) -> None:
    old_keys = rollbacks.owner_key_rows(store.db_path, "alice")
    new_keyring = Keyring.from_key_file(tmp_path / "config" / "new-key")
    with store.open() as pad:
        pad.rotate_master_key(new_keyring)
    rollbacks.restore_owner_keys(store.db_path, old_keys)
    with pytest.raises(WrongKeyError):
        store.open()  # the old master key no longer opens the store
    store.keyring = new_keyring
    refused_everywhere(store.ask("a_text"))
    assert store.ask("b_text", (BOB,)) == ["served"] * 3 + ["listed"]


def test_rollback_of_one_owner_key_version_after_rotation(store: Store, backup: Path) -> None:
    """After alice's rotation, version 1 is retired; putting it back from a backup
    does not make the rewrapped entries open under it."""
    with store.open() as pad:
        pad.rotate_owner_key("alice")
    current = rollbacks.owner_key_rows(store.db_path, "alice")
    rollbacks.restore_owner_keys(store.db_path, rollbacks.owner_key_rows(backup, "alice"))  # only version 1 now
    refused_everywhere(store.ask("a_text"))
    rollbacks.restore_owner_keys(store.db_path, current + rollbacks.owner_key_rows(backup, "alice"))
    assert store.ask("a_text", (ALICE,)) == ["served"] * 3 + [
        "listed"
    ]  # both versions: the entry is read with version 2


def test_restoring_a_forgotten_owners_entries_from_a_backup_fails(store: Store, backup: Path) -> None:
    """Crypto-shredding: with alice's owner key gone, her rows restored from a backup are ciphertext only."""
    with store.open() as pad:
        pad.forget_owner("alice")
    for name in ("a_text", "a_json"):
        row, segments = drills.entry_row(backup, store.ids[name])
        rollbacks.restore_entry(store.db_path, row, segments)
    refused_everywhere(store.ask("a_text"))
    refused_everywhere(store.ask("a_json"))


def test_a_deleted_entry_restored_whole_from_a_backup_is_refused(store: Store, backup: Path) -> None:
    """An entry deleted since, put back whole (row and segments) while its
    owner key still exists, is not in its turn's head any more: every read of it and
    of its turn is refused; the other owner still sees nothing of it."""
    with store.open() as pad:
        pad.delete(ALICE, store.ids["a_text"])
    assert store.ask("a_text", (ALICE,)) == ["NotFoundError"] * 3 + ["unlisted"]
    row, segments = drills.entry_row(backup, store.ids["a_text"])
    rollbacks.restore_entry(store.db_path, row, segments)
    assert store.ask("a_text") == ["IntegrityError"] * 4 + ["NotFoundError"] * 3 + ["unlisted"]


@pytest.mark.parametrize("columns", [("sealed_listing",), ("expires_at",)], ids=lambda c: c[0])
def test_rollback_of_half_an_expiry_extension_fails(store: Store, columns: tuple[str, ...]) -> None:
    """Resuming a turn with extend_ttl re-seals the listing part, bound to the
    later expiry (the whole metadata before it): the older part, or
    the older clear expiry, alone is a mismatch."""
    entry_id = store.ids["a_text"]
    before, _ = drills.entry_row(store.db_path, entry_id)
    with store.open() as pad:
        assert pad.extend_turn(ALICE, "turn-1", 86_400, now=NOW) >= 1
    after, _ = drills.entry_row(store.db_path, entry_id)
    assert after["expires_at"] > before["expires_at"] and after["sealed_listing"] != before["sealed_listing"]
    for column in columns:
        drills.set_column(store.db_path, entry_id, column, before[column])
    refused_everywhere(store.ask("a_text"))


def test_a_whole_expiry_extension_rolled_back_is_refused(store: Store) -> None:
    """Both halves rolled back together is the entry's older, consistent state; the
    turn head holds the extended expiry, so every read refuses it."""
    entry_id = store.ids["a_text"]
    before, _ = drills.entry_row(store.db_path, entry_id)
    with store.open() as pad:
        pad.extend_turn(ALICE, "turn-1", 86_400, now=NOW)
    drills.set_column(store.db_path, entry_id, "sealed_listing", before["sealed_listing"])
    drills.set_column(store.db_path, entry_id, "expires_at", before["expires_at"])
    assert store.ask("a_text", (ALICE,)) == ["IntegrityError"] * 4
    with store.open() as pad, pytest.raises(IntegrityError):
        pad.get(ALICE, entry_id, now=before["expires_at"])


def test_mixing_an_entry_with_an_older_state_of_itself_fails(store: Store, backup: Path) -> None:
    """Half a rollback: the current row with the backup's key material, or segments."""
    entry_id = store.ids["a_text"]
    with store.open() as pad:
        pad.rotate_owner_key("alice")
    old_row, _ = drills.entry_row(backup, entry_id)
    drills.set_column(store.db_path, entry_id, "wrapped_key", old_row["wrapped_key"])
    refused_everywhere(store.ask("a_text"))


# -- owner keys between owners and stores ------------------------------------------------


def test_owner_key_rows_swapped_between_owners(store: Store) -> None:
    drills.swap_owner_keys(store.db_path, "alice", "bob")
    refused_everywhere(store.ask("a_text"))
    refused_everywhere(store.ask("b_text"))


def test_entries_and_owner_key_transplanted_to_another_owner(store: Store) -> None:
    """Every row of alice relabelled as bob's, and bob's owner key replaced by alice's."""
    alice_keys = rollbacks.owner_key_rows(store.db_path, "alice")
    for name in ("a_text", "a_json"):
        drills.move_entry_to_owner(store.db_path, store.ids[name], "bob")
    rollbacks.restore_owner_keys(store.db_path, alice_keys, owner_user_id="bob")
    refused_everywhere(store.ask("a_text"))
    refused_everywhere(store.ask("a_json"))


def test_owner_key_and_entry_from_another_store_with_the_same_master_key(store: Store, tmp_path: Path) -> None:
    """Same master key, same owner id, another store: its owner keys are bound to that store's id."""
    other_path = tmp_path / "other" / "store.db"
    with Scratchpad.open(other_path, keyring=store.keyring) as other:
        other_id = other.put(ALICE, "turn-1", 9, "tool", "alice in another store", now=NOW - 60)["scratchpad_id"]
    row, segments = drills.entry_row(other_path, other_id)
    rollbacks.restore_entry(store.db_path, row, segments)
    rollbacks.restore_owner_keys(store.db_path, rollbacks.owner_key_rows(other_path, "alice"))
    store.ids["foreign"], store.truth[other_id] = other_id, (ALICE, "alice in another store")
    refused_everywhere(store.ask("foreign"))
    refused_everywhere(store.ask("a_text"))


# -- rows copied into another owner --------------------------------------------------------


@pytest.mark.parametrize("into", ["bob", "carol", "alice"])
def test_row_copied_into_another_owner_under_a_new_id(store: Store, into: str) -> None:
    copy_id = secrets.token_hex(8)
    drills.copy_entry(store.db_path, store.ids["a_text"], copy_id, into)
    reader = Principal(into, "planner", "web")
    store.ids["copy"], store.truth[copy_id] = copy_id, (reader, store.truth[store.ids["a_text"]][1])
    refused_everywhere(store.ask("copy", (reader, ALICE, BOB)))
    if into != "alice":
        assert store.ask("a_text", (ALICE,)) == ["served"] * 3 + ["listed"]  # the original is untouched


def test_row_moved_into_another_owner_with_its_segments(store: Store) -> None:
    drills.move_entry_to_owner(store.db_path, store.ids["a_text"], "bob")
    refused_everywhere(store.ask("a_text"))


# -- clear metadata --------------------------------------------------------------------------


def _flip(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[len(data) // 2] ^= 0x01
    return bytes(data)


EDITS: dict[str, Callable[[Any], Any]] = {
    "owner_user_id": lambda v: "bob",
    "actor": lambda v: "coder",
    "channel": lambda v: "slack",
    "turn_id": lambda v: "turn-2",
    "step_num": lambda v: v + 1,
    "executor_name": lambda v: "other-tool",
    "content_kind": lambda v: "binary",
    "size_bytes": lambda v: v - 1,
    "size_chars": lambda v: v + 1,
    "segment_count": lambda v: v - 1,
    "key_version": lambda v: v + 1,
    "created_at": lambda v: v - 3_600,
    "expires_at": lambda v: v + 86_400,
    "nonce_prefix": _flip,
    "commitment": _flip,
    "wrapped_key": _flip,
    "sealed_meta": _flip,
    "sealed_listing": _flip,
}


# Clear columns no one authenticates: quota accounting only. Changing one changes
# no answer (see test_quota_accounting_column_changes_no_answer).
UNAUTHENTICATED = {"stored_bytes"}


# Sealed content, not clear metadata: a one-segment entry's segment, kept in its
# row since migration 8; opened (and authenticated) when it is read, not listed.
CONTENT = {"only_segment"}


def test_every_clear_column_is_covered(store: Store) -> None:
    """A column added by a later schema must be added here: to EDITS, or (with a reason) to UNAUTHENTICATED."""
    assert set(EDITS) | UNAUTHENTICATED | CONTENT | {"id"} == set(drills.entry_columns(store.db_path))


def test_an_edited_segment_in_the_row_is_refused_on_every_read(store: Store) -> None:
    entry_id = store.ids["a_json"]
    row, segments = drills.entry_row(store.db_path, entry_id)
    assert row["only_segment"] is not None and segments == []  # a one-segment entry keeps it in its row
    drills.flip_segment_byte(store.db_path, entry_id)
    # alice's reads fail, the listing (sealed metadata only) still lists it; bob sees nothing
    assert store.ask("a_json") == ["IntegrityError"] * 3 + ["listed"] + ["NotFoundError"] * 3 + ["unlisted"]


def test_quota_accounting_column_is_authenticated_by_the_turn_head(store: Store) -> None:
    """``stored_bytes`` (what an entry counts against its owner's quota) is in the
    turn head: an edited value is refused to its owner, and the other
    owner still sees nothing of it."""
    for name in ("a_text", "b_text"):
        drills.set_column(store.db_path, store.ids[name], "stored_bytes", 1)
    # bob's listing fails on his own edited entry of the turn
    assert store.ask("a_text") == ["IntegrityError"] * 4 + ["NotFoundError"] * 3 + ["IntegrityError"]
    assert store.ask("b_text", (BOB,)) == ["IntegrityError"] * 4


@pytest.mark.parametrize("column", sorted(EDITS))
def test_editing_clear_metadata_fails(store: Store, column: str) -> None:
    entry_id = store.ids["a_text"]
    row, _ = drills.entry_row(store.db_path, entry_id)
    drills.set_column(store.db_path, entry_id, column, EDITS[column](row[column]))
    refused_everywhere(store.ask("a_text", (ALICE, BOB, Principal("alice", "coder", "slack"))))


def test_shortening_the_expiry_only_hides_the_entry(store: Store) -> None:
    """Moving expires_at into the past makes the entry unreadable (a denial, not a disclosure)."""
    entry_id = store.ids["a_text"]
    drills.set_column(store.db_path, entry_id, "expires_at", NOW - 1)
    refused_everywhere(store.ask("a_text"))
