"""``Housekeeping``, the face of ``Scratchpad`` for whole-store work, each handed to its layer."""

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

    def rotate_master_key(self, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
        """Re-wrap every owner key under ``new_keyring``'s master key; see ``lifecycle.rotate_master_key``."""
        if not isinstance(new_keyring, Keyring):
            raise InvalidArgumentError("new_keyring must be a securepad.Keyring")
        return self._assembly.rotate_master_key(new_keyring, progress)

    def rotate_owner_key(self, owner_user_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """New key version for an owner, old ones retired; see ``lifecycle.rotate_owner_key``."""
        from .maintenance import lifecycle  # the maintenance modules load when used: a put never loads them

        parts = self._parts
        return lifecycle.rotate_owner_key(parts.db, parts.keys, owner_user_id, progress=progress, heads=parts.heads)

    def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """Crypto-shred an owner's keys and entries; see ``lifecycle.forget_owner``."""
        from .maintenance import lifecycle

        return lifecycle.forget_owner(self._parts.db, self._parts.keys, owner_user_id)

    def drop_turn(self, owner_user_id: str, turn_id: str) -> dict[str, Any]:
        """Delete an owner's turn whole (entries, records, head), whatever its check
        says: the way out of a tampered turn. Returns what was removed, per table.

        Raises:
            InvalidArgumentError: an identifier is malformed.
            IntegrityError: the owner's owner head or usage head fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        from .maintenance import lifecycle

        return lifecycle.drop_turn(self._parts.db, self._parts.heads, owner_user_id, turn_id)

    def recount_turns(self, owner_user_id: str) -> dict[str, Any]:
        """Count an owner's turns anew from the turn heads present now, whatever its owner
        head says: the way out of a turn removed whole (its head and rows) whose id is not
        known, which otherwise refuses every new turn of the owner. Heads that do not open
        under the owner's key are not counted, and deleted. Returns ``turns_before``,
        ``turns_after`` and what else changed; an owner whose heads add up is left as it is.

        Raises:
            InvalidArgumentError: the identifier is malformed.
            NotFoundError: the owner has no key (never stored anything, or forgotten).
            IntegrityError: the owner's owner head is missing, or it or its usage head fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        from .maintenance import lifecycle

        parts = self._parts
        return lifecycle.recount_turns(parts.db, parts.keys, parts.heads, owner_user_id)

    def gc(self, now: float | None = None, *, wait: bool = True) -> int:
        """Delete expired entries, checkpoints and compaction marks with ``secure_delete``,
        then truncate the WAL; ``scrub`` too when a quarter of the file's pages are free.
        Returns how many entries were deleted. ``wait=False``: no scrub, and the
        checkpoint does not wait for readers (a later ``gc`` finishes the job).

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
        """Check the whole store in one read snapshot: every owner's heads, every entry
        and turn record authenticated and compared with its turn's head; changes nothing.

        Returns ``ok``, counts (``owners``, ``turns``, ``entries``, ``checkpoints``,
        ``compaction_marks``), ``seconds`` and ``problems`` (one dict each with
        ``owner_user_id``, ``turn_id``, ``id``, ``what`` and ``problem``; ``verify.py``).

        Raises:
            InvalidArgumentError: a bad ``now``.
            StoreBusyError, StoreUnavailableError: the snapshot could not be had.
        """
        from .maintenance.verify import verify_store

        parts = self._parts
        return verify_store(parts.db, parts.opener, parts.records, parts.heads, parts.tables.timeline.read_time(now))

    def scrub(self) -> bool:
        """Rebuild the store file (VACUUM, under the write lock) so that no stale copy of
        a deleted row remains, and truncate the WAL. Returns False when a reader kept
        part of the WAL alive. On PostgreSQL it does nothing (the server's VACUUM does it).

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
