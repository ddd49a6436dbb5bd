"""A put at the turn's next step in one message on PostgreSQL (``put_next``, the saver's puts).

The statement is the plain one-message put's (``once_sql``), its entry sealed at the step
after the newest entry of the head this process sealed last: one round trip while that
head is stored; another process's write in between makes it write nothing, and the
two-message put takes the step in its transaction; a lost reply of an applied statement
returns that entry, at the step it was stored with, once; and whatever two stores put
and delete, each next-step put takes the step the transaction's look would take.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from securepad import Keyring, Principal, Scratchpad
from securepad._steps import put_next

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402

from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from tests.support.counting import CountingConnection, counted  # noqa: E402
from tests.support.next_steps import next_step_ops, run_next_step_ops  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, one segment


@pytest.fixture
def single(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    """A store on a pool of one counting autocommit connection."""
    with (
        ConnectionPool(
            pg_store_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, connection_class=CountingConnection
        ) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad


@pytest.fixture
def other(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    """A second store object on the same database: another process, as far as the first can tell."""
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        yield pad


@pytest.fixture
def third(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    """A third store object on the same database, on a pool of its own."""
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        yield pad


def _next(pad: Scratchpad, guess: int = 1, who: Principal = ALICE) -> dict[str, Any]:
    return put_next(pad, who, "t1", "shell", TEXT, guess=guess)


def _steps(pad: Scratchpad) -> list[tuple[int, str]]:
    return [(e["step_num"], e["scratchpad_id"]) for e in pad.list_for_turn(ALICE, "t1")]


def test_a_next_step_put_into_a_turn_this_store_wrote_last_is_one_round_trip(
    single: Scratchpad, other: Scratchpad
) -> None:
    pad = single
    ids = [_next(pad)["scratchpad_id"] for _ in range(3)]  # statements prepared
    for step in range(4, 7):
        view, trips = counted(lambda: _next(pad, guess=1))  # a wrong guess: the listing part sealed again
        assert trips == 1 and view["step_num"] == step
        ids.append(view["scratchpad_id"])
    theirs = _next(other)
    assert theirs["step_num"] == 7
    view, trips = counted(lambda: _next(pad))
    assert trips == 3 and view["step_num"] == 8  # the one message wrote nothing; the transaction took step 8
    ids.append(view["scratchpad_id"])
    expected = [*zip(range(1, 7), ids[:6], strict=True), (7, theirs["scratchpad_id"]), (8, ids[6])]
    assert _steps(pad) == _steps(other) == expected
    assert pad.verify()["ok"]


def test_a_lost_reply_of_an_applied_next_step_put_returns_its_entry_at_its_step_once(
    single: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement wrote step 2, its reply was lost: the transaction, which would take step 3
    now, finds the entry and returns it at step 2."""
    pad = single
    first = _next(pad)["scratchpad_id"]
    write_once = PostgresDatabase.write_once
    lost: list[int] = []

    def losing(self: PostgresDatabase, owner: str, turn_id: str, sql: str, params: Any) -> int | None:
        written = write_once(self, owner, turn_id, sql, params)
        if lost or written is None:
            return written
        lost.append(written)
        return None

    monkeypatch.setattr(PostgresDatabase, "write_once", losing)
    view = _next(pad)
    assert lost == [1] and view["step_num"] == 2
    assert _steps(pad) == [(1, first), (2, view["scratchpad_id"])]
    assert pad.get(ALICE, view["scratchpad_id"]).step_num == 2
    _, trips = counted(lambda: _next(pad))
    assert trips == 1  # the landed head is this store's last again
    assert [step for step, _ in _steps(pad)] == [1, 2, 3]
    assert pad.verify()["ok"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=next_step_ops(max_size=15))
def test_next_step_puts_of_two_stores_take_the_transactions_step(
    other: Scratchpad, third: Scratchpad, ops: list[tuple[str, int, int, bool]]
) -> None:
    """As on SQLite: each next-step put takes the highest live step plus one, whoever wrote last."""
    # On pools of their own (a pool of one cannot load a key inside a transaction).
    run_next_step_ops((other, third), ops, time.time())
