"""``Housekeeping``, the face of ``Scratchpad`` (which inherits it) for the
whole-store work: the key lifecycle and the upkeep (expiry, scrubbing,
verification, counts), each handed to the layer that owns it."""

from __future__ import annotations

from typing import Any

from ._assembly import Assembly, Parts
from .errors import InvalidArgumentError
from .keys.keyring import Keyring
from .keys.keystore import Progress
from .principal import Principal

__all__ = ["Housekeeping"]


class Housekeeping:
    """The key lifecycle and the upkeep of an open store (a face of ``Scratchpad``)."""

    _assembly: Assembly
    _parts: Parts

    # -- key lifecycle (see maintenance/lifecycle.py) -----------------------------
    # The maintenance modules are imported by the methods that use them: a store
    # opened to put and read never loads them.

    def rotate_master_key(self, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
        """Re-wrap every owner key under ``new_keyring``'s master key; see ``lifecycle.rotate_master_key``."""
        if not isinstance(new_keyring, Keyring):
            raise InvalidArgumentError("new_keyring must be a securepad.Keyring")
        return self._assembly.rotate_master_key(new_keyring, progress)

    def rotate_owner_key(self, owner_user_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """New key version for an owner, old ones retired; see ``lifecycle.rotate_owner_key``."""
        from .maintenance import lifecycle

        parts = self._parts
        return lifecycle.rotate_owner_key(parts.db, parts.keys, owner_user_id, progress=progress, heads=parts.heads)

    def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """Crypto-shred an owner's keys and entries; see ``lifecycle.forget_owner``."""
        from .maintenance import lifecycle

        return lifecycle.forget_owner(self._parts.db, self._parts.keys, owner_user_id)

    def drop_turn(self, owner_user_id: str, turn_id: str) -> dict[str, Any]:
        """Delete an owner's turn whole (entries, records, head), whatever its
        check says: the explicit way out of a turn found tampered that no backup
        restores; see ``lifecycle.drop_turn``. Returns what was removed, per table.

        Raises:
            InvalidArgumentError: an identifier is malformed.
            IntegrityError: the owner's owner head or usage head fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        from .maintenance import lifecycle

        return lifecycle.drop_turn(self._parts.db, self._parts.heads, owner_user_id, turn_id)

    # -- upkeep ----------------------------------------------------------------------

    def gc(self, now: float | None = None, *, wait: bool = True) -> int:
        """Delete expired entries and their segments (and expired turn checkpoints
        and compaction marks) with ``secure_delete`` (their cells and the pages
        they free are zeroed), then truncate the WAL; when the deletes left a
        quarter of the file's pages free (whoever freed them), ``scrub`` the file
        too (a rebuild that also removes copies of rows that b-tree rebalancing
        left in live pages' unused space). Returns how many entries were deleted.

        With ``wait=False`` (``turn`` uses this) it does not scrub and the WAL
        checkpoint does not wait for readers: it moves what it can, and a later
        ``gc``, ``scrub`` or ``forget_owner`` finishes the job.

        Raises:
            InvalidArgumentError: ``now`` is not a finite number, or is more
                than the policy's ``max_clock_skew_seconds`` past the clock.
            StoreBusyError: the write lock was not obtained in time.
            StorageFullError: no room for the deletes (nothing was deleted), or
                for the scrub after them (the message says the deletes stand;
                ``gc`` again, once there is room, runs the scrub).
        """
        return self._assembly.gc(now, wait=wait)

    def verify(self, *, now: float | None = None) -> dict[str, Any]:
        """Check the whole store: every owner's heads, every entry (with all its
        segments) and turn record authenticated and compared with its turn's
        head. Time linear in the store; it changes nothing.

        Returns ``ok`` (no problem found), counts (``owners``, ``turns``,
        ``entries``, ``checkpoints``, ``compaction_marks``), ``seconds`` and
        ``problems``: one dict per problem with ``owner_user_id``, ``turn_id``,
        ``id`` (entry or record, or None for a head), ``what`` and ``problem``;
        a turn whose entries differ from its head also has ``steps``,
        ``last_step``, ``missing_steps`` and ``newest_removed`` (``verify.py``).
        Every read is made in one read snapshot: writers that commit meanwhile
        (in this process or others) are not seen half-way.

        Raises:
            InvalidArgumentError: a bad ``now``.
            StoreBusyError, StoreUnavailableError: the snapshot could not be had.
        """
        from .maintenance.verify import verify_store

        parts = self._parts
        return verify_store(parts.db, parts.opener, parts.records, parts.heads, parts.tables.timeline.read_time(now))

    def scrub(self) -> bool:
        """Rewrite the store file so that nothing deleted remains anywhere in it.

        ``delete`` and ``gc`` delete with ``secure_delete``, which zeroes a
        deleted row, but SQLite can leave stale copies of rows it moved
        between pages in those pages' unused space; this rebuilds the file
        (VACUUM) and truncates the WAL. ``gc`` (when it deleted something) and
        ``forget_owner`` do it themselves. It reads and writes the whole store
        and holds the write lock meanwhile. Returns False when a reader kept
        part of the WAL alive (the next checkpoint clears it). On PostgreSQL
        it does nothing (the server's VACUUM removes dead rows).

        Raises:
            StoreBusyError: the write lock was not obtained in time.
        """
        return self._parts.db.scrub()

    def stats(self, principal: Principal | None = None, *, now: float | None = None) -> dict[str, Any]:
        """Counts and sizes: for one principal's scope, or (None) for the whole store.

        Raises:
            InvalidArgumentError: a bad principal.
        """
        return self._assembly.stats(principal, now)
