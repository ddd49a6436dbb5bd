"""A put in one message on PostgreSQL (``tables.entries.put``).

When this process sealed a turn's head last, a put into that turn sends the
settings and locks and one statement (``WITH head AS (UPDATE turn_heads ...)
INSERT INTO entries ... FROM head``) as one implicit transaction: one round
trip, no BEGIN, no COMMIT, no head read. What a user relies on, guarded here:
that costs one round trip in the steady state, and whatever makes the
statement write nothing (another process wrote the turn, a rotation, a taken
step, an id collision) or loses its reply (applied or not) still stores the
entry exactly once, refuses what the two-message put refused, keeps each
owner's rows to that owner (row-level security), leaks no setting through a
transaction pooler, and leaves a store that verifies.
"""

from __future__ import annotations

import functools
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from securepad import IntegrityError, InvalidArgumentError, Keyring, Principal, Scratchpad, StoreUnavailableError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402

from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from securepad.storage.postgres.prepared import Statements  # noqa: E402
from securepad.store import parts  # noqa: E402
from securepad.tables.entries import prepare  # noqa: E402
from securepad.tables.heads.heads import Heads  # noqa: E402
from tests.support.counting import CountingConnection, counted  # noqa: E402
from tests.support.pg_prepared_runs import ran  # noqa: E402  (needs psycopg)
from tests.support.pgbouncer import PgBouncer, find_pgbouncer  # noqa: E402
from tests.support.principals import ALICE, BOB  # noqa: E402

Single = tuple[Scratchpad, ConnectionPool[Any]]
T = TypeVar("T")

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB, one segment
# The statements of a one-message put, as psycopg's dialect and pg_prepared_statements show them.
OPENING = "SELECT set_config('role'"
ONCE = "WITH head AS (UPDATE turn_heads"


@pytest.fixture
def single(pg_store_dsn: str, keyring: Keyring) -> Iterator[Single]:
    """A store on a pool of one counting autocommit connection, with that pool."""
    with (
        ConnectionPool(
            pg_store_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, connection_class=CountingConnection
        ) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad, pool


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


@pytest.fixture
def messages(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statement texts of each message the stores send, as sent (an
    observer of ``Statements.message``: every message is built there)."""
    sent: list[list[str]] = []
    message = Statements.message

    def recording(self: Statements, conn: Any, batch: Any, *, first: bool) -> Any:
        sent.append([text for text, _ in batch])
        return message(self, conn, batch, first=first)

    monkeypatch.setattr(Statements, "message", recording)
    return sent


def _ran(pool: ConnectionPool[Any], call: Callable[[], object]) -> list[str]:
    """The texts of the prepared statements ``call()`` ran, once each."""
    texts = ran(pool, call)
    assert len(set(texts)) == len(texts), texts
    return texts


def _steps(pad: Scratchpad, who: Principal, turn: str, now: float | None = None) -> list[tuple[int, str]]:
    return [(e["step_num"], e["scratchpad_id"]) for e in pad.list_for_turn(who, turn, now=now)]


def _admin(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the server's superuser login (outside the store's roles)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql, params).fetchall())


def test_a_put_into_a_turn_this_store_wrote_last_is_one_message(single: Single, messages: list[list[str]]) -> None:
    """After a turn's first put here, each put into it costs one round trip: settings, locks and one statement."""
    pad, pool = single
    ids = [pad.put(ALICE, "t1", step, "shell", TEXT)["scratchpad_id"] for step in range(1, 8)]  # statements prepared
    trips: list[int] = []

    def put(step: int) -> None:
        view, count = counted(lambda: pad.put(ALICE, "t1", step, "shell", f"{TEXT}{step}"))
        ids.append(view["scratchpad_id"])
        trips.append(count)

    for step in range(8, 11):
        messages.clear()
        texts = _ran(pool, functools.partial(put, step))
        assert trips[-1] == 1
        assert len(messages) == 1 and len(messages[0]) == 2, messages  # no BEGIN, no COMMIT, no head read
        assert messages[0][0].startswith(OPENING) and "pg_advisory_xact_lock(" in messages[0][0]
        assert messages[0][1].startswith(ONCE)
        assert len(texts) == 3, texts
        assert texts[0] == "SELECT 1"  # the anchor
        assert texts[1].startswith(OPENING) and texts[2].startswith(ONCE)
    assert _steps(pad, ALICE, "t1") == list(zip(range(1, 11), ids, strict=True))
    assert [pad.get(ALICE, entry).observation for entry in ids[7:]] == [f"{TEXT}{step}" for step in range(8, 11)]
    assert pad.verify()["ok"]


def test_another_store_writing_the_turn_in_between_costs_one_fallback(single: Single, other: Scratchpad) -> None:
    """A put after another process wrote the turn still stores once (3 round trips), then one round trip again."""
    pad, _ = single
    mine = [pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]]
    view, trips = counted(lambda: pad.put(ALICE, "t1", 2, "shell", "two"))
    mine.append(view["scratchpad_id"])
    assert trips == 1
    theirs = other.put(ALICE, "t1", 3, "shell", "three")["scratchpad_id"]
    view, trips = counted(lambda: pad.put(ALICE, "t1", 4, "shell", "four"))
    assert trips == 3  # the one message wrote nothing; the two-message put then wrote it
    mine.append(view["scratchpad_id"])
    view, trips = counted(lambda: pad.put(ALICE, "t1", 5, "shell", "five"))
    assert trips == 1
    mine.append(view["scratchpad_id"])
    expected = [(1, mine[0]), (2, mine[1]), (3, theirs), (4, mine[2]), (5, mine[3])]
    assert _steps(pad, ALICE, "t1") == _steps(other, ALICE, "t1") == expected
    assert [other.get(ALICE, entry).observation for entry in mine[1:]] == ["two", "four", "five"]
    assert pad.verify()["ok"] and other.verify()["ok"]


# The columns of an entry a planted row copies from a stored one (all but its id and step).
_COPIED = (
    "owner_user_id, actor, channel, turn_id, executor_name, content_kind, size_bytes, size_chars, segment_count,"
    " key_version, created_at, expires_at, wrapped_key, nonce_prefix, commitment, sealed_meta, only_segment,"
    " sealed_listing, stored_bytes"
)


def test_a_step_above_every_step_of_the_head_sends_no_lookup_of_it(
    single: Single, messages: list[list[str]], pg_dsn: str
) -> None:
    """The head this store sealed last records the turn's highest step: a put above
    it sends no lookup of its step (no entry of the turn has it while the stored
    head is that one); a put at or below it looks the step up. A row planted above
    the head's steps does not refuse the put: the turn's check names it."""
    pad, _ = single
    pad.put(ALICE, "t1", 1, "shell", TEXT)
    sent: dict[int, list[str]] = {}
    for step in (5, 3, 9):
        messages.clear()
        view, trips = counted(lambda step=step: pad.put(ALICE, "t1", step, "shell", f"{TEXT}{step}"))
        assert trips == 1 and view["ok"]
        sent[step] = messages[0]
    assert [("NOT EXISTS" in sent[step][1]) for step in (5, 3, 9)] == [False, True, False]
    assert [step for step, _ in _steps(pad, ALICE, "t1")] == [1, 3, 5, 9]
    _admin(
        pg_dsn,
        f"INSERT INTO securepad.entries(id, step_num, {_COPIED}) SELECT 'planted', 10, {_COPIED}"
        " FROM securepad.entries WHERE turn_id = 't1' AND step_num = 9 RETURNING 1",
    )
    pad.put(ALICE, "t1", 10, "shell", "ten")
    with pytest.raises(IntegrityError):
        pad.list_for_turn(ALICE, "t1")
    assert not pad.verify()["ok"]


def test_a_live_entrys_step_is_refused_and_an_expired_ones_is_free(single: Single, pg_dsn: str) -> None:
    """A taken step is refused as before ("already recorded"), writing nothing; an expired entry's step is free."""
    pad, _ = single
    first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    second = pad.put(ALICE, "t1", 2, "shell", "two")["scratchpad_id"]
    rows = _admin(pg_dsn, "SELECT COUNT(*) FROM securepad.entries")
    with pytest.raises(InvalidArgumentError, match="already recorded"):
        pad.put(ALICE, "t1", 1, "shell", "again")
    assert _admin(pg_dsn, "SELECT COUNT(*) FROM securepad.entries") == rows
    assert _steps(pad, ALICE, "t1") == [(1, first), (2, second)]
    assert pad.get(ALICE, first).observation == TEXT
    old = pad.put(ALICE, "t1", 3, "shell", "expired", ttl_seconds=60, now=time.time() - 3600)["scratchpad_id"]
    pad.put(ALICE, "t1", 4, "shell", "four")  # this store sealed the head last again
    view, trips = counted(lambda: pad.put(ALICE, "t1", 3, "shell", "three again"))
    assert trips == 1  # the one message found the step free
    assert view["scratchpad_id"] != old
    assert [step for step, _ in _steps(pad, ALICE, "t1")] == [1, 2, 3, 4]
    assert pad.get(ALICE, view["scratchpad_id"]).observation == "three again"
    assert pad.verify()["ok"]


@pytest.mark.parametrize("rotator", ["this store", "another store"])
def test_a_put_after_an_owner_key_rotation_is_sealed_under_the_new_version(
    single: Single, other: Scratchpad, pg_dsn: str, rotator: str
) -> None:
    """After a rotation (here or in another process) the next put succeeds under the new key version."""
    pad, _ = single
    ids = [pad.put(ALICE, "t1", step, "shell", f"{TEXT}{step}")["scratchpad_id"] for step in (1, 2)]
    rotated = (pad if rotator == "this store" else other).rotate_owner_key("alice")
    assert rotated["complete"] and rotated["version"] == 2
    ids += [pad.put(ALICE, "t1", step, "shell", f"{TEXT}{step}")["scratchpad_id"] for step in (3, 4)]
    versions = _admin(
        pg_dsn,
        "SELECT id, key_version FROM securepad.entries WHERE id = ANY(%s) ORDER BY step_num",
        (ids[2:],),
    )
    assert versions == [(ids[2], 2), (ids[3], 2)]
    assert _admin(pg_dsn, "SELECT key_version FROM securepad.turn_heads WHERE turn_id = 't1'") == [(2,)]
    assert _steps(pad, ALICE, "t1") == list(zip(range(1, 5), ids, strict=True))
    assert [other.get(ALICE, entry).observation for entry in ids] == [f"{TEXT}{step}" for step in range(1, 5)]
    assert pad.verify()["ok"]


def test_an_id_collision_in_the_one_message_put_is_stored_under_another_id(
    single: Single, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one statement's entry id is taken: the put is stored under a new id, the taken entry left as it was."""
    pad, _ = single
    taken = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    pad.put(ALICE, "t1", 2, "shell", "two")
    ids = iter([taken])

    def new_entry_id() -> str:
        """The id just taken once, then fresh ones."""
        return next(ids, None) or secrets.token_hex(8)

    monkeypatch.setattr(prepare, "new_entry_id", new_entry_id)
    view, trips = counted(lambda: pad.put(ALICE, "t1", 3, "shell", "three"))
    assert next(ids, None) is None and view["scratchpad_id"] != taken  # the taken id was tried, then another
    assert trips == 3  # the one message failed as a whole; the two-message put wrote the entry
    assert pad.get(ALICE, taken).observation == TEXT
    assert pad.get(ALICE, view["scratchpad_id"]).observation == "three"
    assert [step for step, _ in _steps(pad, ALICE, "t1")] == [1, 2, 3]
    assert pad.verify()["ok"]


def _lose_first_reply(monkeypatch: pytest.MonkeyPatch, between: Callable[[], object] = lambda: None) -> list[int]:
    """Make the first ``write_once`` run its statement, then ``between``, then
    report a lost reply (None); later ones run as they are. The row counts the
    statement returned, one per lost reply."""
    write_once = PostgresDatabase.write_once
    lost: list[int] = []

    def losing(self: PostgresDatabase, owner: str, turn_id: str, sql: str, params: Any) -> int | None:
        written = write_once(self, owner, turn_id, sql, params)
        if lost or written is None:
            return written
        lost.append(written)
        between()
        return None

    monkeypatch.setattr(PostgresDatabase, "write_once", losing)
    return lost


def test_a_lost_reply_of_an_applied_put_returns_its_entry_once(single: Single, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection fails after the one statement wrote: the put returns that entry, stored once."""
    pad, _ = single
    first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    lost = _lose_first_reply(monkeypatch)
    landed = pad.put(ALICE, "t1", 2, "shell", "two")["scratchpad_id"]
    assert lost == [1]  # the statement had written the entry
    assert _steps(pad, ALICE, "t1") == [(1, first), (2, landed)]
    assert pad.get(ALICE, landed).observation == "two"
    assert pad.verify()["ok"]
    view, trips = counted(lambda: pad.put(ALICE, "t1", 3, "shell", "three"))
    assert trips == 1  # the landed head is this store's last again
    assert _steps(pad, ALICE, "t1") == [(1, first), (2, landed), (3, view["scratchpad_id"])]


def test_a_lost_reply_of_an_applied_put_then_another_writer_returns_its_entry_once(
    single: Single, other: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one statement wrote, its reply was lost, another process wrote the turn: the put still returns its entry."""
    pad, _ = single
    first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
    theirs: list[str] = []
    lost = _lose_first_reply(
        monkeypatch, lambda: theirs.append(other.put(ALICE, "t1", 3, "shell", "three")["scratchpad_id"])
    )
    landed = pad.put(ALICE, "t1", 2, "shell", "two")["scratchpad_id"]
    assert lost == [1]
    assert _steps(pad, ALICE, "t1") == [(1, first), (2, landed), (3, theirs[0])]
    assert pad.get(ALICE, landed).observation == "two"
    assert pad.verify()["ok"]


def test_a_put_whose_connection_is_terminated_while_it_waits_is_stored_once(
    pg_dsn: str, keyring: Keyring, other: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the one-message put's connection while it waits for the turn's lock: stored once anyway."""
    write_once = PostgresDatabase.write_once
    replies: list[int | None] = []

    def observed(self: PostgresDatabase, owner: str, turn_id: str, sql: str, params: Any) -> int | None:
        replies.append(write_once(self, owner, turn_id, sql, params))
        return replies[-1]

    monkeypatch.setattr(PostgresDatabase, "write_once", observed)  # an observer: it runs and answers as it is
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
        outcome = _put_while_its_lock_waiter_is_ended(pad, other, pg_dsn, "pg_terminate_backend")
        assert replies == [None]  # the one message was sent and its connection lost
        assert len(outcome) == 1 and isinstance(outcome[0], str), outcome
        assert _steps(pad, ALICE, "t1") == [(1, first), (2, outcome[0])]
        assert pad.get(ALICE, outcome[0]).observation == "two"
        assert pad.verify()["ok"]


def _put_while_its_lock_waiter_is_ended(pad: Scratchpad, other: Scratchpad, dsn: str, how: str) -> list[Any]:
    """``pad``'s put of step 2 into alice's ``t1`` while ``other`` holds the turn,
    its server process (or statement: ``how``) ended once it waits for the lock;
    the put's outcome (``_outcome``), alone in the list."""
    outcome: list[Any] = []
    with _holding_the_turn(other, "alice", "t1"):
        putter = threading.Thread(target=lambda: outcome.append(_outcome(pad, 2)))
        putter.start()
        ended = _terminate_the_lock_waiter(dsn, how)
    putter.join(30)
    assert not putter.is_alive() and ended
    return outcome


def _outcome(pad: Scratchpad, step: int) -> str | BaseException:
    """A put's entry id, or what it raised (from a thread)."""
    try:
        return str(pad.put(ALICE, "t1", step, "shell", "two")["scratchpad_id"])
    except BaseException as exc:  # reported by the test
        return exc


@contextmanager
def _holding_the_turn(store: Scratchpad, owner: str, turn: str) -> Iterator[None]:
    """``store``'s write transaction of (owner, turn), its locks taken, until the block ends (an empty commit)."""
    with parts(store).db.transaction(owner, turn=turn) as conn:
        conn.query("SELECT 1 AS one")  # BEGIN, the settings and the locks go with it
        yield


def _terminate_the_lock_waiter(dsn: str, how: str = "pg_terminate_backend") -> bool:
    """End the one server process of the database waiting for an advisory
    lock (or, ``how="pg_cancel_backend"``, its statement), once it waits
    (polled: the outcome, not the time, is asserted)."""
    deadline = time.monotonic() + 20
    with psycopg.connect(dsn, autocommit=True) as admin:
        while time.monotonic() < deadline:
            rows = admin.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            ).fetchall()
            if rows:
                assert len(rows) == 1 and "pg_advisory_xact_lock(" in rows[0][1], rows
                return bool(admin.execute(f"SELECT {how}(%s)", (rows[0][0],)).fetchone()[0])
            time.sleep(0.02)
    return False


def test_the_one_message_put_is_held_to_its_owners_rows(single: Single, pg_dsn: str) -> None:
    """Row-level security applies to the one statement: another owner's turn of the same id is never touched."""
    pad, _ = single
    alices = [pad.put(ALICE, "t1", step, "shell", f"alice {step}")["scratchpad_id"] for step in (1, 2)]
    head = _admin(pg_dsn, "SELECT sealed FROM securepad.turn_heads WHERE owner_user_id = 'alice' AND turn_id = 't1'")
    bobs = [pad.put(BOB, "t1", step, "shell", f"bob {step}")["scratchpad_id"] for step in (1, 2)]
    view, trips = counted(lambda: pad.put(BOB, "t1", 3, "shell", "bob 3"))
    assert trips == 1
    bobs.append(view["scratchpad_id"])
    assert _admin(
        pg_dsn, "SELECT sealed FROM securepad.turn_heads WHERE owner_user_id = 'alice' AND turn_id = 't1'"
    ) == (head)
    db = parts(pad).db
    assert isinstance(db, PostgresDatabase)
    touch = "UPDATE turn_heads SET sealed = sealed WHERE owner_user_id = ?"
    assert db.write_once("bob", "t1", touch, ("alice",)) == 0  # as securepad_app, bob's rows only
    assert db.write_once("alice", "t1", touch, ("alice",)) == 3  # the turn's, the owner's and the usage head
    assert _steps(pad, ALICE, "t1") == [(1, alices[0]), (2, alices[1])]
    assert _steps(pad, BOB, "t1") == list(zip((1, 2, 3), bobs, strict=True))
    assert [pad.get(BOB, entry).observation for entry in bobs] == ["bob 1", "bob 2", "bob 3"]
    assert pad.verify()["ok"]


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode with ONE server connection: every client shares one server session."""
    if find_pgbouncer() is None:
        pytest.skip("the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)")
    with PgBouncer(pool_size=1) as b:
        yield b


def test_one_message_puts_behind_pgbouncer_leak_no_setting(pg_dsn: str, bouncer: PgBouncer, keyring: Keyring) -> None:
    """Behind a transaction pooler, 50 puts go one message each and leave no owner or role on the shared session."""
    with Scratchpad.open(pg_dsn, keyring=keyring):
        pass  # the store is created directly (the migration takes session-level care)
    dsn = bouncer.dsn(pg_dsn.rsplit("/", 1)[1])
    kwargs = {"autocommit": True, "prepare_threshold": None}  # what the PostgreSQL guide asks behind a pooler
    with (
        ConnectionPool(dsn, min_size=1, max_size=2, kwargs=kwargs, connection_class=CountingConnection) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        ids = [pad.put(ALICE, "t1", 1, "shell", "step 1")["scratchpad_id"]]
        trips: list[int] = []
        for step in range(2, 51):
            view, count = counted(functools.partial(pad.put, ALICE, "t1", step, "shell", f"step {step}"))
            ids.append(view["scratchpad_id"])
            trips.append(count)
        assert trips == [1] * 49
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as fresh:
            left = fresh.execute(
                "SELECT current_setting('securepad.owner', true), current_user, current_setting('role')"
            ).fetchone()
        assert left is not None and left[0] in (None, "") and left[1:] == ("postgres", "none")
        assert _steps(pad, ALICE, "t1") == list(zip(range(1, 51), ids, strict=True))
        assert pad.get(ALICE, ids[-1]).observation == "step 50"
        assert pad.verify()["ok"]


# One step of the property: (what, which store, which turn or put, short-lived).
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 1), st.integers(0, 1), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 1), st.integers(0, 99), st.just(False)),
        st.tuples(st.just("gc"), st.integers(0, 1), st.just(0), st.just(False)),
    ),
    max_size=15,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_puts_of_two_stores_with_deletes_and_gc_are_each_listed_once(
    other: Scratchpad, third: Scratchpad, ops: list[tuple[str, int, int, bool]]
) -> None:
    """Whatever two processes put, delete and collect in two turns, every put that returned is listed once."""
    stores = (other, third)  # on pools of their own (a pool of one cannot load a key inside a transaction)
    who = Principal(f"prop-{secrets.token_hex(4)}", "planner", "web")
    turns = ("ta", "tb")
    clock = time.time()
    steps = {turn: 0 for turn in turns}
    puts: list[tuple[str, str, float]] = []  # (entry id, turn, expires at)
    deleted: set[str] = set()
    for what, store, which, short in ops:
        clock += 1
        pad = stores[store]
        if what == "put":
            turn = turns[which]
            steps[turn] += 1
            ttl = 3 if short else 3600
            view = pad.put(who, turn, steps[turn], "tool", f"{turn} {steps[turn]}", ttl, now=clock)
            puts.append((view["scratchpad_id"], turn, clock + ttl))
        elif what == "delete":
            alive = [entry for entry, _, expires in puts if entry not in deleted and expires > clock]
            if alive:
                pad.delete(who, alive[which % len(alive)])
                deleted.add(alive[which % len(alive)])
        else:
            pad.gc(clock, wait=False)
    for turn in turns:
        listed = [entry["scratchpad_id"] for entry in stores[0].list_for_turn(who, turn, now=clock)]
        expected = [entry for entry, t, expires in puts if t == turn and entry not in deleted and expires > clock]
        assert listed == expected
    assert stores[1].verify(now=clock)["ok"]


def test_one_message_puts_leave_the_key_use_count_to_a_two_message_put(single: Single, pg_dsn: str) -> None:
    """The owner key's use count still reaches the store: a put due to write it goes in two messages."""
    from securepad.keys.keystore import WRAP_FLUSH_EVERY

    pad, _ = single
    pad.put(ALICE, "t1", 1, "shell", "first")
    trips = [counted(functools.partial(pad.put, ALICE, "t1", step, "shell", "x"))[1] for step in range(2, 202)]
    stored = _admin(pg_dsn, "SELECT wrap_count FROM securepad.owner_keys WHERE owner_user_id = 'alice'")[0][0]
    pending = parts(pad).keys.pending_wraps().get(("alice", 1), 0)
    assert stored > 0 and pending < WRAP_FLUSH_EVERY
    assert stored + pending >= 2 * 201  # an entry key and a head sealed per put, none uncounted
    assert trips.count(2) >= 1 and trips.count(1) == len(trips) - trips.count(2)  # 400 wraps: a flush or more


def test_an_entry_of_several_segments_goes_in_two_messages(single: Single) -> None:
    """An entry over one 64 KiB segment is stored by the two-message put (its segment rows follow it), whole."""
    pad, _ = single
    pad.put(ALICE, "t1", 1, "shell", TEXT)
    big = TEXT * 20  # about 80 KiB: two segments
    view, trips = counted(lambda: pad.put(ALICE, "t1", 2, "shell", big))
    assert trips == 2
    assert pad.get(ALICE, view["scratchpad_id"]).observation == big
    _, trips = counted(lambda: pad.put(ALICE, "t1", 3, "shell", "small"))
    assert trips == 1  # the head the big put sealed is this store's last
    assert [step for step, _ in _steps(pad, ALICE, "t1")] == [1, 2, 3]
    assert pad.verify()["ok"]


def test_a_rotation_between_sealing_and_the_next_head_falls_back(
    pg_dsn: str, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation that retires the entry's key version after it was sealed (another
    thread of this process) makes the put fall back and store under the new version."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t1", 1, "shell", "one")
        change_once = Heads.change_once
        rotated: list[dict[str, Any]] = []

        def after_a_rotation(self: Heads, *args: Any, **kwargs: Any) -> Any:
            if not rotated:
                rotated.append(pad.rotate_owner_key("alice"))  # another thread's, between seal and head
            return change_once(self, *args, **kwargs)

        monkeypatch.setattr(Heads, "change_once", after_a_rotation)
        entry = pad.put(ALICE, "t1", 2, "shell", "two")["scratchpad_id"]
        assert rotated and rotated[0]["complete"] and rotated[0]["version"] == 2
        assert _admin(pg_dsn, "SELECT key_version FROM securepad.entries WHERE id = %s", (entry,)) == [(2,)]
        assert pad.get(ALICE, entry).observation == "two"
        assert pad.verify()["ok"]


def test_a_lost_reply_then_a_failed_fallback_names_the_entry_that_may_be_stored(
    single: Single, other: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one statement applied, its reply lost, and the fallback's lock wait timed
    out (another process's owner-wide write): the put raises StoreUnavailableError
    naming its entry, not StoreBusyError ("nothing written"); the entry is there,
    and putting the step again is refused."""
    pad, _ = single
    db = parts(pad).db
    assert isinstance(db, PostgresDatabase)
    monkeypatch.setattr(db.session, "lock_timeout", "300ms")  # a short lock wait for this store
    pad.put(ALICE, "t1", 1, "shell", "one")
    write_once = PostgresDatabase.write_once
    applied: list[int | None] = []
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _holding_the_owner(other, "alice"):
            held.set()
            release.wait(20)

    def reply_lost(self: PostgresDatabase, owner: str, turn_id: str, sql: str, params: Any) -> int | None:
        applied.append(write_once(self, owner, turn_id, sql, params))
        threading.Thread(target=hold).start()  # then another process's owner-wide write begins
        assert held.wait(20)
        return None

    monkeypatch.setattr(PostgresDatabase, "write_once", reply_lost)
    try:
        with pytest.raises(StoreUnavailableError, match="may be stored as entry") as exc:
            pad.put(ALICE, "t1", 2, "shell", "two")
    finally:
        release.set()
    assert applied == [1]
    entry = str(exc.value).split("may be stored as entry '")[1].split("'")[0]
    monkeypatch.undo()
    assert pad.get(ALICE, entry).observation == "two"
    with pytest.raises(InvalidArgumentError, match="already recorded"):
        pad.put(ALICE, "t1", 2, "shell", "two")
    assert [step for step, _ in _steps(pad, ALICE, "t1")] == [1, 2]
    assert pad.verify()["ok"]


@contextmanager
def _holding_the_owner(store: Scratchpad, owner: str) -> Iterator[None]:
    """``store``'s write transaction of ``owner`` (its exclusive lock), until the block ends."""
    with parts(store).db.transaction(owner) as conn:
        conn.query("SELECT 1 AS one")  # BEGIN, the settings and the locks go with it
        yield


def test_an_edited_head_key_version_is_refused_not_overwritten(
    pg_dsn: str, keyring: Keyring, other: Scratchpad
) -> None:
    """An edit of the head's clear key version alone makes the head fail to open:
    the one statement does not write over it, and the put refuses it, as a
    two-message put does; verify still names it."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t1", 1, "shell", "one")
        pad.put(ALICE, "t1", 2, "shell", "two")
        _admin(
            pg_dsn,
            "UPDATE securepad.turn_heads SET key_version = key_version + 5"
            " WHERE owner_user_id = 'alice' AND turn_id = 't1' RETURNING 1",
        )
        with pytest.raises(IntegrityError):
            pad.put(ALICE, "t1", 3, "shell", "three")
        with pytest.raises(IntegrityError):
            other.list_for_turn(ALICE, "t1")
        assert not pad.verify()["ok"]
        assert [step for (step,) in _admin(pg_dsn, "SELECT step_num FROM securepad.entries ORDER BY 1")] == [1, 2]


def test_the_wrap_count_goes_with_one_put_in_128(single: Single, pg_dsn: str) -> None:
    """Every put wraps two keys (the entry's, the head), counted in memory; the put
    that adds them to ``owner_keys`` (every 256 wraps, as ``write_current``
    decides) goes in two messages, once in 128 puts. The other two-message puts
    are the turn's reservation grants."""
    pad, _ = single
    pad.put(ALICE, "t1", 1, "shell", "first")

    def wrap_count() -> int:
        return int(_admin(pg_dsn, "SELECT wrap_count FROM securepad.owner_keys WHERE owner_user_id = 'alice'")[0][0])

    flushed, counted_before = [], wrap_count()
    for step in range(2, 1002):
        _, trips = counted(lambda step=step: pad.put(ALICE, "t1", step, "shell", "x"))
        assert trips in (1, 2)
        if trips == 2 and wrap_count() != counted_before:
            flushed.append(step)
            counted_before = wrap_count()
    assert len(flushed) == 7 and all(b - a == 128 for a, b in itertools.pairwise(flushed)), flushed


def test_a_put_whose_statement_the_server_cancels_writes_nothing_and_says_so(
    pg_dsn: str, keyring: Keyring, other: Scratchpad
) -> None:
    """The server cancels the one-message put while it waits for the turn's lock
    (its connection stays up): the implicit transaction rolled back, so the put
    raises StoreUnavailableError without a fallback and nothing is stored."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        first = pad.put(ALICE, "t1", 1, "shell", TEXT)["scratchpad_id"]
        outcome = _put_while_its_lock_waiter_is_ended(pad, other, pg_dsn, "pg_cancel_backend")
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError), outcome
        assert "cancelled" in str(outcome[0]) and "may be stored" not in str(outcome[0])
        assert _steps(pad, ALICE, "t1") == [(1, first)]
        second = pad.put(ALICE, "t1", 2, "shell", "two")["scratchpad_id"]
        assert _steps(pad, ALICE, "t1") == [(1, first), (2, second)]
        assert pad.verify()["ok"]
