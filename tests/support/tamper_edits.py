"""The edits an attacker with write access to the store's rows makes,
shared by the SQLite tests (a plain apsw connection on the file) and the
PostgreSQL ones (a psycopg connection as ``securepad_admin``, the tables' owner).

Each edit is one function ``edit(raw, s)``: ``raw`` is a ``Raw`` executor (SQL
with ``?`` placeholders, run on either backend), ``s`` the store's ids as the
tests' fixtures record them: ``ids`` (alice's turn ``t1``, five steps),
``other`` (alice's turn ``t2``) and ``bob`` (bob's ``t1``). The turns also hold
two compaction checkpoints and a compaction mark each.

``snapshot``/``restore`` put the edited tables back byte for byte, so that a
test can show that an edit undone reads again (no sticky false alarm).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import apsw
import psycopg

from securepad import Principal, Scratchpad
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD
from tests.support.principals import NOW

TURN = "t1"


# The tables an edit touches; restored parents first (segments refer to entries).
def record_turn(pad: Scratchpad, principal: Principal, turn: str, steps: int, now: float = NOW) -> list[str]:
    """``steps`` entries of ~3 KB, two checkpoints and a compaction mark in one
    turn (every kind a head counts); the entries' ids."""
    ids = []
    t = pad.turn(principal, turn, now=now)
    for step in range(1, steps + 1):
        view = pad.put(principal, turn, step, "fetch", f"observation {step} " + "x" * 3000, ttl_seconds=3600, now=now)
        ids.append(view["scratchpad_id"])
    t.checkpoint(facts=["first"], now=now)
    t.checkpoint(facts=["second"], now=now + 1)
    t.mark_compaction(now=now + 2)
    return ids


# About 4 KiB of text, 64 lines: the observation of ``record_batches``.
LINES_4K = "".join(f"line {i}: {'x' * 60}\n" for i in range(64))


def record_batches(pad: Scratchpad, principal: Principal, turn: str, steps: int, now: float = NOW) -> list[str]:
    """``steps`` entries of ~4 KiB put 100 at a time (a turn of hundreds of
    steps, quickly), then two checkpoints; the entries' ids."""
    ids = []
    for first in range(1, steps + 1, 100):
        steps_here = range(first, min(first + 100, steps + 1))
        batch = [(step, "fetch", f"observation {step} " + LINES_4K) for step in steps_here]
        ids += [view["scratchpad_id"] for view in pad.put_many(principal, turn, batch, ttl_seconds=3600, now=now)]
    t = pad.turn(principal, turn, now=now)
    t.checkpoint(facts=["first"], now=now)
    t.checkpoint(facts=["second"], now=now + 1)
    return ids


TABLES = ("entries", "segments", "checkpoints", "compaction_marks", "turn_heads")


@contextmanager
def raw_file(db_path: Path) -> Iterator[apsw.Connection]:
    """A plain SQLite connection to the store file, no securepad involved (an
    attacker's, or another program's); its block is one transaction."""
    conn = apsw.Connection(str(db_path))
    # The store's own background work (the anchor's syncer, a WAL checkpoint)
    # may hold the file's lock for a moment: wait for it as any program would.
    conn.setbusytimeout(10_000)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def edit_file(db_path: Path, sql: str, *args: Any) -> int:
    """Run one statement on the store file through ``raw_file``; the rows it changed."""
    with raw_file(db_path) as conn:
        conn.execute(sql, args)
        return conn.changes()


class Raw:
    """A connection outside securepad: SQL with ``?`` placeholders, on an apsw
    connection to the file or a psycopg connection as the admin role."""

    def __init__(self, conn: apsw.Connection | psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.postgres = isinstance(conn, psycopg.Connection)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its rows (none for a statement without a result)."""
        if self.postgres:
            cursor = self.conn.execute(sql.replace("?", "%s"), tuple(params))
            return list(cursor.fetchall()) if cursor.description else []
        return [tuple(row) for row in self.conn.execute(sql, tuple(params)).fetchall()]

    def columns(self, table: str) -> list[str]:
        if self.postgres:
            rows = self.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'securepad' AND table_name = ? ORDER BY ordinal_position",
                (table,),
            )
            return [str(r[0]) for r in rows]
        return [str(r[1]) for r in self.execute(f"PRAGMA table_info({table})")]


@contextmanager
def on_sqlite(db_path: Path) -> Iterator[Raw]:
    """One transaction on the store file through a plain apsw connection: no securepad involved."""
    conn = apsw.Connection(str(db_path))
    try:
        with conn:
            yield Raw(conn)
    finally:
        conn.close()


@contextmanager
def as_admin(dsn: str) -> Iterator[Raw]:
    """One transaction as ``securepad_admin`` (the tables' owner), outside securepad."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET ROLE securepad_admin")
        conn.execute("SET search_path = securepad")
        yield Raw(conn)  # committed when the block ends without an error


Edit = Callable[[Raw, dict[str, Any]], None]

# -- helpers -----------------------------------------------------------------------------------


def delete_entry(raw: Raw, entry_id: str) -> None:
    raw.execute("DELETE FROM segments WHERE entry_id = ?", (entry_id,))
    raw.execute("DELETE FROM entries WHERE id = ?", (entry_id,))


def copy_row(raw: Raw, entry_id: str, new_id: str, **changes: Any) -> None:
    """Genuine sealed bytes under a new id (and whatever else ``changes`` says)."""
    columns = raw.columns("entries")
    row = raw.execute(f"SELECT {', '.join(columns)} FROM entries WHERE id = ?", (entry_id,))[0]
    values = dict(zip(columns, row, strict=True)) | {"id": new_id, **changes}
    raw.execute(
        f"INSERT INTO entries({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", tuple(values.values())
    )
    if raw.postgres:  # segments carry their owner there (row-level security)
        raw.execute(
            "INSERT INTO segments(entry_id, seq, data, owner_user_id) SELECT ?, seq, data, ? FROM segments"
            " WHERE entry_id = ?",
            (new_id, values["owner_user_id"], entry_id),
        )
    else:
        raw.execute(
            "INSERT INTO segments(entry_id, seq, data) SELECT ?, seq, data FROM segments WHERE entry_id = ?",
            (new_id, entry_id),
        )


def pg_entry_copy(conn: psycopg.Connection[Any], new_id: str) -> tuple[str, str]:
    """The column list of PostgreSQL's ``entries`` and a select list that
    copies a row of it with ``new_id`` (an SQL expression) as its id, for an
    ``INSERT INTO entries(<columns>) SELECT <copy> FROM entries ...`` that a test
    runs as the application role inside a statement of its own."""
    columns = [
        row[0]
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'securepad.entries'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]
    return ", ".join(columns), ", ".join(new_id if column == "id" else column for column in columns)


def snapshot(raw: Raw) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    """Every row of the tables an edit touches, as stored."""
    taken = {}
    for table in TABLES:
        columns = raw.columns(table)
        taken[table] = (columns, raw.execute(f"SELECT {', '.join(columns)} FROM {table}"))
    return taken


def restore(raw: Raw, taken: dict[str, tuple[list[str], list[tuple[Any, ...]]]]) -> None:
    """Put back what ``snapshot`` took, byte for byte."""
    for table in reversed(TABLES):
        raw.execute(f"DELETE FROM {table}")
    for table in TABLES:
        columns, rows = taken[table]
        for row in rows:
            raw.execute(f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", row)


# -- the edits ---------------------------------------------------------------------------------


def content_tamper(raw: Raw, s: dict[str, Any]) -> None:
    # A one-segment entry keeps its sealed segment in its row (entries.only_segment).
    data = bytearray(raw.execute("SELECT only_segment FROM entries WHERE id = ?", (s["ids"][2],))[0][0])
    data[len(data) // 2] ^= 0x01
    raw.execute("UPDATE entries SET only_segment = ? WHERE id = ?", (bytes(data), s["ids"][2]))


def tail_truncation(raw: Raw, s: dict[str, Any]) -> None:
    for entry_id in s["ids"][3:]:
        delete_entry(raw, entry_id)


def middle_deletion(raw: Raw, s: dict[str, Any]) -> None:
    delete_entry(raw, s["ids"][2])


def reordering(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("UPDATE entries SET step_num = 9 WHERE id = ?", (s["ids"][1],))
    raw.execute("UPDATE entries SET step_num = 2 WHERE id = ?", (s["ids"][3],))
    raw.execute("UPDATE entries SET step_num = 4 WHERE id = ?", (s["ids"][1],))


def forged_insertion(raw: Raw, s: dict[str, Any]) -> None:
    copy_row(raw, s["ids"][4], secrets.token_hex(8), step_num=6)


def cross_turn_replay(raw: Raw, s: dict[str, Any]) -> None:
    copy_row(raw, s["other"][0], secrets.token_hex(8), turn_id=TURN, step_num=7)


def cross_owner_replay(raw: Raw, s: dict[str, Any]) -> None:
    copy_row(raw, s["bob"][0], secrets.token_hex(8), owner_user_id="alice", step_num=7)


def newest_checkpoint_deleted(raw: Raw, s: dict[str, Any]) -> None:
    """Rollback of a record to an older genuine version: the superseded checkpoint becomes the newest."""
    raw.execute(
        "DELETE FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = ? AND seq ="
        " (SELECT MAX(seq) FROM checkpoints WHERE owner_user_id = 'alice' AND turn_id = ?)",
        (TURN, TURN),
    )


def mark_deleted(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("DELETE FROM compaction_marks WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,))


def expiry_moved_earlier(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (NOW + 10, s["ids"][4]))


def owner_relabelled(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("UPDATE entries SET owner_user_id = 'mallory' WHERE id = ?", (s["ids"][1],))
    if raw.postgres:
        raw.execute("UPDATE segments SET owner_user_id = 'mallory' WHERE entry_id = ?", (s["ids"][1],))


def turn_relabelled(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("UPDATE entries SET turn_id = 't9' WHERE id = ?", (s["ids"][1],))


def stored_bytes_changed(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("UPDATE entries SET stored_bytes = 1 WHERE id = ?", (s["ids"][0],))


def entry_meta_before_resume(raw: Raw, s: dict[str, Any]) -> None:
    """Rollback of an entry's sealed metadata to its genuine version from before
    ``resume(extend_ttl=...)``: ``s["before_resume"]`` holds its (expires_at, sealed_meta)."""
    raw.execute("UPDATE entries SET expires_at = ?, sealed_meta = ? WHERE id = ?", (*s["before_resume"], s["ids"][0]))


def entry_meta(raw: Raw, entry_id: str) -> tuple[Any, ...]:
    """An entry's (expires_at, sealed_meta), for ``entry_meta_before_resume``."""
    return raw.execute("SELECT expires_at, sealed_meta FROM entries WHERE id = ?", (entry_id,))[0]


def whole_turn_removed(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute(
        "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = 'alice' AND turn_id = ?)",
        (TURN,),
    )
    for table in ("entries", "checkpoints", "compaction_marks", "turn_heads"):
        raw.execute(f"DELETE FROM {table} WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,))


def head_deleted(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute("DELETE FROM turn_heads WHERE owner_user_id = 'alice' AND turn_id = ?", (TURN,))


def head_swapped(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute(
        "UPDATE turn_heads SET sealed = (SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        " AND turn_id = 't2') WHERE owner_user_id = 'alice' AND turn_id = ?",
        (TURN,),
    )


def head_of_another_owner(raw: Raw, s: dict[str, Any]) -> None:
    raw.execute(
        "UPDATE turn_heads SET sealed = (SELECT sealed FROM turn_heads WHERE owner_user_id = 'bob'"
        " AND turn_id = ?) WHERE owner_user_id = 'alice' AND turn_id = ?",
        (TURN, TURN),
    )


# Alice's owner head and usage head, copied and put back.


def raw_edit(pad: Scratchpad, where: Any) -> AbstractContextManager[Raw]:
    return on_sqlite(where) if pad.backend == "sqlite" else as_admin(where)


def owner_head_body(pad: Scratchpad, owner: str = "alice") -> dict[str, Any]:
    """The owner's owner head, opened: its body as stored."""
    row = parts(pad).db.query(
        "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?",
        (owner, OWNER_HEAD),
        admin=True,
    )[0]
    found: dict[str, Any] = json.loads(parts(pad).heads.open_body(row, owner, OWNER_HEAD))
    return found


def owner_heads(raw: Raw, which: tuple[str, ...]) -> list[tuple[Any, ...]]:
    marks = ", ".join("?" * len(which))
    return raw.execute(
        f"SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        f" AND turn_id IN ({marks})",
        which,
    )


def put_back(raw: Raw, rows: list[tuple[Any, ...]]) -> None:
    for owner, turn_id, version, sealed in rows:
        raw.execute(
            "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?",
            (version, sealed, owner, turn_id),
        )


def remove_turn(raw: Raw, turn_id: str, owner: str = "alice") -> None:
    """The turn removed whole: its rows and its head."""
    raw.execute(
        "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = ? AND turn_id = ?)",
        (owner, turn_id),
    )
    for table in ("entries", "checkpoints", "compaction_marks", "turn_heads"):
        raw.execute(f"DELETE FROM {table} WHERE owner_user_id = ? AND turn_id = ?", (owner, turn_id))


def forge_head(raw: Raw, turn_id: str, copied_from: str, owner: str = "alice") -> None:
    """A head row under ``turn_id`` holding another turn's genuine sealed bytes (it fails authentication)."""
    raw.execute(
        "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) SELECT owner_user_id, ?, key_version,"
        " sealed FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?",
        (turn_id, owner, copied_from),
    )
