"""What opening a PostgreSQL store costs a fresh process, counted on the client:
connections made and round trips (psycopg waits for the server
through ``Connection.wait`` once per message), whatever the machine's load.

Opening an existing store at the current schema from a DSN makes one
connection (the one that checks the server is handed to the pool as its
first) and two round trips: the schema version, then the store's metadata
(the key check, the anchor key, the heads' and usage flags, read once).
Before: two connections and five round trips (the metadata read three times
more, once per flag).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from securepad import Keyring, Scratchpad, SecurepadError, StoreUnavailableError
from securepad.store import parts
from tests.support.older_heads import as_format_2

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402

from tests.support.principals import ALICE  # noqa: E402


class Counts:
    """Connections made and round trips waited for, by every psycopg connection of the process."""

    def __init__(self) -> None:
        self.connections = 0
        self.round_trips = 0

    def during(self, call: Callable[[], Any]) -> tuple[Any, int, int]:
        """``call``'s result, and the connections and round trips it made."""
        connections, round_trips = self.connections, self.round_trips
        result = call()
        return result, self.connections - connections, self.round_trips - round_trips


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counts]:
    """Counting wrappers around psycopg's own connect and wait (the real ones run)."""
    found = Counts()
    connect = psycopg.Connection.connect.__func__
    wait = psycopg.Connection.wait

    def counted_connect(cls: type[Any], conninfo: str = "", **kwargs: Any) -> Any:
        found.connections += 1
        return connect(cls, conninfo, **kwargs)

    def counted_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        found.round_trips += 1
        return wait(self, *args, **kwargs)

    def counted_module_connect(conninfo: str = "", **kwargs: Any) -> Any:
        return counted_connect(psycopg.Connection, conninfo, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(counted_connect))
    monkeypatch.setattr(psycopg, "connect", counted_module_connect)  # bound to the original at import
    monkeypatch.setattr(psycopg.Connection, "wait", counted_wait)
    yield found


def _existing_store(pg_dsn: str, keyring: Keyring) -> None:
    """A store with an owner, a turn and an entry (its migrations, flags and heads done)."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t1", 1, "shell", "hello")


def test_opening_an_existing_store_from_a_dsn_connects_once_in_two_round_trips(
    pg_dsn: str, keyring: Keyring, counts: Counts
) -> None:
    _existing_store(pg_dsn, keyring)
    pad, connections, round_trips = counts.during(lambda: Scratchpad.open(pg_dsn, keyring=keyring))
    with pad:
        assert (connections, round_trips) == (1, 2)
        # The connection that checked the server is the pool's: the first call connects no more.
        entries, connections, round_trips = counts.during(lambda: pad.list_for_turn(ALICE, "t1"))
        assert len(entries) == 1
        assert connections == 0


def test_opening_on_a_pool_passed_in_takes_two_round_trips(pg_dsn: str, keyring: Keyring, counts: Counts) -> None:
    _existing_store(pg_dsn, keyring)
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        pool.wait()
        pad, connections, round_trips = counts.during(lambda: Scratchpad.open(pool, keyring=keyring))
        with pad:
            assert (connections, round_trips) == (0, 2)


def test_each_open_still_checks_the_schema_version(pg_dsn: str, keyring: Keyring) -> None:
    """The version read at open is not cached across opens: a store a newer
    securepad migrated is refused by the next open."""
    _existing_store(pg_dsn, keyring)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO securepad.schema_version(version) VALUES (999)")
    with pytest.raises(SecurepadError, match="newer than this securepad understands"):
        Scratchpad.open(pg_dsn, keyring=keyring)


def test_the_metadata_read_at_open_still_decides_the_heads_build(pg_dsn: str, keyring: Keyring) -> None:
    """The flags come from the metadata read at unlock: a store whose heads
    flag says they are of format 2 is converted at open, and a flag edited
    to a value that does not authenticate is refused, as when each was read apart."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(ALICE, "t1", 1, "shell", "hello")
        old_flag = parts(pad).db.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")[0]["value"]
        as_format_2(pad)
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        assert [e["view"]["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1]
        flag = parts(pad).db.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")[0]["value"]
        assert flag == old_flag
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE securepad.store_meta SET value = 'forged' WHERE key = 'turn_heads'")
    with pytest.raises(SecurepadError, match="does not authenticate"):
        Scratchpad.open(pg_dsn, keyring=keyring)


def test_a_refused_connection_is_reported_at_once_with_nothing_left_open(
    pg_dsn: str, keyring: Keyring, counts: Counts
) -> None:
    """The connection that checks the server fails before any pool exists: the
    server's reason, without the password, one attempt."""
    parts_of = urlsplit(pg_dsn)
    where = f"{parts_of.username}:hunter2@{parts_of.hostname}:{parts_of.port}"
    missing = urlunsplit(parts_of._replace(netloc=where, path="/securepad_no_such_database"))
    with pytest.raises(StoreUnavailableError, match="securepad_no_such_database") as raised:
        counts.during(lambda: Scratchpad.open(missing, keyring=keyring))
    assert "hunter2" not in str(raised.value)
    assert counts.connections == 1


def test_a_first_resume_takes_six_round_trips_and_a_gc_with_nothing_expired_two(
    pg_dsn: str, keyring: Keyring, counts: Counts
) -> None:
    """After the open: ``pad.turn`` collects expired rows first (its gc reads
    them with its first message and, finding none, deletes nothing: that
    message and COMMIT), then the history (the turn's rows with its head, and
    the owner's key, new to this process) and the tools (2). Before: the gc
    sent its four DELETEs whatever it found (10 round trips)."""
    _existing_store(pg_dsn, keyring)
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:

        def resume() -> tuple[list[Any], list[Any]]:
            turn = pad.turn(ALICE, "t1")
            return list(turn.history()), list(turn.tools())

        (history, tools), _, round_trips = counts.during(resume)
        assert len(history) == 1 and tools
        assert round_trips == 6
        _, _, round_trips = counts.during(lambda: pad.gc())
        assert round_trips == 2


def test_a_gc_that_finds_expired_rows_still_deletes_them(pg_dsn: str, keyring: Keyring) -> None:
    clock = [1_000_000.0]
    with Scratchpad.open(pg_dsn, keyring=keyring, clock=lambda: clock[0]) as pad:
        short = pad.put(ALICE, "t1", 1, "shell", "short-lived", ttl_seconds=60)["scratchpad_id"]
        kept = pad.put(ALICE, "t1", 2, "shell", "kept", ttl_seconds=3600)["scratchpad_id"]
        assert pad.gc() == 0
        clock[0] += 120
        assert pad.gc() == 1
        rows = parts(pad).db.query("SELECT id FROM entries", admin=True)
        assert [r["id"] for r in rows] == [kept] != [short]
        assert [e["view"]["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [2]
