"""``Scratchpad``: the encrypted, authorized observation store.

Every call that touches an entry runs authorize → fetch → decrypt: the
principal's scope is part of the SQL, the row is checked again, and only
then is anything unwrapped or decrypted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import _records, lifecycle, reads, summary
from ._backend import Backend, Conn, DuplicateKeyError, insert_owner_key
from ._db import Database
from ._lru import LRUCache
from .crypto import (
    FORMAT_VERSION,
    EntryCipher,
    Header,
    derive,
    item_key_aad,
    lp,
    owner_key_aad,
    split_bytes,
    split_text,
    unwrap_key,
    wrap_key,
)
from .errors import (
    ExpiredError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    QuotaExceededError,
    SecurepadError,
    StoreBusyError,
    WrongKeyError,
)
from .keys import KEY_BYTES, Keyring
from .policy import NOT_FOUND_MESSAGE, Policy
from .principal import Principal, check_identifier
from .turn import Turn

__all__ = ["Entry", "Scratchpad"]

audit_log = logging.getLogger("securepad.audit")
# A library does not print: applications attach handlers to "securepad.audit" to keep the log.
audit_log.addHandler(logging.NullHandler())

# AES-GCM with random 96-bit nonces stays within NIST's bound for 2**32
# encryptions per key; we advise rotating a key long before, at 2**28.
ROTATE_ADVICE_LOG2 = 28
# Owners whose unwrapped keys stay cached (each cache; ~2.7 KB per owner in
# all). Past it the least recently used owner's keys are unwrapped again on use.
OWNER_KEY_CACHE_SIZE = 4096

_ID_RE = re.compile(r"[0-9a-f]{16}")
# Clear columns that the sealed metadata repeats; a mismatch means tampering.
_SEALED_COLUMNS = ("actor", "channel", "step_num", "executor_name", "created_at", "expires_at")
_ENTRY_COLUMNS = (
    "id, owner_user_id, actor, channel, turn_id, step_num, executor_name, content_kind, size_bytes,"
    " size_chars, segment_count, key_version, created_at, expires_at, wrapped_key, nonce_prefix,"
    " commitment, sealed_meta"
)


@dataclass(frozen=True)
class Entry:
    """A whole stored observation, as returned by ``Scratchpad.get``."""

    scratchpad_id: str
    owner_user_id: str
    actor: str
    channel: str
    turn_id: str
    step_num: int
    executor_name: str
    kind: str
    size_bytes: int
    size_chars: int
    created_at: float
    expires_at: float
    observation: Any
    view: dict[str, Any]


@dataclass(frozen=True)
class _Opened:
    """An authorized, authenticated entry whose content is still sealed."""

    row: dict[str, Any]
    meta: dict[str, Any]
    content: reads.SegmentedContent
    cipher: EntryCipher

    def view(self) -> dict[str, Any]:
        return {"ok": True, "scratchpad_id": self.row["id"], **self.meta["view"]}


class Scratchpad:
    """The observation store. Open one with ``Scratchpad.open``; use it as a context manager.

    Safe to share between threads (each gets its own SQLite connection) and
    to use from several processes on the same file.
    """

    def __init__(self, db: Backend, keyring: Keyring, policy: Policy, clock: Callable[[], float]) -> None:
        self._db = db
        self.policy = policy
        self.keyring = keyring
        self._clock = clock
        # Bounded (issue 18): a long-lived process serving many owners keeps
        # the most recently used ones' keys only.
        self._owner_ciphers: LRUCache[tuple[str, int], AESGCM] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._identity_keys: LRUCache[tuple[str, int], bytes] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._latest: LRUCache[str, int] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._lock = threading.Lock()
        self.store_id, wrap_key_bytes = self._unlock(keyring)
        self._wrap = AESGCM(wrap_key_bytes)

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

        Raises:
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
            return cls(db, keyring, resolved, clock)
        except BaseException:
            db.close()
            raise

    def _unlock(self, keyring: Keyring) -> tuple[str, bytes]:
        """Check the master key against the store (initializing a new store)."""
        meta = self._store_meta()
        if "store_id" not in meta:
            store_id = secrets.token_hex(16)
            master, kdf = keyring._master_key(None, new=True)
            with self._db.transaction(admin=True) as conn:
                if not conn.query("SELECT 1 FROM store_meta WHERE key = 'store_id'"):
                    values = {
                        "store_id": store_id,
                        "format_version": str(FORMAT_VERSION),
                        "key_check": derive(master, "key-check", store_id.encode()).hex(),
                        "kdf": json.dumps(kdf),
                    }
                    conn.executemany("INSERT INTO store_meta(key, value) VALUES (?, ?)", list(values.items()))
            meta = self._store_meta()
        kdf_record = json.loads(meta.get("kdf", "null"))
        store_id = meta["store_id"]
        master, _ = keyring._master_key(kdf_record)
        expected = bytes.fromhex(meta["key_check"])
        if not secrets.compare_digest(derive(master, "key-check", store_id.encode()), expected):
            if kdf_record is not None and keyring.kind != "passphrase":
                raise WrongKeyError(
                    f"this store uses a passphrase (Argon2id): the master key from {keyring!r} cannot open it"
                )
            if kdf_record is None and keyring.kind == "passphrase":
                raise WrongKeyError(
                    "this store's master key is not derived from a passphrase: give its key file or variable"
                )
            raise WrongKeyError(f"the master key from {keyring!r} does not open this store")
        self._key_check = meta["key_check"]
        return store_id, derive(master, "owner-wrap", store_id.encode())

    def _store_meta(self) -> dict[str, str]:
        return {r["key"]: r["value"] for r in self._db.query("SELECT key, value FROM store_meta")}

    @property
    def path(self) -> Path:
        """The database file of a SQLite store.

        Raises:
            SecurepadError: the store is on PostgreSQL (see ``location``).
        """
        return self._sqlite().path

    def _sqlite(self) -> Database:
        """The SQLite database, for what works on the file itself (the audit's scans, copies).

        Raises:
            SecurepadError: the store is on PostgreSQL.
        """
        if not isinstance(self._db, Database):
            raise SecurepadError(f"the store at {self._db.location} is not a SQLite file")
        return self._db

    @property
    def location(self) -> str:
        """Where the store lives: its file, or its PostgreSQL server, database and schema."""
        return self._db.location

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    def close(self) -> None:
        """Close every connection. The object cannot be used afterwards."""
        self._db.close()

    def __enter__(self) -> Scratchpad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _now(self, now: float | None) -> float:
        """The time for expiry: ``now`` (validated) or the clock's.

        Raises:
            InvalidArgumentError: ``now`` is not a finite number of seconds.
        """
        return _check_now(self._clock() if now is None else now)

    # -- owner keys ----------------------------------------------------------------

    def _owner_cipher(self, owner: str, version: int) -> AESGCM:
        """The owner's key of ``version``, unwrapped once and cached.

        Raises:
            IntegrityError: the key is missing or its wrapping was altered.
        """
        cached = self._owner_ciphers.get((owner, version))
        if cached is not None:
            return cached
        cipher = AESGCM(self._unwrap_owner_key(owner, version))
        with self._lock:
            self._owner_ciphers[(owner, version)] = cipher
        return cipher

    def _unwrap_owner_key(self, owner: str, version: int) -> bytes:
        rows = self._db.query(
            "SELECT wrapped FROM owner_keys WHERE owner_user_id = ? AND version = ?", (owner, version), owner=owner
        )
        if not rows:
            raise _MissingOwnerKey("the entry's owner key is missing")
        try:
            return unwrap_key(self._wrap, rows[0]["wrapped"], owner_key_aad(self.store_id, owner, version))
        except IntegrityError:
            self._check_master_current()
            raise

    def _content_id(self, owner: str, version: int, kind: str, segments: list[bytes]) -> str:
        """A keyed identity of an entry's content, for the re-read report.

        HMAC-SHA256 under a key derived from the owner's key: equal contents of
        one owner compare equal, and no one without the owner's key (another
        owner included) can test a guess against it, as a plain hash would allow.
        The owner-key version is part of the identity, so contents stored on
        both sides of an owner-key rotation do not compare equal.
        """
        key = self._identity_keys.get((owner, version))
        if key is None:
            key = derive(self._unwrap_owner_key(owner, version), "content-identity", lp(self.store_id, owner))
            with self._lock:
                self._identity_keys[(owner, version)] = key
        mac = hmac.new(key, lp("content", kind, str(sum(len(s) for s in segments))), hashlib.sha256)
        for segment in segments:
            mac.update(segment)
        return f"{version}:{mac.hexdigest()}"

    def _current_owner_key(self, owner: str) -> tuple[int, AESGCM]:
        """The owner's newest key, created (in its own short transaction) on first use."""
        version = self._latest.get(owner)
        if version is None:
            rows = self._db.query(
                "SELECT MAX(version) AS v FROM owner_keys WHERE owner_user_id = ?", (owner,), owner=owner
            )
            version = rows[0]["v"]
            if version is None:
                version = 1
                wrapped = wrap_key(
                    self._wrap, secrets.token_bytes(KEY_BYTES), owner_key_aad(self.store_id, owner, version)
                )
                with self._db.transaction(owner) as conn:
                    self._check_master_current(conn)
                    insert_owner_key(conn, owner, version, wrapped, time.time())
            with self._lock:
                self._latest[owner] = version
        return version, self._owner_cipher(owner, version)

    def _check_master_current(self, conn: Conn | None = None) -> None:
        """Raise WrongKeyError when another process has rotated the master key
        since this store was opened: nothing may be wrapped under the old one."""
        sql = "SELECT value FROM store_meta WHERE key = 'key_check'"
        rows = conn.query(sql) if conn is not None else self._db.query(sql)
        if not rows or rows[0]["value"] != self._key_check:
            raise WrongKeyError("the master key was rotated since this store was opened; open it with the new key")

    def _forget_cached_keys(self, owner: str) -> None:
        with self._lock:
            self._latest.pop(owner)
            self._owner_ciphers.discard_if(lambda key: key[0] == owner)
            self._identity_keys.discard_if(lambda key: key[0] == owner)

    # -- put -----------------------------------------------------------------------

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
        return self._put(principal, turn_id, step_num, executor_name, observation, ttl_seconds, now=now, free_step=True)

    def _put(
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
        """``put``, keeping (sealed) what a turn showed the model: ``inline`` is
        ``(item,)`` when the observation went into the history itself. With
        ``free_step``, the write transaction refuses a step that a live entry
        of the turn in the principal's scope already has (see ``_check_step_free``).
        With ``next_step`` too (and no ``inline``), ``step_num`` is only a guess:
        the write transaction, which serializes the owner's writes, gives the
        entry the step after the turn's highest live one in the principal's
        scope (sealing its metadata again when the guess was not that), so
        concurrent writers never collide; the returned view has the step taken."""
        if next_step and (inline is not None or not free_step):
            raise InvalidArgumentError("next_step needs free_step and no inline item")
        _check_principal(principal)
        check_identifier("turn_id", turn_id)
        check_identifier("executor_name", executor_name)
        _check_step_num(step_num)
        ttl = self._ttl(ttl_seconds)
        kind, shape, content, rest = _classify(observation, self.policy.max_json_depth)
        breaks: list[int] | None = None
        line_count: int | None = None
        if isinstance(content, bytes):
            segments, counts, size_chars = split_bytes(content), None, 0
        else:
            segments, pieces = split_text(content)
            counts = [len(piece) for piece in pieces]
            size_chars = sum(counts)
            breaks, line_count = reads.line_index(pieces)
            del pieces  # a second copy of the text; not needed past the indexes
        size_bytes = sum(len(s) for s in segments)
        # The limits count everything the observation stores: content and other fields.
        stored_bytes = size_bytes + (len(_dumps(rest)) if rest else 0)
        if stored_bytes > self.policy.max_entry_bytes:
            raise QuotaExceededError(
                f"the observation has {stored_bytes} bytes;"
                f" the policy's max_entry_bytes is {self.policy.max_entry_bytes}"
            )
        created = self._now(now)
        view = _view(kind, step_num, size_bytes, content, rest, observation, self.policy.inline_max_chars)
        meta: dict[str, Any] = {
            "actor": principal.actor,
            "channel": principal.channel,
            "step_num": step_num,
            "executor_name": executor_name,
            "created_at": created,
            "expires_at": created + ttl,
            "shape": shape,
            "rest": rest,
            "counts": counts,
            "breaks": breaks,
            "lines": line_count,
            "view": view,
        }
        if inline is not None:
            meta["inline"] = inline[0]
        owner = principal.owner_user_id
        version, owner_cipher = self._current_owner_key(owner)
        content_version: int | None = None
        for _ in range(5):
            if content_version != version:
                meta["content_id"] = self._content_id(owner, version, kind, segments)
                content_version = version
            entry_id = secrets.token_hex(8)
            header = Header(entry_id, owner, turn_id, kind, size_bytes, size_chars, len(segments), version)
            row, sealed, cipher = _seal(owner_cipher, header, meta, segments)
            row["stored_bytes"] = _row_cost(row, sealed)
            restep = None
            if next_step:
                parts = (kind, size_bytes, content, rest, observation)
                restep = functools.partial(_restep, meta, cipher, parts, self.policy.inline_max_chars)
            try:
                self._insert(row, sealed, created, free_step_for=principal if free_step else None, restep=restep)
            except DuplicateKeyError:
                continue  # a 64-bit id collided: seal again under a new id
            except _StaleOwnerKey:
                # The owner's key was rotated (maybe by another process) since it was cached.
                self._forget_cached_keys(owner)
                version, owner_cipher = self._current_owner_key(owner)
                continue
            return {"ok": True, "scratchpad_id": entry_id, **meta["view"]}
        raise StoreBusyError("could not store the entry: its id or owner key kept changing; try again")

    def _ttl(self, ttl_seconds: int | None) -> int:
        if ttl_seconds is None:
            return self.policy.default_ttl_seconds
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise InvalidArgumentError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        if ttl_seconds > self.policy.max_ttl_seconds:
            raise InvalidArgumentError(
                f"ttl_seconds {ttl_seconds} exceeds the policy's max_ttl_seconds ({self.policy.max_ttl_seconds})"
            )
        return ttl_seconds

    def _quota_used(self, conn: Conn, owner: str, adding: int, now: float) -> int:
        """The owner's live stored bytes, or an upper bound of them that leaves room for ``adding``.

        Entries count what their row costs on disk (``_row_cost``), and so do
        the owner's live checkpoints and compaction marks (summed here: a
        turn keeps few). ``owner_usage`` (kept by triggers) still counts
        expired entries that gc has not removed: when even that bound leaves
        room, the exact sum over the owner's live entries, O(entries), would
        not change the answer.
        """
        records = 0
        for table in _records.TABLES:
            rows = conn.query(
                f"SELECT CAST(COALESCE(SUM(length(sealed) + length(wrapped_key) + {_records.RECORD_ROW_OVERHEAD}), 0)"
                f" AS BIGINT) AS used FROM {table} WHERE owner_user_id = ? AND expires_at > ?",
                (owner, now),
            )
            records += int(rows[0]["used"])
        bound = conn.query("SELECT stored_bytes FROM owner_usage WHERE owner_user_id = ?", (owner,))
        stored = int(bound[0]["stored_bytes"]) if bound else 0
        if records + stored + adding <= self.policy.owner_quota_bytes:
            return records + stored
        live = conn.query(
            "SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS used FROM entries"
            " WHERE owner_user_id = ? AND expires_at > ?",
            (owner, now),
        )
        return records + int(live[0]["used"])

    def _check_quota(self, conn: Conn, owner: str, adding: int, now: float, what: str) -> None:
        """Refuse ``adding`` bytes that do not fit in the owner's quota.

        The message gives the new bytes and the quota only: the owner's total
        counts entries outside the caller's scope, which it must not learn of.

        Raises:
            QuotaExceededError: no room.
        """
        if self._quota_used(conn, owner, adding, now) + adding > self.policy.owner_quota_bytes:
            raise QuotaExceededError(
                f"owner quota exceeded: the {what} needs {adding} bytes on disk and owner_quota_bytes"
                f" {self.policy.owner_quota_bytes} has no room for it; delete entries or let them expire"
            )

    def _insert(
        self,
        row: dict[str, Any],
        segments: list[bytes],
        now: float,
        *,
        free_step_for: Principal | None = None,
        restep: Callable[[int], bytes] | None = None,
    ) -> None:
        """Insert a sealed entry. With ``free_step_for``, refuse a step that a live
        entry of the turn in that principal's scope has; with ``restep`` too,
        take the step after the turn's highest live one instead (``restep(step)``
        seals the metadata for it), read under the same lock as the insert."""
        with self._db.transaction(row["owner_user_id"]) as conn:
            current = conn.query(
                "SELECT MAX(version) AS v FROM owner_keys WHERE owner_user_id = ?", (row["owner_user_id"],)
            )[0]["v"]
            if current != row["key_version"]:
                raise _StaleOwnerKey
            if free_step_for is not None and restep is not None:
                step_num = self._last_step(free_step_for, row["turn_id"], now, conn) + 1
                _check_step_num(step_num)
                if step_num != row["step_num"]:
                    resealed = restep(step_num)
                    row["stored_bytes"] += len(resealed) - len(row["sealed_meta"])  # the quota counts the new one
                    row["step_num"], row["sealed_meta"] = step_num, resealed
            elif free_step_for is not None:
                self._check_step_free(free_step_for, row["turn_id"], row["step_num"], now, conn)
            self._check_quota(conn, row["owner_user_id"], row["stored_bytes"], now, "entry")
            columns = ", ".join(row)
            conn.execute(f"INSERT INTO entries({columns}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
            conn.executemany(
                "INSERT INTO segments(entry_id, seq, data) VALUES (?, ?, ?)",
                ((row["id"], seq, data) for seq, data in enumerate(segments)),
            )
            conn.execute(
                "UPDATE owner_keys SET wrap_count = wrap_count + 1 WHERE owner_user_id = ? AND version = ?",
                (row["owner_user_id"], row["key_version"]),
            )

    # -- authorize → fetch → decrypt ---------------------------------------------

    def _open(
        self, principal: Principal, scratchpad_id: object, now: float | None, turn_id: str | None = None
    ) -> _Opened:
        """The one path from an id to an entry's plaintext (of one turn, if ``turn_id`` is given).

        Raises:
            NotFoundError: absent, malformed, another owner's, or outside the scope.
            ExpiredError: the caller's own entry has expired.
            IntegrityError: the stored entry fails authentication.
        """
        _check_principal(principal)
        if not isinstance(scratchpad_id, str) or not _ID_RE.fullmatch(scratchpad_id):
            self._denied(principal, "malformed id")
            raise NotFoundError(NOT_FOUND_MESSAGE)
        scope, params = self.policy.scope_sql(principal)
        if turn_id is not None:
            scope, params = f"{scope} AND turn_id = ?", (*params, check_identifier("turn_id", turn_id))
        owner = principal.owner_user_id
        rows = self._db.query(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE id = ? AND {scope}", (scratchpad_id, *params), owner=owner
        )
        if not rows:
            self._denied(principal, scratchpad_id)
            raise NotFoundError(NOT_FOUND_MESSAGE)
        row = rows[0]
        self.policy.authorize_row(principal, row)
        _check_row_types(row)
        if turn_id is not None and row["turn_id"] != turn_id:
            raise NotFoundError(NOT_FOUND_MESSAGE)
        if row["expires_at"] <= self._now(now):
            raise ExpiredError("this entry has expired")
        try:
            return self._authenticate(row)
        except _MissingOwnerKey:
            # An owner-key rotation may have re-wrapped the entry and retired the
            # old key between our two queries: look at the row once more.
            again = self._db.query(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE id = ? AND {scope}", (scratchpad_id, *params), owner=owner
            )
            if not again or again[0]["key_version"] == row["key_version"]:
                raise
            return self._authenticate(again[0])

    def _authenticate(self, row: dict[str, Any]) -> _Opened:
        """Unwrap the item key, check the commitment, open and cross-check the metadata."""
        _check_row_types(row)
        header = Header(
            row["id"],
            row["owner_user_id"],
            row["turn_id"],
            row["content_kind"],
            row["size_bytes"],
            row["size_chars"],
            row["segment_count"],
            row["key_version"],
        )
        owner_cipher = self._owner_cipher(row["owner_user_id"], row["key_version"])
        item_key = unwrap_key(
            owner_cipher, row["wrapped_key"], item_key_aad(header.entry_id, header.owner_user_id, header.key_version)
        )
        cipher = EntryCipher(item_key, header, row["nonce_prefix"])
        cipher.verify_commitment(row["commitment"])
        meta = json.loads(cipher.open_meta(row["sealed_meta"]))
        for column in _SEALED_COLUMNS:
            if meta[column] != row[column]:
                raise IntegrityError(f"the entry's clear {column} does not match its sealed copy")
        counts = meta["counts"]
        if counts is None:  # binary: every segment but the last is full
            counts = _binary_counts(header.size_bytes, header.segment_count)
        breaks = meta.get("breaks")
        if len(counts) != header.segment_count or (breaks is not None and len(breaks) != header.segment_count):
            raise IntegrityError("the entry's segment index does not match its header")
        content = reads.SegmentedContent(
            header.kind,
            counts,
            self._fetcher(row["id"], row["owner_user_id"], cipher, header.segment_count),
            breaks=breaks,
            line_count=meta.get("lines"),
        )
        return _Opened(row, meta, content, cipher)

    def _fetcher(self, entry_id: str, owner: str, cipher: EntryCipher, count: int) -> reads.Fetch:
        def fetch(first: int, last: int) -> list[bytes]:
            # Only the segments asked for travel from the database.
            rows = self._db.query(
                "SELECT seq, data FROM segments WHERE entry_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (entry_id, first, last),
                owner=owner,
            )
            if [row["seq"] for row in rows] != list(range(first, last + 1)):
                raise IntegrityError("the entry's segments are missing or out of order")
            if not all(isinstance(row["data"], bytes) for row in rows):
                raise IntegrityError("an entry's segment is not a blob")
            return [cipher.open_segment(row["seq"], row["data"], row["seq"] == count - 1) for row in rows]

        return fetch

    def _denied(self, principal: Principal, what: str) -> None:
        if self.policy.log_denied:
            audit_log.warning(
                "denied: owner=%r actor=%r channel=%r id=%r",
                principal.owner_user_id,
                principal.actor,
                principal.channel,
                what[:64],
            )

    # -- get / read / list ----------------------------------------------------------

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
        opened = self._open(principal, scratchpad_id, now, turn_id)
        row, meta = opened.row, opened.meta
        whole = opened.content.slice(0, opened.content.size)
        return Entry(
            scratchpad_id=row["id"],
            owner_user_id=row["owner_user_id"],
            actor=row["actor"],
            channel=row["channel"],
            turn_id=row["turn_id"],
            step_num=row["step_num"],
            executor_name=row["executor_name"],
            kind=row["content_kind"],
            size_bytes=row["size_bytes"],
            size_chars=row["size_chars"],
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            observation=_rebuild(meta["shape"], whole, meta["rest"]),
            view=opened.view(),
        )

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
        if mode not in reads.MODES:
            raise InvalidArgumentError(f"unknown read mode {mode!r}; use one of {', '.join(reads.MODES)}")
        opened = self._open(principal, scratchpad_id, now, turn_id)
        result = reads.read(
            opened.content,
            mode,
            n=n,
            start=start,
            end=end,
            pattern=pattern,
            max_matches=max_matches,
            context=context,
            cap=self.policy.max_read_chars,
        )
        result["scratchpad_id"] = opened.row["id"]
        if self.policy.log_reads:
            audit_log.info("read: owner=%r id=%s mode=%s", principal.owner_user_id, opened.row["id"], mode)
        return result

    def list_for_turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> list[dict[str, Any]]:
        """The live entries of a turn that the principal may see, in step order.

        Another owner's turn id gives an empty list, as an unused one does.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: a listed entry fails authentication.
        """
        listed = []
        for opened in self._turn_entries(principal, turn_id, now):
            row = opened.row
            listed.append(
                {
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
            )
        return listed

    def _turn_entries(self, principal: Principal, turn_id: str, now: float | None) -> list[_Opened]:
        """The live entries of a turn in the principal's scope, authenticated, in step order."""
        _check_principal(principal)
        check_identifier("turn_id", turn_id)
        scope, params = self.policy.scope_sql(principal)
        sql = f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE turn_id = ? AND {scope} ORDER BY step_num, created_at, id"
        rows = self._db.query(sql, (turn_id, *params), owner=principal.owner_user_id)
        return list(self._authenticate_rows(principal, _live(rows, self._now(now))))

    def _turn_offloads(self, principal: Principal, turn_id: str, now: float | None) -> bool:
        """Whether a live entry of the turn in the principal's scope was offloaded
        (its sealed metadata holds no ``inline`` history item).

        Entries are fetched newest step first, in pages that double (8, 16,
        ...), and authenticated one at a time until one is offloaded: when the
        latest steps were offloaded, one small indexed query and one
        authentication answer, whatever the turn's length. The answer comes
        from authenticated metadata only.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: an entry looked at fails authentication.
        """
        rows = self._newest_first(principal, turn_id, _ENTRY_COLUMNS, now)
        return any("inline" not in opened.meta for opened in self._authenticate_rows(principal, rows))

    def _newest_first(
        self, principal: Principal, turn_id: str, columns: str, now: float | None, conn: Conn | None = None
    ) -> Iterator[dict[str, Any]]:
        """The turn's live rows in the principal's scope, highest step first, fetched
        lazily in pages that double (8, 16, ...): a caller that stops early pays
        for one small indexed query. Inside a write transaction with ``conn``.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        _check_principal(principal)
        check_identifier("turn_id", turn_id)
        scope, params = self.policy.scope_sql(principal)
        current = self._now(now)
        # (step_num, id) follows entries_owner_turn, so a page reads only its own rows.
        sql = (
            f"SELECT {columns} FROM entries WHERE turn_id = ? AND {scope}"
            " ORDER BY step_num DESC, id DESC LIMIT ? OFFSET ?"
        )
        offset, size = 0, 8
        while True:
            args = (turn_id, *params, size, offset)
            rows = (
                conn.query(sql, args) if conn is not None else self._db.query(sql, args, owner=principal.owner_user_id)
            )
            yield from _live(rows, current)
            if len(rows) < size:
                return
            offset, size = offset + size, size * 2

    def _authenticate_rows(self, principal: Principal, rows: Iterable[dict[str, Any]]) -> Iterator[_Opened]:
        """Each row authorized again and authenticated, as the caller gets to it.

        Raises:
            NotFoundError: a row outside the principal's scope (the query let it through).
            IntegrityError: an entry fails authentication.
        """
        owner = principal.owner_user_id
        for row in rows:
            self.policy.authorize_row(principal, row)
            try:
                opened = self._authenticate(row)
            except _MissingOwnerKey:
                # A rotation re-wrapped the entry and retired its old key meanwhile.
                again = self._db.query(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE id = ?", (row["id"],), owner=owner)
                if not again or again[0]["key_version"] == row["key_version"]:
                    raise
                self.policy.authorize_row(principal, again[0])
                opened = self._authenticate(again[0])
            yield opened

    def _last_step(self, principal: Principal, turn_id: str, now: float | None, conn: Conn | None = None) -> int:
        """The highest step number of the turn's live entries in the principal's
        scope, 0 for none: newest first, in doubling pages (one small indexed
        query unless the newest steps have expired); inside a write transaction
        with ``conn``.

        Read from the clear column: it only proposes the next step to try, and
        ``Turn.record`` checks that one, or the insert takes the step after it
        under the owner's write lock (``_put(next_step=True)``); nothing of it
        reaches the model.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: a clear step or expiry that is not a number.
        """
        for row in self._newest_first(principal, turn_id, "step_num, expires_at", now, conn):
            _check_row_types({"step_num": row["step_num"]})
            return int(row["step_num"])
        return 0

    def _check_step_free(
        self, principal: Principal, turn_id: str, step_num: int, now: float | None, conn: Conn | None = None
    ) -> None:
        """Refuse a step that a live entry of the turn in the principal's scope
        already has: one lookup on the (owner, turn, step) index, whatever the
        turn's length. Inside ``_insert``'s write transaction (``conn``), which
        serializes the owner's writes on both backends, no other writer can
        take the step between this look and the insert.

        Raises:
            InvalidArgumentError: a bad principal, turn id or step, or the step is taken.
        """
        _check_principal(principal)
        check_identifier("turn_id", turn_id)
        _check_step_num(step_num)
        scope, params = self.policy.scope_sql(principal)
        sql = f"SELECT expires_at FROM entries WHERE turn_id = ? AND step_num = ? AND {scope}"
        args = (turn_id, step_num, *params)
        rows = conn.query(sql, args) if conn is not None else self._db.query(sql, args, owner=principal.owner_user_id)
        if _live(rows, self._now(now)):
            raise InvalidArgumentError(f"step {step_num} is already recorded in turn {turn_id!r}")

    # -- turns ----------------------------------------------------------------------

    def turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> Turn:
        """The runtime surface for one turn of one principal (see ``securepad.turn``).

        Beginning a turn collects expired entries first (without waiting on
        readers; see ``gc``). A turn id that another owner uses is, for this
        principal, an empty turn.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        _check_principal(principal)
        check_identifier("turn_id", turn_id)
        # Collection is housekeeping (expired entries are never served anyway):
        # a busy store does not stop a turn from starting.
        with contextlib.suppress(StoreBusyError):
            self.gc(now, wait=False)
        return Turn(self, principal, turn_id)

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
        ttl = self._ttl(ttl_seconds)
        current = self._now(now)
        target = current + ttl
        entry_updates = []
        for opened in self._turn_entries(principal, turn_id, current):
            if opened.row["expires_at"] >= target:
                continue
            meta = {**opened.meta, "expires_at": target}
            sealed = opened.cipher.seal_meta(_dumps(meta))
            entry_updates.append((target, sealed, opened.row["id"], opened.row["sealed_meta"]))
        record_updates = _records.prepare_extend(self, principal, turn_id, target, current)
        changed = 0
        with self._db.transaction(principal.owner_user_id) as conn:
            for update in entry_updates:
                changed += conn.execute(
                    "UPDATE entries SET expires_at = ?, sealed_meta = ? WHERE id = ? AND sealed_meta = ?", update
                )
            changed += _records.apply_extend(conn, record_updates)
        return changed

    def delete(self, principal: Principal, scratchpad_id: str, *, now: float | None = None) -> None:
        """Delete one entry of the caller's (expired ones too), with secure_delete,
        and checkpoint the WAL (without waiting on readers) so its ciphertext leaves the files.

        Raises:
            NotFoundError: absent, another owner's, or outside the policy's scope.
            StoreBusyError: the write lock was not obtained in time.
        """
        _check_principal(principal)
        if not isinstance(scratchpad_id, str) or not _ID_RE.fullmatch(scratchpad_id):
            raise NotFoundError(NOT_FOUND_MESSAGE)
        scope, params = self.policy.scope_sql(principal)
        with self._db.transaction(principal.owner_user_id) as conn:
            if not conn.execute(f"DELETE FROM entries WHERE id = ? AND {scope}", (scratchpad_id, *params)):
                self._denied(principal, scratchpad_id)
                raise NotFoundError(NOT_FOUND_MESSAGE)
            conn.execute("DELETE FROM segments WHERE entry_id = ?", (scratchpad_id,))
        # secure_delete zeroed the pages; the checkpoint takes the old ones out of the WAL too.
        self._db.checkpoint(wait=False)

    def _purge_owner(self, owner_user_id: str) -> dict[str, int]:
        """Delete every entry and key of an owner, then scrub the files; returns
        what was removed. ``forget_owner`` is the public face of this."""
        removed: dict[str, int] = {}
        with self._db.transaction(owner_user_id, admin=True) as conn:
            removed["segments"] = conn.execute(
                "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = ?)",
                (owner_user_id,),
            )
            for table in ("entries", *_records.TABLES, "owner_keys"):
                removed[table] = conn.execute(f"DELETE FROM {table} WHERE owner_user_id = ?", (owner_user_id,))
        self._forget_cached_keys(owner_user_id)
        removed["wal_truncated"] = self._db.scrub()
        return removed

    # -- key lifecycle (see lifecycle.py) -----------------------------------------

    def rotate_master_key(self, new_keyring: Keyring, *, progress: lifecycle.Progress | None = None) -> dict[str, Any]:
        """Re-wrap every owner key under ``new_keyring``'s master key; see ``lifecycle.rotate_master_key``."""
        return lifecycle.rotate_master_key(self, new_keyring, progress=progress)

    def rotate_owner_key(self, owner_user_id: str, *, progress: lifecycle.Progress | None = None) -> dict[str, Any]:
        """New key version for an owner, old ones retired; see ``lifecycle.rotate_owner_key``."""
        return lifecycle.rotate_owner_key(self, owner_user_id, progress=progress)

    def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """Crypto-shred an owner's keys and entries; see ``lifecycle.forget_owner``."""
        return lifecycle.forget_owner(self, owner_user_id)

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
        cutoff = self._now(now)
        with self._db.transaction(admin=True, wait=wait) as conn:
            conn.execute(
                "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE expires_at <= ?)", (cutoff,)
            )
            deleted = conn.execute("DELETE FROM entries WHERE expires_at <= ?", (cutoff,))
            records = _records.delete_expired(conn, cutoff)
        if wait and (deleted or records):
            self._db.scrub()
        else:
            self._db.checkpoint(wait=wait)
        return deleted

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
        current = self._now(now)
        if principal is not None:
            _check_principal(principal)
            scope, params = self.policy.scope_sql(principal)
            rows = self._db.query(
                "SELECT COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
                " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes FROM entries"
                f" WHERE expires_at > ? AND {scope}",
                (current, *params),
                owner=principal.owner_user_id,
            )
            return {"owner_user_id": principal.owner_user_id, "scope": self.policy.scope, **rows[0]}
        rows = self._db.query(
            "SELECT COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
            " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes,"
            " COUNT(DISTINCT owner_user_id) AS owners,"
            " COUNT(CASE WHEN expires_at <= ? THEN 1 END) AS expired_pending_gc FROM entries",
            (current,),
            admin=True,
        )
        usage = self._db.query(
            "SELECT COALESCE(MAX(wrap_count), 0) AS owner_key_max_wraps FROM owner_keys", admin=True
        )[0]
        usage["master_key_wraps"] = int(self._store_meta().get("master_wrap_count", "0"))
        usage["advice"] = [
            f"{name} has sealed {count} keys with random nonces; rotate it"
            f" (AES-GCM limit 2**32, advised below 2**{ROTATE_ADVICE_LOG2})"
            for name, count in (
                ("an owner key", usage["owner_key_max_wraps"]),
                ("the master key", usage["master_key_wraps"]),
            )
            if count >= 2**ROTATE_ADVICE_LOG2
        ]
        result = {"path": self.location, "policy": self.policy.name, **rows[0], "key_usage": usage}
        if isinstance(self._db, Database):
            result["file_bytes"] = {
                suffix or "db": _file_size(Path(f"{self.path}{suffix}")) for suffix in ("", "-wal", "-shm")
            }
            result["wal"] = self._db.wal_status()
        return result


# -- helpers ---------------------------------------------------------------------------

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
            allow_shared=policy.allow_shared_files,
        )
    try:
        from ._pg import PostgresDatabase
    except ImportError:
        raise SecurepadError("PostgreSQL stores need psycopg: pip install 'psycopg[binary]' psycopg-pool") from None
    return PostgresDatabase(str(where) if isinstance(where, os.PathLike) else where, admin=admin, schema=schema)


def _check_now(now: object) -> float:
    """A finite number of seconds; NaN would make every expiry comparison false
    (an expired entry served), infinity every entry expired or eternal."""
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise InvalidArgumentError(f"now must be a number of seconds, not {type(now).__name__}")
    try:
        value = float(now)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise InvalidArgumentError(f"now must be a finite number of seconds, not {value}")
    return value


class _MissingOwnerKey(IntegrityError):
    """No owner key of the entry's version: tampering, or a rotation retired it meanwhile."""


class _StaleOwnerKey(Exception):
    """The entry was sealed for an owner-key version that is no longer the newest."""


# The type every clear column of an entry must have; SQLite's dynamic typing
# would let an edited file hand us a string where the code expects a number.
_COLUMN_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "owner_user_id": str,
    "actor": str,
    "channel": str,
    "turn_id": str,
    "step_num": int,
    "executor_name": str,
    "content_kind": str,
    "size_bytes": int,
    "size_chars": int,
    "segment_count": int,
    "key_version": int,
    "created_at": (float, int),
    "expires_at": (float, int),
    "wrapped_key": bytes,
    "nonce_prefix": bytes,
    "commitment": bytes,
    "sealed_meta": bytes,
}


def _check_row_types(row: dict[str, Any]) -> None:
    """Raises IntegrityError when a clear column holds a value of the wrong type."""
    for column, expected in _COLUMN_TYPES.items():
        if column in row and not isinstance(row[column], expected):
            raise IntegrityError(f"the entry's clear {column} has the wrong type")


def _check_principal(principal: object) -> None:
    if not isinstance(principal, Principal):
        raise InvalidArgumentError("principal must be a securepad.Principal")


def _live(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The rows that expire after ``now``.

    Filtered here rather than by ``expires_at > ?`` in the query: given that
    range, SQLite (which has no statistics unless ANALYZE ran) walks
    ``entries_owner_usage``, every live entry of the owner, instead of the
    turn's part of ``entries_owner_turn``, and a turn's lookups grow with
    all of the owner's turns.

    Raises:
        IntegrityError: a clear expiry that is not a number (such a row used
            to pass ``expires_at > ?``, as text sorts after numbers, and fail
            authentication: the outcome is the same).
    """
    for row in rows:
        _check_row_types({"expires_at": row["expires_at"]})
    return [row for row in rows if row["expires_at"] > now]


def _check_step_num(step_num: object) -> None:
    if isinstance(step_num, bool) or not isinstance(step_num, int) or not 0 <= step_num < 2**31:
        raise InvalidArgumentError(f"step_num must be an integer from 0 to 2**31-1, not {step_num!r}")


def _seal(
    owner_cipher: AESGCM, header: Header, meta: dict[str, Any], segments: list[bytes]
) -> tuple[dict[str, Any], list[bytes], EntryCipher]:
    """Encrypt an entry (outside any transaction) and build its row; the
    entry's cipher too (to seal its metadata again, see ``_restep``)."""
    item_key = secrets.token_bytes(KEY_BYTES)
    nonce_prefix = secrets.token_bytes(7)
    cipher = EntryCipher(item_key, header, nonce_prefix)
    last = len(segments) - 1
    sealed = [cipher.seal_segment(seq, data, seq == last) for seq, data in enumerate(segments)]
    row = {
        "id": header.entry_id,
        "owner_user_id": header.owner_user_id,
        "actor": meta["actor"],
        "channel": meta["channel"],
        "turn_id": header.turn_id,
        "step_num": meta["step_num"],
        "executor_name": meta["executor_name"],
        "content_kind": header.kind,
        "size_bytes": header.size_bytes,
        "size_chars": header.size_chars,
        "segment_count": header.segment_count,
        "key_version": header.key_version,
        "created_at": meta["created_at"],
        "expires_at": meta["expires_at"],
        "wrapped_key": wrap_key(
            owner_cipher, item_key, item_key_aad(header.entry_id, header.owner_user_id, header.key_version)
        ),
        "nonce_prefix": nonce_prefix,
        "commitment": cipher.commitment,
        "sealed_meta": cipher.seal_meta(_dumps(meta)),
    }
    return row, sealed, cipher


def _restep(
    meta: dict[str, Any],
    cipher: EntryCipher,
    parts: tuple[str, int, str | bytes, dict[str, Any] | None, Any],
    inline_max_chars: int,
    step_num: int,
) -> bytes:
    """The entry's metadata for another step, sealed (see ``_put(next_step=True)``):
    the view names the step (its reference hint), so it is made again."""
    kind, size_bytes, content, rest, observation = parts
    meta["step_num"] = step_num
    meta["view"] = _view(kind, step_num, size_bytes, content, rest, observation, inline_max_chars)
    return cipher.seal_meta(_dumps(meta))


# What a row costs on disk besides its sealed bytes (measured: an empty entry
# grows the file by about 990 bytes, 530 of them sealed): clear columns, index
# entries, b-tree cells, the segment rows' keys. Counted against the quota, so
# that empty entries, checkpoints and marks are not free.
ENTRY_ROW_OVERHEAD = 512


def _row_cost(row: dict[str, Any], sealed: list[bytes]) -> int:
    """What an entry's rows cost on disk: its sealed bytes plus a fixed overhead."""
    sealed_bytes = sum(len(s) for s in sealed)
    fields = sum(len(row[c]) for c in ("sealed_meta", "wrapped_key", "nonce_prefix", "commitment"))
    return sealed_bytes + fields + ENTRY_ROW_OVERHEAD


def _dumps(value: Any, *, indent: int | None = None) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"the observation is not JSON-serializable: {exc}") from None


def _classify(observation: Any, max_depth: int) -> tuple[str, str, str | bytes, dict[str, Any] | None]:
    """(kind, shape, content, rest): what is stored as content and what as sealed fields."""
    if isinstance(observation, str):
        return "text", "str", observation, None
    if isinstance(observation, bytes | bytearray | memoryview):
        return "binary", "bytes", bytes(observation), None
    if isinstance(observation, dict) and isinstance(observation.get("content"), str | bytes):
        rest = {k: v for k, v in observation.items() if k != "content"}
        _check_structure(rest, max_depth)
        _dumps(rest)  # the other fields must be JSON; fail before anything is stored
        content = observation["content"]
        return ("binary" if isinstance(content, bytes) else "text"), "dict", content, rest
    _check_structure(observation, max_depth)
    # Indented JSON: the readable content, so that lines and grep mean something.
    return "json", "json", _dumps(observation, indent=2).decode("utf-8"), None


def _check_structure(value: Any, max_depth: int) -> None:
    """Refuse non-string dict keys anywhere (JSON would turn 1 into "1" and the
    observation would come back different from what was put), and nesting
    deeper than ``max_depth`` (JSON's encoder would hit Python's recursion
    limit). Iterative: a deep value cannot exhaust the stack here."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > max_depth:
            raise InvalidArgumentError(
                f"the observation nests deeper than {max_depth} levels (the policy's limits.max_json_depth)"
            )
        if isinstance(item, dict):
            if any(not isinstance(k, str) for k in item):
                raise InvalidArgumentError("structured observations need string keys at every level")
            pending.extend((v, depth + 1) for v in item.values())
        else:
            pending.extend((v, depth + 1) for v in item)


def _rebuild(shape: str, whole: str | bytes, rest: dict[str, Any] | None) -> Any:
    if shape == "json":
        return json.loads(whole)
    if shape == "dict":
        return {**(rest or {}), "content": whole}
    return whole


def _view(
    kind: str,
    step_num: int,
    size_bytes: int,
    content: str | bytes,
    rest: dict[str, Any] | None,
    observation: Any,
    limit: int,
) -> dict[str, Any]:
    """The synthetic view, without the id (added when the entry is returned),
    within ``limit`` characters as JSON (with the id)."""
    view: dict[str, Any] = {"step_num": step_num, "size_bytes": size_bytes, "kind": kind}
    fields = rest if rest is not None else (observation if isinstance(observation, dict) else {})
    if isinstance(content, bytes):
        view["summary"] = summary.binary_summary(content)
    elif kind == "text":
        view["summary"] = summary.text_summary(content)
    else:
        info = summary.structure(observation)
        view["summary"] = summary.structure_summary(info)
        view.update(info)
        field = f".{info['list_field']}" if info["list_field"] else ""
        view["ref_hint"] = (
            f"pass {{{{step{step_num}{field}}}}} (or a path inside it, e.g. {{{{step{step_num}{field}.0}}}})"
            " as a tool argument instead of copying the data; read it with scratchpad_read"
        )
    metadata = fields.get("metadata")
    view["metadata"] = metadata if isinstance(metadata, dict) else {}
    # Scalars (counts, flags, messages) sit at the top level; the view's own keys win.
    return summary.fit_view(view, summary.scalars(fields), limit)


def _binary_counts(size: int, segment_count: int) -> list[int]:
    from .crypto import SEGMENT_BYTES

    if segment_count <= 0:
        return []
    return [SEGMENT_BYTES] * (segment_count - 1) + [size - SEGMENT_BYTES * (segment_count - 1)]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
