"""A write's own one-row read and its turn's head rows, in one statement.

A put (``entry_put``: ``Putter.put``, ``put_many``) reads, at the start of
its write transaction, one row of scalars (the owner's newest key version,
the quota's records, a step's look: ``entry_put._quota_sql``) and the head
rows that ``Heads.change`` then rewrites (the turn's, the owner head, the
usage head: ``Heads.select_sql``). ``with_heads`` says what the write sends
(``Conn.prefetch``), ``read_with_heads`` splits the answer for the caller's
checks and for ``Heads.change(rows=...)``. On PostgreSQL the two reads are one
statement (``beside_sql``): one Bind, one portal and one executor start-up
rather than two; on SQLite they stay two, since a statement there
costs no message and the put measured no faster with the join.
"""

from __future__ import annotations

from typing import Any

from ...storage.base import Conn, Params, Rows
from .heads import Heads
from .owner import OWNER_HEAD, USAGE_HEAD

__all__ = ["beside_sql", "read_with_heads", "with_heads"]


def beside_sql(one_row: tuple[str, Params], owner: str, turn_id: str) -> tuple[str, Params]:
    """The query ``one_row`` (one row of scalars, as ``entry_put``'s quota) and the
    turn's head rows (``Heads.select_sql``) in one statement: each head row carries
    the scalars; with no head row, one row of the scalars and NULL head
    columns (``read_with_heads`` splits them)."""
    sql, params = one_row
    return (
        f"SELECT one.*, h.owner_user_id, h.turn_id, h.key_version, h.sealed FROM ({sql}) AS one"
        " LEFT JOIN turn_heads AS h ON h.owner_user_id = ? AND h.turn_id IN (?, ?, ?)",
        (*params, owner, turn_id, OWNER_HEAD, USAGE_HEAD),
    )


def with_heads(dialect: str, one_row: tuple[str, Params], owner: str, turn_id: str) -> list[tuple[str, Params]]:
    """The reads of ``one_row`` and of the turn's head rows, as a write
    announces them (``Conn.prefetch``) and ``read_with_heads`` answers them:
    one statement on PostgreSQL (``beside_sql``), two on SQLite."""
    if dialect == "postgresql":
        return [beside_sql(one_row, owner, turn_id)]
    return [one_row, Heads.select_sql(owner, turn_id)]


def read_with_heads(conn: Conn, reads: list[tuple[str, Params]]) -> tuple[dict[str, Any], Rows]:
    """``with_heads``'s answer inside the write: the one row, and the head rows (for ``Heads.change``)."""
    rows = conn.query(*reads[0])
    if len(reads) == 1:
        return rows[0], [row for row in rows if row["turn_id"] is not None]
    return rows[0], conn.query(*reads[1])
