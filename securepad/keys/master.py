"""The store's master key: its check at open, the wrapped anchor key, the owner
keys wrapped under it, and its rotation.

A source's store (PKCS#11, KMS) keeps the key's identifier (``master_source``),
its hash (``key_check``) and a random anchor key wrapped by the source: opening
that wrapping proves at each open that the source holds the store's key (one call).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable

from ..crypto.primitives import (
    FORMAT_VERSION,
    HEADS_ERA,
    SOURCE_CHECK_PREFIX,
    CounterSeal,
    KeyHandle,
    RemoteWrapper,
    Wrapper,
    anchor_key,
    anchor_key_aad,
    key_check,
    owner_key_aad,
    source_key_check,
)
from ..errors import IntegrityError, InvalidArgumentError, WrongKeyError
from ..storage import meta as keys_sql
from ..storage.base import Backend, Conn
from .keyring import Keyring, master_key

__all__ = ["Master", "Progress", "store_meta"]

# Owner keys a source's store keeps between their creation and their first read.
_FRESH_KEPT = 64

Progress = Callable[[int, int], None]


def store_meta(db: Backend) -> dict[str, str]:
    """The store's clear metadata (id, format version, key check, KDF record, counters)."""
    return {r["key"]: r["value"] for r in db.query(keys_sql.META_SQL)}


class Master:
    """The master key of one open store (as a wrapper), and what it wraps."""

    def __init__(self, db: Backend, keyring: Keyring) -> None:
        """Check ``keyring``'s master key against the store (initializing a new store).

        Raises:
            WrongKeyError: the master key does not open this store.
            IntegrityError: the store's id or key check was deleted.
        """
        self._db = db
        self.keyring = keyring
        # The metadata read to unlock, which the rest of the open reads (no second round trip).
        self.opened_meta: dict[str, str] = {}
        # A source's store: the anchor key opened at unlock, and owner keys just wrapped, until read back.
        self._anchor: KeyHandle | None = None
        self._fresh: dict[bytes, tuple[str, int, KeyHandle]] = {}
        self._fresh_lock = threading.Lock()
        self.store_id, self._wrap, self._key_check = self._unlock(keyring)

    def _unlock(self, keyring: Keyring) -> tuple[str, Wrapper, str]:
        meta = store_meta(self._db)
        if ("store_id" in meta) != ("key_check" in meta) or (
            "store_id" not in meta and self._db.query(keys_sql.ANY_OWNER_KEY_SQL, admin=True)
        ):
            # Initializing again would wrap under another store id.
            raise IntegrityError("the store's id or master key check was deleted from store_meta: the file was edited")
        if "store_id" not in meta:
            meta = self._initialize(keyring)
        store_id = meta["store_id"]
        by_source = meta["key_check"].startswith(SOURCE_CHECK_PREFIX)
        if keyring.source is not None or by_source:
            wrap = self._unlock_by_source(keyring, meta, by_source)
            self.opened_meta = meta
            return store_id, wrap, meta["key_check"]
        kdf_record = json.loads(meta.get("kdf", "null"))
        master, _ = master_key(keyring, kdf_record)
        if not secrets.compare_digest(key_check(master, store_id), meta["key_check"]):
            if kdf_record is not None and keyring.kind != "passphrase":
                raise WrongKeyError(
                    f"this store uses a passphrase (Argon2id): the master key from {keyring!r} cannot open it"
                )
            if kdf_record is None and keyring.kind == "passphrase":
                raise WrongKeyError(
                    "this store's master key is not derived from a passphrase: give its key file or variable"
                )
            raise WrongKeyError(f"the master key from {keyring!r} does not open this store")
        wrap = Wrapper.for_master(master, store_id)
        if "anchor_key" not in meta:
            # The first anchored open: derive the anchor key once and keep it wrapped.
            wrapped = wrap.wrap(anchor_key(master, store_id), anchor_key_aad(store_id)).hex()
            with self._db.transaction(admin=True) as conn:
                if not conn.query(keys_sql.META_VALUE_SQL, ("anchor_key",)):
                    conn.execute(keys_sql.INSERT_META_SQL, ("anchor_key", wrapped))
            meta = store_meta(self._db)  # the anchor key stored (ours, or a racing opener's)
        self.opened_meta = meta
        return store_id, wrap, meta["key_check"]

    def _initialize(self, keyring: Keyring) -> dict[str, str]:
        """Record a new store's id and key check (and a source's wrapped anchor key); a racing opener's wins."""
        store_id = secrets.token_hex(16)
        values, wrap = _set_up(keyring, store_id)
        anchor = KeyHandle.random() if keyring.source is not None else None  # else derived at unlock
        if anchor is not None:
            values["anchor_key"] = wrap.wrap(anchor, anchor_key_aad(store_id)).hex()
        with self._db.transaction(admin=True) as conn:
            if not conn.query(keys_sql.META_VALUE_SQL, ("store_id",)):
                values |= {"store_id": store_id, "format_version": str(FORMAT_VERSION)}
                conn.executemany(keys_sql.INSERT_META_SQL, list(values.items()))
                self._anchor = anchor  # ours is the store's: no call to open it again
        return store_meta(self._db)

    def _unlock_by_source(self, keyring: Keyring, meta: dict[str, str], by_source: bool) -> Wrapper:
        """The wrapper of a source's store, once the wrapped anchor key opened through it.

        Raises:
            WrongKeyError: the store and the keyring disagree on where the key
                is, or the source's key does not open the anchor key.
            IntegrityError: the wrapped anchor key was deleted.
        """
        source = keyring.source
        recorded = meta.get("master_source", "an unnamed source")
        if source is None:
            raise WrongKeyError(
                f"this store's master key is held by {recorded}: open it with --master-key-uri (Keyring.from_uri),"
                f" not with {keyring!r}"
            )
        if not by_source:
            raise WrongKeyError(
                f"this store's master key is a key file, variable or passphrase: {source.shown_uri} cannot open it"
            )
        store_id = meta["store_id"]
        source.prepare()
        if not secrets.compare_digest(source_key_check(source.key_id(), store_id), meta["key_check"]):
            raise WrongKeyError(
                f"the master key {source.key_id()} ({source.shown_uri}) does not open this store; it was made with"
                f" {recorded}"
            )
        wrap = RemoteWrapper(source)
        if self._anchor is None:
            if "anchor_key" not in meta:
                raise IntegrityError("the store's wrapped anchor key was deleted from store_meta: the file was edited")
            try:
                self._anchor = wrap.unwrap(_hex(meta["anchor_key"]), anchor_key_aad(store_id))
            except IntegrityError:
                raise WrongKeyError(
                    f"the master key {source.shown_uri} does not open this store's wrapped anchor key:"
                    " another key under the same name, or an edited store"
                ) from None
        return wrap

    def counter_seal(self) -> CounterSeal:
        """The seal of the store's write counter. Raises IntegrityError: the anchor key was altered."""
        if self._anchor is not None:
            return CounterSeal(self._anchor, self.store_id)
        blob = _hex(self.opened_meta.get("anchor_key", ""))
        return CounterSeal(self._wrap.unwrap(blob, anchor_key_aad(self.store_id)), self.store_id)

    def new_owner_key(self, owner: str, version: int) -> tuple[bytes, KeyHandle]:
        """(its wrapping in the heads era, the key) of a fresh owner key."""
        wrapped, key = self._wrap.wrap_fresh(owner_key_aad(self.store_id, owner, version, HEADS_ERA))
        if isinstance(self._wrap, RemoteWrapper):
            # The keystore reads the new key back from its row: no second call for it.
            with self._fresh_lock:
                if len(self._fresh) >= _FRESH_KEPT:
                    self._fresh.pop(next(iter(self._fresh)))
                self._fresh[wrapped] = (owner, version, key)
        return wrapped, key

    def unwrap_owner_key(self, wrapped: object, owner: str, version: int) -> KeyHandle:
        """The owner key of ``version`` from its stored wrapping (of either era).

        Raises:
            IntegrityError: the wrapping was altered (or is another owner's or version's).
            WrongKeyError: another process rotated the master key meanwhile.
        """
        if self._fresh and isinstance(wrapped, bytes):
            with self._fresh_lock:
                fresh = self._fresh.pop(wrapped, None)
            if fresh is not None and fresh[:2] == (owner, version):
                return fresh[2]
        try:
            return self._unwrap_either(wrapped, owner, version)[0]
        except IntegrityError:
            self.check_current()
            raise

    def _unwrap_either(self, wrapped: object, owner: str, version: int) -> tuple[KeyHandle, bool]:
        """(the key, whether its wrapping carries the heads era), trying that AAD first."""
        try:
            return self._wrap.unwrap(wrapped, owner_key_aad(self.store_id, owner, version, HEADS_ERA)), True
        except IntegrityError:
            return self._wrap.unwrap(wrapped, owner_key_aad(self.store_id, owner, version)), False

    def mark_owner_keys(self, conn: Conn, *, refuse_marked: bool) -> int:
        """Wrap again in the heads era every owner key wrapped before heads, in ``conn``
        (a key that opens under neither AAD is left: its reads refuse it). Returns how many.

        Raises:
            IntegrityError: ``refuse_marked`` (the flag says the store never had
                heads, or had heads of format 1 only) and a key already carries
                the heads era: the flag was set back.
            WrongKeyError: another process rotated the master key meanwhile.
        """
        self.check_current(conn)
        updates = []
        for row in conn.query(keys_sql.ALL_OWNER_KEYS_SQL):
            owner, version = row["owner_user_id"], int(row["version"])
            try:
                key, marked = self._unwrap_either(row["wrapped"], owner, version)
            except IntegrityError:
                continue
            if marked and refuse_marked:
                raise IntegrityError(
                    "store_meta.turn_heads asks for heads to be built or converted ('pending', 'built' or"
                    " 'convert': a store from before heads) but an owner key is wrapped in the heads era, since"
                    " the store had heads: the flag was set back to have the heads rebuilt from an edited store;"
                    " refused (SECURITY.md, 'turn heads')"
                )
            if not marked:
                updates.append(
                    (self._wrap.wrap(key, owner_key_aad(self.store_id, owner, version, HEADS_ERA)), owner, version)
                )
        if updates:
            conn.executemany(keys_sql.REWRAP_SQL, updates)
            conn.execute(keys_sql.ADD_MASTER_WRAPS_SQL, (len(updates),))
        return len(updates)

    def check_current(self, conn: Conn | None = None) -> None:
        """Raise WrongKeyError when another process rotated the master key since the open."""
        rows = (conn if conn is not None else self._db).query(keys_sql.META_VALUE_SQL, ("key_check",))
        if not rows or rows[0]["value"] != self._key_check:
            raise WrongKeyError("the master key was rotated since this store was opened; open it with the new key")

    def rotate(self, new_keyring: Keyring, progress: Progress | None) -> int:
        """Re-wrap every owner key (and the anchor key) under ``new_keyring``'s master
        key in one transaction. Returns how many owner keys were re-wrapped.

        Raises:
            InvalidArgumentError: the new master key is the current one.
            WrongKeyError: this master key is no longer the store's.
            StoreBusyError: the write lock was not obtained in time.
            KeySourceError: a source cannot be used (nothing is rotated then).
        """
        values, new_wrap = _set_up(new_keyring, self.store_id)
        new_check = values["key_check"]
        if secrets.compare_digest(new_check, self._key_check):
            raise InvalidArgumentError("the new master key is the current one")
        with self._db.transaction(admin=True) as conn:
            self.check_current(conn)
            rows = conn.query(keys_sql.ALL_OWNER_KEYS_SQL)
            updates = []
            for done, row in enumerate(rows, 1):
                owner, version = row["owner_user_id"], int(row["version"])
                key, _ = self._unwrap_either(row["wrapped"], owner, version)
                aad = owner_key_aad(self.store_id, owner, version, HEADS_ERA)  # an open store has heads
                updates.append((new_wrap.wrap(key, aad), owner, row["version"]))
                if progress is not None and (done % 256 == 0 or done == len(rows)):
                    progress(done, len(rows))
            conn.executemany(keys_sql.REWRAP_SQL, updates)
            aad = anchor_key_aad(self.store_id)
            for row in conn.query(keys_sql.META_VALUE_SQL, ("anchor_key",)):
                anchor = self._anchor or self._wrap.unwrap(_hex(row["value"]), aad)
                conn.execute(keys_sql.SET_META_SQL, (new_wrap.wrap(anchor, aad).hex(), "anchor_key"))
            conn.executemany(
                keys_sql.SET_META_SQL,
                [(new_check, "key_check"), (values["kdf"], "kdf"), (str(len(rows)), "master_wrap_count")],
            )
            conn.execute(keys_sql.DELETE_META_SQL, ("master_source",))
            if "master_source" in values:
                conn.execute(keys_sql.INSERT_META_SQL, ("master_source", values["master_source"]))
        self._wrap, self._key_check, self.keyring = new_wrap, new_check, new_keyring
        return len(rows)


def _set_up(keyring: Keyring, store_id: str) -> tuple[dict[str, str], Wrapper]:
    """What ``store_meta`` records of a new store's or rotation's master key, and its wrapper."""
    source = keyring.source
    if source is None:
        master, kdf = master_key(keyring, None, new=True)
        return {"key_check": key_check(master, store_id), "kdf": json.dumps(kdf)}, Wrapper.for_master(master, store_id)
    source.prepare(create=True)
    key_id = source.key_id()
    values = {"key_check": source_key_check(key_id, store_id), "kdf": "null", "master_source": key_id}
    return values, RemoteWrapper(source)


def _hex(value: str) -> bytes:
    """A wrapped anchor key as stored. Raises IntegrityError: not hex (the file was edited)."""
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise IntegrityError("the store's wrapped anchor key was altered (not hex)") from None
