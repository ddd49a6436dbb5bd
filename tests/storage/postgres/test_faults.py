"""PostgreSQL under network faults, through a fault-injecting TCP
proxy in front of the real server: a black hole, a refusing server, a restart.

The shared server is never restarted (other test sessions use it at the same
time): a restart is simulated at the proxy by dropping every connection,
refusing new ones for a while, then accepting again — what a client sees of a
real restart.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from securepad import Keyring, Scratchpad, StoreBusyError, StoreUnavailableError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from securepad.cli import main  # noqa: E402
from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402  (needs psycopg)
from tests.support.faults import LIMITS, FaultyProxy, through  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402


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


def test_a_put_sent_in_one_message_into_a_black_hole_names_its_entry(
    faulty_pad: Scratchpad, proxy: FaultyProxy
) -> None:
    """A put in one message (its turn's head sealed here last) sent into a black hole
    is cut at the deadline: it may yet be applied, so the error names the entry it may
    have stored instead of meaning "nothing was written"; once the network is back,
    the entry is there or not, and the turn reads and verifies either way."""
    faulty_pad.put(ALICE, "t", 1, "tool", "before the black hole")
    proxy.black_hole = True
    outcome, _ = bounded(lambda: faulty_pad.put(ALICE, "t", 2, "tool", "into the void"))
    proxy.black_hole = False
    assert isinstance(outcome, StoreUnavailableError), outcome
    assert "the call was cut" in str(outcome) and "may be stored as entry" in str(outcome), outcome
    entry = str(outcome).split("may be stored as entry '")[1].split("'")[0]
    until_it_works(lambda: faulty_pad.list_for_turn(ALICE, "t"))
    steps = [e["step_num"] for e in faulty_pad.list_for_turn(ALICE, "t")]
    assert steps in ([1], [1, 2])
    if steps == [1, 2]:
        assert faulty_pad.get(ALICE, entry).observation == "into the void"
    assert faulty_pad.verify()["ok"]


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
    # psycopg_pool's default back-off made the first success 19 s late.
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
        with db.connections.app.connection() as conn:
            given = conn.info.get_parameters()
        assert given["connect_timeout"] == "5"
        assert given["keepalives_idle"] == "5" and given["keepalives_count"] == "3"
        assert given["tcp_user_timeout"] == "10000"
    finally:
        db.close()


def test_a_dsn_keeps_its_own_limits(pg_dsn: str) -> None:
    db = PostgresDatabase(pg_dsn + "?connect_timeout=9", schema="securepad")
    try:
        with db.connections.app.connection() as conn:
            assert conn.info.get_parameters()["connect_timeout"] == "9"
    finally:
        db.close()


def test_opening_an_unreachable_server_is_unavailable(proxy: FaultyProxy, pg_dsn: str, keyring: Keyring) -> None:
    proxy.refuse()
    outcome, _ = bounded(lambda: Scratchpad.open(through(pg_dsn, proxy), keyring=keyring))
    assert type(outcome) is StoreUnavailableError
    assert "cannot connect" in str(outcome)


def test_cli_prints_one_line_when_the_server_is_unreachable(proxy: FaultyProxy, pg_dsn: str, tmp_path: Path) -> None:
    Keyring.create_key_file(tmp_path / "key")
    proxy.refuse()
    store = ["--db", through(pg_dsn, proxy), "--key-file", str(tmp_path / "key")]
    result = CliRunner().invoke(main, [*store, "stats"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith("error: StoreUnavailableError: ") and result.stderr.count("\n") == 1
    result = CliRunner().invoke(main, [*store, "stats", "--json"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    error = json.loads(result.stderr)["error"]
    assert error["type"] == "StoreUnavailableError" and "cannot connect" in error["message"]
