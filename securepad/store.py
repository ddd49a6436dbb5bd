"""``Scratchpad``: the encrypted, authorized observation store (the face).

The store is built in layers that look down only (see ARCHITECTURE.md):
``keystore`` (keys), ``access`` (the one authorized access path),
``entries`` and ``_records`` (the sealed tables), ``turn`` and ``lifecycle``
on top. ``Scratchpad`` validates, documents and delegates.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import entries, lifecycle, reads
from ._backend import Backend
from ._db import Database
from ._records import Records
from .access import Access, check_principal
from .anchor import Anchor, default_path
from .entries import Entries, Entry
from .errors import InvalidArgumentError, SecurepadError, StorageFullError, StoreBusyError
from .keys import Keyring
from .keystore import OWNER_KEY_CACHE_SIZE, Keystore, Progress
from .policy import Policy
from .principal import Principal, check_identifier
from .turn import Turn, extend_turn
from .verify import verify_store

# Scratchpad.open's anchor: a path, None (beside the key file) or False (none).
AnchorOption = str | os.PathLike[str] | bool | None
Anchoring = tuple[AnchorOption, bool]  # (anchor, adopt_anchor)
NEAR_KEY: Anchoring = (None, False)

__all__ = ["OWNER_KEY_CACHE_SIZE", "Entry", "Parts", "Scratchpad", "parts", "sqlite_of"]


@dataclass(frozen=True)
class Parts:
    """The layers one open store is built from, for the package's own tools
    (the audit, the drills, the demo) that work below the public surface."""

    db: Backend
    keys: Keystore
    access: Access
    entries: Entries
    records: Records


class Scratchpad:
    """The observation store. Open one with ``Scratchpad.open``; use it as a context manager.

    Safe to share between threads (each gets its own SQLite connection) and
    to use from several processes on the same file.
    """

    def __init__(
        self, db: Backend, keyring: Keyring, policy: Policy, clock: Callable[[], float], anchor: Anchoring = NEAR_KEY
    ) -> None:
        self._db = db
        self.policy = policy
        self._keys = Keystore(db, keyring)
        self.store_id = self._keys.store_id
        self._anchor = _open_anchor(db, self._keys, policy, anchor)
        access = Access(db, policy)
        self._entries = Entries(db, self._keys, access, policy, clock)
        self._records = Records(
            db, self._keys, access, self._entries.ttl, self._entries.now, self._entries.check_quota, self._entries.heads
        )
        self._entries.heads.build_if_needed()
        self._parts = Parts(db, self._keys, access, self._entries, self._records)

    @property
    def keyring(self) -> Keyring:
        """The keyring whose master key opens the store (the new one after ``rotate_master_key``)."""
        return self._keys.keyring

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
    ) -> Scratchpad:
        """Open (creating if needed) the store at ``db_path``.

        ``db_path`` is a SQLite file, or a PostgreSQL store: a
        ``postgresql://`` DSN or a ``psycopg_pool.ConnectionPool`` (install
        ``psycopg[binary]`` and ``psycopg-pool``). On PostgreSQL, ``admin``
        (a DSN or pool; default: the same as ``db_path``) runs housekeeping
        and migrations, and the store lives in ``schema``; see
        the README's PostgreSQL section for roles and grants.

        ``policy`` is a shipped policy's name (``"strict"``), a path to a TOML
        policy, a ``Policy``, or None for the shipped default. ``clock`` is the time source for expiry.
        ``anchor``: the snapshot-rollback anchor (SQLite; a path, None: beside the key
        file, False: none); ``adopt_anchor=True`` accepts this copy as current (SECURITY.md).

        Raises:
            IntegrityError: this is an older copy of the store (below its
                anchor), or the anchor is missing, damaged or forged.
            WrongKeyError: the keyring's master key does not open this store.
            PolicyError: the policy file is invalid.
            InvalidArgumentError: PostgreSQL options given for a SQLite file.
            SecurepadError: the file or server cannot be opened, or the store
                was made by a newer version.
        """
        if not isinstance(keyring, Keyring):
            raise InvalidArgumentError("keyring must be a securepad.Keyring")
        if policy is None:
            resolved = Policy.default()
        elif isinstance(policy, Policy):
            resolved = policy
        else:
            resolved = Policy.load(policy if isinstance(policy, str) else Path(policy))
        db = _open_backend(db_path, admin, schema, resolved)
        try:
            return cls(db, keyring, resolved, clock, (anchor, adopt_anchor))
        except BaseException:
            db.close()
            raise

    @property
    def path(self) -> Path:
        """The database file of a SQLite store.

        Raises:
            SecurepadError: the store is on PostgreSQL (see ``location``).
        """
        return sqlite_of(self).path

    @property
    def location(self) -> str:
        """Where the store lives: its file, or its PostgreSQL server, database and schema."""
        return self._db.location

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    def close(self) -> None:
        """Write this process's pending key-use counts, anchor the last writes,
        then close every connection. The object cannot be used afterwards."""
        with _closing(self._db):
            with contextlib.suppress(SecurepadError):  # a busy or broken store: the counts stay low by < 256 a key
                self._keys.flush_wraps()
            # A full or busy store cannot advance its counter now: the writes
            # are committed, only the anchor lags, as after a kill (SECURITY.md).
            with contextlib.suppress(StorageFullError, StoreBusyError):
                _close_anchor(self._anchor)

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
                observation that is not JSON-serializable, or the step is
                already recorded in the turn.
            QuotaExceededError: the entry exceeds ``max_entry_bytes`` or the
                owner's ``owner_quota_bytes``.
            StoreBusyError: the write lock was not obtained in time.
        """
        return self._entries.put(
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
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``put``.
        """
        return self._entries.put_many(principal, turn_id, items, ttl_seconds, now=now)

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
        return self._entries.get(principal, scratchpad_id, now=now, turn_id=turn_id)

    def read(
        self,
        principal: Principal,
        scratchpad_id: str,
        mode: str = "head",
        n: int = reads.DEFAULT_N,
        start: int = 0,
        end: int | None = None,
        *,
        pattern: str | None = None,
        max_matches: int = reads.DEFAULT_MAX_MATCHES,
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
        return self._entries.read(
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
        return [
            {
                "scratchpad_id": opened.row["id"],
                "step_num": opened.row["step_num"],
                "executor_name": opened.row["executor_name"],
                "actor": opened.row["actor"],
                "channel": opened.row["channel"],
                "kind": opened.row["content_kind"],
                "size_bytes": opened.row["size_bytes"],
                "size_chars": opened.row["size_chars"],
                "created_at": opened.row["created_at"],
                "expires_at": opened.row["expires_at"],
                "summary": opened.meta["view"].get("summary", ""),
                "view": opened.view(),
            }
            for opened in self._entries.turn_entries(principal, turn_id, now)
        ]

    def delete(self, principal: Principal, scratchpad_id: str, *, now: float | None = None) -> None:
        """Delete one entry of the caller's (expired ones too), with secure_delete,
        and checkpoint the WAL (without waiting on readers) so its ciphertext leaves the files.

        Raises:
            NotFoundError: absent, another owner's, or outside the policy's scope.
            StoreBusyError: the write lock was not obtained in time.
        """
        self._entries.delete(principal, scratchpad_id)

    # -- turns ----------------------------------------------------------------------

    def turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> Turn:
        """The runtime surface for one turn of one principal (see ``securepad.turn``).

        Beginning a turn collects expired entries first (without waiting on
        readers; see ``gc``). A turn id that another owner uses is, for this
        principal, an empty turn.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        # Collection is housekeeping (expired entries are never served anyway):
        # a busy store does not stop a turn from starting.
        with contextlib.suppress(StoreBusyError):
            self.gc(now, wait=False)
        return Turn(self._entries, self._records, principal, turn_id)

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
        return extend_turn(self._entries, self._records, principal, turn_id, ttl_seconds, now)

    # -- key lifecycle (see lifecycle.py) -----------------------------------------

    def rotate_master_key(self, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
        """Re-wrap every owner key under ``new_keyring``'s master key; see ``lifecycle.rotate_master_key``."""
        if not isinstance(new_keyring, Keyring):
            raise InvalidArgumentError("new_keyring must be a securepad.Keyring")
        done = lifecycle.rotate_master_key(self._db, self._keys, new_keyring, progress=progress)
        self._anchor = _move_anchor(self._anchor, self._keys, new_keyring)
        return done

    def rotate_owner_key(self, owner_user_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """New key version for an owner, old ones retired; see ``lifecycle.rotate_owner_key``."""
        return lifecycle.rotate_owner_key(
            self._db, self._keys, owner_user_id, progress=progress, heads=self._entries.heads
        )

    def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """Crypto-shred an owner's keys and entries; see ``lifecycle.forget_owner``."""
        return lifecycle.forget_owner(self._db, self._keys, owner_user_id)

    # -- maintenance ----------------------------------------------------------------

    def gc(self, now: float | None = None, *, wait: bool = True) -> int:
        """Delete expired entries and their segments (and expired turn checkpoints
        and compaction marks), then, when it deleted anything, ``scrub`` the
        file so their ciphertext leaves it. Returns how many entries were deleted.

        With ``wait=False`` (``turn`` uses this) it does not scrub and the WAL
        checkpoint does not wait for readers: it moves what it can, and a later
        ``gc``, ``scrub`` or ``forget_owner`` finishes the job.

        Raises:
            StoreBusyError: the write lock was not obtained in time.
        """
        cutoff = self._entries.now(now)
        with self._db.transaction(admin=True, wait=wait) as conn:
            self._entries.heads.prune(conn, cutoff)
            deleted = entries.delete_expired(conn, cutoff)
            records = Records.delete_expired(conn, cutoff)
        if wait and (deleted or records):
            self._db.scrub()
        else:
            self._db.checkpoint(wait=wait)
        return deleted

    def verify(self, *, now: float | None = None) -> dict[str, Any]:
        """Check the whole store: every owner's heads, every entry (with all its
        segments) and turn record authenticated and compared with its turn's
        head. Time linear in the store; it changes nothing.

        Returns ``ok`` (no problem found), counts (``owners``, ``turns``,
        ``entries``, ``checkpoints``, ``compaction_marks``), ``seconds`` and
        ``problems``: one dict per problem with ``owner_user_id``, ``turn_id``,
        ``id`` (entry or record, or None for a head), ``what`` and ``problem``.

        Raises:
            InvalidArgumentError: a bad ``now``.
        """
        return verify_store(self._entries, self._records, self._entries.heads, self._entries.now(now))

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
        return self._db.scrub()

    def stats(self, principal: Principal | None = None, *, now: float | None = None) -> dict[str, Any]:
        """Counts and sizes: for one principal's scope, or (None) for the whole store.

        Raises:
            InvalidArgumentError: a bad principal.
        """
        access = self._parts.access
        result = entries.stats(self._db, self._keys, access, principal, self._entries.now(now), self.location)
        return result if principal else {**result, "anchor": self._anchor and self._anchor.status()}


# -- helpers ---------------------------------------------------------------------------


def parts(pad: Scratchpad) -> Parts:
    """The layers of an open store (the audit, drills and demo work on them)."""
    return pad._parts


def sqlite_of(pad: Scratchpad) -> Database:
    """The SQLite database, for what works on the file itself (the audit's scans, copies).

    Raises:
        SecurepadError: the store is on PostgreSQL.
    """
    db = parts(pad).db
    if not isinstance(db, Database):
        raise SecurepadError(f"the store at {db.location} is not a SQLite file")
    return db


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
    anchor = Anchor(db, keys.counter_seal, path, sync=sync, interval_s=interval_s, default=where is None)
    anchor.open(adopt=adopt)
    return anchor


@contextlib.contextmanager
def _closing(db: Backend) -> Iterator[None]:
    try:
        yield
    finally:
        db.close()


def _close_anchor(anchor: Anchor | None) -> None:
    """Anchor the last writes of a store that has an anchor."""
    if anchor is not None:
        anchor.close()


def _move_anchor(anchor: Anchor | None, keys: Keystore, new_keyring: Keyring) -> Anchor | None:
    """After a master rotation to a key file elsewhere, the anchor follows it
    (where the next open will look for it)."""
    if anchor is None or not anchor.default:
        return anchor
    path = default_path(new_keyring.key_file, keys.store_id)
    if path is None or path == anchor.path:
        return anchor
    anchor.close()
    moved = Anchor(anchor.db, keys.counter_seal, path, sync=anchor.sync, interval_s=anchor.interval_s, default=True)
    moved.open(adopt=True)
    return moved


_PG_SCHEMES = ("postgresql://", "postgres://")


def _open_backend(where: Any, admin: Any, schema: str, policy: Policy) -> Backend:
    """A SQLite file, or a PostgreSQL store for a DSN or a connection pool."""
    if isinstance(where, str | os.PathLike) and not str(where).startswith(_PG_SCHEMES):
        if admin is not None or schema != "securepad":
            raise InvalidArgumentError("admin and schema are options of PostgreSQL stores")
        return Database(
            Path(where),
            wal_limit_bytes=policy.wal_limit_bytes,
            incremental_vacuum=policy.incremental_vacuum,
            durability=policy.durability,
            allow_shared=policy.allow_shared_files,
        )
    try:
        from ._pg import PostgresDatabase
    except ImportError:
        raise SecurepadError("PostgreSQL stores need psycopg: pip install 'psycopg[binary]' psycopg-pool") from None
    return PostgresDatabase(str(where) if isinstance(where, os.PathLike) else where, admin=admin, schema=schema)
