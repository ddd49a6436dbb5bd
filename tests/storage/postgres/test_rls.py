"""PostgreSQL's row-level security, the second line of defence: what a session
of the application role sees and may do, whatever SQL it runs.

These tests connect as a login role that is a member of ``securepad_app``
only, as an application deployed per docs/how-to/postgresql.md does.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from securepad import Keyring, NotFoundError, Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from securepad.storage.postgres.database import APP_ROLE  # noqa: E402  (needs psycopg)
from securepad.store import parts  # noqa: E402
from tests.support.principals import ALICE, BOB  # noqa: E402

OWNER_TABLES = ("entries", "segments", "owner_keys", "turn_heads", "checkpoints", "compaction_marks")


@pytest.fixture
def pg_pad(pg_store_dsn: str, keyring: Keyring) -> Iterator[Scratchpad]:
    """A store with entries, a checkpoint and a compaction mark of alice and of bob."""
    with Scratchpad.open(pg_store_dsn, keyring=keyring) as pad:
        for principal in (ALICE, BOB):
            turn = pad.turn(principal, "t1")
            turn.record(1, "shell", f"{principal.owner_user_id}\n" * 20_000)
            turn.checkpoint(facts=[principal.owner_user_id])
            turn.mark_compaction()
        yield pad


@pytest.fixture
def app_session(pg_pad: Scratchpad, pg_dsn: str) -> Iterator[psycopg.Connection]:
    """A connection as a fresh login role that is a member of securepad_app only."""
    login = f"securepad_rls_test_{secrets.token_hex(4)}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {login} LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE {APP_ROLE}")
        try:
            url = urlsplit(pg_dsn)
            dsn = urlunsplit(url._replace(netloc=f"{login}@{url.hostname}:{url.port or 5432}"))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET search_path = securepad")
                yield conn
        finally:
            admin.execute(f"DROP ROLE IF EXISTS {login}")


def owners(conn: psycopg.Connection, table: str) -> list[str]:
    return sorted({row[0] for row in conn.execute(f"SELECT owner_user_id FROM {table}")})


def test_the_application_role_cannot_bypass_row_level_security(app_session: psycopg.Connection) -> None:
    rows = app_session.execute(
        "SELECT r.rolsuper, r.rolbypassrls FROM pg_roles r WHERE r.rolname IN (current_user, %s)", (APP_ROLE,)
    ).fetchall()
    assert rows == [(False, False), (False, False)]


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_a_raw_select_without_the_owner_setting_returns_no_rows(
    app_session: psycopg.Connection, pg_pad: Scratchpad, table: str
) -> None:
    assert pg_pad.stats()["owners"] == 2  # the rows are there, for the admin role
    assert app_session.execute(f"SELECT * FROM {table}").fetchall() == []
    assert app_session.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,)


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_with_an_owner_setting_a_raw_select_returns_only_that_owners_rows(
    app_session: psycopg.Connection, table: str
) -> None:
    for owner in ("alice", "bob"):
        with app_session.transaction():
            app_session.execute("SELECT set_config('securepad.owner', %s, true)", (owner,))
            assert owners(app_session, table) == [owner]
            # Even a condition naming the other owner finds nothing.
            other = "bob" if owner == "alice" else "alice"
            found = app_session.execute(
                f"SELECT COUNT(*) FROM {table} WHERE owner_user_id = %s",
                (other,),
            ).fetchone()
            assert found == (0,)
    # The setting ended with the transaction.
    assert app_session.execute("SELECT * FROM entries").fetchall() == []


def test_the_application_role_cannot_write_into_another_owner(app_session: psycopg.Connection) -> None:
    with app_session.transaction():
        app_session.execute("SELECT set_config('securepad.owner', 'alice', true)")
        changed = app_session.execute("UPDATE entries SET expires_at = 0 WHERE owner_user_id = 'bob'").rowcount
        deleted = app_session.execute("DELETE FROM segments WHERE owner_user_id = 'bob'").rowcount
        assert (changed, deleted) == (0, 0)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"), app_session.transaction():
        app_session.execute("SELECT set_config('securepad.owner', 'alice', true)")
        app_session.execute("UPDATE entries SET owner_user_id = 'bob'")  # no such grant
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"), app_session.transaction():
        app_session.execute("SELECT set_config('securepad.owner', 'alice', true)")
        bob_entry = "0123456789abcdef"
        app_session.execute(
            "INSERT INTO segments(entry_id, seq, data, owner_user_id) VALUES (%s, 0, 'x', 'bob')", (bob_entry,)
        )


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM owner_keys",
        "UPDATE owner_keys SET wrapped = 'x'",
        "UPDATE entries SET wrapped_key = 'x'",
        "DELETE FROM store_meta",
        "DROP TABLE entries",
    ],
)
def test_housekeeping_statements_are_refused_to_the_application_role(
    app_session: psycopg.Connection, statement: str
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege), app_session.transaction():
        app_session.execute("SELECT set_config('securepad.owner', 'alice', true)")
        app_session.execute(statement)


def test_store_meta_is_readable_but_only_the_wrap_count_can_change(app_session: psycopg.Connection) -> None:
    keys = {row[0] for row in app_session.execute("SELECT key FROM store_meta")}
    assert {"store_id", "key_check", "master_wrap_count"} <= keys
    with app_session.transaction():
        assert app_session.execute("UPDATE store_meta SET value = 'x' WHERE key = 'key_check'").rowcount == 0
        assert app_session.execute("UPDATE store_meta SET value = value WHERE key = 'master_wrap_count'").rowcount == 1


def test_a_query_that_forgets_the_owner_still_sees_only_the_owners_rows(
    pg_pad: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first line (the owner in the WHERE) broken on purpose: the server holds."""
    alice_id = pg_pad.list_for_turn(ALICE, "t1")[0]["scratchpad_id"]
    monkeypatch.setattr(type(pg_pad.policy), "scope_sql", lambda self, principal: ("1 = 1", ()))
    monkeypatch.setattr(type(pg_pad.policy), "authorize_row", lambda self, principal, row: None)
    rows = parts(pg_pad).db.query("SELECT owner_user_id FROM entries", owner="bob")
    assert [row["owner_user_id"] for row in rows] == ["bob"]
    assert [entry["scratchpad_id"] for entry in pg_pad.list_for_turn(BOB, "t1")] != [alice_id]
    assert len(pg_pad.list_for_turn(BOB, "t1")) == 1
    with pytest.raises(NotFoundError):
        pg_pad.read(BOB, alice_id)
    with pytest.raises(NotFoundError):
        pg_pad.delete(BOB, alice_id)
    assert pg_pad.get(ALICE, alice_id).owner_user_id == "alice"


def test_segments_are_read_one_range_at_a_time(pg_pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial read asks the server for the segments it needs, not the whole entry."""
    big = pg_pad.put(ALICE, "t2", 1, "shell", "x" * 300_000)["scratchpad_id"]
    asked: list[tuple[object, ...]] = []
    query = parts(pg_pad).db.query

    def spy(sql: str, params: tuple[object, ...] = (), **kwargs: object) -> list[dict[str, object]]:
        if sql.startswith("SELECT seq, data FROM segments"):
            asked.append(params)
        return query(sql, params, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(parts(pg_pad).db, "query", spy)
    assert pg_pad.read(ALICE, big, "tail", n=10)["content"] == "x" * 10
    assert asked == [(big, 4, 4)]  # (its entry row carries no segment: it has five)
