"""One open store put together: the backend for a path, DSN or pool; the
layers built over it, in order (keys, anchor, access, tables); and the work
that spans those layers, which ``Scratchpad`` delegates to: the
snapshot-rollback anchor kept from open through a master rotation to close,
expiry collection (``gc``) and the store-wide ``stats``.

``Scratchpad`` (the face) validates and documents; this module holds no SQL
of its own and reads no policy setting the layers do not hand it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.timeline import Timeline
from .errors import InvalidArgumentError, SecurepadError, StorageFullError, StoreBusyError
from .keys.keyring import Keyring
from .keys.keystore import Keystore, Progress
from .policy import Policy
from .principal import Principal
from .storage.anchor import Anchor, default_path
from .storage.base import Backend
from .storage.sqlite import Database
from .tables.access import Access
from .tables.entries import entries
from .tables.entries.listings import Listings
from .tables.entries.open import EntryParts, Opener
from .tables.entries.put import Putter
from .tables.heads.build import HeadBuilder
from .tables.heads.heads import Heads
from .tables.records import Records

__all__ = [
    "NEAR_KEY",
    "QUICK_GC_RECOUNT_ROWS",
    "Anchoring",
    "Assembly",
    "Parts",
    "open_backend",
    "resolve_policy",
]

# Scratchpad.open's (anchor, adopt_anchor); the anchor: a path, None (beside the key file) or False (none).
Anchoring = tuple[str | os.PathLike[str] | bool | None, bool]
NEAR_KEY: Anchoring = (None, False)

_PG_SCHEMES = ("postgresql://", "postgres://")
# The rows a quick gc (``Scratchpad.turn``'s) may recount, over the turns it
# collects from: under the write lock, each collected turn is checked against
# its head whole, and one tenant's 30,000-entry turn with one expiring entry
# made every tenant's ``turn()`` wait ~340 ms. A longer turn waits for a full gc.
QUICK_GC_RECOUNT_ROWS = 2000


@dataclass(frozen=True, eq=False)
class Parts:
    """The layers one open store is built from: the faces call each part
    directly, and so do the package's own tools (the audit, the drills)."""

    db: Backend
    keys: Keystore
    access: Access
    tables: EntryParts  # what the tables are built from: heads, policy, the times
    heads: Heads
    opener: Opener
    listings: Listings
    putter: Putter
    records: Records

    @classmethod
    def build(cls, db: Backend, keys: Keystore, policy: Policy, clock: Callable[[], float]) -> Parts:
        """The parts of a store over ``db``, each built from those below it."""
        access = Access(db, policy)
        timeline = Timeline(clock, policy.max_clock_skew_seconds)
        tables = EntryParts(db, keys, access, policy, timeline, Heads(db, keys, policy))
        opener = Opener(tables)
        listings = Listings(tables, opener)
        return cls(db, keys, access, tables, tables.heads, opener, listings, Putter(tables, listings), Records(tables))


def resolve_policy(policy: str | os.PathLike[str] | Policy | None) -> Policy:
    """A shipped policy's name, a TOML file's path, a ``Policy``, or None (the shipped default).

    Raises:
        PolicyError: the policy file is invalid.
    """
    if policy is None:
        return Policy.default()
    if isinstance(policy, Policy):
        return policy
    return Policy.load(policy if isinstance(policy, str) else Path(policy))


def store_exists(where: str | os.PathLike[str]) -> bool:
    """Whether a store is at ``where``: the SQLite file, or a PostgreSQL DSN's store (its schema).

    Raises:
        StoreUnavailableError: the PostgreSQL server cannot be reached.
    """
    if not str(where).startswith(_PG_SCHEMES):
        return Path(where).exists()
    from .storage.postgres.pool import store_present

    return store_present(str(where))


def location_of(where: str | os.PathLike[str]) -> str:
    """Where ``where`` is, for a message: the file's absolute path, or the DSN without its password."""
    if not str(where).startswith(_PG_SCHEMES):
        return str(Path(where).absolute())
    from .storage.postgres.pool import describe_source

    return describe_source(str(where))


def open_backend(
    where: Any, admin: Any, schema: str, policy: Policy, *, call_timeout_s: float | None = None
) -> Backend:
    """A SQLite file, or a PostgreSQL store for a DSN or a connection pool.
    ``call_timeout_s`` (PostgreSQL) overrides the policy's ``call_timeout_seconds``.

    Raises:
        InvalidArgumentError: PostgreSQL options given for a SQLite file, or a
            call deadline that is not a positive number of seconds.
        SecurepadError: psycopg is not installed.
    """
    if isinstance(where, str | os.PathLike) and not str(where).startswith(_PG_SCHEMES):
        if admin is not None or schema != "securepad" or call_timeout_s is not None:
            raise InvalidArgumentError("admin, schema and call_timeout_s are options of PostgreSQL stores")
        return Database(
            Path(where),
            wal_limit_bytes=policy.wal_limit_bytes,
            incremental_vacuum=policy.incremental_vacuum,
            durability=policy.durability,
            allow_shared=policy.allow_shared_files,
        )
    try:
        from .storage.postgres.database import PostgresDatabase
    except ImportError:
        raise SecurepadError("PostgreSQL stores need psycopg: pip install 'psycopg[binary]' psycopg-pool") from None
    return PostgresDatabase(
        str(where) if isinstance(where, os.PathLike) else where,
        admin=admin,
        schema=schema,
        durability=policy.durability,
        call_timeout_s=policy.call_timeout_seconds if call_timeout_s is None else call_timeout_s,
    )


class Assembly:
    """An open store's layers (``parts``) and its anchor, and the work that spans them."""

    def __init__(
        self, db: Backend, keyring: Keyring, policy: Policy, clock: Callable[[], float], anchoring: Anchoring
    ) -> None:
        keys = Keystore(db, keyring)
        # The anchor is checked before anything is written (HeadBuilder.build_if_needed may write).
        self.anchor = _open_anchor(db, keys, policy, anchoring)
        self.parts = Parts.build(db, keys, policy, clock)
        writes = self.anchor.status()["committed"] if self.anchor else 0
        # The flags as read at unlock, not read again (a round trip each on
        # PostgreSQL): a flag only goes from "to do" to "done", in a transaction
        # that reads it again, so a read made earlier in this open decides as well.
        meta = keys.opened_meta
        # The usage heads of a store from before them come in the same transaction.
        HeadBuilder(self.parts.heads, db, keys).build_if_needed(
            self.parts.tables.timeline.read_time, writes=writes, meta=meta
        )

    def close(self) -> None:
        """``Scratchpad.close``: key-use counts, then the anchor, then the connections."""
        try:
            with contextlib.suppress(SecurepadError):  # a busy or broken store: the counts stay low by < 256 a key
                self.parts.keys.flush_wraps()
            # A full or busy store cannot advance its counter now: the writes
            # are committed, only the anchor lags, as after a kill (SECURITY.md).
            if self.anchor is not None:
                with contextlib.suppress(StorageFullError, StoreBusyError):
                    self.anchor.close()
        finally:
            self.parts.db.close()

    def rotate_master_key(self, new_keyring: Keyring, progress: Progress | None) -> dict[str, Any]:
        """``Scratchpad.rotate_master_key``; the anchor follows the key file."""
        from .maintenance import lifecycle  # only a rotation loads the key lifecycle

        done = lifecycle.rotate_master_key(self.parts.db, self.parts.keys, new_keyring, progress=progress)
        self.anchor = _move_anchor(self.anchor, self.parts.keys, new_keyring)
        return done

    def gc(self, now: float | None, *, wait: bool) -> int:
        """``Scratchpad.gc``: heads pruned, expired entries and records deleted in
        one admin transaction, then (with ``wait``) a scrub when the file has a
        quarter of its pages free (``Backend.scrub_after_deletes``), or a checkpoint."""
        db = self.parts.db
        cutoff = self.parts.tables.timeline.write_time(now)
        with db.transaction(admin=True, wait=wait) as conn:
            # prune reads every row the deletes below would remove (expired
            # entries, checkpoints and marks; segments go with their entries),
            # under the store-wide write lock, and checks each turn it collects
            # from against its head: the deletes leave the turns that failed
            # (``kept``) alone, and are skipped when no turn is collected from
            # (on PostgreSQL, 4 round trips of the 6 that each pad.turn paid
            # for its collection, the common case).
            changed, kept = self.parts.heads.prune(conn, cutoff, None if wait else QUICK_GC_RECOUNT_ROWS)
            if changed:
                deleted = entries.delete_expired(conn, cutoff, kept)
                records = Records.delete_expired(conn, cutoff, kept)
            else:
                deleted = records = 0
        if wait:  # also after a gc that deleted nothing: a scrub that could not run before runs now
            try:
                db.scrub_after_deletes()
            except StorageFullError:
                done = (
                    f"gc deleted {deleted} expired entries and {records} turn records (committed: their cells and"
                    " the pages they freed are zeroed), but"
                    if deleted or records
                    else "gc found nothing expired to delete; a quarter of the file's pages are free, but"
                )
                raise StorageFullError(
                    f"{done} the disk holding the store has no room for the scrub that rebuilds the file, which"
                    " did not run; free space, then run gc again (`securepad gc`) or Scratchpad.scrub() to rebuild it"
                ) from None
        else:
            db.checkpoint(wait=wait)
        return deleted

    def gc_quietly(self, now: float | None) -> None:
        """Collect expired entries without waiting on readers (``Scratchpad.turn``).

        Collection is housekeeping (expired entries are never served anyway):
        a busy store does not stop a turn from starting."""
        with contextlib.suppress(StoreBusyError):
            self.gc(now, wait=False)

    def stats(self, principal: Principal | None, now: float | None) -> dict[str, Any]:
        """``Scratchpad.stats``; the store-wide figures include the anchor's status and the master key's identifier."""
        db, keys, access = self.parts.db, self.parts.keys, self.parts.access
        result = entries.stats(db, keys, access, principal, self.parts.tables.timeline.read_time(now), db.location)
        if principal:
            return result
        return {**result, "anchor": self.anchor and self.anchor.status(), "master_key": keys.keyring.identifier}


def _open_anchor(db: Backend, keys: Keystore, policy: Policy, anchoring: Anchoring) -> Anchor | None:
    """The snapshot-rollback anchor of a SQLite store, checked and hooked into
    every write (None on PostgreSQL, with ``anchor=False``, or with no path
    and no key file to put it beside). ``anchoring``: (``anchor``, ``adopt_anchor``)."""
    where, adopt = anchoring
    if where is True or not isinstance(where, str | os.PathLike | bool | None):
        raise InvalidArgumentError("anchor must be a path, None (the default place) or False (no anchor)")
    assert where is not True  # for mypy: refused above
    if not isinstance(db, Database):
        if where not in (None, False) or adopt:
            raise InvalidArgumentError("anchor and adopt_anchor are options of SQLite stores (SECURITY.md)")
        return None
    if where is False:
        return None
    path = default_path(keys.keyring.key_file, keys.store_id) if where is None else Path(where)
    if path is None:
        return None
    sync, interval_s = policy.anchor_sync, float(policy.anchor_interval_seconds)
    # Beside the key file, the key file's override covers the anchor too.
    shared = policy.allow_shared_files or (where is None and keys.keyring.allow_shared)
    anchor = Anchor(
        db, keys.counter_seal, path, sync=sync, interval_s=interval_s, default=where is None, allow_shared=shared
    )
    anchor.open(adopt=adopt)
    return anchor


def _move_anchor(anchor: Anchor | None, keys: Keystore, new_keyring: Keyring) -> Anchor | None:
    """After a master rotation to a key file elsewhere, the anchor follows it
    (where the next open will look for it)."""
    if anchor is None or not anchor.default:
        return anchor
    path = default_path(new_keyring.key_file, keys.store_id)
    if path is None or path == anchor.path:
        return anchor
    anchor.close()
    moved = Anchor(
        anchor.db,
        keys.counter_seal,
        path,
        sync=anchor.sync,
        interval_s=anchor.interval_s,
        default=True,
        allow_shared=anchor.allow_shared or new_keyring.allow_shared,
    )
    moved.open(adopt=True)
    return moved
