"""A read's cost does not depend on the turn's length, nor on other turns' writers.

A read of a turn checks its rows against the turn's verified inventory, kept
between reads (``tables.heads.reading.HeadCache``) while its freshness token holds
(``tables.heads.reading``). The token is per turn: a commit of another connection to
another turn or another owner leaves it holding, and a write of this process
edits the cached inventory as it edits the turn (SQLite: the token holds the
head it sealed). Counted, not timed: the rows a read fetches (the entry's
row and the head's token row; the turn's inventory when it is recounted) are
the same in a turn of 100 entries as in one of 3,000.

And a whole-turn read beside a writer is never refused: on SQLite the read
that must check a consistent pair reads it in one snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad.errors import IntegrityError, StoreBusyError
from securepad.store import parts
from tests.support.meters import ReadMeter
from tests.support.principals import ALICE, BOB, NOW
from tests.support.tamper_edits import raw_file

LATER = NOW + 10
LENGTHS = (100, 3000)
# What a warm ``get`` fetches: the entry's row and the head statement's token row.
WARM_ROWS = 2


def _fill(pad: Scratchpad, principal: Principal, turn: str, steps: int) -> list[str]:
    ids: list[str] = []
    for first in range(1, steps + 1, 500):
        batch = [(step, "fetch", f"observation {step}") for step in range(first, min(first + 500, steps + 1))]
        ids += [view["scratchpad_id"] for view in pad.put_many(principal, turn, batch, ttl_seconds=3600, now=NOW)]
    return ids


# The anchor advanced in each write's own commit: no background commit of
# another connection comes between a test's write and its read.
NO_BACKGROUND = Policy(anchor_sync="commit")


@pytest.fixture
def long_turns(store_location: Any, keyring: Keyring) -> Iterator[dict[str, Any]]:
    """A store holding a turn of each length, read once (warm), and a second
    store object on it: another connection, as another process would be."""
    with (
        Scratchpad.open(store_location, keyring=keyring, policy=NO_BACKGROUND) as pad,
        Scratchpad.open(store_location, keyring=keyring, policy=NO_BACKGROUND) as other,
    ):
        ids = {length: _fill(pad, ALICE, f"t{length}", length) for length in LENGTHS}
        _fill(other, ALICE, "elsewhere", 1)
        _fill(other, BOB, "elsewhere", 1)
        for length in LENGTHS:
            pad.get(ALICE, ids[length][0], now=LATER)
        yield {"pad": pad, "other": other, "ids": ids}


def _rows(pad: Scratchpad, call: Callable[[], Any]) -> int:
    return ReadMeter(pad).counts(call)["rows"]


def test_a_read_after_this_process_put_fetches_the_same_rows_whatever_the_turn_length(
    long_turns: dict[str, Any], backend: str
) -> None:
    pad, ids = long_turns["pad"], long_turns["ids"]
    fetched = {}
    for length in LENGTHS:
        new = pad.put(ALICE, f"t{length}", length + 1, "fetch", "new", ttl_seconds=3600, now=NOW)["scratchpad_id"]
        first = _rows(pad, lambda new=new: pad.get(ALICE, new, now=LATER))  # type: ignore[misc]
        again = _rows(pad, lambda length=length: pad.get(ALICE, ids[length][0], now=LATER))  # type: ignore[misc]
        fetched[length] = (first, again)
    if backend == "sqlite":
        # The put edited the cached inventory: neither read recounts the turn.
        assert fetched == {length: (WARM_ROWS, WARM_ROWS) for length in LENGTHS}
    else:
        # PostgreSQL's token holds the server's digest of the turn's rows, which
        # a write cannot know: the first read after it recounts, once.
        assert fetched[LENGTHS[-1]][0] > LENGTHS[-1]
        assert {again for _, again in fetched.values()} == {WARM_ROWS}


@pytest.mark.parametrize("elsewhere", ["another turn", "another owner"])
def test_a_read_after_another_connection_commits_elsewhere_fetches_no_inventory(
    long_turns: dict[str, Any], elsewhere: str
) -> None:
    pad, other, ids = long_turns["pad"], long_turns["other"], long_turns["ids"]
    principal = ALICE if elsewhere == "another turn" else BOB
    fetched = []
    for step, length in enumerate(LENGTHS * 2, 2):
        other.put(principal, "elsewhere", step, "fetch", "elsewhere", now=NOW)
        fetched.append(_rows(pad, lambda length=length: pad.get(ALICE, ids[length][-1], now=LATER)))  # type: ignore[misc]
    assert fetched == [WARM_ROWS] * len(fetched)
    history = [
        _rows(pad, lambda length=length: pad.list_for_turn(ALICE, f"t{length}", now=LATER)) for length in LENGTHS
    ]
    other.put(principal, "elsewhere", 99, "fetch", "elsewhere", now=NOW)
    # A whole-turn listing fetches its own rows, and no inventory beside them.
    assert [
        _rows(pad, lambda length=length: pad.list_for_turn(ALICE, f"t{length}", now=LATER)) for length in LENGTHS
    ] == history


def test_a_read_after_own_put_then_another_commit_elsewhere_is_verified_once(
    long_turns: dict[str, Any], backend: str
) -> None:
    """After this process's write the token's rows' text is not known: a
    commit elsewhere then costs one recount, after which reads are warm again."""
    pad, other, ids = long_turns["pad"], long_turns["other"], long_turns["ids"]
    pad.put(ALICE, "t100", 101, "fetch", "new", now=NOW)
    other.put(BOB, "elsewhere", 2, "fetch", "elsewhere", now=NOW)
    assert _rows(pad, lambda: pad.get(ALICE, ids[100][0], now=LATER)) > 100
    other.put(BOB, "elsewhere", 3, "fetch", "elsewhere", now=NOW)
    assert _rows(pad, lambda: pad.get(ALICE, ids[100][0], now=LATER)) == WARM_ROWS


def test_a_warm_read_on_sqlite_sends_the_token_alone_and_the_whole_statement_once_the_turn_changed(
    db_path: Any, keyring: Keyring
) -> None:
    """The head statement of a warm read computes the token and reads no
    inventory branch; a commit of another connection into the turn moves the
    token, and the read then runs the whole statement and verifies the inventory."""
    with (
        Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as pad,
        Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as other,
    ):
        ids = _fill(pad, ALICE, "t", 100)
        pad.get(ALICE, ids[0], now=LATER)
        meter = ReadMeter(pad)
        warm = {"statements": 2, "rows": WARM_ROWS, "calls": 1}
        assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER)) == warm
        other.put(ALICE, "t", 101, "fetch", "another connection's", ttl_seconds=3600, now=NOW)
        changed = meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER))
        assert changed["statements"] == 3 and changed["rows"] > 100
        assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER)) == warm


# -- what the per-turn token still finds -------------------------------------------------------


def _sqlite_edits() -> dict[str, Callable[[Any, list[str]], None]]:
    return {
        "deleted": lambda conn, ids: conn.execute("DELETE FROM entries WHERE id = ?", (ids[5],)),
        "expiry by one ulp": lambda conn, ids: conn.execute(
            "UPDATE entries SET expires_at = expires_at + 2e-7 WHERE id = ?", (ids[5],)
        ),
        "expiry as a blob": lambda conn, ids: conn.execute(
            "UPDATE entries SET expires_at = CAST(CAST(expires_at AS TEXT) AS BLOB) WHERE id = ?", (ids[5],)
        ),
        "steps swapped": lambda conn, ids: conn.execute(
            "UPDATE entries SET step_num = CASE id WHEN ? THEN 7 ELSE 6 END WHERE id IN (?, ?)",
            (ids[5], ids[5], ids[6]),
        ),
        "stored bytes": lambda conn, ids: conn.execute(
            "UPDATE entries SET stored_bytes = stored_bytes + 1 WHERE id = ?", (ids[5],)
        ),
        "channel": lambda conn, ids: conn.execute("UPDATE entries SET channel = 'web ' WHERE id = ?", (ids[5],)),
        "relabelled": lambda conn, ids: conn.execute("UPDATE entries SET turn_id = 'x' WHERE id = ?", (ids[5],)),
    }


@pytest.mark.parametrize("edit", sorted(_sqlite_edits()))
@pytest.mark.parametrize("after", ["a read", "this process's put"])
def test_an_edit_of_another_row_of_the_turn_is_refused_by_a_read_of_any_entry(
    db_path: Any, keyring: Keyring, edit: str, after: str
) -> None:
    """The rows' text differs after any edit of any row of the turn, so a
    ``get`` of an entry the edit did not touch refuses the turn too."""
    with Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as pad:
        ids = _fill(pad, ALICE, "t", 20)
        pad.get(ALICE, ids[0], now=LATER)
        if after != "a read":
            pad.put(ALICE, "t", 21, "fetch", "new", ttl_seconds=3600, now=NOW)
            pad.get(ALICE, ids[0], now=LATER)  # the rows' text after the put: computed by the next full check
            pad.put(ALICE, "t", 22, "fetch", "new", ttl_seconds=3600, now=NOW)
        with raw_file(db_path) as conn:
            _sqlite_edits()[edit](conn, ids)
        with pytest.raises(IntegrityError):
            pad.get(ALICE, ids[0], now=LATER)
        assert "t" in {problem["turn_id"] for problem in pad.verify(now=LATER)["problems"]}


def test_a_write_that_rolls_back_leaves_no_edited_inventory_behind(db_path: Any, keyring: Keyring) -> None:
    """A write edits the cached inventory with the head it seals; when its
    transaction rolls back, that head is not the stored one, and the next
    read verifies the turn again, with no false alarm."""
    with Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as pad:
        ids = _fill(pad, ALICE, "t", 5)
        pad.get(ALICE, ids[0], now=LATER)
        db = parts(pad).db
        with pytest.raises(RuntimeError), db.transaction() as tx:
            heads = parts(pad).heads
            heads.change(tx, "alice", "t", lambda edit: edit.remove("e", ids[1], [2, NOW + 3600, 0, "planner", "web"]))
            raise RuntimeError("the write fails after its head was sealed")
        meter = ReadMeter(pad)
        assert meter.counts(lambda: pad.get(ALICE, ids[1], now=LATER))["rows"] > 5  # verified again
        assert [view["step_num"] for view in pad.list_for_turn(ALICE, "t", now=LATER)] == [1, 2, 3, 4, 5]
        assert meter.counts(lambda: pad.get(ALICE, ids[1], now=LATER))["rows"] == WARM_ROWS


# -- a whole-turn read beside a writer ----------------------------------------------------------


def _read_beside_writer(
    pad: Scratchpad, writer: Scratchpad, principal: Principal, turn: str, reads: int
) -> tuple[int, list[BaseException]]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        # At most four writes a read: a turn that grew without bound would make
        # each read (and each write's head) longer than the one before.
        step = 1000
        try:
            while not stop.is_set() and step < 1000 + 4 * reads:
                step += 1
                writer.put(principal, turn, step, "fetch", "writer", now=NOW)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    refused = 0
    try:
        for _ in range(reads):
            try:
                pad.turn(ALICE, "t", now=LATER).history(now=LATER)
            except StoreBusyError:
                refused += 1
    finally:
        stop.set()
        thread.join()
    return refused, errors


@pytest.mark.parametrize("where", ["another turn", "another owner"])
def test_a_whole_turn_read_beside_a_writer_elsewhere_is_never_refused(
    store_location: Any, keyring: Keyring, where: str
) -> None:
    with (
        Scratchpad.open(store_location, keyring=keyring) as pad,
        Scratchpad.open(store_location, keyring=keyring) as writer,
    ):
        _fill(pad, ALICE, "t", 300)
        principal = ALICE if where == "another turn" else BOB
        refused, errors = _read_beside_writer(pad, writer, principal, "elsewhere", 40)
        assert (refused, errors) == (0, [])


def test_a_whole_turn_read_beside_a_writer_of_the_same_turn_is_never_refused(db_path: Any, keyring: Keyring) -> None:
    """The read's rows and the head are read by two statements: a writer of
    the turn that commits between them makes them disagree, and the pair is
    read again in one snapshot, where no writer can come between."""
    with Scratchpad.open(db_path, keyring=keyring) as pad, Scratchpad.open(db_path, keyring=keyring) as writer:
        _fill(pad, ALICE, "t", 300)
        refused, errors = _read_beside_writer(pad, writer, ALICE, "t", 40)
        assert (refused, errors) == (0, [])


# -- the rows' text: exact ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Scratchpad, Any]]:
    where = tmp_path_factory.mktemp("rows-text")
    keyring = Keyring.from_key_file(where / "key")
    with Scratchpad.open(where / "s.db", keyring=keyring, policy=NO_BACKGROUND) as pad:
        ids = _fill(pad, ALICE, "t", 2)
        yield pad, ids


def _rows_text(pad: Scratchpad, column: str, value: Any, entry_id: str) -> str:
    """The rows' text the read's statement computes with ``column`` of one entry set to ``value``."""
    conn = parts(pad).db.query  # this thread's connection, as the read uses it
    conn(f"UPDATE entries SET {column} = ? WHERE id = ?", (value, entry_id))
    sql, params = parts(pad).heads.reads.sql("?", "t", "alice")
    (token,) = [row for row in conn(sql, params) if row["k"] == "v"]
    return str(token["channel"])


_DOUBLES = st.floats(allow_nan=False) | st.sampled_from([1.0, 2.0**53, 2.0**53 - 1, 1 - 2**-53, 1e300, 5e-324, -1.5])


@settings(max_examples=150)
@given(first=_DOUBLES, second=_DOUBLES)
def test_two_expiries_give_the_same_rows_text_only_when_they_are_the_same(
    text_store: tuple[Scratchpad, list[str]], first: float, second: float
) -> None:
    pad, ids = text_store
    texts = [_rows_text(pad, "expires_at", value, ids[1]) for value in (first, second)]
    assert (texts[0] == texts[1]) == (first == second), (first, second)


@settings(max_examples=100)
@given(first=st.text(max_size=8), second=st.text(max_size=8) | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=4))
def test_two_channels_give_the_same_rows_text_only_when_they_are_the_same(
    text_store: tuple[Scratchpad, list[str]], first: str, second: Any
) -> None:
    pad, ids = text_store
    texts = [_rows_text(pad, "channel", value, ids[1]) for value in (first, second)]
    assert (texts[0] == texts[1]) == (first == second), (first, second)
