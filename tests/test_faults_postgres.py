"""PostgreSQL under network faults (issue 18), through a fault-injecting TCP
proxy in front of the real server: a black hole, a refusing server, a restart.

The shared server is never restarted (other test sessions use it at the same
time): a restart is simulated at the proxy by dropping every connection,
refusing new ones for a while, then accepting again — what a client sees of a
real restart.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import ALICE

from securepad import Keyring, Policy, Scratchpad, StoreBusyError, StoreUnavailableError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from securepad._pg import PostgresDatabase  # noqa: E402  (needs psycopg)


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of the server, with faults on demand.

    ``black_hole`` keeps every connection open but forwards nothing either way
    (the kernel still acknowledges packets: TCP keepalives see nothing wrong);
    ``refuse`` drops every connection and refuses new ones; ``heal`` undoes both.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.black_hole = False
        self._down = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self.accept()

    def accept(self) -> None:
        """Listen (again, on the same port)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True).start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: refusing
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._down:  # accepted just before the listener closed
                    client.close()
                    upstream.close()
                    continue
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if self._down:
                break
            if self.black_hole:
                continue  # swallowed: neither side hears anything
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def drop_all(self) -> None:
        """End every proxied connection, as a server restart does."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def refuse(self) -> None:
        """Drop every connection and refuse new ones (the server is down)."""
        self._down = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.drop_all()

    def heal(self) -> None:
        self.black_hole = False
        if self._listener is None:
            self.accept()
        self._down = False

    def close(self) -> None:
        self.refuse()


@pytest.fixture
def proxy(pg_database: str) -> Iterator[FaultyProxy]:
    server = urlsplit(pg_database)
    faulty = FaultyProxy((server.hostname or "127.0.0.1", server.port or 5432))
    yield faulty
    faulty.close()


def through(dsn: str, proxy: FaultyProxy) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}"))


# Small limits, so that each fault shows within seconds.
LIMITS: dict[str, Any] = {
    "lock_timeout_ms": 1000,
    "statement_timeout_ms": 1500,
    "connect_timeout_s": 1,
    "pool_timeout_s": 1.5,
    "call_timeout_s": 2.5,
}


@pytest.fixture
def faulty_pad(pg_dsn: str, proxy: FaultyProxy, keyring: Keyring) -> Iterator[Scratchpad]:
    db = PostgresDatabase(through(pg_dsn, proxy), schema="securepad", pool_size=4, **LIMITS)
    pad = Scratchpad(db, keyring, Policy.default(), time.time)
    yield pad
    proxy.heal()
    pad.close()


def bounded(call: Callable[[], Any], limit_s: float = 20) -> tuple[Any, float]:
    """Run ``call`` in a thread; its result or exception and how long it took.
    A call still blocked after ``limit_s`` fails the test instead of hanging it."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the call was still blocked after {limit_s} s"
    return outcome[0], time.monotonic() - started


def until_it_works(call: Callable[[], Any], limit_s: float = 15) -> float:
    """Retry ``call`` on the retryable errors; how long until it first succeeded."""
    started = time.monotonic()
    while True:
        try:
            call()
            return time.monotonic() - started
        except (StoreUnavailableError, StoreBusyError):
            assert time.monotonic() - started < limit_s, "the store did not come back"
            time.sleep(0.05)


def test_a_black_hole_ends_at_the_deadline(faulty_pad: Scratchpad, proxy: FaultyProxy) -> None:
    entry = faulty_pad.put(ALICE, "t", 1, "tool", "before the black hole")["scratchpad_id"]
    proxy.black_hole = True
    for call in (
        lambda: faulty_pad.get(ALICE, entry),
        lambda: faulty_pad.put(ALICE, "t", 2, "tool", "into the void"),
    ):
        outcome, took = bounded(call)
        assert isinstance(outcome, StoreUnavailableError), outcome
        # The call deadline (2.5 s), plus a pool wait and a probe at most.
        assert took < 2.5 + 1.5 + 1 + 2
    proxy.black_hole = False
    until_it_works(lambda: faulty_pad.get(ALICE, entry))
    assert faulty_pad.get(ALICE, entry).observation == "before the black hole"


def test_a_refusing_server_is_unavailable_not_busy(faulty_pad: Scratchpad, proxy: FaultyProxy) -> None:
    faulty_pad.put(ALICE, "t", 1, "tool", "first")
    proxy.refuse()
    outcome, _ = bounded(lambda: faulty_pad.put(ALICE, "t", 2, "tool", "refused"))
    assert type(outcome) is StoreUnavailableError
    assert "PostgreSQL" in str(outcome) and "busy" not in str(outcome)
    outcome, _ = bounded(lambda: faulty_pad.list_for_turn(ALICE, "t"))
    assert type(outcome) is StoreUnavailableError


def test_a_restart_is_survived_by_the_next_call(faulty_pad: Scratchpad, proxy: FaultyProxy) -> None:
    """Every pooled session ends; the server is back at once. The next calls
    replace the dead connections themselves: no error reaches the caller."""
    entry = faulty_pad.put(ALICE, "t", 1, "tool", "survives")["scratchpad_id"]
    workers = [threading.Thread(target=faulty_pad.get, args=(ALICE, entry)) for _ in range(4)]
    for worker in workers:  # several connections in the pool
        worker.start()
    for worker in workers:
        worker.join()
    proxy.drop_all()
    assert faulty_pad.get(ALICE, entry).observation == "survives"
    proxy.drop_all()
    faulty_pad.put(ALICE, "t", 2, "tool", "written after a restart")
    assert [e["step_num"] for e in faulty_pad.list_for_turn(ALICE, "t")] == [1, 2]


def test_recovery_within_two_seconds_of_the_servers_return(faulty_pad: Scratchpad, proxy: FaultyProxy) -> None:
    entry = faulty_pad.put(ALICE, "t", 1, "tool", "x")["scratchpad_id"]
    proxy.refuse()  # down for 6 s: the pool's reconnect attempts fail meanwhile
    errors: list[BaseException] = []
    down_until = time.monotonic() + 6
    while time.monotonic() < down_until:
        outcome, _ = bounded(lambda: faulty_pad.get(ALICE, entry))
        errors.append(outcome)
    assert errors and all(type(e) is StoreUnavailableError for e in errors)
    proxy.heal()
    # psycopg_pool's default back-off made the first success 19 s late (issue 18).
    assert until_it_works(lambda: faulty_pad.get(ALICE, entry)) < 3.0


def test_statement_timeout_bounds_a_slow_statement(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn, schema="securepad", **LIMITS)
    try:
        assert db.query("SHOW statement_timeout")[0]["statement_timeout"] == "1500ms"
        # Housekeeping (store-wide, maybe long on a large store) gets ten times as long.
        assert db.query("SHOW statement_timeout", admin=True)[0]["statement_timeout"] == "15s"
        with pytest.raises(StoreUnavailableError, match="cancel"):
            db.query("SELECT pg_sleep(5)")
        assert db.query("SELECT 1 AS one") == [{"one": 1}]  # the connection is fine afterwards
    finally:
        db.close()


def test_pools_made_from_a_dsn_carry_the_network_limits(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn, schema="securepad")
    try:
        with psycopg.connect(pg_dsn) as probe:
            assert probe.info.get_parameters().get("keepalives_idle") is None  # a plain connection: none
        rows = db.query("SELECT 1 AS one")
        assert rows == [{"one": 1}]
        with db._app.connection() as conn:
            given = conn.info.get_parameters()
        assert given["connect_timeout"] == "5"
        assert given["keepalives_idle"] == "5" and given["keepalives_count"] == "3"
        assert given["tcp_user_timeout"] == "10000"
    finally:
        db.close()


def test_a_dsn_keeps_its_own_limits(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn + "?connect_timeout=9", schema="securepad")
    try:
        with db._app.connection() as conn:
            assert conn.info.get_parameters()["connect_timeout"] == "9"
    finally:
        db.close()


def test_opening_an_unreachable_server_is_unavailable(proxy: FaultyProxy, pg_dsn: str, keyring: Keyring) -> None:
    proxy.refuse()
    outcome, _ = bounded(lambda: Scratchpad.open(through(pg_dsn, proxy), keyring=keyring))
    assert type(outcome) is StoreUnavailableError
    assert "cannot connect" in str(outcome)
