"""The owner's quota: what a write may add, decided inside the owner's write
transaction (``room``; ``Heads.change`` reserves it, or refuses)."""

from __future__ import annotations

from typing import Any

from ..keys.keystore import Keystore
from ..policy import Policy
from ..storage.base import Conn
from .access import RECORD_IDENTIFIER_WEIGHTS, RECORD_ROW_OVERHEAD, live_entry_bytes, quota_sql
from .heads.heads import Room

__all__ = ["record_cost", "room"]


def room(
    conn: Conn,
    policy: Policy,
    owner: str,
    version: int,
    now: float,
    what: str,
    found: dict[str, Any] | None = None,
    *,
    records_adding: int = 0,
    unsent: int = 0,
) -> Room:
    """Refuse a write sealed under a stale owner-key ``version`` (``StaleOwnerKey``)
    and give what the quota leaves; ``found``: ``quota_sql``'s row if read
    already; ``unsent``: an entry's bytes not sent yet, added to the live sum."""
    if found is None:
        found = conn.query(*quota_sql(owner, now))[0]
    Keystore.check_newest(found["newest"], version)
    return Room(
        policy.owner_quota_bytes,
        int(found["used"]),
        lambda: live_entry_bytes(conn, owner, now) + unsent,
        what,
        records_adding,
    )


def record_cost(row: dict[str, Any]) -> int:
    """What a record's row costs on disk: its sealed bytes, its weighted clear
    identifiers and a fixed overhead (``records_used_sql`` counts the same in SQL)."""
    identifiers = sum(len(row[column].encode()) * weight for column, weight in RECORD_IDENTIFIER_WEIGHTS) // 2
    return len(row["sealed"]) + len(row["wrapped_key"]) + identifiers + RECORD_ROW_OVERHEAD
