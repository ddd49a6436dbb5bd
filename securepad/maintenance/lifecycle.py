"""Key lifecycle: master-key rotation, owner-key rotation, crypto-shredding.

Each operation is a sequence of transactions, each of which leaves a store
that opens with the right key and serves every entry: running an interrupted
operation again finishes it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ..crypto.primitives import item_key_aad, record_key_aad
from ..errors import IntegrityError, NotFoundError
from ..keys.keyring import Keyring
from ..keys.keystore import Keystore, Progress
from ..principal import check_identifier
from ..storage.base import Backend, Params, Rows
from ..tables import access
from ..tables.access import audit_log
from ..tables.entries import entries
from ..tables.heads.heads import Heads
from ..tables.records import TABLES, Records

__all__ = ["Progress", "drop_turn", "forget_owner", "recount_turns", "rotate_master_key", "rotate_owner_key"]

# Item keys re-wrapped per transaction (writers wait milliseconds), passes per table in one rotation.
REWRAP_BATCH = 500
MAX_PASSES = 3
# The tables whose rows hold an item key wrapped by an owner key, with that wrapping's AAD.
_WRAPPED_TABLES: tuple[tuple[str, Callable[[str, str, int], bytes]], ...] = (
    ("entries", item_key_aad),
    *((table, record_key_aad) for table in TABLES),
)


def rotate_master_key(
    db: Backend, keys: Keystore, new_keyring: Keyring, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Re-wrap every owner key under the master key of ``new_keyring`` (which may
    use another source); after it returns, only the new master key opens the store.

    Raises:
        InvalidArgumentError: the new master key is the current one.
        WrongKeyError: the open store's master key is no longer the store's.
        StoreBusyError: the write lock was not obtained in time.
    """
    started = time.perf_counter()
    rewrapped = keys.rotate_master(new_keyring, progress)
    db.checkpoint()
    return {"owner_keys_rewrapped": rewrapped, "source": new_keyring.kind, "seconds": time.perf_counter() - started}


def rotate_owner_key(
    db: Backend,
    keys: Keystore,
    owner_user_id: str,
    *,
    progress: Progress | None = None,
    batch: int = REWRAP_BATCH,
    heads: Heads,
) -> dict[str, Any]:
    """Give an owner a new key version (new puts use it at once), re-wrap its
    item keys, retire the old versions; an interrupted rotation is finished.

    Raises:
        NotFoundError: the owner has no key (never stored anything, or forgotten).
        IntegrityError: an item key fails to unwrap (tampering).
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    started = time.perf_counter()
    versions = keys.versions(owner_user_id)
    if not versions:
        raise NotFoundError(f"owner {owner_user_id!r} has no key")
    if len(versions) == 1:
        keys.add_version(owner_user_id, versions[-1] + 1, admin=True)
        versions = keys.versions(owner_user_id)
    new_version = versions[-1]
    keys.forget(owner_user_id)
    rewrap = _Rewrap(db, keys, owner_user_id, new_version, progress)
    rewrap.run(batch)
    with db.transaction(owner_user_id, admin=True) as conn:
        left = _below(conn.query, owner_user_id, new_version)
        if left:  # a writer slipped in under an old version: finish it next run
            retired: list[int] = []
        else:
            retired = [v for v in versions if v < new_version]
            heads.reseal_owner(conn, owner_user_id)
            keys.retire_older(conn, owner_user_id, new_version)
    keys.forget(owner_user_id)
    db.checkpoint()
    return {
        "owner_user_id": owner_user_id,
        "version": new_version,
        "item_keys_rewrapped": rewrap.done,
        "retired_versions": retired,
        "complete": not left,
        "seconds": time.perf_counter() - started,
    }


def _below(query: Callable[[str, Params], Rows], owner: str, version: int) -> int:
    """How many of the owner's item keys are still wrapped under a version below ``version``."""
    return sum(int(query(*access.count_below_sql(table, owner, version))[0]["n"]) for table, _ in _WRAPPED_TABLES)


class _Rewrap:
    """One owner rotation's re-wrapping of item keys, chunk by chunk."""

    def __init__(self, db: Backend, keys: Keystore, owner: str, version: int, progress: Progress | None) -> None:
        self._db, self._keys, self._owner, self._version, self._progress = db, keys, owner, version, progress
        self.total = _below(functools.partial(db.query, owner=owner, admin=True), owner, version)
        self.done = 0

    def run(self, batch: int) -> None:
        """Every table's rows under an old version, listed by id then fetched in
        chunks of ``batch``; a pass more for rows whose compare-and-set lost a race."""
        for table, aad_of in _WRAPPED_TABLES:
            for _ in range(MAX_PASSES):
                ids = [row["id"] for row in access.below_version(self._db, table, "id", self._owner, self._version)]
                if not ids:
                    break
                for first in range(0, len(ids), batch):
                    self.chunk(table, aad_of, ids[first : first + batch])

    def chunk(self, table: str, aad_of: Callable[[str, str, int], bytes], ids: list[str]) -> None:
        """Re-wrap the item keys of ``ids`` (and reseal entries' listing parts) in one transaction."""
        owner, version = self._owner, self._version
        listed = table == "entries"
        # By primary key only, so the engine cannot pick the owner index and
        # scan the owner's rows per chunk; owner and version are checked here.
        fetched = access.by_ids(self._db, table, _LISTING_COLUMNS if listed else _KEY_COLUMNS, ids, owner)
        rows = [r for r in fetched if r["owner_user_id"] == owner and r["key_version"] < version]
        updates: list[tuple[Any, ...]] = []
        for row in rows:
            try:
                updates.append(self._update(row, aad_of, listed))
            except IntegrityError:
                if self._moved(table, row):
                    continue  # another rotation re-wrapped it and retired its version since it was read
                raise
        with self._db.transaction(owner, admin=True) as conn:  # compare-and-set: a changed row waits a pass
            if listed:
                entries.rewrap(conn, updates)
            else:
                Records.rewrap(conn, table, updates)
            self._keys.count_wraps(conn, owner, version, len(updates))
        self.done += len(rows)
        if self._progress is not None:
            self._progress(min(self.done, self.total), self.total)

    def _update(self, row: dict[str, Any], aad_of: Callable[[str, str, int], bytes], listed: bool) -> tuple[Any, ...]:
        """The compare-and-set update of one row under the new version, with its old values.

        Raises:
            IntegrityError: a key is missing (retired meanwhile, or tampering) or a wrapping was altered.
        """
        owner, version, old = self._owner, self._version, row["key_version"]
        new = self._keys.owner_wrapper(owner, version)
        wrapped = self._keys.owner_wrapper(owner, old).rewrap(
            row["wrapped_key"], aad_of(row["id"], owner, old), new, aad_of(row["id"], owner, version)
        )
        keys = (row["id"], old, row["wrapped_key"])
        if listed:  # the part as it was read, too: an extension may have re-sealed it meanwhile
            return (wrapped, version, self._reseal_listing(row), *keys, b"", row["sealed_listing"] or b"")
        return (wrapped, version, *keys)

    def _moved(self, table: str, row: dict[str, Any]) -> bool:
        """Whether ``row`` (read before its keys failed) was re-wrapped by another
        rotation or deleted since; if not, its missing key is tampering."""
        found = access.wrapping_of(self._db, table, row["id"], self._owner)
        return not found or any(found[0][k] != row[k] for k in ("key_version", "wrapped_key"))

    def _reseal_listing(self, row: dict[str, Any]) -> bytes | None:
        """An entry's listing part under the new version's listing key (None: it has none).

        Raises:
            IntegrityError: the part fails authentication under the old version.
        """
        if row["sealed_listing"] is None:
            return None
        plain = self._keys.listing_key(self._owner, row["key_version"]).open(row)
        return self._keys.listing_key(self._owner, self._version).seal({**row, "key_version": self._version}, plain)


_KEY_COLUMNS = "id, owner_user_id, key_version, wrapped_key"
# What an entry's listing part is bound to (crypto.listing_aad), besides the key columns.
_LISTING_COLUMNS = (
    f"{_KEY_COLUMNS}, turn_id, actor, channel, step_num, executor_name, content_kind, size_bytes,"
    " size_chars, segment_count, created_at, expires_at, commitment, sealed_listing"
)


def forget_owner(db: Backend, keys: Keystore, owner_user_id: str) -> dict[str, Any]:
    """Crypto-shred an owner: delete its keys and rows with ``secure_delete``,
    then scrub the file, so no ciphertext or wrapped key of it remains
    (backups keep both: SECURITY.md). Returns what was removed, per table.

    Raises:
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    removed: dict[str, Any] = {"owner_user_id": owner_user_id}
    with db.transaction(owner_user_id, admin=True) as conn:
        removed.update(entries.delete_owner(conn, owner_user_id))
        removed.update(Records.delete_owner(conn, owner_user_id))
        removed["turn_heads"] = Heads.delete_owner(conn, owner_user_id)
        removed["owner_keys"] = keys.delete_owner(conn, owner_user_id)
    keys.forget(owner_user_id)
    removed["wal_truncated"] = db.scrub()
    return removed


def drop_turn(db: Backend, heads: Heads, owner_user_id: str, turn_id: str) -> dict[str, Any]:
    """Delete an owner's turn whole (rows, head, its place in the owner and usage
    heads) in one transaction, whatever its check says: the way out of a turn
    found tampered that no backup restores. Returns what was removed, per table.

    Raises:
        InvalidArgumentError: an identifier is malformed.
        IntegrityError: the owner's owner head or usage head fails authentication.
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    check_identifier("turn_id", turn_id)
    removed: dict[str, Any] = {"owner_user_id": owner_user_id, "turn_id": turn_id}
    with db.transaction(owner_user_id, admin=True) as conn:
        removed.update(entries.delete_turn(conn, owner_user_id, turn_id))
        removed.update(Records.delete_turn(conn, owner_user_id, turn_id))
        removed["turn_heads"] = heads.drop_turn(conn, owner_user_id, turn_id)
    heads.turn_dropped(owner_user_id, turn_id)
    db.checkpoint(wait=False)
    return removed


def recount_turns(db: Backend, keys: Keystore, heads: Heads, owner_user_id: str) -> dict[str, Any]:
    """Count an owner's turns anew: its turns become those whose heads are present now,
    whatever the owner head says (the way out of a turn removed whole whose id is not
    known). The owner head and usage head are sealed again over them in one transaction
    under the owner's exclusive lock; a head row that does not open under the owner's
    key is not counted and is deleted (``tables/heads/recount.py`` says why). Returns
    the turns counted before and after and what else changed.

    Raises:
        InvalidArgumentError: the identifier is malformed.
        NotFoundError: the owner has no key (never stored anything, or forgotten).
        IntegrityError: the owner head is missing, or it or the usage head fails authentication.
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    if not keys.versions(owner_user_id):
        raise NotFoundError(f"owner {owner_user_id!r} has no key")
    with db.transaction(owner_user_id, admin=True) as conn:
        done = heads.recount_turns(conn, owner_user_id)
    heads.owners.recounted(owner_user_id)
    if done.deleted:
        audit_log.warning(
            "recounting owner %r's turns deleted head rows that are not the owner's: %r", owner_user_id, done.deleted
        )
    if done.resealed:
        db.checkpoint(wait=False)
    return {"owner_user_id": owner_user_id, **done.report()}
