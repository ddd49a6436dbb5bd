"""The SQLite connection's settings, as every statement relies on them."""

from __future__ import annotations

import threading
from pathlib import Path

import apsw
import pytest

from securepad import Keyring, Scratchpad
from securepad.errors import SecurepadError
from securepad.storage.sqlite import Database
from securepad.store import sqlite_of
from tests.support.principals import AGENT_ALICE as ALICE


def _compiles(conn: apsw.Connection) -> list[int]:
    """Count SQLite's compilations on ``conn`` (its authorizer runs at each one, a recompilation included).

    A write that creates a turn reads the connection's data version through the
    pragma's table-valued function (``pragma_data_version()``), which SQLite
    answers by running ``PRAGMA data_version`` itself: that small statement is
    compiled at each new turn by SQLite's pragma table, not one of the store's."""
    calls: list[int] = []

    def authorize(code: int, name: object, *_: object) -> int:
        if (code, name) != (apsw.SQLITE_PRAGMA, "data_version"):
            calls.append(code)
        return apsw.SQLITE_OK

    conn.authorizer = authorize
    return calls


def test_a_warm_put_compiles_no_statement_again_whatever_values_it_binds(db_path: Path, keyring: Keyring) -> None:
    """The query planner's stability guarantee is on: a statement whose plan a bound
    value could change (the owner's newest key version, the step's look, the turn's
    heads) is compiled once, not at every execution with new values."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        conn = sqlite_of(pad).conn
        compiles = _compiles(conn)
        pad.put(ALICE, "t", 1, "tool", "warm")  # compiles the put's statements once
        pad.put(ALICE, "t", 2, "tool", "warm again")
        compiles.clear()
        for step in range(3, 8):
            pad.put(ALICE, "t", step, "tool", f"step {step}")
            pad.put(ALICE, f"turn-{step}", step, "tool", "another turn")
        assert compiles == []
        conn.authorizer = None


def test_every_connection_has_the_planner_stability_guarantee(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        seen = [sqlite_of(pad).conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1)]
        worker = threading.Thread(
            target=lambda: seen.append(sqlite_of(pad).conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1))
        )
        worker.start()
        worker.join()
    assert seen == [1, 1]


def test_warm_puts_and_reads_make_no_cursor(db_path: Path, keyring: Keyring) -> None:
    """A thread's statements run on its connection's one cursor (``Holder``): a warm
    put or read makes and frees none of its own."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        conn = sqlite_of(pad).conn
        made: list[apsw.Connection] = []

        def counted(connection: apsw.Connection) -> apsw.Cursor:
            made.append(connection)
            return apsw.Cursor(connection)

        conn.cursor_factory = counted
        first = pad.put(ALICE, "t", 1, "tool", "warm")["scratchpad_id"]
        pad.read(ALICE, first, "head", n=4)
        made.clear()
        for step in range(2, 6):
            pad.put(ALICE, "t", step, "tool", f"step {step}")
            assert pad.read(ALICE, first, "head", n=4)["content"] == "warm"
        assert made == []
        conn.cursor_factory = apsw.Cursor


def test_a_query_that_fails_among_its_rows_leaves_no_snapshot_open(db_path: Path) -> None:
    """A read that stops at an undecodable row fails, and its connection holds no read
    snapshot after it (one would pin the WAL until the cursor's next statement)."""
    db = Database(db_path)
    try:
        with db.transaction() as tx:
            tx.execute("CREATE TABLE notes(body TEXT)")
            tx.execute("INSERT INTO notes VALUES ('fine'), (CAST(x'ff' AS TEXT)), ('after')")
        with pytest.raises(SecurepadError):
            db.query("SELECT body FROM notes")
        assert db.conn.txn_state() == apsw.SQLITE_TXN_NONE
        assert db.query("SELECT count(*) AS n FROM notes") == [{"n": 3}]
        with pytest.raises(SecurepadError), db.transaction() as tx:
            tx.query("SELECT body FROM notes")
        assert db.conn.txn_state() == apsw.SQLITE_TXN_NONE
        assert db.checkpoint(wait=False)
    finally:
        db.close()
