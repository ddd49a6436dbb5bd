"""Load-independent costs of a call on a SQLite store: ``statements`` (SQLite's
statement trace; a trigger's apart, as ``trigger_statements``), ``wal_frames``
appended to an emptied WAL, and the key work ``crypto.primitives.WORK`` counts.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

if TYPE_CHECKING:
    from securepad import Principal, Scratchpad

# The WAL file: a 32-byte header, then frames of a 24-byte header and one page.
_WAL_HEADER = 32
_FRAME_HEADER = 24


def frames_in(conn: apsw.Connection) -> int:
    """Frames now in the write-ahead log of ``conn``'s database (0 after a truncating checkpoint)."""
    page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])  # type: ignore[arg-type]
    wal = Path(f"{conn.filename}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - _WAL_HEADER) // (page_size + _FRAME_HEADER)


@contextmanager
def counting(conn: apsw.Connection) -> Iterator[dict[str, int]]:
    """Count the statements run on ``conn`` and the key work done meanwhile (filled in on exit)."""
    from securepad.crypto.primitives import WORK  # the store's layers wait until counted: see ``empty_wal``

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


def empty_wal(target: Scratchpad | apsw.Connection) -> apsw.Connection:
    """Empty the write-ahead log of a store's SQLite database, or of a connection's,
    and return the connection. Raises RuntimeError: a reader kept the WAL from being emptied."""
    if isinstance(target, apsw.Connection):
        target.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        return target
    # Imported here: a measured process of raw apsw loads apsw alone, not the store's layers.
    from securepad.store import sqlite_of

    db = sqlite_of(target)
    if not db.checkpoint():
        raise RuntimeError("a reader kept the WAL from being emptied; cannot count frames")
    return db.conn


def measure(target: Scratchpad | apsw.Connection, call: Callable[[], object]) -> dict[str, int]:
    """The costs of ``call()`` on a store's SQLite database, or on a connection's.
    Raises RuntimeError: a reader kept the WAL from being emptied."""
    conn = empty_wal(target)
    with counting(conn) as counts:
        call()
    counts["wal_frames"] = frames_in(conn)
    return counts


def put_costs(pad: Scratchpad, principal: Principal, size_bytes: int) -> dict[str, int]:
    """The costs of one warm put of ``size_bytes`` into a new turn. Raises SecurepadError: PostgreSQL."""
    line = "observation line with some words in it 0123456789\n"
    text = (line * (size_bytes // len(line) + 1))[:size_bytes]
    turn = f"costs-{secrets.token_hex(4)}"
    pad.put(principal, turn, 0, "warm", "warm-up")  # the owner key exists, caches are warm
    return measure(pad, lambda: pad.put(principal, turn, 1, "tool", text))
