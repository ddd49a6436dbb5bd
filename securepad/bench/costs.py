"""Load-independent costs of one put and one listing on a SQLite store.

Time depends on the machine and on what else runs on it; the number of SQL
statements, WAL frames and key operations a call makes does not. These are
the figures ``tests/tables/entries/test_hot_path.py`` guards and the benchmark prints beside
its timings.

- ``statements``: every SQL statement the store ran on its connection
  (``BEGIN`` and ``COMMIT`` included; each row of an ``executemany`` is one),
  counted by SQLite's statement trace; a trigger's firing and the statements
  inside it are counted apart, as ``trigger_statements``.
- ``wal_frames``: frames the call appended to the write-ahead log (each frame
  is one page, 4 KiB by default, plus a 24-byte header), read from the WAL
  file's size after a truncating checkpoint emptied it.
- ``key_derivations``, ``key_unwraps``, ``header_digests``: the key work
  counted by ``securepad.crypto.primitives.WORK``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from securepad import Principal, Scratchpad
from securepad.crypto.primitives import WORK
from securepad.store import sqlite_of

__all__ = ["frames_in", "listing_costs", "put_costs", "turn_put_costs", "wal_frames"]

# The WAL file: a 32-byte header, then frames of a 24-byte header and one page.
_WAL_HEADER = 32
_FRAME_HEADER = 24


def wal_frames(pad: Scratchpad) -> int:
    """Frames now in the store's write-ahead log (0 after a truncating checkpoint)."""
    db = sqlite_of(pad)
    return frames_in(db.conn, db.path)


def frames_in(conn: apsw.Connection, path: Path | str) -> int:
    """Frames now in the write-ahead log of the database at ``path``, open as ``conn``."""
    page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])  # type: ignore[arg-type]
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - _WAL_HEADER) // (page_size + _FRAME_HEADER)


@contextmanager
def _counting(pad: Scratchpad) -> Iterator[dict[str, int]]:
    """Count the statements run on this thread's connection and the key work done meanwhile."""
    conn = sqlite_of(pad).conn
    counts = {"statements": 0, "trigger_statements": 0}

    def trace(event: dict[str, Any]) -> None:
        counts["trigger_statements" if event.get("trigger") else "statements"] += 1

    before, opened = WORK.snapshot(), WORK.head_opens
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        yield counts
    finally:
        conn.trace_v2(0, None)
        after = WORK.snapshot()
        counts.update({name: after[name] - before[name] for name in after})
        counts["head_opens"] = WORK.head_opens - opened


def _measure(pad: Scratchpad, call: Callable[[], object]) -> dict[str, int]:
    db = sqlite_of(pad)
    if not db.checkpoint():
        raise RuntimeError("a reader kept the WAL from being emptied; cannot count frames")
    with _counting(pad) as counts:
        call()
    counts["wal_frames"] = wal_frames(pad)
    return counts


def put_costs(pad: Scratchpad, principal: Principal, size_bytes: int) -> dict[str, int]:
    """The costs of one put of ``size_bytes`` of text into a new turn (the owner's key already exists).

    Returns ``{"statements", "trigger_statements", "wal_frames", "key_derivations",
    "key_unwraps", "header_digests", "head_opens"}``. Raises ``SecurepadError`` on a PostgreSQL store.
    """
    text = _text(size_bytes)
    turn = f"costs-{secrets.token_hex(4)}"
    pad.put(principal, turn, 0, "warm", "warm-up")  # the owner key exists, caches are warm
    return _measure(pad, lambda: pad.put(principal, turn, 1, "tool", text))


def turn_put_costs(pad: Scratchpad, principal: Principal, turn_id: str, step: int) -> dict[str, int]:
    """The costs of one put of 4 KiB at ``step`` into ``turn_id``, keys as ``put_costs``'."""
    return _measure(pad, lambda: pad.put(principal, turn_id, step, "tool", "x" * 4096, now=1_000_000.0))


def listing_costs(pad: Scratchpad, principal: Principal, turn_id: str) -> dict[str, int]:
    """The costs of one ``list_for_turn``, with ``entries`` the number of entries listed."""
    listed: list[dict[str, Any]] = []
    counts = _measure(pad, lambda: listed.extend(pad.list_for_turn(principal, turn_id)))
    counts["entries"] = len(listed)
    return counts


def _text(size_bytes: int) -> str:
    line = "observation line with some words in it 0123456789\n"
    return (line * (size_bytes // len(line) + 1))[:size_bytes]
