"""Drills against the store's defences, run on scratch copies, never the user's file.

Used by ``securepad demo`` and ``securepad audit``: they copy the store,
damage the copy the way an attacker with write access to the file would,
and check that the damage is detected.
"""

from __future__ import annotations

from pathlib import Path

import apsw

__all__ = ["flip_segment_byte", "move_entry_to_owner"]


def _edit(path: Path, sql: str, params: tuple[object, ...]) -> None:
    conn = apsw.Connection(str(path))
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


def flip_segment_byte(path: Path, entry_id: str, seq: int = 0) -> None:
    """Flip one bit in the middle of a segment's ciphertext, as bit rot or an attacker would."""
    conn = apsw.Connection(str(path))
    try:
        rows = conn.execute("SELECT data FROM segments WHERE entry_id = ? AND seq = ?", (entry_id, seq)).fetchall()
        if not rows:
            raise LookupError(f"no segment {seq} of {entry_id} in {path}")
        data = bytearray(rows[0][0])  # type: ignore[arg-type]
        data[len(data) // 2] ^= 0x01
        with conn:
            conn.execute("UPDATE segments SET data = ? WHERE entry_id = ? AND seq = ?", (bytes(data), entry_id, seq))
    finally:
        conn.close()


def move_entry_to_owner(path: Path, entry_id: str, owner_user_id: str) -> None:
    """Relabel an entry's row as another owner's, as an attacker with write access could."""
    _edit(path, "UPDATE entries SET owner_user_id = ? WHERE id = ?", (owner_user_id, entry_id))
