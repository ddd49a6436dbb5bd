"""Rollbacks of a store file to rows taken earlier (from the same file or a
backup): an attacker with write access putting back an older entry row, or
older owner-key wrappings. The tests' own drills, beside ``securepad.audit.drills``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw

from securepad.audit.drills import entry_columns

_KEY_COLUMNS = ("owner_user_id", "version", "wrapped", "created_at")


def _edit(path: Path, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    conn = apsw.Connection(str(path))
    try:
        conn.setbusytimeout(5_000)
        with conn:
            for sql, params in statements:
                conn.execute(sql, params)
    finally:
        conn.close()


def restore_entry(path: Path, row: dict[str, Any], segments: list[bytes] | None = None) -> None:
    """Write ``row`` back over the entry with its id (and, given them, its segments):
    a rollback to an older state taken with ``drills.entry_row``."""
    columns = list(row)
    if unknown := set(columns) - set(entry_columns(path)):
        raise ValueError(f"entries has no column {sorted(unknown)[0]!r}")
    statements: list[tuple[str, tuple[Any, ...]]] = [
        ("DELETE FROM entries WHERE id = ?", (row["id"],)),
        (f"INSERT INTO entries({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", tuple(row.values())),
    ]
    if segments is not None:
        statements.append(("DELETE FROM segments WHERE entry_id = ?", (row["id"],)))
        statements += [
            ("INSERT INTO segments(entry_id, seq, data) VALUES (?, ?, ?)", (row["id"], seq, data))
            for seq, data in enumerate(segments)
        ]
    _edit(path, statements)


def owner_key_rows(path: Path, owner_user_id: str) -> list[dict[str, Any]]:
    """An owner's key rows as stored (wrapped under the master key), for rollbacks and transplants."""
    conn = apsw.Connection(str(path))
    try:
        sql = f"SELECT {', '.join(_KEY_COLUMNS)} FROM owner_keys WHERE owner_user_id = ?"
        rows = conn.execute(sql, (owner_user_id,)).fetchall()
    finally:
        conn.close()
    return [dict(zip(_KEY_COLUMNS, row, strict=True)) for row in rows]


def restore_owner_keys(path: Path, rows: list[dict[str, Any]], *, owner_user_id: str | None = None) -> None:
    """Write key rows taken with ``owner_key_rows`` (from this file or another) over an
    owner's current ones; with ``owner_user_id`` they are relabelled as that owner's."""
    if not rows:
        return
    owner = owner_user_id if owner_user_id is not None else rows[0]["owner_user_id"]
    statements: list[tuple[str, tuple[Any, ...]]] = [("DELETE FROM owner_keys WHERE owner_user_id = ?", (owner,))]
    statements += [
        (
            "INSERT INTO owner_keys(owner_user_id, version, wrapped, created_at) VALUES (?, ?, ?, ?)",
            (owner, row["version"], row["wrapped"], row["created_at"]),
        )
        for row in rows
    ]
    _edit(path, statements)
