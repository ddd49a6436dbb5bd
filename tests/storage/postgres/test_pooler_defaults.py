"""A store opened from a plain DSN (the default pools) through PgBouncer in
transaction pooling mode.

``tests/storage/postgres/test_pgbouncer.py`` gives the store pools of its own made as the docs
say (``prepare_threshold=None``). Here nothing is configured: the DSN of the
pooler goes to ``Scratchpad.open`` as it is, the store is created through the
pooler, and 64 clients put, read and list while some of their writes fail (a
step recorded twice: the transaction is rolled back). Before the store's
ROLLBACK was sent with ``prepare=False``, psycopg prepared the sixth ROLLBACK
of a pooled connection on one server session and ran it by name on another
("prepared statement _pg3_N does not exist"): the rollback failed and the pool
had to clean up after it ("rolling back returned connection", some connections
broken).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from securepad import InvalidArgumentError, Keyring, Principal, Scratchpad
from securepad.store import parts
from tests.support.pgbouncer import PgBouncer, find_pgbouncer

CLIENTS = 64
STORES = 8  # 8 stores x 8 connections (the default pool size) = 64 client connections
SERVER_CONNECTIONS = 4
ROUNDS = 8  # more than psycopg's prepare threshold (5) of failed writes per connection


@pytest.fixture
def bouncer(pg_dsn: str) -> Iterator[PgBouncer]:
    if find_pgbouncer() is None:
        reason = "the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with PgBouncer(pool_size=SERVER_CONNECTIONS) as b:
        yield b


def _seen(pad: Scratchpad, owner: str | None) -> dict[str, Any]:
    """What one transaction sees of its own settings and of other owners' rows."""
    return parts(pad).db.query(
        "SELECT current_setting('securepad.owner', true) AS owner, current_user AS role, pg_backend_pid() AS pid,"
        " (SELECT COUNT(*) FROM entries) AS visible,"
        " (SELECT COUNT(*) FROM entries WHERE owner_user_id <> current_setting('securepad.owner', true)) AS others,"
        # psycopg's own protocol-level names (_pg3_N), not the store's SQL PREPAREs
        r" (SELECT COUNT(*) FROM pg_prepared_statements WHERE name LIKE '\_pg3\_%') AS prepared",
        owner=owner,
    )[0]


def test_the_default_pools_through_pgbouncer_serve_64_clients_cleanly(
    pg_dsn: str, bouncer: PgBouncer, keyring: Keyring, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = bouncer.dsn(pg_dsn.rsplit("/", 1)[1])
    with Scratchpad.open(dsn, keyring=keyring):
        pass  # created through the pooler: the migration holds only transaction-level locks
    stores = [Scratchpad.open(dsn, keyring=keyring) for _ in range(STORES)]
    tag = secrets.token_hex(4)
    errors: list[str] = []
    written = [0] * CLIENTS
    refused = [0] * CLIENTS
    pids: dict[int, set[str]] = {}
    prepared: set[int] = set()
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        pad = stores[i % STORES]
        me = Principal(f"dflt-{tag}-{i}", "agent", "web")
        try:
            start.wait()
            for step in range(1, ROUNDS + 1):
                text = f"{me.owner_user_id} step {step}"
                entry = pad.put(me, "turn", step, "tool", text)["scratchpad_id"]
                written[i] += 1
                try:
                    pad.put(me, "turn", step, "tool", "the same step again")
                except InvalidArgumentError:
                    refused[i] += 1  # rolled back: the pooled connection must come back clean
                assert pad.get(me, entry).observation == text
                assert pad.read(me, entry, mode="full")["content"] == text
                assert [v["step_num"] for v in pad.list_for_turn(me, "turn")] == list(range(1, step + 1))
                mine, nobody = _seen(pad, me.owner_user_id), _seen(pad, None)
                assert (mine["owner"], mine["role"], mine["others"], mine["visible"]) == (
                    me.owner_user_id,
                    "securepad_app",
                    0,
                    step,
                ), mine
                assert (nobody["owner"], nobody["role"], nobody["visible"]) == ("", "securepad_app", 0), nobody
                with lock:
                    pids.setdefault(mine["pid"], set()).add(me.owner_user_id)
                    prepared.update((mine["prepared"], nobody["prepared"]))
        except Exception as exc:
            with lock:
                errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    caplog.set_level(logging.WARNING, logger="psycopg")
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stored = [stores[0].stats(Principal(f"dflt-{tag}-{i}", "agent", "web"))["entries"] for i in range(CLIENTS)]
        report = stores[0].verify()
    finally:
        for pad in stores:
            pad.close()
    assert errors == []
    assert stored == written == [ROUNDS] * CLIENTS  # 0 lost writes
    assert refused == [ROUNDS] * CLIENTS
    assert report["ok"], report["problems"]
    # No rollback failed on a server session (the pool never had to clean up after one),
    # and no server session holds a statement psycopg prepared.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert prepared == {0}
    # The server connections were shared: PgBouncer's pool, each serving many owners in turn.
    assert len(pids) <= SERVER_CONNECTIONS
    assert max(len(owners) for owners in pids.values()) > 1
