"""The entries: the face of the put pipeline (``entry_put``), the authenticated
open (``entry_open``), the turn listings (``entry_listings``); delete, gc, stats.

Built from its parts (the database, the keystore, the authorized access path,
the policy, the clock), never from a ``Scratchpad``. Every fetch of an entry
row goes through ``access.Access``; every entry is sealed by
``crypto.seal_entry`` and opened by ``crypto.open_entry``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ...core import shaping
from ...core.timeline import Timeline
from ...errors import NotFoundError
from ...keys.keystore import Keystore
from ...policy import NOT_FOUND_MESSAGE, Policy
from ...principal import Principal
from ...storage.base import Backend, Conn, Rows
from ...storage.sqlite import Database
from ..access import Access, check_principal
from ..heads.heads import Heads, Room, entry_item, expired_sql
from .listings import Listings
from .open import Opener
from .put import Putter, Shown
from .rows import COLUMNS, ID_RE, Entry, EntryParts, Opened, Readable, check_step_num, listing_fields

__all__ = ["ROTATE_ADVICE_LOG2", "Entries", "Entry", "Opened", "check_step_num"]

# AES-GCM with random 96-bit nonces stays within NIST's bound for 2**32
# encryptions per key; we advise rotating a key long before, at 2**28.
ROTATE_ADVICE_LOG2 = 28


class Entries:
    """The entries of one store. Safe to share between threads."""

    def __init__(self, db: Backend, keys: Keystore, access: Access, policy: Policy, clock: Callable[[], float]) -> None:
        self._db = db
        self._access = access
        self._keys = keys
        self.policy = policy
        timeline = Timeline(clock, policy.max_clock_skew_seconds)
        parts = EntryParts(db, keys, access, policy, timeline, Heads(db, keys, policy))
        self.heads = parts.heads
        self.now, self.write_now, self.ttl = parts.now, parts.write_now, parts.ttl
        self.opener = Opener(parts)
        self.listings = Listings(parts, self.opener)
        self.putter = Putter(parts, self.listings)

    # -- delegated: each call looks its part's method up when it runs ----------------------------

    def put(
        self,
        principal: Principal,
        turn_id: str,
        step_num: int,
        executor_name: str,
        observation: Any,
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
        inline: tuple[Any] | None = None,
        free_step: bool = False,
        next_step: bool = False,
    ) -> dict[str, Any]:
        """``entry_put.Putter.put``."""
        return self.putter.put(
            principal,
            turn_id,
            step_num,
            executor_name,
            observation,
            ttl_seconds,
            now=now,
            inline=inline,
            free_step=free_step,
            next_step=next_step,
        )

    def put_many(
        self,
        principal: Principal,
        turn_id: str,
        items: Any,
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
        shown: Shown | None = None,
    ) -> list[dict[str, Any]]:
        """``entry_put.Putter.put_many``."""
        return self.putter.put_many(principal, turn_id, items, ttl_seconds, now=now, shown=shown)

    def check_quota(self, conn: Conn, owner: str, version: int, adding: int, now: float, what: str) -> Room:
        """``entry_put.Putter.room`` for a record of ``adding`` bytes (``Heads.change`` decides)."""
        return self.putter.room(conn, owner, version, now, what, records_adding=adding)

    def open(
        self, principal: Principal, scratchpad_id: object, now: float | None, turn_id: str | None = None
    ) -> Readable:
        """``entry_open.Opener.open``."""
        return self.opener.open(principal, scratchpad_id, now, turn_id)

    def get(
        self, principal: Principal, scratchpad_id: str, *, now: float | None = None, turn_id: str | None = None
    ) -> Entry:
        """``entry_open.Opener.get``."""
        return self.opener.get(principal, scratchpad_id, now=now, turn_id=turn_id)

    def read(
        self,
        principal: Principal,
        scratchpad_id: str,
        mode: str = "head",
        *,
        now: float | None = None,
        turn_id: str | None = None,
        **args: Any,
    ) -> dict[str, Any]:
        """``entry_open.Opener.read``."""
        return self.opener.read(principal, scratchpad_id, mode, now=now, turn_id=turn_id, **args)

    def verify_row(self, row: dict[str, Any]) -> None:
        """``entry_open.Opener.verify_row``."""
        self.opener.verify_row(row)

    def turn_entries(self, principal: Principal, turn_id: str, now: float | None) -> list[Opened]:
        """``entry_listings.Listings.turn_entries``."""
        return self.listings.turn_entries(principal, turn_id, now)

    def turn_offloads(self, principal: Principal, turn_id: str, now: float | None) -> bool:
        """``entry_listings.Listings.turn_offloads``."""
        return self.listings.turn_offloads(principal, turn_id, now)

    def last_step(self, principal: Principal, turn_id: str, now: float | None, conn: Conn | None = None) -> int:
        """``entry_listings.Listings.last_step``."""
        return self.listings.last_step(principal, turn_id, now, conn)

    def check_step_free(
        self, principal: Principal, turn_id: str, step_num: int, now: float | None, conn: Conn | None = None
    ) -> None:
        """``entry_listings.Listings.check_step_free``."""
        self.listings.check_step_free(principal, turn_id, step_num, now, conn)

    # -- housekeeping -------------------------------------------------------------------------------

    def all_rows(self) -> Rows:
        """Every entry row of the store, by owner and turn (housekeeping: ``verify``)."""
        return self._db.query(
            f"SELECT owner_user_id, actor, channel, {COLUMNS} FROM entries ORDER BY owner_user_id, turn_id, step_num",
            admin=True,
        )

    # -- expiry, delete, gc, stats -----------------------------------------------------------------

    def transaction(self, owner: str) -> AbstractContextManager[Conn]:
        """A write transaction of ``owner`` (for writes that span entries and records)."""
        return self._db.transaction(owner)

    def prepare_extend(self, principal: Principal, turn_id: str, target: float, now: float) -> list[tuple[Any, ...]]:
        """The turn's live entries that expire before ``target``, sealed again
        for it (outside any transaction); ``apply_extend`` writes them. An entry
        of format 2 gets a new listing part (its expiry is bound to it, under
        the owner's listing key); one of format 1, new metadata under its item key."""
        updates: list[tuple[Any, ...]] = []
        for opened in self.turn_entries(principal, turn_id, now):
            row = opened.row
            if row["expires_at"] >= target:
                continue
            if isinstance(opened, Readable) and row["sealed_listing"] is None:
                sealed = opened.cipher.seal_meta(shaping.dumps({**opened.meta, "expires_at": target}))
                updates.append(("sealed_meta", target, sealed, row["id"], row["sealed_meta"]))
            else:
                listing = self._keys.listing_key(row["owner_user_id"], row["key_version"])
                sealed = listing.seal({**row, "expires_at": target}, shaping.pack(listing_fields(opened.meta)))
                updates.append(("sealed_listing", target, sealed, row["id"], row["sealed_listing"]))
        return updates

    def delete(self, principal: Principal, scratchpad_id: str) -> None:
        """``Scratchpad.delete``."""
        check_principal(principal)
        if not isinstance(scratchpad_id, str) or not ID_RE.fullmatch(scratchpad_id):
            raise NotFoundError(NOT_FOUND_MESSAGE)
        owner = principal.owner_user_id
        # Every read by the id is held to the principal's scope: another
        # owner's id reads what an absent one reads.
        scope, scope_params = self.policy.scope_sql(principal)
        turn_sql = (
            f"SELECT turn_id, step_num, expires_at, stored_bytes, actor, channel FROM entries WHERE id = ? AND {scope}",
            (scratchpad_id, *scope_params),
        )
        heads_sql = Heads.entry_select_sql(owner, scratchpad_id, self.policy.scope_columns(principal))
        with self._db.transaction(owner) as conn:
            # Read before the delete, with it (one message on PostgreSQL): the
            # entry's turn, its head rows, the owner's newest key version.
            for sql, params in (turn_sql, heads_sql, Heads.newest_sql(owner)):
                conn.prefetch(sql, params)
            if not self._access.delete(conn, principal, "entries", scratchpad_id):
                self._access.denied(principal, scratchpad_id)
                raise NotFoundError(NOT_FOUND_MESSAGE)
            conn.defer("DELETE FROM segments WHERE entry_id = ?", (scratchpad_id,))
            row = conn.query(*turn_sql)[0]
            self.heads.change(
                conn,
                owner,
                row["turn_id"],
                lambda head: head.remove("e", scratchpad_id, entry_item(row)),
                rows=conn.query(*heads_sql),
            )
        # secure_delete zeroed the pages; the checkpoint takes the old ones out of the WAL too.
        self._db.checkpoint(wait=False)


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
    in_rows = conn.query(f"SELECT COUNT(*) AS n FROM entries WHERE {where} AND only_segment IS NOT NULL", params)
    return {
        "segments": int(in_rows[0]["n"])
        + conn.execute(f"DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE {where})", params),
        "entries": conn.execute(f"DELETE FROM entries WHERE {where}", params),
    }


def delete_owner(conn: Conn, owner: str) -> dict[str, int]:
    """Delete every entry and segment of an owner inside the caller's transaction
    (``segments`` counts those kept in their entry's row too)."""
    in_rows = conn.query(
        "SELECT COUNT(*) AS n FROM entries WHERE owner_user_id = ? AND only_segment IS NOT NULL", (owner,)
    )
    return {
        "segments": int(in_rows[0]["n"])
        + conn.execute(
            "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = ?)", (owner,)
        ),
        "entries": conn.execute("DELETE FROM entries WHERE owner_user_id = ?", (owner,)),
    }


def stats(
    db: Backend, keys: Keystore, access: Access, principal: Principal | None, current: float, location: str
) -> dict[str, Any]:
    """``Scratchpad.stats`` at time ``current``: for one principal's scope, or (None) for the whole store."""
    policy = access.policy
    if principal is not None:
        check_principal(principal)
        totals = access.aggregate(
            principal,
            "entries",
            "COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
            " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes",
            "expires_at > ?",
            (current,),
        )
        return {"owner_user_id": principal.owner_user_id, "scope": policy.scope, **totals}
    rows = db.query(
        "SELECT COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
        " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes,"
        " COUNT(DISTINCT owner_user_id) AS owners,"
        " COUNT(CASE WHEN expires_at <= ? THEN 1 END) AS expired_pending_gc FROM entries",
        (current,),
        admin=True,
    )
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
    result = {"path": location, "policy": policy.name, **rows[0], "key_usage": usage}
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
