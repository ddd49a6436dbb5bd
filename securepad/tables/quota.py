"""The owner's quota: what a write may add, decided inside the owner's write
transaction (``room``; ``Heads.change`` reserves it, or refuses)."""

from __future__ import annotations

from typing import Any

from ..keys.keystore import NEWEST_VERSION_SQL, Keystore
from ..policy import Policy
from ..principal import Principal
from ..storage.base import Conn, Params, check_write_bound
from .access import RECORD_IDENTIFIER_WEIGHTS, RECORD_ROW_OVERHEAD, live_entry_bytes, records_used_sql
from .entries.prepare import Prepared
from .heads.heads import Room

__all__ = ["check_write_size", "quota_sql", "record_cost", "room"]


def quota_sql(
    owner: str, now: float, step: tuple[str, Params] | None = None, *, records: bool = True
) -> tuple[str, Params]:
    """``room``'s one query: the owner's newest key version, its live records'
    cost (``used``; NULL without ``records``: the shared lock checks no quota)
    and with ``step``, the latest expiry of the entries at the step."""
    used, params = records_used_sql(owner, now) if records else ("NULL", ())
    sql = f"SELECT {NEWEST_VERSION_SQL} AS newest, {used} AS used"
    if step is None:
        return sql, (owner, *params)
    return f"{sql}, (SELECT MAX(expires_at) FROM ({step[0]}) AS taken) AS step_expires", (owner, *params, *step[1])


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


def check_write_size(
    prepared: list[tuple[Prepared, str]], principal: Principal, turn_id: str, limit: int | None, what: str
) -> None:
    """Refuse, before anything is written, entries that could take more than
    ``limit`` bytes in one transaction (raises QuotaExceededError)."""
    if limit is None:
        return
    names = {"actor": principal.actor, "channel": principal.channel}
    owner = principal.owner_user_id
    size = sum(p.cost_bound({**names, "executor_name": executor}, owner, turn_id) for p, executor in prepared)
    check_write_bound(size, limit, what)


def record_cost(row: dict[str, Any]) -> int:
    """What a record's row costs on disk: its sealed bytes, its weighted clear
    identifiers and a fixed overhead (``records_used_sql`` counts the same in SQL)."""
    identifiers = sum(len(row[column].encode()) * weight for column, weight in RECORD_IDENTIFIER_WEIGHTS) // 2
    return len(row["sealed"]) + len(row["wrapped_key"]) + identifiers + RECORD_ROW_OVERHEAD
