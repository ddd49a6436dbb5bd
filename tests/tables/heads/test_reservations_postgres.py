"""On PostgreSQL: one owner's puts into different turns do not wait for each other.

A put within its turn's reservation takes the owner's advisory lock shared and
its turn's exclusive (``Backend.transaction(owner, turn=...)``). Whether a put
waits is read from ``pg_locks`` (an ungranted advisory lock of the put's
server session) while another transaction holds its locks: no timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from securepad import Keyring, Policy, Principal, QuotaExceededError, Scratchpad  # noqa: E402
from securepad.store import parts  # noqa: E402
from securepad.tables.entries.entries import every_row  # noqa: E402
from tests.support.principals import AGENT_ALICE as ALICE  # noqa: E402
from tests.support.principals import NOW  # noqa: E402
from tests.support.usage import exact  # noqa: E402


def _waiting(pg_dsn: str) -> int:
    """Server sessions of this database waiting for an advisory lock."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _holding(pad: Scratchpad, turn: str | None) -> Iterator[None]:
    """A write transaction of alice's (``turn``: in turn mode, as a put within its
    reservation takes it) holding its locks until the block ends."""
    with parts(pad).db.transaction("alice", turn=turn) as conn:
        conn.query("SELECT 1 AS one")  # the first message: the locks are taken with it
        yield


def _put_in_thread(pad: Scratchpad, turn: str, step: int) -> tuple[threading.Thread, list[Any]]:
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(pad.put(ALICE, turn, step, "tool", "x" * 4000, now=NOW))
        except Exception as exc:  # handed to the test
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def _wait_until_waiting(pg_dsn: str, thread: threading.Thread) -> bool:
    for _ in range(200):
        if _waiting(pg_dsn):
            return True
        if not thread.is_alive():
            return False
        thread.join(0.02)
    return False


def test_puts_of_one_owner_into_other_turns_do_not_wait(pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as holder, Scratchpad.open(pg_dsn, keyring=keyring) as writer:
        holder.put(ALICE, "a", 1, "tool", "x" * 4000, now=NOW)
        writer.put(ALICE, "b", 1, "tool", "x" * 4000, now=NOW)  # the turn's grant: now it has room
        with _holding(holder, "a"):
            thread, done = _put_in_thread(writer, "b", 2)
            thread.join(10)
            assert not thread.is_alive() and "scratchpad_id" in done[0]  # it did not wait for turn a
            assert _waiting(pg_dsn) == 0
            thread, done = _put_in_thread(writer, "a", 2)  # the same turn waits for the holder
            assert _wait_until_waiting(pg_dsn, thread), done
            assert not done
        thread.join(10)
        assert "scratchpad_id" in done[0]
        with _holding(holder, None):  # an owner-wide write (delete, gc, a grant) excludes every put of the owner
            thread, done = _put_in_thread(writer, "b", 3)
            assert _wait_until_waiting(pg_dsn, thread), done
        thread.join(10)
        assert "scratchpad_id" in done[0]
        exact(writer)
        assert writer.verify(now=NOW)["ok"]


def test_a_new_turn_waits_for_a_put_in_turn_mode(pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as holder, Scratchpad.open(pg_dsn, keyring=keyring) as writer:
        holder.put(ALICE, "a", 1, "tool", "x", now=NOW)
        with _holding(holder, "a"):
            thread, done = _put_in_thread(writer, "new", 1)
            assert _wait_until_waiting(pg_dsn, thread), done
        thread.join(10)
        assert "scratchpad_id" in done[0]


@pytest.mark.parametrize("quota", [1 << 30, 400_000])
def test_eight_threads_of_two_owners_keep_the_totals_exact(pg_dsn: str, keyring: Keyring, quota: int) -> None:
    """Puts and deletes from 8 threads (4 an owner, a turn each, some turns shared),
    with a quota that forces grants, reclaims and refusals when small."""
    policy = Policy(owner_quota_bytes=quota, max_entry_bytes=20_000)
    owners = [Principal(name, "agent", "web") for name in ("alice", "bob")]
    errors: list[BaseException] = []
    refused = [0]
    with Scratchpad.open(pg_dsn, keyring=keyring, policy=policy) as pad:

        def work(index: int) -> None:
            principal = owners[index % 2]
            turn = f"turn-{index % 3}"  # two threads of an owner share a turn
            mine: list[str] = []
            try:
                for step in range(40):
                    if step % 5 == 4 and mine:
                        pad.delete(principal, mine.pop(0), now=NOW)
                        continue
                    try:
                        view = pad.put(principal, turn, index * 1000 + step, "tool", "y" * (500 + 397 * step), now=NOW)
                    except QuotaExceededError:
                        refused[0] += 1
                        continue
                    mine.append(view["scratchpad_id"])
            except BaseException as exc:  # handed to the test
                errors.append(exc)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(work, range(8)))
        assert not errors, errors
        exact(pad)
        assert pad.verify(now=NOW)["ok"]
        used: dict[str, int] = {}
        for row in every_row(parts(pad).db):
            used[row["owner_user_id"]] = used.get(row["owner_user_id"], 0) + int(row["stored_bytes"])
        assert all(total <= quota for total in used.values())
        if quota < 1 << 30:
            assert refused[0] > 0  # the quota was reached: its check ran under load


def test_round_trips_of_a_put_in_each_mode(pg_dsn: str, keyring: Keyring) -> None:
    """A turn's grant 2 (the owner's lock exclusive); within the reservation 1
    when this process sealed the turn's head last (one message, under the
    owner's lock shared), else 3: the one message writes nothing (another
    process wrote the turn), then the 2 of the shared attempt. A stale hint
    (the turn's reservation reclaimed by another process) costs, after that
    message, the shared attempt's first message and its rollback before the 2
    of the exclusive one, which records the head it sealed (the next put is one
    message again); a put that needs more than the turn's reservation sends no
    message that cannot write: the 2 of a grant."""
    from psycopg_pool import ConnectionPool

    from tests.support.counting import CountingConnection, trips

    policy = Policy(owner_quota_bytes=200_000, max_entry_bytes=190_000)
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=CountingConnection) as pool,
        Scratchpad.open(pool, keyring=keyring, policy=policy) as pad,
        Scratchpad.open(pg_dsn, keyring=keyring, policy=policy) as other,
    ):
        pad.put(ALICE, "warm", 1, "tool", "x", now=NOW)  # the owner's key made and cached
        assert trips(lambda: pad.put(ALICE, "t1", 1, "tool", "x" * 1000, now=NOW)) == 2  # the grant
        assert trips(lambda: pad.put(ALICE, "t1", 2, "tool", "x" * 1000, now=NOW)) == 1  # within it: one message
        other.put(ALICE, "t1", 3, "tool", "x" * 10, now=NOW)  # within it too: t1's head is other's now
        assert trips(lambda: pad.put(ALICE, "t1", 4, "tool", "x" * 1000, now=NOW)) == 3  # one message, then shared
        assert trips(lambda: pad.put(ALICE, "t1", 5, "tool", "x" * 1000, now=NOW)) == 1  # the head is pad's again
        other.put(ALICE, "t2", 1, "tool", "y" * 170_000, now=NOW)  # near the quota: t1's spare reclaimed
        assert trips(lambda: pad.put(ALICE, "t1", 6, "tool", "x" * 1000, now=NOW)) == 1 + 2 + 2  # as said above
        assert trips(lambda: pad.put(ALICE, "t1", 7, "tool", "x" * 10, now=NOW)) == 1  # its head recorded again
        # Past the reservation left: no message that cannot write, straight to the exclusive grant.
        assert trips(lambda: pad.put(ALICE, "t1", 8, "tool", "x" * 3000, now=NOW)) == 2
        exact(pad)
        assert pad.verify(now=NOW)["ok"]
