"""Drills against the store's defences: damage a scratch copy the way an
attacker with write access to the file would (the demo, the audit, the tests).

Every function commits on its own connection before returning, so a
``Scratchpad`` open on the same file sees the damage on its next query.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

__all__ = [
    "SEGMENT_SQL",
    "clone",
    "copy_entry",
    "copy_entry_columns",
    "copy_segment",
    "drop_last_segment",
    "entry_columns",
    "entry_row",
    "flip_segment_byte",
    "keep_only_owners",
    "move_entry_to_owner",
    "set_column",
    "swap_owner_keys",
    "swap_segments",
]


@contextmanager
def _connect(path: Path) -> Iterator[apsw.Connection]:
    conn = apsw.Connection(str(path))
    try:
        conn.setbusytimeout(5_000)
        yield conn
    finally:
        conn.close()


def _edit(path: Path, statements: Iterable[tuple[str, tuple[Any, ...]]]) -> None:
    with _connect(path) as conn, conn:
        for sql, params in statements:
            conn.execute(sql, params)


def entry_columns(path: Path) -> tuple[str, ...]:
    """Every column of the ``entries`` table in this file, in order."""
    with _connect(path) as conn:
        return tuple(str(row[1]) for row in conn.execute("PRAGMA table_info(entries)").fetchall())


def _known(path: Path, names: Iterable[str]) -> list[str]:
    """``names``, each a column of ``entries`` in this file. Raises ValueError: one is not."""
    columns, names = entry_columns(path), list(names)
    if unknown := [name for name in names if name not in columns]:
        raise ValueError(f"entries has no column {unknown[0]!r}")
    return names


def clone(src: Path, dest: Path) -> None:
    """Copy a (checkpointed, closed) scratch store file to ``dest``, created 0600."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, src.open("rb") as source:
        shutil.copyfileobj(source, out)


def keep_only_owners(path: Path, owners: Iterable[str]) -> None:
    """Delete every other owner's entries, segments and keys from a scratch
    copy, then vacuum it: each drill's copy is cheap and holds no other owner's ciphertext."""
    keep = tuple(sorted(set(owners)))
    marks = ", ".join("?" * len(keep))
    statements = [
        (f"DELETE FROM {table} WHERE owner_user_id NOT IN ({marks})", keep) for table in ("entries", "owner_keys")
    ]
    _edit(path, [*statements, ("DELETE FROM segments WHERE entry_id NOT IN (SELECT id FROM entries)", ())])
    with _connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("VACUUM")


def entry_row(path: Path, entry_id: str) -> tuple[dict[str, Any], list[bytes]]:
    """An entry's row and its segments' ciphertext, as stored (for rollbacks and comparisons):
    the segments table's rows (none for an entry whose one segment is in its row's ``only_segment``)."""
    columns = entry_columns(path)
    with _connect(path) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM entries WHERE id = ?", (entry_id,)).fetchall()
        if not rows:
            raise LookupError(f"no entry {entry_id} in {path}")
        segments = conn.execute("SELECT data FROM segments WHERE entry_id = ? ORDER BY seq", (entry_id,)).fetchall()
    return dict(zip(columns, rows[0], strict=True)), [bytes(s[0]) for s in segments]  # type: ignore[arg-type]


# A segment's ciphertext wherever it is kept: the segments table, or the row's
# only_segment (a one-segment entry). Parameters: entry id, seq (twice each).
SEGMENT_SQL = (
    "COALESCE((SELECT data FROM segments WHERE entry_id = ? AND seq = ?),"
    " (SELECT only_segment FROM entries WHERE id = ? AND ? = 0))"
)


def _set_segment(entry_id: str, seq: int, value_sql: str, params: tuple[Any, ...]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that overwrite segment ``seq`` of an entry, wherever it is kept."""
    return [
        (f"UPDATE segments SET data = {value_sql} WHERE entry_id = ? AND seq = ?", (*params, entry_id, seq)),
        (
            f"UPDATE entries SET only_segment = {value_sql} WHERE id = ? AND ? = 0 AND only_segment IS NOT NULL",
            (*params, entry_id, seq),
        ),
    ]


def flip_segment_byte(path: Path, entry_id: str, seq: int = 0) -> None:
    """Flip one bit in the middle of a segment's ciphertext, as bit rot or an attacker would."""
    with _connect(path) as conn:
        rows = conn.execute(f"SELECT {SEGMENT_SQL}", (entry_id, seq, entry_id, seq)).fetchall()
    if not rows or rows[0][0] is None:
        raise LookupError(f"no segment {seq} of {entry_id} in {path}")
    data = bytearray(rows[0][0])  # type: ignore[arg-type]
    data[len(data) // 2] ^= 0x01
    _edit(path, _set_segment(entry_id, seq, "?", (bytes(data),)))


def move_entry_to_owner(path: Path, entry_id: str, owner_user_id: str) -> None:
    """Relabel an entry's row as another owner's, as an attacker with write access could."""
    set_column(path, entry_id, "owner_user_id", owner_user_id)


def set_column(path: Path, entry_id: str, column: str, value: object) -> None:
    """Overwrite one clear column of an entry's row."""
    _edit(path, [(f"UPDATE entries SET {_known(path, [column])[0]} = ? WHERE id = ?", (value, entry_id))])


def copy_entry_columns(path: Path, src_id: str, dest_id: str, columns: Iterable[str]) -> None:
    """Copy columns (say ``wrapped_key``: an item key) from one entry's row onto another's."""
    names = _known(path, columns)
    assignments = ", ".join(f"{c} = (SELECT {c} FROM entries WHERE id = ?)" for c in names)
    _edit(path, [(f"UPDATE entries SET {assignments} WHERE id = ?", (*([src_id] * len(names)), dest_id))])


def copy_segment(path: Path, src_id: str, src_seq: int, dest_id: str, dest_seq: int) -> None:
    """Overwrite one segment's ciphertext with another segment's (of any entry or owner)."""
    _edit(path, _set_segment(dest_id, dest_seq, SEGMENT_SQL, (src_id, src_seq, src_id, src_seq)))


def swap_segments(path: Path, entry_id: str, seq_a: int, seq_b: int) -> None:
    """Exchange two segments of an entry: a reordering."""
    _edit(
        path,
        [
            ("UPDATE segments SET seq = -1 WHERE entry_id = ? AND seq = ?", (entry_id, seq_a)),
            ("UPDATE segments SET seq = ? WHERE entry_id = ? AND seq = ?", (seq_a, entry_id, seq_b)),
            ("UPDATE segments SET seq = ? WHERE entry_id = ? AND seq = -1", (seq_b, entry_id)),
        ],
    )


def drop_last_segment(path: Path, entry_id: str, *, fix_count: bool = False) -> None:
    """Truncate an entry by its last segment; with ``fix_count`` the row's
    ``segment_count`` is lowered to match, as a careful attacker would."""
    statements: list[tuple[str, tuple[Any, ...]]] = [
        (
            "DELETE FROM segments WHERE entry_id = ? AND seq = (SELECT MAX(seq) FROM segments WHERE entry_id = ?)",
            (entry_id, entry_id),
        )
    ]
    # A one-segment entry that keeps its segment in its row loses that one.
    statements.append(("UPDATE entries SET only_segment = NULL WHERE id = ? AND segment_count = 1", (entry_id,)))
    if fix_count:
        statements.append(("UPDATE entries SET segment_count = segment_count - 1 WHERE id = ?", (entry_id,)))
    _edit(path, statements)


def copy_entry(path: Path, entry_id: str, new_id: str, owner_user_id: str) -> None:
    """Insert a copy of an entry (row and segments) under a new id and owner."""
    others = ", ".join(c for c in entry_columns(path) if c not in ("id", "owner_user_id"))
    _edit(
        path,
        [
            (
                f"INSERT INTO entries(id, owner_user_id, {others}) SELECT ?, ?, {others} FROM entries WHERE id = ?",
                (new_id, owner_user_id, entry_id),
            ),
            (
                "INSERT INTO segments(entry_id, seq, data) SELECT ?, seq, data FROM segments WHERE entry_id = ?",
                (new_id, entry_id),
            ),
        ],
    )


def swap_owner_keys(path: Path, owner_a: str, owner_b: str) -> None:
    """Exchange two owners' wrapped owner keys (the versions both have)."""
    with _connect(path) as conn:
        rows = conn.execute(
            "SELECT owner_user_id, version, wrapped FROM owner_keys WHERE owner_user_id IN (?, ?)", (owner_a, owner_b)
        ).fetchall()
    keys = {(str(owner), int(version)): bytes(wrapped) for owner, version, wrapped in rows}  # type: ignore[arg-type]
    shared = {v for (o, v) in keys if o == owner_a} & {v for (o, v) in keys if o == owner_b}
    update = "UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = ? AND version = ?"
    _edit(
        path,
        [
            (update, (keys[(other, version)], owner, version))
            for version in sorted(shared)
            for owner, other in ((owner_a, owner_b), (owner_b, owner_a))
        ],
    )
