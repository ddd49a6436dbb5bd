"""The policy's durability on PostgreSQL (docs/reliability.md): ``"normal"``
is ``synchronous_commit = off`` and ``"full"`` is ``on``, set inside each of
the store's transactions with the owner and the role (``set_config(...,
true)``, in the statement the transaction sends anyway), so it costs no round
trip and never outlives its transaction on a pooled server session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from securepad import Keyring, Policy, Principal, Scratchpad, SecurepadError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad._pg import PostgresDatabase  # noqa: E402
from securepad.store import parts  # noqa: E402

ALICE = Principal("alice", "planner", "web")
EXPECTED = {"normal": "off", "full": "on"}
SHOW = "SELECT current_setting('synchronous_commit') AS sync, pg_backend_pid() AS pid"


def _policy(durability: str) -> Policy:
    return Policy.from_dict({"access": {"scope": "owner"}, "storage": {"durability": durability}})


@pytest.fixture
def one_connection(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    """A pool of one connection: every transaction runs on the same server session."""
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        yield pool


def _session_default(pool: ConnectionPool[Any]) -> tuple[str, int]:
    """The server session's own setting, outside any store transaction."""
    with pool.connection() as conn:
        row = conn.execute(SHOW).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_each_write_transaction_runs_with_the_policys_synchronous_commit(
    one_connection: ConnectionPool[Any], keyring: Keyring, durability: str
) -> None:
    with Scratchpad.open(one_connection, keyring=keyring, policy=_policy(durability)) as pad:
        db = parts(pad).db
        default, pid = _session_default(one_connection)
        assert default == "on"  # the server's default: the store's setting is its own
        for owner, admin in ((ALICE.owner_user_id, False), (None, True)):
            with db.transaction(owner, admin=admin) as conn:
                row = conn.query(SHOW)[0]
            assert (row["sync"], row["pid"]) == (EXPECTED[durability], pid)
            # The next transaction on the same server session (here: plain SQL) has the default again.
            assert _session_default(one_connection) == ("on", pid)
        # Reads carry it too (one statement for every call's settings); it ends with them.
        assert db.query(SHOW)[0]["sync"] == EXPECTED[durability]
        assert _session_default(one_connection) == ("on", pid)
        # A put commits under it, and what it wrote is there.
        entry = pad.put(ALICE, "t", 1, "shell", "kept")["scratchpad_id"]
        assert pad.get(ALICE, entry).observation == "kept"
        assert _session_default(one_connection) == ("on", pid)


def test_a_failed_write_transaction_leaves_the_session_default(
    one_connection: ConnectionPool[Any], keyring: Keyring
) -> None:
    with Scratchpad.open(one_connection, keyring=keyring) as pad:
        db = parts(pad).db
        with pytest.raises(ZeroDivisionError), db.transaction(ALICE.owner_user_id) as conn:
            assert conn.query(SHOW)[0]["sync"] == "off"
            raise ZeroDivisionError
        assert _session_default(one_connection)[0] == "on"


def test_the_default_policy_is_normal_on_postgresql_too(pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad, parts(pad).db.transaction(ALICE.owner_user_id) as conn:
        assert conn.query(SHOW)[0]["sync"] == "off"


def test_an_unknown_durability_is_refused(pg_dsn: str) -> None:
    with pytest.raises(SecurepadError, match="durability must be one of normal, full"):
        PostgresDatabase(pg_dsn, durability="off")


def test_through_pgbouncer_the_setting_never_reaches_the_next_transaction(pg_dsn: str, keyring: Keyring) -> None:
    """PgBouncer in transaction pooling mode with one server connection: a store
    transaction and a plain client's next one run on the same server session;
    the plain one sees the server's default."""
    from securepad.bench.pgbouncer import PgBouncer, find_pgbouncer, pooled_store

    if find_pgbouncer() is None:
        reason = "the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with Scratchpad.open(pg_dsn, keyring=keyring):
        pass
    with PgBouncer(pool_size=1) as bouncer:
        dsn = bouncer.dsn(pg_dsn.rsplit("/", 1)[1])
        pad, pool = pooled_store(dsn, keyring, pool_size=2)
        try:
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as plain:
                for step in (1, 2, 3):
                    with parts(pad).db.transaction(ALICE.owner_user_id) as conn:
                        inside = conn.query(SHOW)[0]
                    pad.put(ALICE, "t", step, "shell", "through the pooler")
                    after = plain.execute(SHOW).fetchone()
                    assert inside["sync"] == "off"
                    assert after is not None and (after[0], after[1]) == ("on", inside["pid"])
        finally:
            pad.close()
            pool.close()


class _Counting(psycopg.Connection[Any]):
    """Counts the connection's waits for the server: its round trips (as test_pg_round_trips)."""

    waits = 0

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        _Counting.waits += 1
        return super().wait(gen, *args, **kwargs)


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_the_setting_costs_no_round_trip(pg_dsn: str, keyring: Keyring, durability: str) -> None:
    """A put is two round trips and a read one under either policy (the budget of issue 15)."""
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=_Counting) as pool,
        Scratchpad.open(pool, keyring=keyring, policy=_policy(durability)) as pad,
    ):
        pad.put(ALICE, "t", 1, "shell", "warm")  # the owner's key made and cached
        before = _Counting.waits
        entry = pad.put(ALICE, "t", 2, "shell", "x" * 4096)["scratchpad_id"]
        put = _Counting.waits - before
        before = _Counting.waits
        assert pad.read(ALICE, entry, "head", n=100)["content"] == "x" * 100
        assert (put, _Counting.waits - before) == (2, 1)
