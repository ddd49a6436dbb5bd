"""The read cost: a read reuses its turn's verified inventory (``reading.HeadCache``) while its token holds.

A warm read in an unchanged store checks its rows against the inventory
verified before and fetches none of it: the same statements and rows in a
1-step turn as in a 300-step one. The token is SQLite's ``PRAGMA
data_version`` of the reading connection, which moves with every commit of
another connection: an edit made through another connection after warm reads
(each kind below) is refused by the next warm read, as by a cold one. This
process's own writes drop what they change (``Heads.change``): a warm read
after a put, a checkpoint, an extension, a delete, gc, a rotation or forgetting
an owner sees the new state, never a false alarm, with several threads and
processes writing too.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError, NotFoundError
from securepad.store import parts
from securepad.tables.heads.reading import CACHE_TURNS, HeadCache
from securepad.tables.heads.tally import Head
from tests.support.meters import ReadMeter
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import raw_file, record_batches

LATER = NOW + 100
TURN = "t1"


def _warm(pad: Scratchpad, ids: list[str], turn: str = TURN) -> None:
    """Every read the tests repeat, twice: the second one runs on the cache."""
    for _ in range(2):
        pad.get(ALICE, ids[0], now=LATER)
        pad.read(ALICE, ids[-1], "tail", n=100, now=LATER)
        pad.turn(ALICE, turn, now=LATER).history(now=LATER)
        pad.turn(ALICE, turn, now=LATER).latest_checkpoint(now=LATER)


@pytest.fixture
def warm(db_path: Path, keyring: Keyring) -> Iterator[dict[str, Any]]:
    """An open store whose turn was read (warm), and what the edits need."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = record_batches(pad, ALICE, TURN, 5)
        with raw_file(db_path) as conn:
            head = conn.execute("SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,))
            older_head = head.fetchall()[0][0]
            older_meta = conn.execute("SELECT expires_at, sealed_meta FROM entries WHERE id = ?", (ids[0],)).fetchall()
        pad.turn(ALICE, TURN, now=NOW).resume(extend_ttl=7200, now=NOW + 10)  # rewrites the head and the metas
        _warm(pad, ids)
        assert ReadMeter(pad).counts(lambda: pad.get(ALICE, ids[2], now=LATER))["rows"] == 2  # warm: no inventory
        yield {"pad": pad, "path": db_path, "ids": ids, "older_head": older_head, "older_meta": older_meta[0]}


def _delete(conn: apsw.Connection, entry_id: str) -> None:
    conn.execute("DELETE FROM segments WHERE entry_id = ?", (entry_id,))
    conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,))


def tail_deletion(conn: apsw.Connection, s: dict[str, Any]) -> None:
    for entry_id in s["ids"][3:]:
        _delete(conn, entry_id)


def middle_deletion(conn: apsw.Connection, s: dict[str, Any]) -> None:
    _delete(conn, s["ids"][2])


def expiry_moved_earlier(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (NOW + 50, s["ids"][2]))


def owner_relabelled(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute("UPDATE entries SET owner_user_id = 'mallory' WHERE id = ?", (s["ids"][2],))


def turn_relabelled(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute("UPDATE entries SET turn_id = 't9' WHERE id = ?", (s["ids"][2],))


def stored_bytes_changed(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute("UPDATE entries SET stored_bytes = 1 WHERE id = ?", (s["ids"][0],))


def row_rolled_back(conn: apsw.Connection, s: dict[str, Any]) -> None:
    """An entry's expiry and sealed metadata put back as they were before ``resume(extend_ttl=...)``."""
    conn.execute("UPDATE entries SET expires_at = ?, sealed_meta = ? WHERE id = ?", (*s["older_meta"], s["ids"][0]))


def newest_checkpoint_deleted(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute(
        "DELETE FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = ? AND seq ="
        " (SELECT MAX(seq) FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = ?)",
        (TURN, TURN),
    )


def head_deleted(conn: apsw.Connection, s: dict[str, Any]) -> None:
    conn.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,))


def head_rolled_back(conn: apsw.Connection, s: dict[str, Any]) -> None:
    """The turn's head put back as it was before the resume (a genuine older head)."""
    conn.execute(
        "UPDATE turn_heads SET sealed = ? WHERE owner_user_id = 'alice' AND turn_id = ?", (s["older_head"], TURN)
    )


EDITS: list[Callable[[apsw.Connection, dict[str, Any]], None]] = [
    tail_deletion,
    middle_deletion,
    expiry_moved_earlier,
    owner_relabelled,
    turn_relabelled,
    stored_bytes_changed,
    row_rolled_back,
    newest_checkpoint_deleted,
    head_deleted,
    head_rolled_back,
]
# The entry each edit touched (get and read of it are refused), when one.
TOUCHED = {
    tail_deletion: 4,
    middle_deletion: 2,
    expiry_moved_earlier: 2,
    owner_relabelled: 2,
    turn_relabelled: 2,
    stored_bytes_changed: 0,
    row_rolled_back: 0,
}
READS: dict[str, Callable[[Scratchpad, list[str]], Any]] = {
    "history": lambda pad, ids: pad.turn(ALICE, TURN, now=LATER).history(now=LATER),
    "list_for_turn": lambda pad, ids: pad.list_for_turn(ALICE, TURN, now=LATER),
    "latest_checkpoint": lambda pad, ids: pad.turn(ALICE, TURN, now=LATER).latest_checkpoint(now=LATER),
    "tools": lambda pad, ids: pad.turn(ALICE, TURN, now=LATER).tools(now=LATER),
}


# latest_checkpoint and tools look at no entry row but the newest: they are left the
# edits of an older entry's columns (the turn reads above refuse those).
_NOT_SEEN = {
    "latest_checkpoint": {expiry_moved_earlier, stored_bytes_changed, row_rolled_back},
    "tools": {expiry_moved_earlier, stored_bytes_changed, row_rolled_back, newest_checkpoint_deleted},
}


@pytest.mark.parametrize(
    ("read", "edit"),
    [(read, edit) for read in READS for edit in EDITS if edit not in _NOT_SEEN.get(read, set())],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_an_edit_through_another_connection_is_refused_by_the_next_warm_turn_read(
    warm: dict[str, Any], read: str, edit: Any
) -> None:
    with raw_file(warm["path"]) as conn:
        edit(conn, warm)
    with pytest.raises(IntegrityError):
        READS[read](warm["pad"], warm["ids"])


@pytest.mark.parametrize("edit", list(TOUCHED), ids=lambda edit: edit.__name__)
def test_an_edit_through_another_connection_is_refused_by_the_next_warm_get_and_read(
    warm: dict[str, Any], edit: Any
) -> None:
    with raw_file(warm["path"]) as conn:
        edit(conn, warm)
    entry = warm["ids"][TOUCHED[edit]]
    deleted = edit in (tail_deletion, middle_deletion)
    with pytest.raises(NotFoundError if deleted or edit is owner_relabelled else IntegrityError):
        warm["pad"].get(ALICE, entry, now=LATER)
    with pytest.raises(NotFoundError if deleted or edit is owner_relabelled else IntegrityError):
        warm["pad"].read(ALICE, entry, "tail", n=100, now=LATER)
    if deleted or edit is owner_relabelled:  # the entry is gone from the owner: its turn says so
        with pytest.raises(IntegrityError):
            warm["pad"].get(ALICE, warm["ids"][1], now=LATER)


def test_a_genuine_write_through_another_connection_is_seen_by_the_next_warm_read(
    warm: dict[str, Any], keyring: Keyring
) -> None:
    """Another store object (its own connections) writes: the warm reader's token moved; it verifies again."""
    with Scratchpad.open(warm["path"], keyring=keyring) as other:
        other.put(ALICE, TURN, 6, "fetch", "from another connection", now=NOW)
    pad = warm["pad"]
    assert [s["step_num"] for s in pad.turn(ALICE, TURN, now=LATER).steps(now=LATER)] == [1, 2, 3, 4, 5, 6]
    assert len(pad.turn(ALICE, TURN, now=LATER).history(now=LATER)) == 6


# -- what a warm read costs -----------------------------------------------------------------


def test_a_warm_read_fetches_no_inventory_whatever_the_turn_length(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        tails = {length: record_batches(pad, ALICE, f"length-{length}", length)[-1] for length in (1, 300)}
        meter = ReadMeter(pad)
        costs = {}
        heads = parts(pad).heads
        for length, entry in tails.items():
            turn = f"length-{length}"
            # The turns this connection wrote are kept verified: emptied, as another process's first read finds them.
            heads.cache_limit(0)
            heads.cache_limit(CACHE_TURNS)
            cold = meter.counts(lambda entry=entry: pad.read(ALICE, entry, "tail", n=2000, now=LATER))
            handle = pad.turn(ALICE, turn, now=LATER)  # opening a turn collects what expired (nothing here)
            handle.history(now=LATER)
            warm_read = meter.counts(lambda entry=entry: pad.read(ALICE, entry, "tail", n=2000, now=LATER))
            warm_get = meter.counts(lambda entry=entry: pad.get(ALICE, entry, now=LATER))
            history = meter.counts(lambda handle=handle: handle.history(now=LATER))
            latest = meter.counts(lambda handle=handle: handle.latest_checkpoint(now=LATER))
            assert cold["rows"] >= length + 4  # the first read of the turn: its head rows and inventory
            costs[length] = (warm_read, warm_get, latest)
            assert warm_get == warm_read
            # A warm history fetches the turn's own rows and the token, nothing else.
            assert history == {"statements": 2, "rows": length + 1, "calls": 1}
        # The entry's row and the token: the same in a 1-step turn as in a 300-step turn.
        assert costs[1] == costs[300]
        assert costs[1][0] == {"statements": 2, "rows": 2, "calls": 1}
        # The turn's live checkpoints (its scope's sequence), the newest one, the token.
        assert costs[1][2]["statements"] == 3


def test_without_the_cache_every_read_fetches_the_inventory(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry = record_batches(pad, ALICE, TURN, 20)[-1]
        parts(pad).heads.cache_limit(0)
        meter = ReadMeter(pad)
        for _ in range(3):
            assert meter.counts(lambda: pad.read(ALICE, entry, "tail", n=100, now=LATER))["rows"] >= 24


def test_a_write_of_this_process_edits_the_cached_turn_and_the_next_read_fetches_no_inventory(
    db_path: Path, keyring: Keyring
) -> None:
    # The anchor advanced in each write's own commit: no background commit comes between the put and the reads.
    with Scratchpad.open(db_path, keyring=keyring, policy=Policy(anchor_sync="commit")) as pad:
        ids = record_batches(pad, ALICE, TURN, 3)
        other = record_batches(pad, ALICE, "t2", 3)
        _warm(pad, ids)
        _warm(pad, other, "t2")
        meter = ReadMeter(pad)
        four = pad.put(ALICE, TURN, 4, "fetch", "four", now=NOW)["scratchpad_id"]
        # The write applied its own edit to the turn's cached inventory: no recount, and the new entry is in it.
        assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER))["rows"] == 2
        assert meter.counts(lambda: pad.get(ALICE, four, now=LATER))["rows"] == 2
        assert meter.counts(lambda: pad.get(ALICE, other[0], now=LATER))["rows"] == 2
        assert [view["step_num"] for view in pad.list_for_turn(ALICE, TURN, now=LATER)] == [1, 2, 3, 4]


# -- own writes: never a false alarm, always the new state ----------------------------------


def _history(pad: Scratchpad, turn: str = TURN, now: float = LATER) -> list[int]:
    return [item["step_num"] for item in pad.turn(ALICE, turn, now=now).steps(now=now)]


def test_every_kind_of_write_keeps_warm_reads_right(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = record_batches(pad, ALICE, TURN, 3)
        _warm(pad, ids)
        turn = pad.turn(ALICE, TURN, now=NOW)
        new = pad.put(ALICE, TURN, 4, "fetch", "put", ttl_seconds=60, now=NOW)["scratchpad_id"]
        assert _history(pad, now=NOW + 1) == [1, 2, 3, 4]
        assert pad.get(ALICE, new, now=NOW + 1).observation == "put"
        turn.record(5, "fetch", "recorded", now=NOW)
        assert _history(pad, now=NOW + 1) == [1, 2, 3, 4, 5]
        turn.checkpoint(facts=["third"], now=NOW + 2)
        assert turn.latest_checkpoint(now=NOW + 3)["facts"] == ["third"]  # type: ignore[index]
        assert turn.resume(extend_ttl=7200, now=NOW + 3)["extended"] >= 1
        assert pad.get(ALICE, ids[0], now=NOW + 4000).observation.startswith("observation 1")
        pad.delete(ALICE, ids[1], now=NOW + 5)
        assert _history(pad, now=NOW + 6) == [1, 3, 4, 5]
        with pytest.raises(NotFoundError):
            pad.get(ALICE, ids[1], now=NOW + 6)
        pad.put(ALICE, TURN, 6, "fetch", "short-lived", ttl_seconds=10, now=NOW)
        assert _history(pad, now=NOW + 6) == [1, 3, 4, 5, 6]
        listed = pad.list_for_turn(ALICE, TURN, now=NOW + 20)  # expired: absent, not tampering
        assert [view["step_num"] for view in listed] == [1, 3, 4, 5]
        assert pad.gc(now=NOW + 20) >= 1
        assert _history(pad, now=NOW + 20) == [1, 3, 4, 5]
        pad.rotate_owner_key("alice")
        assert _history(pad, now=NOW + 20) == [1, 3, 4, 5]
        assert pad.get(ALICE, ids[0], now=NOW + 20).observation.startswith("observation 1")
        pad.forget_owner("alice")
        assert _history(pad, now=NOW + 20) == []
        with pytest.raises(NotFoundError):
            pad.get(ALICE, ids[0], now=NOW + 20)
        pad.put(ALICE, TURN, 1, "fetch", "after forgetting", now=NOW)
        assert _history(pad, now=NOW + 20) == [1]
        assert pad.verify(now=NOW + 20)["ok"]


def test_threads_writing_and_reading_never_see_a_false_alarm(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        record_batches(pad, ALICE, TURN, 2)
        errors: list[BaseException] = []

        def writer(turn: str) -> None:
            try:
                for step in range(1, 16):
                    pad.put(ALICE, turn, step, "fetch", f"{turn} {step}", now=NOW)
                    pad.put(ALICE, TURN, 100 + step + (100 if turn == "w2" else 0), "fetch", "shared", now=NOW)
            except BaseException as exc:
                errors.append(exc)

        def reader() -> None:
            try:
                for _ in range(40):
                    steps = _history(pad)
                    assert steps == sorted(steps) and steps[:2] == [1, 2]
                    for view in pad.list_for_turn(ALICE, TURN, now=LATER)[-2:]:
                        pad.get(ALICE, view["scratchpad_id"], now=LATER)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in (1, 2)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(_history(pad)) == 2 + 30
        assert pad.verify(now=LATER)["ok"]


def _write_in_a_process(path: str, key: str, turn: str, steps: int) -> None:
    with Scratchpad.open(Path(path), keyring=Keyring.from_key_file(Path(key))) as pad:
        for step in range(1, steps + 1):
            pad.put(ALICE, turn, 1000 + step, "fetch", f"process {os.getpid()}", now=NOW)


@pytest.mark.slow
def test_processes_writing_while_a_warm_reader_reads(db_path: Path, keyring: Keyring, key_file: Path) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        record_batches(pad, ALICE, TURN, 2)
        _history(pad)
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=_write_in_a_process, args=(str(db_path), str(key_file), TURN, 10))]
        workers += [context.Process(target=_write_in_a_process, args=(str(db_path), str(key_file), "t2", 10))]
        for worker in workers:
            worker.start()
        seen = 0
        while any(worker.is_alive() for worker in workers) or seen < 12:
            steps = _history(pad)
            assert steps[:2] == [1, 2] and steps == sorted(steps)
            seen = len(steps)
            if not any(worker.is_alive() for worker in workers):
                break
        for worker in workers:
            worker.join()
            assert worker.exitcode == 0
        assert len(_history(pad)) == 12


# -- the cache itself -----------------------------------------------------------------------


class _Scope:
    """A stand-in for a connection: any object that can be weakly referenced."""


def _head(rows: int) -> Head:
    return Head(e={f"{i:016x}": [i, NOW, 1, "a", "c"] for i in range(rows)})


def test_the_cache_keeps_the_most_recently_used_turns_within_its_bounds() -> None:
    cache = HeadCache(turns=2, rows=100)
    scope = _Scope()
    for turn in ("a", "b", "c"):
        cache.put(scope, "o", turn, (1,), _head(10))
    assert cache.get(scope, "o", "a") is None
    assert cache.get(scope, "o", "b") is not None  # b is now the most recently used
    cache.put(scope, "o", "d", (1,), _head(10))
    assert cache.get(scope, "o", "c") is None and cache.get(scope, "o", "b") is not None
    cache.put(scope, "o", "big", (1,), _head(95))  # over the row bound: the older turns go
    assert cache.get(scope, "o", "b") is None and cache.get(scope, "o", "big") is not None
    cache.limit(0)
    assert cache.get(scope, "o", "big") is None
    cache.put(scope, "o", "a", (1,), _head(1))
    assert cache.get(scope, "o", "a") is None  # off: nothing kept


def test_an_entry_belongs_to_its_scope() -> None:
    cache = HeadCache()
    first, second = _Scope(), _Scope()
    cache.put(first, "o", "t", (7,), _head(2))
    assert cache.get(second, "o", "t") is None and cache.listing(second, "o", f"{1:016x}") is None
    listed = cache.listing(first, "o", f"{1:016x}")
    assert listed is not None and listed.token == (7,)
    assert cache.listing(first, "o", f"{5:016x}") is None and cache.listing(first, "p", f"{1:016x}") is None
    cache.drop("o", "t")
    assert cache.get(first, "o", "t") is None


def test_an_entry_of_a_connection_gone_is_never_taken_for_another_at_the_same_address() -> None:
    cache = HeadCache()
    scope = _Scope()
    cache.put(scope, "o", "t", (1,), _head(1))
    address = id(scope)
    del scope
    for _ in range(1000):  # find a new object at the old address, if the allocator reuses it
        other = _Scope()
        if id(other) == address:
            assert cache.get(other, "o", "t") is None
            break


def _child_sees(cache: HeadCache, scope: object, out: Any) -> None:
    out.put(cache.get(scope, "o", "t") is None)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_starts_with_an_empty_cache() -> None:
    cache = HeadCache()
    scope = _Scope()
    cache.put(scope, "o", "t", (1,), _head(1))
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_sees, args=(cache, scope, out))
    child.start()
    child.join()
    assert out.get(timeout=10) is True
    assert cache.get(scope, "o", "t") is not None  # the parent keeps its own


def test_threads_share_the_cache_safely() -> None:
    cache = HeadCache(turns=16)
    scope = _Scope()
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            for i in range(2000):
                turn = f"t{(i + worker) % 40}"
                cache.put(scope, "o", turn, (i,), _head(2))
                cache.get(scope, "o", turn)
                cache.listing(scope, "o", "0" * 16)
                if i % 7 == 0:
                    cache.drop("o", turn)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_benchmark_s_read_length_counts_are_the_ones_the_docs_give(db_path: Path, keyring: Keyring) -> None:
    """``python -m benchmarks.heads``'s read_length section (no timing asserted)."""
    from benchmarks.heads import read_length

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        result = read_length(pad, (1, 20), repeat=2)
    for length in (1, 20):
        sides = result[f"{length}_steps"]
        assert (sides["cache"]["statements"], sides["cache"]["rows"]) == (2, 2)
        # The entry, the turn's head and owner head, its rows, the owner's key version, the token.
        assert (sides["no_cache"]["statements"], sides["no_cache"]["rows"]) == (2, length + 5)
