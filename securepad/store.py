"""``Scratchpad``: the encrypted, authorized observation store (the face).

The store is built in layers that look down only (see ARCHITECTURE.md):
``keystore`` (keys), ``access`` (the one authorized access path),
``entries`` and ``_records`` (the sealed tables), ``turn`` and ``lifecycle``
on top. ``_assembly`` puts one open store together (backend, layers,
anchor) and runs the work that spans the layers (close, gc, stats,
rotation). ``Scratchpad`` validates, documents and delegates; its faces
``_housekeeping.Housekeeping`` (key lifecycle, upkeep) and ``_place.Place``
(where the store lives, backup, restore) are its other methods.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._assembly import NEAR_KEY, Anchoring, Assembly, Parts, open_backend, resolve_policy
from ._housekeeping import Housekeeping
from ._place import Place, sqlite_of_parts
from .core import read_modes
from .errors import InvalidArgumentError
from .keys.keyring import Keyring
from .keys.keystore import OWNER_KEY_CACHE_SIZE
from .policy import Policy
from .principal import Principal, check_identifier
from .storage.base import Backend
from .storage.sqlite import Database
from .tables.access import check_principal
from .tables.entries import entries
from .tables.entries.open import Entry, Opened
from .turn import Turn, extend_turn

__all__ = ["OWNER_KEY_CACHE_SIZE", "Entry", "Parts", "Scratchpad", "listed", "parts", "sqlite_of"]

# A library does not print: an application attaches a handler to "securepad" to see
# its warnings (a store upgraded at open, say); the command line prints them.
_log = logging.getLogger("securepad")
_log.addHandler(logging.NullHandler())


class Scratchpad(Housekeeping, Place):
    """The observation store. Open one with ``Scratchpad.open``; use it as a context manager.

    Safe to share between threads (each gets its own SQLite connection) and
    to use from several processes on the same file. Its whole-store work
    (key lifecycle, gc, verify, stats) is the face ``Housekeeping``; where it
    lives and its copies (location, backup, restore) the face ``Place``.
    """

    policy: Policy
    store_id: str

    def __init__(
        self, db: Backend, keyring: Keyring, policy: Policy, clock: Callable[[], float], anchor: Anchoring = NEAR_KEY
    ) -> None:
        self.policy = policy
        self._assembly = Assembly(db, keyring, policy, clock, anchor)
        self._parts = self._assembly.parts
        self.store_id = self._parts.keys.store_id

    @property
    def keyring(self) -> Keyring:
        """The keyring whose master key opens the store (the new one after ``rotate_master_key``)."""
        return self._parts.keys.keyring

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        db_path: str | os.PathLike[str] | Any,
        *,
        keyring: Keyring,
        policy: str | os.PathLike[str] | Policy | None = None,
        clock: Callable[[], float] = time.time,
        admin: str | Any | None = None,
        schema: str = "securepad",
        anchor: str | os.PathLike[str] | bool | None = None,
        adopt_anchor: bool = False,
        call_timeout_s: float | None = None,
    ) -> Scratchpad:
        """Open (creating if needed) the store at ``db_path``.

        ``db_path`` is a SQLite file, or a PostgreSQL store: a
        ``postgresql://`` DSN or a ``psycopg_pool.ConnectionPool`` (install
        ``psycopg[binary]`` and ``psycopg-pool``). On PostgreSQL, ``admin``
        (a DSN or pool; default: the same as ``db_path``) runs housekeeping
        and migrations, and the store lives in ``schema``; roles and
        grants: docs/how-to/postgresql.md.

        ``policy`` is a shipped policy's name (``"strict"``), a path to a TOML
        policy, a ``Policy``, or None for the shipped default. ``clock`` is the time source for expiry.
        ``anchor``: the snapshot-rollback anchor (SQLite; a path, None: beside the key
        file, False: none); ``adopt_anchor=True`` accepts this copy as current (SECURITY.md).
        ``call_timeout_s`` (PostgreSQL; default: the policy's
        ``call_timeout_seconds``, 60) is the deadline of one call: past it the
        call's connection is cut and ``StoreUnavailableError`` raised; the lock,
        statement and pool waits are cut to fit under it (housekeeping gets ten
        times as long). A caller that serves an agent may want seconds.

        Raises:
            IntegrityError: this is an older copy of the store (below its
                anchor), or the anchor is missing, damaged or forged.
            WrongKeyError: the keyring's master key does not open this store.
            PolicyError: the policy file is invalid.
            InvalidArgumentError: PostgreSQL options given for a SQLite file, or
                a call deadline that is not a positive number of seconds.
            SecurepadError: the file or server cannot be opened, or the store
                was made by a newer version.
        """
        if not isinstance(keyring, Keyring):
            raise InvalidArgumentError("keyring must be a securepad.Keyring")
        resolved = resolve_policy(policy)
        db = open_backend(db_path, admin, schema, resolved, call_timeout_s=call_timeout_s)
        try:
            pad = cls(db, keyring, resolved, clock, (anchor, adopt_anchor))
        except BaseException:
            db.close()
            raise
        if db.upgraded is not None:
            _log.warning("%s", pad.upgrade_notice)
        return pad

    def close(self) -> None:
        """Write this process's pending key-use counts, anchor the last writes,
        then close every connection. The object cannot be used afterwards."""
        self._assembly.close()

    def __enter__(self) -> Scratchpad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- entries -------------------------------------------------------------------

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
    ) -> dict[str, Any]:
        """Store an observation, encrypted, and return its synthetic view.

        ``observation`` is a str (text), bytes (binary), a dict whose
        ``content`` is a str or bytes (text or binary; the other fields are
        kept, encrypted), or any other JSON value (json). The view has
        ``scratchpad_id``, ``step_num``, ``size_bytes``, ``kind``, ``summary``,
        ``metadata``, the top-level scalars and, for json, ``list_field``,
        ``count``, ``schema`` and a ``ref_hint``.

        A live step of a turn holds one entry: as ``Turn.record``, ``put``
        refuses a step that a live entry of the turn in the principal's scope
        already has (an expired or deleted one frees the step).

        Raises:
            InvalidArgumentError: a bad principal, id, step, ttl, an
                observation that is not JSON-serializable, the step is
                already recorded in the turn, or ``now`` is more than the
                policy's ``max_clock_skew_seconds`` past the clock.
            QuotaExceededError: the entry exceeds ``max_entry_bytes`` or the
                owner's ``owner_quota_bytes``.
            StoreBusyError: the write lock was not obtained in time.
        """
        return self._parts.putter.put(
            principal, turn_id, step_num, executor_name, observation, ttl_seconds, now=now, free_step=True
        )

    def put_many(
        self,
        principal: Principal,
        turn_id: str,
        items: Sequence[tuple[int, str, Any]],
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
    ) -> list[dict[str, Any]]:
        """Store several observations of a turn, ``(step_num, executor_name,
        observation)`` each (an agent's parallel tool calls), in one
        transaction: all of them or none. Each is checked as ``put`` checks it
        (a step given twice, or already live, refuses the batch); the quota
        must hold the whole batch. Returns the views, in order.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``put``;
                QuotaExceededError also when the batch could write more than one
                transaction may (SQLite: half its ``wal_limit_bytes``), before
                anything is stored.
        """
        return self._parts.putter.put_many(principal, turn_id, items, ttl_seconds, now=now)

    def get(
        self, principal: Principal, scratchpad_id: str, *, now: float | None = None, turn_id: str | None = None
    ) -> Entry:
        """The whole entry, ``observation`` equal to what was put (not capped:
        this is the library's view, not the model's). With ``turn_id``, only
        an entry of that turn is found.

        Raises:
            NotFoundError: absent, another owner's, outside the policy's scope,
                or (with ``turn_id``) of another turn.
            ExpiredError: the caller's own entry has expired.
            IntegrityError: the stored entry fails authentication.
        """
        return self._parts.opener.get(principal, scratchpad_id, now=now, turn_id=turn_id)

    def read(
        self,
        principal: Principal,
        scratchpad_id: str,
        mode: str = "head",
        n: int = read_modes.DEFAULT_N,
        start: int = 0,
        end: int | None = None,
        *,
        pattern: str | None = None,
        max_matches: int = read_modes.DEFAULT_MAX_MATCHES,
        context: int = 0,
        now: float | None = None,
        turn_id: str | None = None,
    ) -> dict[str, Any]:
        """Read part of an entry, never more than the policy's ``max_read_chars``.

        Text and json entries count characters; binary entries count bytes and
        return base64. The result's ``metadata`` gives ``size_full``,
        ``size_returned``, ``truncated`` (less than the whole entry came back),
        ``capped`` (the read cap cut the request) and ``next_start``.

        ``mode='lines'`` returns lines ``start``..``end`` (1-based, inclusive;
        0 means the first line). ``mode='grep'`` returns the lines matching
        ``pattern`` (RE2 syntax, linear time) as ``N:line``, at most
        ``max_matches`` of them, with ``context`` lines around each as
        ``N-line``; ``start``/``end`` narrow the lines searched. Both work on
        text and json entries, one segment at a time, and their metadata says
        where to continue (``next_line``). With ``turn_id``, only an entry of
        that turn is read.

        Raises:
            NotFoundError, ExpiredError, IntegrityError: as for ``get``.
            InvalidArgumentError: unknown mode, negative n/start/end, start > end,
                lines or grep on a binary entry, an invalid pattern, max_matches < 1.
        """
        return self._parts.opener.read(
            principal,
            scratchpad_id,
            mode,
            now=now,
            turn_id=turn_id,
            n=n,
            start=start,
            end=end,
            pattern=pattern,
            max_matches=max_matches,
            context=context,
        )

    def list_for_turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> list[dict[str, Any]]:
        """The live entries of a turn that the principal may see, in step order.

        Another owner's turn id gives an empty list, as an unused one does.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: a listed entry fails authentication.
        """
        return [listed(opened) for opened in self._parts.listings.turn_entries(principal, turn_id, now)]

    def delete(self, principal: Principal, scratchpad_id: str, *, now: float | None = None) -> None:
        """Delete one entry of the caller's (expired ones too), with secure_delete,
        and checkpoint the WAL (without waiting on readers) so its ciphertext leaves the files.

        Raises:
            NotFoundError: absent, another owner's, or outside the policy's scope.
            StoreBusyError: the write lock was not obtained in time.
        """
        entries.delete(self._parts.tables, principal, scratchpad_id)

    # -- turns ----------------------------------------------------------------------

    def turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> Turn:
        """The runtime surface for one turn of one principal (see ``securepad.turn``).

        Beginning a turn collects expired entries first (without waiting on
        readers; see ``gc``), recounting at most 2,000 rows of the turns it
        collects from: the expired entries of a longer turn wait for a full
        ``gc``. A turn id that another owner uses is, for this principal, an
        empty turn.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        self._assembly.gc_quietly(now)
        return Turn(self._parts, principal, turn_id)

    def extend_turn(
        self, principal: Principal, turn_id: str, ttl_seconds: int | None = None, *, now: float | None = None
    ) -> int:
        """Let a turn's live entries, checkpoints and compaction marks (those in
        the principal's scope) live ``ttl_seconds`` from now; expiry is never
        shortened. Returns how many were extended.

        Only the small sealed metadata is re-sealed (the clear ``expires_at`` has
        a sealed copy), all of it before one short write transaction; a row
        that changed meanwhile is left as the other writer made it.

        Raises:
            InvalidArgumentError: a bad principal, turn id or ttl.
            IntegrityError: an entry or record fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        return extend_turn(self._parts, principal, turn_id, ttl_seconds, now)


# -- helpers ---------------------------------------------------------------------------


def parts(pad: Scratchpad) -> Parts:
    """The layers of an open store (the audit, drills and demo work on them)."""
    return pad._parts


def sqlite_of(pad: Scratchpad) -> Database:
    """The SQLite database, for what works on the file itself (the audit's scans, copies).

    Raises:
        SecurepadError: the store is on PostgreSQL.
    """
    return sqlite_of_parts(parts(pad))


def listed(opened: Opened) -> dict[str, Any]:
    """One entry of ``Scratchpad.list_for_turn``: its clear columns, summary and view."""
    row, view = opened.row, opened.meta["view"]
    return {
        "scratchpad_id": row["id"],
        "step_num": row["step_num"],
        "executor_name": row["executor_name"],
        "actor": row["actor"],
        "channel": row["channel"],
        "kind": row["content_kind"],
        "size_bytes": row["size_bytes"],
        "size_chars": row["size_chars"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "summary": view.get("summary", ""),
        "view": {"ok": True, "scratchpad_id": row["id"], **view},  # ``Opened.view``
    }
