"""Round trips to PostgreSQL per call, counted on the client: psycopg waits
for the server's answer through ``Connection.wait`` (once per message: a
query, a batch of statements sent as one message, a COMMIT), so counting
those waits counts the round trips, whatever the machine's load.

The budget, in the steady state (the owner's key already made and
cached): one round trip per read (its entry row comes with its segment). A
put into a turn whose head this process sealed last is one: its settings and
locks, then the entry's INSERT with the head's conditional UPDATE, as one
implicit transaction (``_Put.once``). Every other put is two, as before: its
reads (owner-key version, step, quota, the turn's heads) go with BEGIN and the
settings, and its writes with COMMIT: a turn's first put in this process, a
put after another process wrote the turn (after the one message, which wrote
nothing: three in all), ``put_many`` and an entry of more than one segment. A step
the library takes (``put_next``) is one too, when the head this process sealed last
tells it (after the two round trips that read the turn's last step, unless given a guess).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from securepad import Keyring, Scratchpad
from securepad._steps import put_next
from securepad.core.shaping import SEGMENT_BYTES, SEGMENT_SLACK

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg import Connection  # noqa: E402  (needs psycopg)
from psycopg_pool import ConnectionPool  # noqa: E402

from tests.support.counting import CountingConnection, trips  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, 60 lines
BIG = "y" * (SEGMENT_BYTES + SEGMENT_SLACK + 1)  # two segments


@pytest.fixture
def counted(pg_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=CountingConnection) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad


def measure(pad: Scratchpad, other: Scratchpad) -> dict[str, int]:
    """The round trips of each call of the budget, on a store with the owner's
    key made (``other``: another process's store on the same database)."""
    first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    entry = pad.put(ALICE, "t1", 2, "shell", TEXT)["scratchpad_id"]
    figures = {
        "put (turn this process wrote last)": trips(lambda: pad.put(ALICE, "t1", 3, "shell", TEXT)),
        "put (first into a turn)": trips(lambda: pad.put(ALICE, "t3", 1, "shell", TEXT)),
        "put_many of 4": trips(lambda: pad.put_many(ALICE, "t1", [(s, "shell", TEXT) for s in range(4, 8)])),
        "put (after put_many)": trips(lambda: pad.put(ALICE, "t1", 8, "shell", TEXT)),
        "put of two segments": trips(lambda: pad.put(ALICE, "t1", 9, "shell", BIG)),
    }
    other.put(ALICE, "t1", 10, "shell", TEXT)
    figures["put (after another process wrote the turn)"] = trips(lambda: pad.put(ALICE, "t1", 11, "shell", TEXT))
    figures["put_next"] = trips(lambda: put_next(pad, ALICE, "t1", "shell", TEXT))
    figures["put_next (a guess given)"] = trips(lambda: put_next(pad, ALICE, "t1", "shell", TEXT, guess=1))
    figures |= {
        "get": trips(lambda: pad.get(ALICE, entry)),
        "read head": trips(lambda: pad.read(ALICE, entry, "head", n=100)),
        "read tail": trips(lambda: pad.read(ALICE, entry, "tail", n=100)),
        "read range": trips(lambda: pad.read(ALICE, entry, "range", start=100, end=300)),
        "read grep": trips(lambda: pad.read(ALICE, entry, "grep", pattern="line 4")),
        "list_for_turn": trips(lambda: pad.list_for_turn(ALICE, "t1")),
        "delete": trips(lambda: pad.delete(ALICE, first)),
    }
    turn = pad.turn(ALICE, "t2")
    figures["turn.record (first into a turn)"] = trips(lambda: turn.record(1, "shell", TEXT))
    figures["turn.record (turn this process wrote last)"] = trips(lambda: turn.record(2, "shell", TEXT))
    figures["resolve"] = trips(lambda: turn.resolve("{{step1}}"))
    return figures


BUDGET = {
    # One message: the settings and locks, then the entry with its turn's head, if the stored head is still
    # the one this process sealed (``_Put.once``). The puts below it read the head first: two messages.
    "put (turn this process wrote last)": 1,
    "put (first into a turn)": 2,  # nothing recorded: the head is read (the grant, the owner's lock exclusive)
    "put_many of 4": 2,  # like put: its reads (quota, steps, heads) with the first message
    "put (after put_many)": 1,  # put_many recorded the head it sealed
    "put of two segments": 2,  # the segment rows follow the entry's: never in one message
    "put (after another process wrote the turn)": 3,  # the one message wrote nothing, then two
    # The turn's last step (its newest entries, then the head that checks them), then one message: the
    # step after the newest entry of the head this process sealed last, written only while that head is stored.
    "put_next": 3,
    "put_next (a guess given)": 1,
    "get": 1,
    "read head": 1,
    "read tail": 1,
    "read range": 1,
    "read grep": 1,
    "list_for_turn": 1,
    "delete": 2,
    "turn.record (first into a turn)": 2,
    "turn.record (turn this process wrote last)": 1,
    "resolve": 2,  # the turn's listing (which steps exist), then the step's entry: one round trip each
}


def test_round_trips_per_call_within_budget(counted: Scratchpad, pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as other:  # not counted: its connections are its own
        figures = measure(counted, other)
    assert {name: count for name, count in figures.items() if count > BUDGET[name]} == {}
    assert figures == BUDGET  # none costs less than its budget either: the figures in the docs hold


def test_the_counted_store_still_answers_correctly(counted: Scratchpad) -> None:
    """The folded messages change no result: what was put reads back, a taken
    step is refused, a deleted entry is gone."""
    from securepad import InvalidArgumentError, NotFoundError

    entry = counted.put(ALICE, "t9", 1, "shell", TEXT)["scratchpad_id"]
    assert counted.get(ALICE, entry).observation == TEXT
    turn = counted.turn(ALICE, "t9")
    with pytest.raises(InvalidArgumentError, match="already recorded"):
        turn.record(1, "shell", "again")
    counted.delete(ALICE, entry)
    with pytest.raises(NotFoundError):
        counted.get(ALICE, entry)


def test_the_benchmark_meter_reports_the_same_round_trips(pg_dsn: str) -> None:
    """``python -m benchmarks.pg_cpu``'s table, for the store opened from a
    DSN (as users open it) and on a pool passed in: its round trips agree with
    the budget, its server CPU is read from the store's one server process (the
    CPU figures are timings: the benchmark reports them), and the class-level
    counter it installs on ``psycopg.Connection.wait`` is gone after it."""
    from benchmarks.pg_costs import cpu_per_op, cpu_table

    wait = Connection.wait
    count = 5
    result = cpu_per_op(pg_dsn, count=count, size=4096, read_chars=2000, pool=True)
    assert Connection.wait is wait
    # Its puts go into one turn of their own: the first reads the head, the others are one message each.
    first, then = BUDGET["put (first into a turn)"], BUDGET["put (turn this process wrote last)"]
    for mode in ("securepad-postgresql", "securepad-postgresql-pool"):
        assert result[mode]["put"]["round_trips"] == (first + (count - 1) * then) / count
        assert result[mode]["read"]["round_trips"] == BUDGET["read head"]
        assert result[mode]["put"]["server_processes"] == result[mode]["read"]["server_processes"] == 1
    assert result["securepad"]["put"]["round_trips"] == 0
    assert set(result["ratio"]) == set(result["ratio_pool"]) == {"put", "read"}
    table = "\n".join(cpu_table(result))
    assert "| from a DSN | put |" in table and "| on a pool passed in | read |" in table


def test_the_benchmark_measures_the_store_from_a_dsn_unless_asked(pg_dsn: str) -> None:
    """The pool passed in is a second, optional row: ``python -m
    benchmarks.postgres`` reads ``securepad-postgresql`` and ``ratio``."""
    from benchmarks.pg_costs import cpu_per_op

    result = cpu_per_op(pg_dsn, count=2, size=256, read_chars=100)
    assert set(result) == {"securepad", "securepad-postgresql", "ratio"}
    assert result["securepad-postgresql"]["read"]["round_trips"] == BUDGET["read head"]
