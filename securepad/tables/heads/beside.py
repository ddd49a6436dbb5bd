"""A write's own one-row read and its turn's head rows: one statement on
PostgreSQL (``beside_sql``: one Bind, one portal, one executor start-up
rather than two), two on SQLite, where a statement costs no message."""

from __future__ import annotations

from typing import Any

from ...storage.base import Conn, Params, Rows
from .statements import beside_sql, select_sql, turn_select_sql

__all__ = ["beside_sql", "read_with_heads", "with_heads"]


def with_heads(
    dialect: str, one_row: tuple[str, Params], owner: str, turn_id: str, *, turn_only: bool = False
) -> list[tuple[str, Params]]:
    """The reads of ``one_row`` and of the turn's head rows, as a write announces
    them (``Conn.prefetch``) and ``read_with_heads`` answers them; ``turn_only``
    (the owner's lock shared): on SQLite the turn's own head row alone."""
    if dialect == "postgresql":
        return [beside_sql(one_row, owner, turn_id)]
    return [one_row, turn_select_sql(owner, turn_id) if turn_only else select_sql(owner, turn_id)]


def read_with_heads(conn: Conn, reads: list[tuple[str, Params]]) -> tuple[dict[str, Any], Rows]:
    """``with_heads``'s answer inside the write: the one row, and the head rows (for ``Heads.change``)."""
    rows = conn.query(*reads[0])
    if len(reads) == 1:
        return rows[0], [row for row in rows if row["turn_id"] is not None]
    return rows[0], conn.query(*reads[1])
