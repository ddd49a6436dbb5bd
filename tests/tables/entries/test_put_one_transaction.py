"""A put on SQLite into a turn whose head this process sealed last: one write
transaction of the head's conditional UPDATE and the entry's INSERT, no read first
(``Heads.change_once``). What a user relies on, guarded here: whatever makes the
UPDATE write nothing (another writer sealed the turn's head since, a rotation, a
taken step) stores the entry exactly once by the reading put, or refuses what that
put refuses, and leaves a store that verifies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import apsw
import pytest

from securepad import IntegrityError, InvalidArgumentError, Keyring, Scratchpad, SecurepadError
from securepad.store import sqlite_of
from tests.support.principals import ALICE, NOW

pytestmark = pytest.mark.sqlite_only

LATER = NOW + 10


@pytest.fixture
def two(db_path: Path, keyring: Keyring) -> Iterator[tuple[Scratchpad, Scratchpad]]:
    """Two stores open on one file, as two processes have it: each its own record of the heads it sealed."""
    first = Scratchpad.open(db_path, keyring=keyring, anchor=False, clock=lambda: NOW)
    second = Scratchpad.open(db_path, keyring=keyring, anchor=False, clock=lambda: NOW)
    yield first, second
    second.close()
    first.close()


def _statements(pad: Scratchpad, call: Callable[[], object]) -> list[str]:
    seen: list[str] = []
    conn = sqlite_of(pad).conn
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda event: seen.append(str(event["sql"])))
    try:
        call()
    finally:
        conn.trace_v2(0, None)
    return seen


def test_writers_taking_turns_store_every_entry_once(two: tuple[Scratchpad, Scratchpad]) -> None:
    first, second = two
    for step in range(1, 13):
        (first if step % 3 else second).put(ALICE, "t", step, "tool", f"observation {step}", now=NOW)
    assert [entry["step_num"] for entry in first.list_for_turn(ALICE, "t", now=LATER)] == list(range(1, 13))
    assert second.verify(now=LATER)["ok"]


def test_a_put_after_another_writers_reads_the_head_and_the_next_one_does_not(
    two: tuple[Scratchpad, Scratchpad],
) -> None:
    first, second = two
    first.put(ALICE, "t", 1, "tool", "one", now=NOW)
    second.put(ALICE, "t", 2, "tool", "two", now=NOW)
    after_another = _statements(first, lambda: first.put(ALICE, "t", 3, "tool", "three", now=NOW))
    after_its_own = _statements(first, lambda: first.put(ALICE, "t", 4, "tool", "four", now=NOW))
    # The one-transaction put wrote nothing (the stored head is the other writer's) and was rolled
    # back, committing nothing; then the put that reads the head, which records it as this writer's.
    assert [sql.split()[0] for sql in after_another] == [
        *("BEGIN", "UPDATE", "INSERT", "ROLLBACK"),
        *("BEGIN", "SELECT", "INSERT", "INSERT", "COMMIT"),
    ]
    assert [sql.split()[0] for sql in after_its_own] == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    assert [entry["step_num"] for entry in second.list_for_turn(ALICE, "t", now=LATER)] == [1, 2, 3, 4]


def test_a_step_another_writer_took_is_refused_and_nothing_is_stored(two: tuple[Scratchpad, Scratchpad]) -> None:
    first, second = two
    first.put(ALICE, "t", 1, "tool", "one", now=NOW)
    second.put(ALICE, "t", 2, "tool", "theirs", now=NOW)
    with pytest.raises(InvalidArgumentError, match="step 2 is already recorded"):
        first.put(ALICE, "t", 2, "tool", "mine", now=NOW)
    assert [entry["summary"] for entry in first.list_for_turn(ALICE, "t", now=LATER)] == ["one", "theirs"]
    assert first.verify(now=LATER)["ok"]


def test_a_step_of_its_own_turn_taken_is_refused_in_the_one_transaction(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, anchor=False, clock=lambda: NOW) as pad:
        pad.put(ALICE, "t", 1, "tool", "one", now=NOW)
        with pytest.raises(InvalidArgumentError, match="step 1 is already recorded"):
            pad.put(ALICE, "t", 1, "tool", "again", now=NOW)
        pad.put(ALICE, "t", 2, "tool", "two", now=NOW)
        assert [entry["step_num"] for entry in pad.list_for_turn(ALICE, "t", now=LATER)] == [1, 2]
        assert pad.verify(now=LATER)["ok"]


def test_a_put_after_another_writers_rotation_is_stored_under_the_new_key(
    two: tuple[Scratchpad, Scratchpad],
) -> None:
    first, second = two
    first.put(ALICE, "t", 1, "tool", "one", now=NOW)
    second.rotate_owner_key(ALICE.owner_user_id)
    first.put(ALICE, "t", 2, "tool", "two", now=NOW)
    versions = [
        row[0] for row in sqlite_of(first).conn.execute("SELECT key_version FROM entries WHERE step_num = 2").fetchall()
    ]
    assert versions == [2]
    assert [entry["step_num"] for entry in second.list_for_turn(ALICE, "t", now=LATER)] == [1, 2]
    assert second.verify(now=LATER)["ok"]


def _turn_head(path: Path) -> tuple[int, bytes]:
    row = (
        apsw.Connection(str(path)).execute("SELECT key_version, sealed FROM turn_heads WHERE turn_id = 't'").fetchone()
    )
    assert row is not None
    return int(row[0]), bytes(row[1])


def _set_turn_head(path: Path, version: int, sealed: bytes) -> None:
    apsw.Connection(str(path)).execute(
        "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE turn_id = 't'", (version, sealed)
    )


def _entries(path: Path) -> int:
    row = apsw.Connection(str(path)).execute("SELECT COUNT(*) FROM entries").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("edit", ["sealed", "key_version"])
def test_a_head_edited_in_the_file_is_refused_and_nothing_is_stored(db_path: Path, keyring: Keyring, edit: str) -> None:
    with Scratchpad.open(db_path, keyring=keyring, anchor=False, clock=lambda: NOW) as pad:
        pad.put(ALICE, "t", 1, "tool", "one", now=NOW)
        version, sealed = _turn_head(db_path)
        if edit == "sealed":
            _set_turn_head(db_path, version, sealed[:-1] + bytes([sealed[-1] ^ 1]))
        else:
            _set_turn_head(db_path, version + 1, sealed)
        with pytest.raises(SecurepadError):
            pad.put(ALICE, "t", 2, "tool", "two", now=NOW)
        assert _entries(db_path) == 1


def test_a_head_put_back_to_the_one_sealed_here_is_found_by_the_reads(two: tuple[Scratchpad, Scratchpad]) -> None:
    first, second = two
    path = sqlite_of(first).path
    first.put(ALICE, "t", 1, "tool", "one", now=NOW)
    sealed_here = _turn_head(path)
    second.put(ALICE, "t", 2, "tool", "two", now=NOW)
    _set_turn_head(path, *sealed_here)  # the other writer's entry left out of the head
    first.put(ALICE, "t", 3, "tool", "three", now=NOW)  # goes on from that head (SECURITY.md)
    with pytest.raises(IntegrityError):
        first.list_for_turn(ALICE, "t", now=LATER)
    assert not second.verify(now=LATER)["ok"]


def test_a_put_after_the_owner_or_the_turn_went_elsewhere_starts_the_turn_again(
    two: tuple[Scratchpad, Scratchpad],
) -> None:
    first, second = two
    first.put(ALICE, "t", 1, "tool", "one", now=NOW)
    second.forget_owner(ALICE.owner_user_id)
    first.put(ALICE, "t", 2, "tool", "two", now=NOW)
    assert [entry["step_num"] for entry in second.list_for_turn(ALICE, "t", now=LATER)] == [2]
    second.drop_turn(ALICE.owner_user_id, "t")
    first.put(ALICE, "t", 3, "tool", "three", now=NOW)
    assert [entry["step_num"] for entry in second.list_for_turn(ALICE, "t", now=LATER)] == [3]
    assert second.verify(now=LATER)["ok"]


def test_an_entry_deleted_elsewhere_leaves_the_kept_inventory_right(two: tuple[Scratchpad, Scratchpad]) -> None:
    first, second = two
    one = first.put(ALICE, "t", 1, "tool", "one", now=NOW)["scratchpad_id"]
    first.put(ALICE, "t", 2, "tool", "two", now=NOW)
    first.list_for_turn(ALICE, "t", now=NOW)  # the turn's inventory verified and kept
    second.delete(ALICE, one, now=NOW)
    first.put(ALICE, "t", 3, "tool", "three", now=NOW)
    assert [entry["step_num"] for entry in first.list_for_turn(ALICE, "t", now=NOW)] == [2, 3]
    assert first.verify(now=LATER)["ok"]


@pytest.mark.parametrize("same_connection", [False, True])
def test_a_row_removed_in_the_file_is_found_after_a_put_that_kept_the_inventory(
    db_path: Path, keyring: Keyring, same_connection: bool
) -> None:
    with Scratchpad.open(db_path, keyring=keyring, anchor=False, clock=lambda: NOW) as pad:
        one = pad.put(ALICE, "t", 1, "tool", "one", now=NOW)["scratchpad_id"]
        pad.put(ALICE, "t", 2, "tool", "two", now=NOW)
        pad.list_for_turn(ALICE, "t", now=NOW)  # the turn's inventory verified and kept
        # On the store's own connection the data version does not move: the read's rows still count.
        editor = sqlite_of(pad).conn if same_connection else apsw.Connection(str(db_path))
        editor.execute("DELETE FROM entries WHERE id = ?", (one,))
        pad.put(ALICE, "t", 3, "tool", "three", now=NOW)  # edits the kept inventory
        with pytest.raises(IntegrityError):
            pad.list_for_turn(ALICE, "t", now=NOW)
