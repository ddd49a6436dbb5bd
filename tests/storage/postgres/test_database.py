"""The PostgreSQL backend's own behaviour: opening, concurrency, lock timeouts,
and what it tells about where the store is. The store's behaviour itself is
tested on both backends through the ``pad`` fixture."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from securepad import (
    InvalidArgumentError,
    Keyring,
    Policy,
    Principal,
    QuotaExceededError,
    Scratchpad,
    SecurepadError,
    StoreBusyError,
)

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from securepad.storage.postgres.database import PostgresDatabase  # noqa: E402
from securepad.store import parts  # noqa: E402
from tests.support.principals import ALICE, BOB  # noqa: E402


@pytest.fixture
def pg_pad(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        yield pad


def test_a_connection_pool_opens_the_same_store(pg_pad: Scratchpad, pg_dsn: str, keyring: Keyring) -> None:
    entry = pg_pad.put(ALICE, "t1", 1, "shell", "from the DSN")["scratchpad_id"]
    with ConnectionPool(pg_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        with Scratchpad.open(pool, keyring=keyring) as other:
            assert other.get(ALICE, entry).observation == "from the DSN"
            assert other.backend == "postgresql"
        assert not pool.closed  # the caller's pool stays the caller's


def test_location_names_server_database_and_schema_never_the_password(pg_database: str, keyring: Keyring) -> None:
    # The password is wrong for nothing: the test server trusts local connections.
    url = pg_database.replace("postgresql://postgres@", "postgresql://postgres:hunter2@")
    with Scratchpad.open(url, keyring=keyring, schema="located") as pad:
        assert "hunter2" not in pad.location
        assert pad.location.endswith(f"/{pg_database.rsplit('/', 1)[1]} (schema located)")
        assert "hunter2" not in str(pad.stats())
        with pytest.raises(SecurepadError, match="not a SQLite file"):
            _ = pad.path
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA located CASCADE")


def test_the_wrong_master_key_is_refused(pg_pad: Scratchpad, pg_dsn: str, tmp_path: Path) -> None:
    from securepad import WrongKeyError

    with pytest.raises(WrongKeyError):
        Scratchpad.open(pg_dsn, keyring=Keyring.from_key_file(tmp_path / "other-key"))


def test_no_server_is_a_clear_error(keyring: Keyring) -> None:
    with pytest.raises(SecurepadError, match="cannot connect to PostgreSQL"):
        PostgresDatabase("postgresql://postgres@127.0.0.1:9/nowhere?connect_timeout=1")


def test_postgresql_options_are_refused_for_a_sqlite_file(db_path: Path, keyring: Keyring) -> None:
    with pytest.raises(InvalidArgumentError, match="PostgreSQL"):
        Scratchpad.open(db_path, keyring=keyring, schema="other")


def test_bad_schema_names_are_refused(pg_database: str, keyring: Keyring) -> None:
    with pytest.raises(SecurepadError, match="schema"):
        Scratchpad.open(pg_database, keyring=keyring, schema="x; DROP TABLE entries")


def test_threads_of_two_owners_lose_nothing_and_keep_the_quota(pg_dsn: str, keyring: Keyring) -> None:
    """Eight threads put and read at once; one owner's quota holds exactly under the race."""
    # What one such entry costs on disk (content, sealed fields, row overhead, give or take the
    # digits of a time): the quota holds 20, not 21.
    carol = Principal("carol", "planner", "web")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.put(carol, "turn-0", 0, "shell", "0-0-" + "x" * 996)
        cost = pad.stats(carol)["stored_bytes"]
        pad.forget_owner("carol")
    policy = Policy.from_dict({"limits": {"owner_quota_bytes": 20 * cost + 500, "max_entry_bytes": 1000}}, name="tight")
    with Scratchpad.open(pg_dsn, keyring=keyring, policy=policy) as pad:
        stored: dict[str, tuple[Principal, str]] = {}
        refused: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def work(worker: int) -> None:
            principal = ALICE if worker % 2 else BOB
            try:
                for i in range(10):
                    text = f"{worker}-{i}-" + "x" * (1000 - len(f"{worker}-{i}-"))
                    try:
                        entry = pad.put(principal, f"turn-{worker}", i, "shell", text)["scratchpad_id"]
                    except QuotaExceededError:
                        with lock:
                            refused.append(worker)
                        continue
                    assert pad.read(principal, entry, "head", n=20)["content"] == text[:20]
                    with lock:
                        stored[entry] = (principal, text)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        # 40 puts of 1000 bytes per owner against a quota of 20 such entries: exactly 20 fit.
        per_owner = {o: sum(1 for p, _ in stored.values() if p.owner_user_id == o) for o in ("alice", "bob")}
        assert per_owner == {"alice": 20, "bob": 20}
        assert len(refused) == 40
        for entry, (principal, text) in stored.items():
            assert pad.get(principal, entry).observation == text
        assert 20 * cost - 500 <= pad.stats(ALICE)["stored_bytes"] <= 20 * cost + 500


def test_a_lock_held_too_long_is_store_busy(pg_dsn: str, keyring: Keyring) -> None:
    """Another session holds alice's write lock: alice's put gives up after the
    lock timeout with StoreBusyError; bob writes meanwhile."""
    db = PostgresDatabase(pg_dsn, lock_timeout_ms=200)
    pad = Scratchpad(db, keyring, Policy.default(), __import__("time").time)
    try:
        pad.put(ALICE, "t1", 1, "shell", "first")  # alice's key exists
        with db.transaction("alice") as held:
            held.query("SELECT 1 AS one")  # the lock is taken with the transaction's first message
            done: list[object] = []
            thread = threading.Thread(target=lambda: done.append(_put_or_error(pad, ALICE)))
            thread.start()
            thread.join()
            assert isinstance(done[0], StoreBusyError)
            assert isinstance(_put_or_error(pad, BOB), dict)  # another owner is not held up
        assert isinstance(_put_or_error(pad, ALICE), dict)
    finally:
        pad.close()


def _put_or_error(pad: Scratchpad, principal: Principal) -> object:
    try:
        return pad.put(principal, "t1", 2, "shell", "second")
    except StoreBusyError as exc:
        return exc


def test_gc_that_begins_a_turn_does_not_wait_for_another_collector(pg_pad: Scratchpad) -> None:
    db = parts(pg_pad).db
    with db.transaction(admin=True) as held:  # another process is collecting
        held.query("SELECT 1 AS one")  # its lock is taken with its first message
        turn = pg_pad.turn(ALICE, "t1")  # returns at once instead of waiting
        assert turn.history() == []
        with pytest.raises(StoreBusyError):
            pg_pad.gc(wait=False)


def test_a_login_with_the_application_role_only_serves_principals(
    pg_pad: Scratchpad, pg_dsn: str, keyring: Keyring
) -> None:
    """The deployment docs/how-to/postgresql.md describes: the runtime's login is a member
    of securepad_app only. It opens the store, puts, reads and runs turns (the
    gc that begins a turn is skipped); housekeeping is refused."""
    import secrets
    from urllib.parse import urlsplit, urlunsplit

    from securepad.storage.postgres.database import APP_ROLE

    login = f"securepad_app_test_{secrets.token_hex(4)}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {login} LOGIN IN ROLE {APP_ROLE}")
        try:
            url = urlsplit(pg_dsn)
            dsn = urlunsplit(url._replace(netloc=f"{login}@{url.hostname}:{url.port or 5432}"))
            with Scratchpad.open(dsn, keyring=keyring) as app:
                turn = app.turn(ALICE, "t1")
                turn.record(1, "shell", "y" * 10_000)
                entry = app.list_for_turn(ALICE, "t1")[0]["scratchpad_id"]
                assert app.read(ALICE, entry, "tail", n=3)["content"] == "yyy"
                assert app.stats(ALICE)["entries"] == 1
                for housekeeping in (app.gc, app.stats, lambda: app.forget_owner("alice")):
                    with pytest.raises(SecurepadError, match="refused"):
                        housekeeping()
        finally:
            admin.execute(f"DROP ROLE IF EXISTS {login}")
    assert pg_pad.stats()["entries"] == 1


def _fill(pad: Scratchpad, principal: Principal, count: int) -> dict[str, str]:
    turn = pad.turn(principal, "t1")
    turn.checkpoint(facts=[f"fact of {principal.owner_user_id}"])
    entries = {}
    for i in range(count):
        text = f"{principal.owner_user_id} {i} " * 5_000
        entries[pad.put(principal, "t1", i + 10, "shell", text)["scratchpad_id"]] = text
    return entries


def _admin_count(pad: Scratchpad, sql: str, *params: object) -> int:
    return int(parts(pad).db.query(sql, params, admin=True)[0]["n"])


def test_owner_rotation_rewraps_and_retires_on_postgresql(pg_pad: Scratchpad) -> None:
    alice, bob = _fill(pg_pad, ALICE, 3), _fill(pg_pad, BOB, 2)
    result = pg_pad.rotate_owner_key("alice", progress=lambda done, total: None)
    assert (result["version"], result["retired_versions"], result["complete"]) == (2, [1], True)
    assert result["item_keys_rewrapped"] == 4  # 3 entries and the checkpoint
    rows = parts(pg_pad).db.query("SELECT owner_user_id, version FROM owner_keys ORDER BY 1", admin=True)
    assert [(r["owner_user_id"], r["version"]) for r in rows] == [("alice", 2), ("bob", 1)]
    for principal, entries in ((ALICE, alice), (BOB, bob)):
        for entry, text in entries.items():
            assert pg_pad.get(principal, entry).observation == text
        checkpoint = pg_pad.turn(principal, "t1").latest_checkpoint()
        assert checkpoint is not None
        assert checkpoint["facts"] == [f"fact of {principal.owner_user_id}"]


def test_master_rotation_on_postgresql(pg_pad: Scratchpad, pg_dsn: str, keyring: Keyring, tmp_path: Path) -> None:
    from securepad import WrongKeyError

    entries = _fill(pg_pad, ALICE, 2)
    new = Keyring.from_key_file(tmp_path / "new-key")
    assert pg_pad.rotate_master_key(new)["owner_keys_rewrapped"] == 1
    with pytest.raises(WrongKeyError):
        Scratchpad.open(pg_dsn, keyring=keyring)
    with Scratchpad.open(pg_dsn, keyring=new) as reopened:
        for entry, text in entries.items():
            assert reopened.get(ALICE, entry).observation == text


def test_forget_owner_on_postgresql_leaves_no_row_of_the_owner(pg_pad: Scratchpad) -> None:
    _fill(pg_pad, ALICE, 2)
    bob = _fill(pg_pad, BOB, 1)
    removed = pg_pad.forget_owner("alice")
    assert (removed["entries"], removed["owner_keys"], removed["checkpoints"]) == (2, 1, 1)
    assert removed["segments"] >= 2
    for table in ("entries", "segments", "owner_keys", "turn_heads", "checkpoints", "compaction_marks"):
        assert _admin_count(pg_pad, f"SELECT COUNT(*) AS n FROM {table} WHERE owner_user_id = ?", "alice") == 0
    ((entry, text),) = bob.items()
    assert pg_pad.get(BOB, entry).observation == text


def test_the_audit_passes_on_a_postgresql_store_and_leaves_nothing(pg_login_dsn: str, keyring: Keyring) -> None:
    from securepad.audit import run_audit

    with Scratchpad.open(pg_login_dsn, keyring=keyring) as pg_pad:
        report = run_audit(pg_pad)
        assert report.passed, [(r.name, r.happened) for r in report.failed]
        assert pg_pad.stats()["owners"] == 0
