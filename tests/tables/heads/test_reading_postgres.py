"""The read cost on PostgreSQL: the verified-head cache and its digest token.

A warm read sends, beside its own rows, the token of its cached inventory;
the server computes the turn's head and its SHA-256 of the turn's inventory
rows (``storage.postgres.functions.PG_FRESHNESS``): equal to the cached pair, the inventory's rows
are left out and the cached inventory checks the read's rows. The read stays
one round trip. An edit by the admin role (the tables' owner) changes the
digest or the head: the statement then sends the inventory (still one round
trip), and the read verifies it and refuses the edit. A genuine write from
elsewhere (a store object with a cache of its own) is served the same way.
Through PgBouncer (no prepared statements) the same holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from securepad import Keyring, Scratchpad
from securepad.errors import IntegrityError, NotFoundError
from tests.support.meters import ReadMeter
from tests.support.tamper_edits import record_batches

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402

from tests.support.counting import CountingConnection, trips  # noqa: E402
from tests.support.pgbouncer import PgBouncer, find_pgbouncer  # noqa: E402
from tests.support.principals import ALICE, NOW  # noqa: E402

LATER = NOW + 100
TURN = "t1"


@contextmanager
def as_admin(dsn: str, schema: str = "securepad") -> Iterator[psycopg.Connection[Any]]:
    """One transaction as ``securepad_admin`` (the tables' owner), outside securepad."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET ROLE securepad_admin")
        conn.execute(f"SET search_path = {schema}")
        yield conn


def _warm(pad: Scratchpad, ids: list[str]) -> None:
    for _ in range(2):
        pad.get(ALICE, ids[0], now=LATER)
        pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
        pad.turn(ALICE, TURN, now=LATER).latest_checkpoint(now=LATER)


@pytest.fixture
def counted(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(
            pg_store_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=CountingConnection
        ) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad


@pytest.fixture
def warm(pg_store_dsn: str, keyring: Keyring) -> Iterator[dict[str, Any]]:
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        ids = record_batches(pad, ALICE, TURN, 5)
        with as_admin(pg_store_dsn) as conn:
            older_head = conn.execute(
                "SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = %s", (TURN,)
            ).fetchall()[0][0]
            older_meta = conn.execute(
                "SELECT expires_at, sealed_meta FROM entries WHERE id = %s", (ids[0],)
            ).fetchall()[0]
        pad.turn(ALICE, TURN, now=NOW).resume(extend_ttl=7200, now=NOW + 10)
        _warm(pad, ids)
        assert ReadMeter(pad).counts(lambda: pad.get(ALICE, ids[2], now=LATER))["rows"] == 2  # warm: no inventory
        yield {"pad": pad, "dsn": pg_store_dsn, "ids": ids, "older_head": older_head, "older_meta": older_meta}


def test_a_warm_read_is_one_round_trip_and_fetches_no_inventory(counted: Scratchpad) -> None:
    pad = counted
    meter = ReadMeter(pad)
    costs = {}
    for length in (1, 200):
        entry = record_batches(pad, ALICE, f"length-{length}", length)[-1]
        turn = f"length-{length}"
        assert meter.counts(lambda entry=entry: pad.get(ALICE, entry, now=LATER))["rows"] >= length + 4  # cold
        handle = pad.turn(ALICE, turn, now=LATER)
        handle.history(now=LATER)
        reads = {
            "read": lambda entry=entry: pad.read(ALICE, entry, "tail", n=2000, now=LATER),
            "get": lambda entry=entry: pad.get(ALICE, entry, now=LATER),
            "history": lambda handle=handle: handle.history(now=LATER),
        }
        costs[length] = {name: (trips(read), meter.counts(read)) for name, read in reads.items()}
    for length, by_read in costs.items():
        assert by_read["read"] == (1, {"statements": 2, "rows": 2, "calls": 1})
        assert by_read["get"] == by_read["read"]
        assert by_read["history"] == (1, {"statements": 2, "rows": length + 1, "calls": 1})


def test_a_write_from_elsewhere_sends_the_inventory_in_the_same_round_trip(
    counted: Scratchpad, pg_dsn: str, keyring: Keyring
) -> None:
    pad = counted
    ids = record_batches(pad, ALICE, TURN, 3)
    _warm(pad, ids)
    meter = ReadMeter(pad)
    assert trips(lambda: pad.get(ALICE, ids[0], now=LATER)) == 1
    assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER))["rows"] == 2  # warm
    with Scratchpad.open(pg_dsn, keyring=keyring) as other:  # another process's store, in effect
        other.put(ALICE, TURN, 4, "fetch", "from elsewhere", now=NOW)
    handle = pad.turn(ALICE, TURN, now=LATER)
    # The head moved: the token differs, so the statement sends the inventory; it is verified, the new row served.
    assert trips(lambda: handle.history(now=LATER)) == 1
    assert [view["step_num"] for view in pad.list_for_turn(ALICE, TURN, now=LATER)] == [1, 2, 3, 4]
    assert trips(lambda: pad.get(ALICE, ids[0], now=LATER)) == 1
    assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER))["rows"] == 2  # cached again


def test_this_process_s_write_drops_the_turn_so_the_next_read_is_still_one_round_trip(counted: Scratchpad) -> None:
    pad = counted
    ids = record_batches(pad, ALICE, TURN, 3)
    _warm(pad, ids)
    new = pad.put(ALICE, TURN, 4, "fetch", "four", now=NOW)["scratchpad_id"]
    assert trips(lambda: pad.get(ALICE, new, now=LATER)) == 1  # the inventory, asked for at once
    assert trips(lambda: pad.get(ALICE, new, now=LATER)) == 1
    assert ReadMeter(pad).counts(lambda: pad.get(ALICE, new, now=LATER))["rows"] == 2


def _exec(sql: str, params: Callable[[dict[str, Any]], tuple[Any, ...]] = lambda s: ()) -> Any:
    def edit(conn: psycopg.Connection[Any], s: dict[str, Any]) -> None:
        conn.execute(sql, params(s))

    return edit


EDITS: dict[str, Any] = {
    "middle_deletion": _exec("DELETE FROM entries WHERE id = %s", lambda s: (s["ids"][2],)),
    "expiry_moved_earlier": _exec(
        "UPDATE entries SET expires_at = %s WHERE id = %s", lambda s: (NOW + 50, s["ids"][2])
    ),
    "turn_relabelled": _exec("UPDATE entries SET turn_id = 't9' WHERE id = %s", lambda s: (s["ids"][2],)),
    "stored_bytes_changed": _exec("UPDATE entries SET stored_bytes = 1 WHERE id = %s", lambda s: (s["ids"][2],)),
    "actor_changed": _exec("UPDATE entries SET actor = 'other' WHERE id = %s", lambda s: (s["ids"][2],)),
    "row_rolled_back": _exec(
        "UPDATE entries SET expires_at = %s, sealed_meta = %s WHERE id = %s",
        lambda s: (*s["older_meta"], s["ids"][0]),
    ),
    "newest_checkpoint_deleted": _exec(
        "DELETE FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = 't1' AND seq ="
        " (SELECT MAX(seq) FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = 't1')"
    ),
    "head_deleted": _exec("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = 't1'"),
    "head_rolled_back": _exec(
        "UPDATE turn_heads SET sealed = %s WHERE owner_user_id = 'alice' AND turn_id = 't1'",
        lambda s: (s["older_head"],),
    ),
}
_ENTRY_EDITS = {"middle_deletion", "expiry_moved_earlier", "turn_relabelled", "stored_bytes_changed", "actor_changed"}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_admin_edit_after_warm_reads_is_refused_by_the_next_warm_read(warm: dict[str, Any], edit: str) -> None:
    with as_admin(warm["dsn"]) as conn:
        EDITS[edit](conn, warm)
    pad = warm["pad"]
    # get and read first: opening a turn (``pad.turn``) collects what its clear expiry says has expired.
    if edit in _ENTRY_EDITS or edit == "row_rolled_back":
        touched = warm["ids"][0 if edit == "row_rolled_back" else 2]
        expected = NotFoundError if edit == "middle_deletion" else IntegrityError
        with pytest.raises(expected):
            pad.get(ALICE, touched, now=LATER)
    if edit not in _ENTRY_EDITS - {"middle_deletion", "turn_relabelled"}:
        with pytest.raises(IntegrityError):  # another entry of the turn: its turn is refused as a whole
            pad.get(ALICE, warm["ids"][1], now=LATER)
    with pytest.raises(IntegrityError):
        pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
    if edit in ("newest_checkpoint_deleted", "head_deleted", "head_rolled_back"):
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=LATER).latest_checkpoint(now=LATER)


def test_the_digest_sees_an_expiry_moved_by_one_ulp_in_a_row_the_read_does_not_fetch(warm: dict[str, Any]) -> None:
    """The expiry goes into the digest as its 8 bytes: the smallest change a double allows still shows."""
    with as_admin(warm["dsn"]) as conn:
        row = conn.execute("SELECT expires_at FROM entries WHERE id = %s", (warm["ids"][3],)).fetchone()
        assert row is not None
        conn.execute("UPDATE entries SET expires_at = %s WHERE id = %s", (math.nextafter(row[0], 0.0), warm["ids"][3]))
    with pytest.raises(IntegrityError):  # latest_checkpoint fetches no entry row: the digest saw it
        warm["pad"].turn(ALICE, TURN, now=LATER).latest_checkpoint(now=LATER)


@pytest.fixture(scope="module")
def pgbouncer_exe() -> str:
    exe = find_pgbouncer()
    if exe is None:
        pytest.skip("the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)")
    return exe


def test_through_pgbouncer_warm_reads_use_the_digest_and_refuse_an_edit(
    pg_dsn: str, pgbouncer_exe: str, keyring: Keyring
) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring):
        pass  # the store is created directly (the migration takes session-level care)
    dbname = pg_dsn.rsplit("/", 1)[1]
    with PgBouncer(pool_size=2) as bouncer, Scratchpad.open(bouncer.dsn(dbname), keyring=keyring) as pad:
        ids = record_batches(pad, ALICE, TURN, 5)
        for _ in range(3):  # past the first messages: the pooler makes the store stop preparing
            _warm(pad, ids)
        meter = ReadMeter(pad)
        assert meter.counts(lambda: pad.get(ALICE, ids[2], now=LATER))["rows"] == 2
        assert len(pad.turn(ALICE, TURN, now=LATER).history(now=LATER)) == 5
        with as_admin(pg_dsn) as conn:
            conn.execute("DELETE FROM entries WHERE id = %s", (ids[2],))
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, TURN, now=LATER).history(now=LATER)
        with pytest.raises(IntegrityError):
            pad.get(ALICE, ids[1], now=LATER)


def test_with_the_cache_off_every_read_verifies_the_whole_inventory(pg_dsn: str, keyring: Keyring) -> None:
    """``Heads.cache_limit(0)`` (the benchmark's "before"): no digest, the inventory every time."""
    from securepad.store import parts

    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        parts(pad).heads.cache_limit(0)
        ids = record_batches(pad, ALICE, TURN, 5)
        meter = ReadMeter(pad)
        for _ in range(2):
            assert meter.counts(lambda: pad.get(ALICE, ids[0], now=LATER))["rows"] >= 10
        with as_admin(pg_dsn) as conn:
            conn.execute("DELETE FROM entries WHERE id = %s", (ids[3],))
        with pytest.raises(IntegrityError):
            pad.get(ALICE, ids[0], now=LATER)
