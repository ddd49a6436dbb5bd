"""Many clients through PgBouncer in transaction pooling mode, and SCRAM password
authentication.

Each test starts Debian's ``pgbouncer`` on a free local port with its own ini and
userlist in a temporary directory, and stops it. Without pgbouncer the tests are
skipped, saying why; with ``CI=true`` its absence is a failure (``.ci/run``
installs it).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from securepad import Keyring, Principal, Scratchpad, SecurepadError
from securepad.store import parts
from tests.support.pgbouncer import PgBouncer, find_pgbouncer, pooled_store

CLIENTS = 64
STORES = 8  # 8 stores x 8 pooled connections = 64 client connections to PgBouncer
SERVER_CONNECTIONS = 4
ROUNDS = 6


@pytest.fixture(scope="module")
def pgbouncer_exe() -> str:
    exe = find_pgbouncer()
    if exe is None:
        reason = "the PgBouncer tests need Debian's pgbouncer (apt-get install pgbouncer)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return exe


@pytest.fixture
def dbname(pg_dsn: str, pgbouncer_exe: str) -> str:
    return pg_dsn.rsplit("/", 1)[1]


@pytest.fixture
def bouncer(dbname: str) -> Iterator[PgBouncer]:
    with PgBouncer(pool_size=SERVER_CONNECTIONS) as b:
        yield b


def _check(pad: Scratchpad, owner: str | None, *, admin: bool = False) -> dict[str, Any]:
    """What one transaction sees of its own settings, and of others' rows."""
    return parts(pad).db.query(
        "SELECT current_setting('securepad.owner', true) AS owner, current_user AS role, pg_backend_pid() AS pid,"
        " (SELECT COUNT(*) FROM entries) AS visible,"
        " (SELECT COUNT(*) FROM entries WHERE owner_user_id <> current_setting('securepad.owner', true)) AS others",
        owner=owner,
        admin=admin,
    )[0]


def test_64_clients_never_see_another_transactions_owner_or_role(
    pg_dsn: str, bouncer: PgBouncer, dbname: str, keyring: Keyring
) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring):
        pass  # the store is created directly (the migration takes session-level care)
    opened = [pooled_store(bouncer.dsn(dbname), keyring, pool_size=CLIENTS // STORES) for _ in range(STORES)]
    tag = secrets.token_hex(4)
    errors: list[str] = []
    pids: dict[int, set[str]] = {}
    written = [0] * CLIENTS
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        pad = opened[i % STORES][0]
        me = Principal(f"pool-{tag}-{i}", "agent", "web")
        try:
            start.wait()
            for step in range(1, ROUNDS + 1):
                entry = pad.put(me, "turn", step, "tool", f"{me.owner_user_id} step {step}")["scratchpad_id"]
                written[i] += 1
                assert pad.get(me, entry).observation == f"{me.owner_user_id} step {step}"
                seen = _check(pad, me.owner_user_id)
                assert (seen["owner"], seen["role"], seen["others"]) == (me.owner_user_id, "securepad_app", 0), seen
                assert seen["visible"] == step
                anonymous = _check(pad, None)
                assert (anonymous["owner"], anonymous["role"], anonymous["visible"]) == ("", "securepad_app", 0)
                with lock:
                    pids.setdefault(seen["pid"], set()).add(me.owner_user_id)
                    pids.setdefault(anonymous["pid"], set()).add("")
                listed = pad.list_for_turn(me, "turn")
                assert {v["scratchpad_id"] for v in listed} >= {entry}
        except Exception as exc:
            with lock:
                errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pad = opened[0][0]
        housekeeping = _check(pad, None, admin=True)
        stored = [pad.stats(Principal(f"pool-{tag}-{i}", "agent", "web"))["entries"] for i in range(CLIENTS)]
    finally:
        for store, pool in opened:
            store.close()
            pool.close()
    assert errors == []
    assert stored == written == [ROUNDS] * CLIENTS  # 0 lost writes
    assert housekeeping["role"] == "securepad_admin" and housekeeping["visible"] == CLIENTS * ROUNDS
    # The server connections were shared: at most PgBouncer's pool, each serving many owners in turn.
    assert len(pids) <= SERVER_CONNECTIONS
    assert max(len(owners) for owners in pids.values()) > 1


@pytest.fixture
def scram_role(pg_dsn: str) -> Iterator[tuple[str, str]]:
    """A login role of this test's own, with a SCRAM-SHA-256 password, member of securepad_app."""
    role, password = f"securepad_scram_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE securepad_app")
    try:
        yield role, password
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_scram_password_authentication_through_pgbouncer(
    pg_dsn: str, dbname: str, scram_role: tuple[str, str], keyring: Keyring, tmp_path: Path
) -> None:
    """The local server trusts 127.0.0.1, so authentication is checked by PgBouncer
    with ``auth_type = scram-sha-256`` and the role's SCRAM secret from pg_authid:
    the client (libpq) proves the password with SCRAM, never sending it."""
    role, password = scram_role
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()
    assert row is not None and str(row[0]).startswith("SCRAM-SHA-256$")
    with Scratchpad.open(pg_dsn, keyring=keyring) as admin_pad:
        entry = admin_pad.put(Principal("erin", "a", "c"), "t", 1, "x", "by the admin login")["scratchpad_id"]
    with PgBouncer(users={role: str(row[0])}, auth_type="scram-sha-256") as b:
        with Scratchpad.open(b.dsn(dbname, role, password), keyring=keyring) as pad:
            me = Principal("erin", "a", "c")
            assert pad.get(me, entry).observation == "by the admin login"
            mine = pad.put(me, "t", 2, "x", "through SCRAM")["scratchpad_id"]
            assert pad.get(me, mine).observation == "through SCRAM"
            assert "password" not in pad.location and password not in pad.location
        for wrong in (password + "x", ""):
            with pytest.raises(SecurepadError, match=r"SASL authentication failed|no password supplied") as refused:
                Scratchpad.open(b.dsn(dbname, role, wrong), keyring=keyring)
            assert password not in str(refused.value)


def test_the_benchmark_runs_and_counts_errors_and_lost_writes(
    pgbouncer_exe: str, pg_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A smoke run (no timing asserted): the table has a row per target and client
    count, with 0 errors and 0 lost writes."""
    from benchmarks.pgbouncer import TARGETS, main

    assert main(["--quick", "--seconds", "0.5", "--clients", "1", "4", "32", "--server", pg_database]) == 0
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert [(r[0], r[1]) for r in rows[1:]] == [(t, c) for t in TARGETS for c in ("1", "4")]  # --quick: up to 8
    assert all(r[5] == "0" and r[6] == "0" for r in rows[1:]), rows
