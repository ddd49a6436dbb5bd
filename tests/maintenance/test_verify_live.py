"""``verify`` on a store that other writers use at the same time.

The check reads the heads, the entries, each entry's segments and the turn
records in several statements. Every one of them runs in one read snapshot
(``Backend.snapshot``), so what other connections commit in between is not
seen half-way: no problem is reported for a store that is only being
written, while a real edit is still found.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.store import parts
from securepad.turn import record_next
from tests.support.principals import ALICE, BOB
from tests.support.tamper_edits import as_admin, delete_entry, on_sqlite

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # ~4 KiB: one segment
LONG = TEXT * 40  # ~160 KiB: several segments, fetched by a statement of their own


def _writes(pad: Scratchpad, tag: str = "") -> Iterator[Callable[[], object]]:
    """Writes of every kind that changes a turn: a put into a new turn and into a
    known one (one message on PostgreSQL), an entry of several segments, a
    batch, a step the library takes, a checkpoint, a compaction mark, a delete
    (each writer its own ``tag``: the given steps of two writers never meet)."""
    for n in itertools.count():
        owner = ALICE if n % 2 else BOB
        turn = f"w{n % 3}"
        yield lambda owner=owner, n=n: pad.put(owner, f"new{tag}{n}", 1, "tool", TEXT)
        yield lambda owner=owner, turn=turn, n=n: pad.put(owner, turn + tag, 1000 + n, "tool", TEXT)
        yield lambda owner=owner, turn=turn, n=n: pad.put(owner, turn + tag, 5000 + n, "tool", LONG)
        yield lambda owner=owner, turn=turn, n=n: pad.put_many(
            owner, f"{turn}b{tag}{n}", [(s, "tool", TEXT) for s in (1, 2)]
        )
        yield lambda owner=owner, turn=turn: pad.turn(owner, turn + "b").record_many([("tool", TEXT), ("tool", "x")])
        yield lambda owner=owner, turn=turn: record_next(pad.turn(owner, turn), "tool", TEXT)
        yield lambda owner=owner, turn=turn, n=n: pad.turn(owner, turn).checkpoint(facts=[f"fact {n}"])
        yield lambda owner=owner, turn=turn: pad.turn(owner, turn).mark_compaction()
        yield lambda owner=owner, n=n: pad.delete(
            owner, pad.put(owner, f"gone{tag}{n}", 1, "tool", TEXT)["scratchpad_id"]
        )


def _seed(pad: Scratchpad) -> None:
    for owner in (ALICE, BOB):
        for turn in ("w0", "w1", "w2"):
            pad.put(owner, turn, 1, "tool", TEXT)
            pad.put(owner, turn, 2, "tool", LONG)


def test_writes_committed_between_verifys_statements_are_not_reported(
    pad: Scratchpad, store_location: Any, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another store object (another process, as far as this one can tell)
    commits a write before each of verify's statements: verify sees none of them."""
    _seed(pad)
    db = parts(pad).db
    with Scratchpad.open(store_location, keyring=keyring) as writer:
        writes = _writes(writer)
        query = db.query
        done: list[int] = []

        def writing_first(*args: Any, **kwargs: Any) -> Any:
            next(writes)()
            done.append(1)
            return query(*args, **kwargs)

        monkeypatch.setattr(db, "query", writing_first)
        report = pad.verify()
        monkeypatch.undo()
        assert len(done) >= 10  # a write before each statement: heads, keys, entries, segments, records
        assert report["problems"] == []
        assert report["ok"]
        after = pad.verify()
    assert after["ok"], after["problems"]
    assert after["entries"] > report["entries"]  # the writes landed, after the snapshot verify read


def test_verify_under_concurrent_writers_reports_nothing(
    pad: Scratchpad, store_location: Any, keyring: Keyring
) -> None:
    """Two writer threads, each with a store object of its own, write without
    pause while verify runs again and again: no run reports a problem."""
    _seed(pad)
    stop = threading.Event()
    failed: list[BaseException] = []
    written = [0, 0]

    def write(index: int) -> None:
        try:
            with Scratchpad.open(store_location, keyring=keyring) as writer:
                for call in _writes(writer, str(index)):
                    if stop.is_set():
                        return
                    call()
                    written[index] += 1
        except BaseException as exc:  # reported by the test, not lost in the thread
            failed.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    reports = []
    try:
        for _ in range(12):
            before = sum(written)
            reports.append(pad.verify())
            while sum(written) == before and not failed:  # at least one write between two runs
                threading.Event().wait(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failed, failed
    assert [r["problems"] for r in reports if not r["ok"]] == []
    assert sum(written) >= 12


def test_a_deleted_entry_is_found_while_writers_write_other_turns(
    pad: Scratchpad, store_location: Any, backend: str, keyring: Keyring
) -> None:
    """A real edit (an entry deleted under its head) is still found with writers at work."""
    ids = [pad.put(ALICE, "kept", step, "tool", TEXT)["scratchpad_id"] for step in (1, 2, 3)]
    _seed(pad)
    with on_sqlite(store_location) if backend == "sqlite" else as_admin(str(store_location)) as raw:
        delete_entry(raw, ids[1])
    stop = threading.Event()

    def write() -> None:
        with Scratchpad.open(store_location, keyring=keyring) as writer:
            for call in _writes(writer):
                if stop.is_set():
                    return
                call()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        reports = [pad.verify() for _ in range(3)]
    finally:
        stop.set()
        thread.join()
    for report in reports:
        assert [(p["owner_user_id"], p["turn_id"], p["what"]) for p in report["problems"]] == [
            ("alice", "kept", "turn")
        ]
        (problem,) = report["problems"]
        assert problem["missing_steps"] == [[2, 2]]
