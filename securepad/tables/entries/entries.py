"""What the entries table does besides put, open and list: delete, extend,
the housekeeping deletes (gc, drop_turn, forget_owner), rotation's re-wrap
and the stats. Every read goes through ``access``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core import shaping
from ...errors import NotFoundError
from ...keys.keystore import Keystore
from ...policy import NOT_FOUND_MESSAGE
from ...principal import Principal
from ...storage.base import Backend, Conn
from ...storage.sqlite import Database
from .. import access
from ..access import Access, check_principal
from ..heads.heads import Heads, entry_item, expired_sql
from .listings import Listings
from .open import COLUMNS, ID_RE, EntryParts, Readable
from .prepare import listing_fields

__all__ = [
    "ROTATE_ADVICE_LOG2",
    "apply_extend",
    "delete",
    "delete_expired",
    "delete_owner",
    "delete_turn",
    "every_row",
    "prepare_extend",
    "rewrap",
    "stats",
]

# AES-GCM with random 96-bit nonces stays within NIST's bound for 2**32
# encryptions per key; we advise rotating a key long before, at 2**28.
ROTATE_ADVICE_LOG2 = 28
# The columns of a turn's entry that delete reads before deleting it.
_DELETED_COLUMNS = "turn_id, step_num, expires_at, stored_bytes"


def every_row(db: Backend) -> list[dict[str, Any]]:
    """Every entry row of the store, by owner and turn (housekeeping: ``verify``)."""
    return access.every_row(db, "entries", COLUMNS, "owner_user_id, turn_id, step_num")


def prepare_extend(
    parts: EntryParts, listings: Listings, principal: Principal, turn_id: str, target: float, now: float
) -> list[tuple[Any, ...]]:
    """The turn's live entries that expire before ``target``, sealed again for
    it (outside any transaction); ``apply_extend`` writes them. Format 2 gets a
    new listing part (its expiry is bound to it); format 1, new metadata."""
    updates: list[tuple[Any, ...]] = []
    for opened in listings.turn_entries(principal, turn_id, now):
        row = opened.row
        if row["expires_at"] >= target:
            continue
        if isinstance(opened, Readable) and row["sealed_listing"] is None:
            sealed = opened.cipher.seal_meta(shaping.dumps({**opened.meta, "expires_at": target}))
            updates.append(("sealed_meta", target, sealed, row["id"], row["sealed_meta"]))
        else:
            listing = parts.keys.listing_key(row["owner_user_id"], row["key_version"])
            sealed = listing.seal({**row, "expires_at": target}, shaping.pack(listing_fields(opened.meta)))
            updates.append(("sealed_listing", target, sealed, row["id"], row["sealed_listing"]))
    return updates


def delete(parts: EntryParts, principal: Principal, scratchpad_id: str) -> None:
    """``Scratchpad.delete``."""
    check_principal(principal)
    if not isinstance(scratchpad_id, str) or not ID_RE.fullmatch(scratchpad_id):
        raise NotFoundError(NOT_FOUND_MESSAGE)
    owner, db, scoped = principal.owner_user_id, parts.db, parts.access
    # Every read by the id is held to the principal's scope: another owner's id reads what an absent one reads.
    turn_sql = scoped.rows_sql(principal, "entries", _DELETED_COLUMNS, "id = ?", (scratchpad_id,))
    heads_sql = Heads.entry_select_sql(owner, scratchpad_id, parts.policy.scope_columns(principal))
    with db.transaction(owner) as conn:
        # Read before the delete, with it (one message on PostgreSQL): the
        # entry's turn, its head rows, the owner's newest key version.
        for sql, params in (turn_sql, heads_sql, Heads.newest_sql(owner)):
            conn.prefetch(sql, params)
        if not scoped.delete(conn, principal, "entries", scratchpad_id):
            scoped.denied(principal, scratchpad_id)
            raise NotFoundError(NOT_FOUND_MESSAGE)
        conn.defer("DELETE FROM segments WHERE entry_id = ?", (scratchpad_id,))
        row = scoped.rows(principal, "entries", _DELETED_COLUMNS, "id = ?", (scratchpad_id,), conn=conn)[0]
        parts.heads.change(
            conn,
            owner,
            row["turn_id"],
            lambda head: head.remove("e", scratchpad_id, entry_item(row)),
            rows=conn.query(*heads_sql),
        )
    # secure_delete zeroed the pages; the checkpoint takes the old ones out of the WAL too.
    db.checkpoint(wait=False)


def apply_extend(conn: Conn, updates: list[tuple[Any, ...]]) -> list[str]:
    """Write ``prepare_extend``'s updates (compare-and-set) inside the caller's
    transaction; the ids of the entries extended."""
    return [
        entry_id
        for column, target, sealed, entry_id, before in updates
        if conn.execute(
            f"UPDATE entries SET expires_at = ?, {column} = ? WHERE id = ? AND {column} = ?",
            (target, sealed, entry_id, before),
        )
    ]


def delete_expired(conn: Conn, cutoff: float, kept: list[tuple[str, str]]) -> int:
    """Delete expired entries and their segments inside the caller's (gc)
    transaction, except those of the turns in ``kept`` (``Heads.prune``)."""
    where, params = expired_sql(cutoff, kept)
    conn.execute(f"DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE {where})", params)
    return conn.execute(f"DELETE FROM entries WHERE {where}", params)


def delete_turn(conn: Conn, owner: str, turn_id: str) -> dict[str, int]:
    """Delete every entry and segment of an owner's turn inside the caller's
    transaction (``lifecycle.drop_turn``; ``segments`` counts those kept in
    their entry's row too)."""
    where, params = "owner_user_id = ? AND turn_id = ?", (owner, turn_id)
    return {
        "segments": access.segments_in_rows(conn, where, params)
        + conn.execute(f"DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE {where})", params),
        "entries": conn.execute(f"DELETE FROM entries WHERE {where}", params),
    }


def delete_owner(conn: Conn, owner: str) -> dict[str, int]:
    """Delete every entry and segment of an owner inside the caller's transaction
    (``segments`` counts those kept in their entry's row too)."""
    return {
        "segments": access.segments_in_rows(conn, "owner_user_id = ?", (owner,))
        + conn.execute(
            "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = ?)", (owner,)
        ),
        "entries": conn.execute("DELETE FROM entries WHERE owner_user_id = ?", (owner,)),
    }


def stats(
    db: Backend, keys: Keystore, scoped: Access, principal: Principal | None, current: float, location: str
) -> dict[str, Any]:
    """``Scratchpad.stats`` at time ``current``: for one principal's scope, or (None) for the whole store."""
    policy = scoped.policy
    if principal is not None:
        check_principal(principal)
        totals = scoped.aggregate(
            principal,
            "entries",
            "COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
            " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes",
            "expires_at > ?",
            (current,),
        )
        return {"owner_user_id": principal.owner_user_id, "scope": policy.scope, **totals}
    totals = access.store_totals(db, current)
    # With the wraps this process counted but has not written yet (Keystore.WRAP_FLUSH_EVERY).
    pending = keys.pending_wraps()
    counted = db.query("SELECT owner_user_id, version, wrap_count FROM owner_keys", admin=True)
    usage: dict[str, Any] = {
        "owner_key_max_wraps": max(
            (int(r["wrap_count"]) + pending.get((r["owner_user_id"], r["version"]), 0) for r in counted), default=0
        )
    }
    usage["master_key_wraps"] = int(keys.store_meta().get("master_wrap_count", "0"))
    usage["advice"] = [
        f"{name} has sealed {count} keys with random nonces; rotate it"
        f" (AES-GCM limit 2**32, advised below 2**{ROTATE_ADVICE_LOG2})"
        for name, count in (
            ("an owner key", usage["owner_key_max_wraps"]),
            ("the master key", usage["master_key_wraps"]),
        )
        if count >= 2**ROTATE_ADVICE_LOG2
    ]
    result = {"path": location, "policy": policy.name, **totals, "key_usage": usage}
    if isinstance(db, Database):
        path = db.path
        result["file_bytes"] = {suffix or "db": _file_size(Path(f"{path}{suffix}")) for suffix in ("", "-wal", "-shm")}
        result["wal"] = db.wal_status()
    return result


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def rewrap(conn: Conn, updates: list[tuple[Any, ...]]) -> None:
    """Rotation's compare-and-set of entries' item keys and listing parts: each
    update is (wrapped key, version, listing part, id, old version, old wrapped
    key, b"", old listing part); a row changed meanwhile is left for the next pass."""
    conn.executemany(
        "UPDATE entries SET wrapped_key = ?, key_version = ?, sealed_listing = ?"
        " WHERE id = ? AND key_version = ? AND wrapped_key = ? AND COALESCE(sealed_listing, ?) = ?",
        updates,
    )
