"""Rotations of one owner's key that overlap, with reads and writes alongside.

A rotation adds a key version, re-wraps the owner's item keys chunk by chunk
and retires the old versions. Two rotations of one owner at once (two
processes, or two threads with a store object each) must each finish or
leave the work to the other, never report tampering for the library's own
race: each chunk reads its rows and their keys under the owner's lock, in
the transaction that re-wraps them, and a version another rotation retired
meanwhile has no row left to re-wrap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.maintenance import lifecycle
from securepad.store import parts
from tests.support.principals import ALICE, BOB

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(20))


def _run_together(calls: list[Callable[[], object]]) -> list[BaseException]:
    """Run each call in a thread of its own, started together; the exceptions they raised."""
    failed: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> None:
        try:
            start.wait()
            call()
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed


def test_overlapping_rotations_of_one_owner_raise_nothing_and_lose_nothing(
    pad: Scratchpad, store_location: Any, keyring: Keyring
) -> None:
    """Two store objects rotate alice's key at once, again and again, while a
    third reads her entries and writes new ones: no call fails, every entry
    reads, the store verifies and one key version is left."""
    ids = [pad.put(ALICE, "t", step, "tool", f"{step} {TEXT}")["scratchpad_id"] for step in range(1, 61)]
    pad.turn(ALICE, "t").checkpoint(facts=["a fact"])
    pad.put(BOB, "t", 1, "tool", "bob's")
    with (
        Scratchpad.open(store_location, keyring=keyring) as first,
        Scratchpad.open(store_location, keyring=keyring) as second,
    ):
        # Small chunks: many transactions, so the two rotations interleave.
        rotations = [first, second]
        stop = threading.Event()
        read_failures: list[BaseException] = []
        step = [100]

        def read_and_write() -> None:
            try:
                while not stop.is_set():
                    for entry in ids[::7]:
                        assert pad.get(ALICE, entry).observation.endswith(TEXT)
                    step[0] += 1
                    pad.put(ALICE, "t", step[0], "tool", f"{step[0]} {TEXT}")
            except BaseException as exc:  # reported by the test
                read_failures.append(exc)

        reader = threading.Thread(target=read_and_write)
        reader.start()
        try:
            for _ in range(6):
                failed = _run_together([lambda s=s: _rotate_in_chunks(s) for s in rotations])
                assert failed == []
        finally:
            stop.set()
            reader.join()
        assert read_failures == []
    for entry in ids:
        assert pad.get(ALICE, entry).observation.endswith(TEXT)
    assert pad.verify()["ok"]
    pad.rotate_owner_key("alice")  # a last one alone finishes whatever a rerun would
    assert parts(pad).keys.versions("alice") == [max(parts(pad).keys.versions("alice"))]


def _rotate_in_chunks(pad: Scratchpad) -> dict[str, Any]:
    """An owner rotation in chunks of 4 item keys (many transactions)."""
    got = parts(pad)
    return lifecycle.rotate_owner_key(got.db, got.keys, "alice", batch=4, heads=got.heads)


@pytest.mark.parametrize("rotations", [3])
def test_three_rotations_at_once_each_report_a_version_that_exists_or_is_newer(
    pad: Scratchpad, store_location: Any, keyring: Keyring, rotations: int
) -> None:
    """Three rotations started together: each returns, and the one key left
    is at least the newest version any of them reported."""
    for step in range(1, 41):
        pad.put(ALICE, "t", step, "tool", TEXT)
    stores = [Scratchpad.open(store_location, keyring=keyring) for _ in range(rotations)]
    try:
        for _ in range(4):
            results: list[dict[str, Any]] = []
            failed = _run_together([lambda s=s, r=results: r.append(_rotate_in_chunks(s)) for s in stores])
            assert failed == []
            newest = max(parts(pad).keys.versions("alice"))
            assert all(result["version"] <= newest for result in results)
    finally:
        for store in stores:
            store.close()
    assert pad.verify()["ok"]


def test_a_rotation_that_ends_inside_another_ones_chunk_is_no_tampering(
    pad: Scratchpad, store_location: Any, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other rotation re-wraps every row and retires the old version after
    this one read a chunk's rows and before it unwrapped their keys: the rows
    it read are re-wrapped already, not tampered with."""
    ids = [pad.put(ALICE, "t", step, "tool", f"{step} {TEXT}")["scratchpad_id"] for step in range(1, 11)]
    pad.turn(ALICE, "t").checkpoint(facts=["a fact"])
    finished: list[dict[str, Any]] = []
    with Scratchpad.open(store_location, keyring=keyring) as other:
        keys = parts(other).keys
        unwrap = keys.owner_wrapper

        def other_rotation_first(owner: str, version: int) -> Any:
            if version == 1 and not finished:  # the chunk's rows are read, their old key not yet
                finished.append(pad.rotate_owner_key("alice"))
            return unwrap(owner, version)

        monkeypatch.setattr(keys, "owner_wrapper", other_rotation_first)
        result = other.rotate_owner_key("alice")
    assert finished[0]["complete"] and finished[0]["retired_versions"] == [1]
    assert result["complete"] and result["version"] == 2
    assert parts(pad).keys.versions("alice") == [2]
    assert [pad.get(ALICE, entry).observation.split(" ")[0] for entry in ids] == [str(n) for n in range(1, 11)]
    assert pad.verify()["ok"]


def test_a_row_whose_key_version_is_edited_to_a_missing_one_still_fails_the_rotation(
    pad: Scratchpad, store_location: Any, backend: str
) -> None:
    """Not the library's race: a row under a version no key has (an edit) is tampering."""
    from securepad import IntegrityError
    from tests.support.tamper_edits import as_admin, on_sqlite

    entry = pad.put(ALICE, "t", 1, "tool", TEXT)["scratchpad_id"]
    pad.put(ALICE, "t", 2, "tool", TEXT)
    with on_sqlite(store_location) if backend == "sqlite" else as_admin(str(store_location)) as raw:
        raw.execute("UPDATE entries SET key_version = 0 WHERE id = ?", (entry,))
    with pytest.raises(IntegrityError, match="owner key"):
        pad.rotate_owner_key("alice")


def test_a_rotation_that_read_an_old_version_list_never_makes_a_retired_version_again(pad: Scratchpad) -> None:
    """A rotation that read the versions before two others ran adds no key
    under a version they used and retired (it would carry other key material)."""
    pad.put(ALICE, "t", 1, "tool", TEXT)
    pad.rotate_owner_key("alice")
    pad.rotate_owner_key("alice")
    keys = parts(pad).keys
    assert keys.versions("alice") == [3]
    keys.add_version("alice", 2, admin=True)  # what the late rotation does with the versions it read ([1])
    assert keys.versions("alice") == [3]
    assert pad.verify()["ok"]
