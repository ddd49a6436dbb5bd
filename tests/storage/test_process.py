"""A forked child sees its own process id, and never uses its parent's connection."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from securepad.storage import process
from securepad.storage.sqlite import Database

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")


def _child_reports(db: Database, parent_conn: object, out: Any) -> None:
    conn = db.conn
    rows = conn.execute("SELECT 1").fetchall()
    out.put((process.pid == os.getpid(), conn is not parent_conn, db.conn is conn, rows == [(1,)]))


def test_the_process_id_is_this_process_s() -> None:
    assert process.pid == os.getpid()


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    db = Database(tmp_path / "store.db")
    try:
        parent_conn = db.conn
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_child_reports, args=(db, parent_conn, out))
        child.start()
        child.join()
        # Its own id, a connection of its own (kept for its later calls), and a working one.
        assert out.get(timeout=10) == (True, True, True, True)
        assert child.exitcode == 0
        assert db.conn is parent_conn  # the parent's stays its own
        assert process.pid == os.getpid()
    finally:
        db.close()
