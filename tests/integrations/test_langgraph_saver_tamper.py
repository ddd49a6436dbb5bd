"""Edits of the SQLite file under ``SecurepadSaver``, as an attacker with write
access to the file (and no key) would make them.

Every checkpoint, pending write and channel value is a sealed entry bound to
its owner, turn (thread / channel) and step, and a
checkpoint names the entries of its big values. Deleting the newest
checkpoint or a pending write is refused by the turn's sealed head (issue
14); rolling the whole file back by the store's snapshot-rollback anchor.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import pytest

from securepad import IntegrityError, Keyring, Principal, Scratchpad
from tests.support.tamper_edits import edit_file

if TYPE_CHECKING:
    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

BIG = "b" * 50_000


def _put(saver: SecurepadSaver, thread_id: str, parent: Any, small: int, new: dict[str, str]) -> Any:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    config = generate_config(thread_id)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    versions = {"big": "1", "small": str(small)}
    checkpoint = generate_checkpoint(channel_values={"big": BIG, "small": small}, channel_versions=versions)
    return saver.put(config, checkpoint, generate_metadata(step=small), new)


class World:
    """Two threads of alice and one of bob, each: a checkpoint with a big value,
    a second one with pending writes."""

    def __init__(self, db_path: Path, keyring: Keyring) -> None:
        self.db_path, self.keyring = db_path, keyring
        self.configs: dict[tuple[str, str], list[Any]] = {}
        for owner in ("alice", "bob"):
            with self.saver(owner) as saver:
                for thread_id in ("t1", "t2") if owner == "alice" else ("t1",):
                    first = _put(saver, thread_id, None, 1, {"big": "1", "small": "1"})
                    second = _put(saver, thread_id, first, 2, {"small": "2"})
                    saver.put_writes(second, [("small", 3), ("note", "pending")], "task-1")
                    self.configs[(owner, thread_id)] = [first, second]

    def saver(self, owner: str = "alice") -> Any:
        from securepad.integrations.langgraph import SecurepadSaver

        world = self

        class Opened:
            def __enter__(self) -> SecurepadSaver:
                self.pad = Scratchpad.open(world.db_path, keyring=world.keyring)
                return SecurepadSaver(self.pad, Principal(owner, "graph", "api"))

            def __exit__(self, *exc: object) -> None:
                self.pad.close()

        return Opened()

    def latest(self, thread_id: str = "t1", owner: str = "alice") -> Any:
        from langgraph.checkpoint.conformance.test_utils import generate_config

        with self.saver(owner) as saver:
            return saver.get_tuple(generate_config(thread_id))

    def listed(self, thread_id: str = "t1", owner: str = "alice") -> list[Any]:
        from langgraph.checkpoint.conformance.test_utils import generate_config

        with self.saver(owner) as saver:
            return list(saver.list(generate_config(thread_id)))

    def turn(self, kind: str, *parts: Any) -> str:
        """The keyed name of alice's turn of ``kind`` for ``parts`` (it needs the store's key)."""
        from securepad.integrations.langgraph_saver import keyed_turn

        with Scratchpad.open(self.db_path, keyring=self.keyring) as pad:
            return keyed_turn(pad, Principal("alice", "graph", "api"), kind, *parts)

    def ids(self, executor: str, turn: str) -> list[str]:
        conn = apsw.Connection(str(self.db_path))
        try:
            sql = "SELECT id FROM entries WHERE executor_name = ? AND turn_id = ? AND owner_user_id = 'alice'"
            return [row[0] for row in conn.execute(sql, (executor, turn))]
        finally:
            conn.close()


@pytest.fixture
def world(db_path: Path, keyring: Keyring) -> Iterator[World]:
    built = World(db_path, keyring)
    assert built.latest().pending_writes == [("task-1", "small", 3), ("task-1", "note", "pending")]
    yield built


def test_an_untouched_file_reads_back(world: World) -> None:
    latest = world.latest()
    assert latest.checkpoint["channel_values"] == {"big": BIG, "small": 2}
    assert len(world.listed()) == 2


# -- refused today -----------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["langgraph.checkpoint", "langgraph.write"])
def test_an_edited_checkpoint_or_write_is_refused(world: World, executor: str) -> None:
    """Small checkpoints and writes live in the entry's listing part (its sealed metadata in rows written before it)."""
    conn = apsw.Connection(str(world.db_path))
    try:
        sql = "SELECT id, sealed_listing FROM entries WHERE executor_name = ? AND owner_user_id = 'alice' LIMIT 1"
        entry_id, sealed = next(conn.execute(sql, (executor,)))
    finally:
        conn.close()
    changed = bytearray(sealed)
    changed[len(changed) // 2] ^= 1
    edit_file(world.db_path, "UPDATE entries SET sealed_listing = ? WHERE id = ?", bytes(changed), entry_id)
    with pytest.raises(IntegrityError):
        world.listed("t1")
        world.listed("t2")


def test_an_edited_big_value_is_refused(world: World) -> None:
    (value,) = world.ids("langgraph.blob", world.turn("values", "t1", "", "big"))
    # One segment: kept in the entry's row (migration 8).
    edit_file(world.db_path, "UPDATE entries SET only_segment = zeroblob(length(only_segment)) WHERE id = ?", value)
    with pytest.raises(IntegrityError):
        world.latest()


def test_a_deleted_big_value_is_refused(world: World) -> None:
    assert edit_file(
        world.db_path, "DELETE FROM entries WHERE executor_name = 'langgraph.blob' AND owner_user_id = 'alice'"
    )
    with pytest.raises(IntegrityError, match="missing"):
        world.latest()
    assert world.latest("t1", owner="bob").checkpoint["channel_values"]["big"] == BIG


def test_a_big_value_swapped_for_another_threads_is_refused(world: World) -> None:
    (one,) = world.ids("langgraph.blob", world.turn("values", "t1", "", "big"))
    (two,) = world.ids("langgraph.blob", world.turn("values", "t2", "", "big"))
    # The value of t2 put in place of t1's (same owner, channel, version and size).
    edit_file(
        world.db_path,
        "UPDATE entries SET only_segment = (SELECT only_segment FROM entries WHERE id = ?) WHERE id = ?",
        two,
        one,
    )
    with pytest.raises(IntegrityError):
        world.latest("t1")
    assert world.latest("t2").checkpoint["channel_values"]["big"] == BIG


def test_a_checkpoint_replayed_into_another_thread_is_refused(world: World) -> None:
    moved = world.ids("langgraph.checkpoint", world.turn("thread", "t2"))[0]
    edit_file(world.db_path, "UPDATE entries SET turn_id = ? WHERE id = ?", world.turn("thread", "t1"), moved)
    with pytest.raises(IntegrityError):
        world.latest("t1")


def test_a_pending_write_replayed_onto_another_thread_is_refused(world: World) -> None:
    """A write names its checkpoint in its sealed metadata and is bound to its
    thread's turn: moved into another thread's turn, it is refused there."""
    (moved,) = world.ids("langgraph.write", world.turn("thread", "t1"))
    assert edit_file(world.db_path, "UPDATE entries SET turn_id = ? WHERE id = ?", world.turn("thread", "t2"), moved)
    with pytest.raises(IntegrityError):
        world.listed("t2")
    with pytest.raises(IntegrityError):
        world.latest("t1")


def test_a_checkpoint_given_to_another_owner_is_refused(world: World) -> None:
    """Turn names are keyed with the owner: alice's rows relabelled to bob sit in
    turns that name none of bob's threads, so bob's thread reads as it was;
    alice's is refused (its head lists them) and verify finds the rows."""
    bobs = world.latest("t1", owner="bob").checkpoint
    edit_file(world.db_path, "UPDATE entries SET owner_user_id = 'bob' WHERE owner_user_id = 'alice'")
    assert world.latest("t1", owner="bob").checkpoint == bobs
    with pytest.raises(IntegrityError):  # alice's thread head still lists them
        world.latest("t1", owner="alice")
    with Scratchpad.open(world.db_path, keyring=world.keyring) as pad:
        assert pad.verify()["ok"] is False


def test_a_reordered_or_relabelled_entry_is_refused(world: World) -> None:
    edit_file(world.db_path, "UPDATE entries SET step_num = 5 WHERE executor_name = 'langgraph.write'")
    with pytest.raises(IntegrityError):
        world.latest()


# -- refused: the thread's turn head lists every entry -------------------------------


def test_deleting_the_newest_checkpoint_is_refused(world: World) -> None:
    second = world.configs[("alice", "t1")][1]["configurable"]["checkpoint_id"]
    with world.saver() as saver:  # which row is the newest checkpoint (the test may look; an attacker guesses)
        listed = saver.pad.list_for_turn(Principal("alice", "graph", "api"), world.turn("thread", "t1"))
    (newest,) = [
        item["scratchpad_id"]
        for item in listed
        if item["view"]["metadata"]["checkpoint_id"] == second and item["executor_name"] == "langgraph.checkpoint"
    ]
    assert edit_file(world.db_path, "DELETE FROM entries WHERE id = ?", newest) == 1
    with pytest.raises(IntegrityError):  # not the previous one served as the latest
        world.latest()
    with pytest.raises(IntegrityError):
        world.listed()


def test_deleting_an_older_checkpoint_is_refused(world: World) -> None:
    """Not only the tail: any checkpoint of the thread deleted from the file."""
    first = world.configs[("alice", "t1")][0]["configurable"]["checkpoint_id"]
    with world.saver() as saver:
        listed = saver.pad.list_for_turn(Principal("alice", "graph", "api"), world.turn("thread", "t1"))
    (older,) = [
        item["scratchpad_id"]
        for item in listed
        if item["view"]["metadata"]["checkpoint_id"] == first and item["executor_name"] == "langgraph.checkpoint"
    ]
    assert edit_file(world.db_path, "DELETE FROM entries WHERE id = ?", older) == 1
    with pytest.raises(IntegrityError):
        world.latest()
    with pytest.raises(IntegrityError):
        world.listed()


def test_deleting_pending_writes_is_refused(world: World) -> None:
    edit_file(world.db_path, "DELETE FROM entries WHERE executor_name = 'langgraph.write' AND owner_user_id = 'alice'")
    with pytest.raises(IntegrityError):
        world.latest()


# -- refused: the store's snapshot-rollback anchor -----------------------------------


def test_rolling_the_file_back_is_refused(world: World, tmp_path: Path) -> None:
    """The store's anchor (beside the key file) is above the older copy's write counter."""
    copy = tmp_path / "before.db"
    with world.saver() as saver:
        saver.pad.gc()  # the WAL into the file, so that the copy is whole
    shutil.copy(world.db_path, copy)
    with world.saver() as saver:
        saver.delete_thread("t1")
    assert world.latest() is None
    for suffix in ("-wal", "-shm"):
        Path(f"{world.db_path}{suffix}").unlink(missing_ok=True)
    shutil.copy(copy, world.db_path)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        world.latest()


def test_an_edited_large_checkpoint_is_refused(world: World) -> None:
    """A checkpoint above the metadata's 4 KiB is the entry's content."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    with world.saver() as saver:
        config = generate_config("t3")
        checkpoint = generate_checkpoint(channel_values={"mid": "m" * 8000}, channel_versions={"mid": "1"})
        saver.put(config, checkpoint, generate_metadata(), {"mid": "1"})
        assert world.latest("t3") is not None
    (entry,) = world.ids("langgraph.checkpoint", world.turn("thread", "t3"))
    sql = "UPDATE entries SET only_segment = zeroblob(length(only_segment)) WHERE id = ?"  # its one segment
    assert edit_file(world.db_path, sql, entry) == 1
    with pytest.raises(IntegrityError):
        world.latest("t3")
