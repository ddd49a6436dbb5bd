"""Each call's first statement (``storage/postgres/session.py``): the role,
owner, timeouts and durability it sets, and the advisory locks a write takes:
the store's and the owner's (shared when the write is one turn's, with the
turn's), or the store's alone for housekeeping."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")

from securepad.storage.postgres.migrate import ADMIN_ROLE, APP_ROLE
from securepad.storage.postgres.session import Session

SESSION = Session("store_a", lock_timeout_ms=500, statement_timeout_ms=2_000, durability="normal")


def test_a_principals_call_is_the_application_role_for_its_owner() -> None:
    text, params = SESSION.settings("alice", admin=False)
    assert "set_config('securepad.owner'" in text
    assert params == (APP_ROLE, "store_a", "alice", "500ms", "2000ms", "off")


def test_housekeeping_is_the_admin_role_with_ten_times_the_statement_limit_and_no_owner() -> None:
    assert SESSION.settings(None, admin=True)[1] == (ADMIN_ROLE, "store_a", "", "500ms", "20000ms", "off")


def test_full_durability_waits_for_the_flush() -> None:
    full = Session("store_a", lock_timeout_ms=500, statement_timeout_ms=2_000, durability="full")
    assert full.settings("alice", admin=False)[1][-1] == "on"


def test_a_turns_write_takes_the_store_and_owner_locks_shared_then_the_turns() -> None:
    text, params = SESSION.opening("alice", admin=False, wait=True, turn="t1")
    assert text.count("pg_advisory_xact_lock_shared(%s)") == 2 and text.count("pg_advisory_xact_lock(%s)") == 1
    store, owner, turn = params[6:]
    assert params[:6] == SESSION.settings("alice", admin=False)[1]
    assert (store, owner, turn) == SESSION.turn_locks("alice", "t1")
    assert SESSION.turn_locks("alice", "t2")[:2] == (store, owner) and SESSION.turn_locks("alice", "t2")[2] != turn
    assert SESSION.turn_locks("bob", "t1")[1] != owner


def test_an_owner_wide_write_takes_the_owners_lock_exclusively() -> None:
    text, params = SESSION.opening("alice", admin=False, wait=True, turn=None)
    assert text.count("pg_advisory_xact_lock_shared(%s)") == 1 and text.count("pg_advisory_xact_lock(%s)") == 1
    assert params[6:] == SESSION.turn_locks("alice", "t1")[:2]


def test_housekeeping_takes_the_stores_lock_alone_or_only_tries_it() -> None:
    text, params = SESSION.opening(None, admin=True, wait=True, turn=None)
    assert "shared" not in text and text.count("pg_advisory_xact_lock(%s)") == 1
    assert params[6:] == SESSION.turn_locks("alice", "t1")[:1]
    text, params = SESSION.opening(None, admin=True, wait=False, turn=None)
    assert text.endswith("pg_try_advisory_xact_lock(%s) AS locked") and len(params) == 7


def test_another_schemas_store_takes_other_locks() -> None:
    other = Session("store_b", lock_timeout_ms=500, statement_timeout_ms=2_000, durability="normal")
    assert set(other.turn_locks("alice", "t1")).isdisjoint(SESSION.turn_locks("alice", "t1"))
