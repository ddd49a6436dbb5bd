"""Round trips to PostgreSQL per call, counted on the client: psycopg waits
for the server's answer through ``Connection.wait`` (once per message: a
query, a batch of statements sent as one message, a COMMIT), so counting
those waits counts the round trips, whatever the machine's load.

The budget (issue 15): one round trip per read, at most two per put, in the
steady state (the owner's key already made and cached): a read's entry row
comes with its segment; a put's reads (owner-key version, step, quota) go
with BEGIN and the settings, and its writes with COMMIT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from securepad import Keyring, Principal, Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg import Connection  # noqa: E402  (needs psycopg)
from psycopg_pool import ConnectionPool  # noqa: E402

ALICE = Principal("alice", "planner", "web")
TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, 60 lines


class CountingConnection(Connection[Any]):
    """A psycopg connection that counts its waits for the server (round trips)."""

    waits = 0

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        CountingConnection.waits += 1
        return super().wait(gen, *args, **kwargs)


@pytest.fixture
def counted(pg_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=CountingConnection) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad


def trips(call: Callable[[], object]) -> int:
    """How many round trips ``call`` made."""
    before = CountingConnection.waits
    call()
    return CountingConnection.waits - before


def measure(pad: Scratchpad) -> dict[str, int]:
    """The round trips of each call of the brief, on a store with the owner's key made."""
    first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    entry = pad.put(ALICE, "t1", 2, "shell", TEXT)["scratchpad_id"]
    figures = {
        "put": trips(lambda: pad.put(ALICE, "t1", 3, "shell", TEXT)),
        "put_many of 4": trips(lambda: pad.put_many(ALICE, "t1", [(s, "shell", TEXT) for s in range(4, 8)])),
        "get": trips(lambda: pad.get(ALICE, entry)),
        "read head": trips(lambda: pad.read(ALICE, entry, "head", n=100)),
        "read tail": trips(lambda: pad.read(ALICE, entry, "tail", n=100)),
        "read range": trips(lambda: pad.read(ALICE, entry, "range", start=100, end=300)),
        "read grep": trips(lambda: pad.read(ALICE, entry, "grep", pattern="line 4")),
        "list_for_turn": trips(lambda: pad.list_for_turn(ALICE, "t1")),
        "delete": trips(lambda: pad.delete(ALICE, first)),
    }
    turn = pad.turn(ALICE, "t2")
    figures["turn.record"] = trips(lambda: turn.record(1, "shell", TEXT))
    figures["resolve"] = trips(lambda: turn.resolve("{{step1}}"))
    return figures


BUDGET = {
    "put": 2,
    "put_many of 4": 2,  # like put: its reads (quota, steps, heads) with the first message
    "get": 1,
    "read head": 1,
    "read tail": 1,
    "read range": 1,
    "read grep": 1,
    "list_for_turn": 1,
    "delete": 2,
    "turn.record": 2,
    "resolve": 2,  # the turn's listing (which steps exist), then the step's entry: one round trip each
}


def test_round_trips_per_call_within_budget(counted: Scratchpad) -> None:
    figures = measure(counted)
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
    """``python -m securepad.bench.pg_cpu``'s table, for the store opened from a
    DSN (as users open it) and on a pool passed in: its round trips agree with
    the budget, its server CPU is read from the store's one server process (the
    CPU figures are timings: the benchmark reports them), and the class-level
    counter it installs on ``psycopg.Connection.wait`` is gone after it."""
    from securepad.bench.pg_costs import cpu_per_op, cpu_table

    wait = Connection.wait
    result = cpu_per_op(pg_dsn, count=5, size=4096, read_chars=2000, pool=True)
    assert Connection.wait is wait
    for mode in ("securepad-postgresql", "securepad-postgresql-pool"):
        assert result[mode]["put"]["round_trips"] == BUDGET["put"]
        assert result[mode]["read"]["round_trips"] == BUDGET["read head"]
        assert result[mode]["put"]["server_processes"] == result[mode]["read"]["server_processes"] == 1
    assert result["securepad"]["put"]["round_trips"] == 0
    assert set(result["ratio"]) == set(result["ratio_pool"]) == {"put", "read"}
    table = "\n".join(cpu_table(result))
    assert "| from a DSN | put |" in table and "| on a pool passed in | read |" in table


def test_the_benchmark_measures_the_store_from_a_dsn_unless_asked(pg_dsn: str) -> None:
    """The pool passed in is a second, optional row: ``python -m
    securepad.bench.postgres`` reads ``securepad-postgresql`` and ``ratio``."""
    from securepad.bench.pg_costs import cpu_per_op

    result = cpu_per_op(pg_dsn, count=2, size=256, read_chars=100)
    assert set(result) == {"securepad", "securepad-postgresql", "ratio"}
    assert result["securepad-postgresql"]["read"]["round_trips"] == BUDGET["read head"]
