"""``Scratchpad``: the encrypted, authorized observation store (the face).

The store is built in layers that look down only (see ARCHITECTURE.md):
``keystore`` (keys), ``access`` (the one authorized access path),
``entries`` and ``_records`` (the sealed tables), ``turn`` and ``lifecycle``
on top. ``_assembly`` puts one open store together (backend, layers,
anchor) and runs the work that spans the layers (close, gc, stats,
rotation). ``Scratchpad`` validates, documents and delegates.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._assembly import NEAR_KEY, Anchoring, Assembly, Parts, location_of, open_backend, resolve_policy, store_exists
from ._restore import replace_store, stage_copy
from .core import read_modes
from .errors import IntegrityError, InvalidArgumentError, SecurepadError
from .keys.keyring import Keyring
from .keys.keystore import OWNER_KEY_CACHE_SIZE, Progress
from .maintenance.verify import verify_store
from .policy import Policy
from .principal import Principal, check_identifier
from .storage.base import Backend
from .storage.sqlite import Database
from .tables.access import check_principal
from .tables.entries import entries
from .tables.entries.rows import Entry, Opened
from .turn import Turn, extend_turn

__all__ = ["OWNER_KEY_CACHE_SIZE", "Entry", "Parts", "Scratchpad", "parts", "sqlite_of"]

# A library does not print: an application attaches a handler to "securepad" to see
# its warnings (a store upgraded at open, say); the command line prints them.
_log = logging.getLogger("securepad")
_log.addHandler(logging.NullHandler())


class Scratchpad:
    """The observation store. Open one with ``Scratchpad.open``; use it as a context manager.

    Safe to share between threads (each gets its own SQLite connection) and
    to use from several processes on the same file.
    """

    policy: Policy
    store_id: str
    exists = staticmethod(store_exists)
    location_of = staticmethod(location_of)

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
        and migrations, and the store lives in ``schema``; see
        the README's PostgreSQL section for roles and grants.

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

    @property
    def schema_upgrade(self) -> dict[str, int] | None:
        """``{"from": old, "to": new}`` when this open upgraded the store's
        schema (an older securepad then refuses it), else None; also logged
        as a warning on the ``securepad`` logger."""
        upgraded = self._parts.db.upgraded
        return None if upgraded is None else {"from": upgraded[0], "to": upgraded[1]}

    @property
    def upgrade_notice(self) -> str | None:
        """The one-line notice of ``schema_upgrade``, or None."""
        upgraded = self._parts.db.upgraded
        if upgraded is None:
            return None
        return (
            f"store {self.location} upgraded: schema {upgraded[0]} \u2192 {upgraded[1]}; a securepad older than"
            f" {_package_version()} refuses it now (docs/deployment.md: back up before upgrading)"
        )

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
        return self._parts.db.location

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._parts.db.dialect

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
        return [_listed(opened) for opened in self._parts.listings.turn_entries(principal, turn_id, now)]

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

    # -- key lifecycle (see lifecycle.py) -----------------------------------------

    def rotate_master_key(self, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
        """Re-wrap every owner key under ``new_keyring``'s master key; see ``lifecycle.rotate_master_key``."""
        if not isinstance(new_keyring, Keyring):
            raise InvalidArgumentError("new_keyring must be a securepad.Keyring")
        return self._assembly.rotate_master_key(new_keyring, progress)

    def rotate_owner_key(self, owner_user_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """New key version for an owner, old ones retired; see ``lifecycle.rotate_owner_key``."""
        return self._assembly.rotate_owner_key(owner_user_id, progress)

    def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """Crypto-shred an owner's keys and entries; see ``lifecycle.forget_owner``."""
        return self._assembly.forget_owner(owner_user_id)

    def drop_turn(self, owner_user_id: str, turn_id: str) -> dict[str, Any]:
        """Delete an owner's turn whole (entries, records, head), whatever its
        check says: the explicit way out of a turn found tampered that no backup
        restores; see ``lifecycle.drop_turn``. Returns what was removed, per table.

        Raises:
            InvalidArgumentError: an identifier is malformed.
            IntegrityError: the owner's owner head or usage head fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        return self._assembly.drop_turn(owner_user_id, turn_id)

    # -- maintenance ----------------------------------------------------------------

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

    def backup(self, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """Write a consistent copy of the live store to the new file ``dest``
        (mode 0600), while other connections go on reading and writing: one
        ``VACUUM INTO``, which reads one snapshot and writes only live rows.
        The copy is encrypted as the store is; keep the key apart from it.
        ``Scratchpad.restore`` puts it back. Returns ``backup`` (the path),
        ``bytes`` and ``store_id``.

        Raises:
            InvalidArgumentError: ``dest`` exists, or the store is on
                PostgreSQL (back it up with ``pg_dump``; docs/how-to/backup.md).
            StorageFullError: the disk is full (no copy is left behind).
            SecurepadError: ``dest`` cannot be written, or its directory is
                writable by others.
        """
        db = self._parts.db
        if not isinstance(db, Database):
            raise InvalidArgumentError(
                f"the store at {db.location} is on PostgreSQL: back it up with pg_dump (docs/how-to/backup.md)"
            )
        path = Path(dest)
        if os.path.lexists(path):
            raise InvalidArgumentError(f"{path} exists: a backup is never written over a file")
        try:
            db.copy_to(path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return {"backup": str(path), "bytes": path.stat().st_size, "store_id": self.store_id}

    @classmethod
    def restore(
        cls,
        db_path: str | os.PathLike[str],
        src: str | os.PathLike[str],
        *,
        keyring: Keyring,
        policy: str | os.PathLike[str] | Policy | None = None,
        anchor: str | os.PathLike[str] | bool | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Put the backup ``src`` (a file ``backup`` wrote) in place of the SQLite
        store at ``db_path``, knowingly accepting it as the current copy.

        In order: ``src`` is copied to a private file beside ``db_path``; that
        copy is opened with ``keyring`` and verified (a backup that fails
        changes nothing); the store at ``db_path``, if there is one, is backed
        up to ``<db_path>.replaced-N`` and its content replaced through
        SQLite's backup API (so no connection open elsewhere sees a mix);
        then the store is opened adopting its snapshot-rollback anchor (an
        older copy is what a restore means) and verified again. Stop the
        processes that write to the store first: what they write meanwhile
        is replaced.

        Returns ``restored``, ``source``, ``replaced`` (the copy of the store
        it replaced, or None) and ``verify`` (the final check's report).

        Raises:
            InvalidArgumentError: a PostgreSQL store, a missing ``src``, or a
                ``src`` with a write-ahead log beside it (a live store, not a backup).
            WrongKeyError: ``keyring`` does not open the backup.
            IntegrityError: the backup fails verification (nothing was changed).
            StoreCorruptError: ``src`` or the store at ``db_path`` is not a
                securepad store.
        """
        source, target = Path(src), Path(db_path)
        if str(db_path).startswith(("postgresql://", "postgres://")):
            raise InvalidArgumentError("restore puts back a SQLite store; restore PostgreSQL with pg_restore")
        if not source.is_file():
            raise InvalidArgumentError(f"no backup file at {source}")
        if Path(f"{source}-wal").exists() and Path(f"{source}-wal").stat().st_size:
            raise InvalidArgumentError(
                f"{source} has a write-ahead log beside it: it is a live store, not a backup"
                f" (copy it with backup first)"
            )
        resolved = resolve_policy(policy)
        staged = stage_copy(source, target)
        try:
            with cls.open(staged, keyring=keyring, policy=resolved, anchor=False) as copy:
                checked = copy.verify(now=now)
            if not checked["ok"]:
                raise IntegrityError(
                    f"the backup {source} fails verification ({len(checked['problems'])} problems): nothing was"
                    " changed; run securepad verify on a copy of it to see them"
                )
            replaced = replace_store(target, staged, resolved)
        finally:
            for leftover in (staged, Path(f"{staged}-wal"), Path(f"{staged}-shm")):
                leftover.unlink(missing_ok=True)
        with cls.open(target, keyring=keyring, policy=resolved, anchor=anchor, adopt_anchor=True) as pad:
            report = pad.verify(now=now)
        return {"restored": str(target), "source": str(source), "replaced": replaced, "verify": report}

    def stats(self, principal: Principal | None = None, *, now: float | None = None) -> dict[str, Any]:
        """Counts and sizes: for one principal's scope, or (None) for the whole store.

        Raises:
            InvalidArgumentError: a bad principal.
        """
        return self._assembly.stats(principal, now)


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


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only for an upgrade's notice

    try:
        return version("securepad")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without metadata
        return "this version"


def _listed(opened: Opened) -> dict[str, Any]:
    """One entry of ``Scratchpad.list_for_turn``: its clear columns, summary and view."""
    row = opened.row
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
        "summary": opened.meta["view"].get("summary", ""),
        "view": opened.view(),
    }
