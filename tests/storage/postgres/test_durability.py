"""The policy's durability on PostgreSQL (docs/reliability.md): ``"normal"``
is ``synchronous_commit = off`` and ``"full"`` is ``on``, set inside each of
the store's transactions with the owner and the role (``set_config(...,
true)``, in the statement the transaction sends anyway; in a put of one
message, the implicit transaction's), so it costs no round trip and
never outlives its transaction on a pooled server session.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from securepad import Keyring, Policy, Scratchpad, SecurepadError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from securepad.storage.postgres.migrate import APP_ROLE  # noqa: E402
from securepad.store import parts  # noqa: E402
from tests.support.counting import CountingConnection  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

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
    from tests.support.pgbouncer import PgBouncer, find_pgbouncer, pooled_store

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


@contextmanager
def _settings_noted(pg_dsn: str) -> Iterator[Callable[[str], tuple[str, str, int]]]:
    """A trigger on the store's entries (the test's, not the store's) that notes,
    for each entry inserted, the ``synchronous_commit`` and role of the
    statement that inserted it and its server session: what it holds until its
    transaction commits. Yields: entry id -> (setting, role, server pid)."""
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE public.settings_noted (entry_id text, sync text, role text, pid int)")
        admin.execute(
            "CREATE FUNCTION public.note_settings() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN"
            " INSERT INTO public.settings_noted VALUES (NEW.id, current_setting('synchronous_commit'),"
            " current_setting('role'), pg_backend_pid()); RETURN NEW; END $$"
        )
        admin.execute(
            "CREATE TRIGGER note_settings AFTER INSERT ON securepad.entries"
            " FOR EACH ROW EXECUTE FUNCTION public.note_settings()"
        )

        def noted(entry_id: str) -> tuple[str, str, int]:
            rows = admin.execute(
                "SELECT sync, role, pid FROM public.settings_noted WHERE entry_id = %s", (entry_id,)
            ).fetchall()
            assert len(rows) == 1, rows
            return str(rows[0][0]), str(rows[0][1]), int(rows[0][2])

        try:
            yield noted
        finally:
            admin.execute("DROP TRIGGER IF EXISTS note_settings ON securepad.entries")
            admin.execute("DROP FUNCTION public.note_settings()")
            admin.execute("DROP TABLE public.settings_noted")


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_the_setting_costs_no_round_trip(pg_dsn: str, keyring: Keyring, durability: str) -> None:
    """Under either policy (the round-trip budget): a put is one round trip
    into a turn whose head this process sealed last, and two into a turn's
    first (the head read first); a read is one. Each put's entry is inserted
    under the policy's setting and the store's role (noted by a trigger): in
    the put of one message too, whose settings statement goes in that message
    and whose implicit transaction commits under it. The session's own
    setting is the server's default after each."""
    kwargs = {"autocommit": True}
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=CountingConnection) as pool,
        Scratchpad.open(pool, keyring=keyring, policy=_policy(durability)) as pad,
        _settings_noted(pg_dsn) as noted,
    ):
        pad.put(ALICE, "warm", 1, "shell", "warm")  # the owner's key made and cached
        default, pid = _session_default(pool)
        trips: dict[str, int] = {}
        for name, step in (("put (first into a turn)", 1), ("put (turn this process wrote last)", 2)):
            before = CountingConnection.waits
            entry = pad.put(ALICE, "t", step, "shell", "x" * 4096)["scratchpad_id"]
            trips[name] = CountingConnection.waits - before
            assert noted(entry) == (EXPECTED[durability], APP_ROLE, pid)
            assert _session_default(pool) == (default, pid) == ("on", pid)
        before = CountingConnection.waits
        assert pad.read(ALICE, entry, "head", n=100)["content"] == "x" * 100
        trips["read"] = CountingConnection.waits - before
        assert trips == {"put (first into a turn)": 2, "put (turn this process wrote last)": 1, "read": 1}
