"""The store's master key: its unlock, the owner keys wrapped under it, its rotation.

Everything wrapped directly under the master key lives here: the check of the
master key against the store (and the store's initialization), the wrapped
anchor key, the wrapping and unwrapping of owner keys, and the master-key
rotation that re-wraps them all. ``keystore.Keystore`` holds one ``Master``
and builds the owner-key cache and the write under the current key on it.
Keys are ``crypto.KeyHandle``s and ``crypto.Wrapper``s, never bytes.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

from ..crypto.primitives import (
    FORMAT_VERSION,
    HEADS_ERA,
    CounterSeal,
    KeyHandle,
    Wrapper,
    anchor_key,
    anchor_key_aad,
    key_check,
    owner_key_aad,
)
from ..errors import IntegrityError, InvalidArgumentError, WrongKeyError
from ..storage import meta as keys_sql
from ..storage.base import Backend, Conn
from .keyring import Keyring, master_key

__all__ = ["Master", "Progress", "store_meta"]

# Progress callback: (done, total).
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
        # The store's metadata as read to unlock it: what the rest of the open
        # needs of it (the anchor key, the heads' and usage flags) is read here
        # once, not again by each (one round trip each on PostgreSQL).
        self.opened_meta: dict[str, str] = {}
        self.store_id, self._wrap, self._key_check = self._unlock(keyring)

    def _unlock(self, keyring: Keyring) -> tuple[str, Wrapper, str]:
        meta = store_meta(self._db)
        if ("store_id" in meta) != ("key_check" in meta) or (
            "store_id" not in meta and self._db.query(keys_sql.ANY_OWNER_KEY_SQL, admin=True)
        ):
            # A new store has neither, and no owner key: one without the other
            # was edited, and initializing it again would wrap under another store id.
            raise IntegrityError("the store's id or master key check was deleted from store_meta: the file was edited")
        if "store_id" not in meta:
            store_id = secrets.token_hex(16)
            master, kdf = master_key(keyring, None, new=True)
            with self._db.transaction(admin=True) as conn:
                if not conn.query(keys_sql.META_VALUE_SQL, ("store_id",)):
                    values = {
                        "store_id": store_id,
                        "format_version": str(FORMAT_VERSION),
                        "key_check": key_check(master, store_id),
                        "kdf": json.dumps(kdf),
                    }
                    conn.executemany(keys_sql.INSERT_META_SQL, list(values.items()))
            meta = store_meta(self._db)
        store_id = meta["store_id"]
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
            # The store's first anchored open (a new store, or one made before
            # the anchor): derive the anchor key once and keep it wrapped.
            wrapped = wrap.wrap(anchor_key(master, store_id), anchor_key_aad(store_id)).hex()
            with self._db.transaction(admin=True) as conn:
                if not conn.query(keys_sql.META_VALUE_SQL, ("anchor_key",)):
                    conn.execute(keys_sql.INSERT_META_SQL, ("anchor_key", wrapped))
            meta = store_meta(self._db)  # the anchor key stored (ours, or a racing opener's)
        self.opened_meta = meta
        return store_id, wrap, meta["key_check"]

    def counter_seal(self) -> CounterSeal:
        """The seal of the store's write counter (see ``anchor.Anchor``), from
        the wrapped anchor key read at unlock.

        Raises:
            IntegrityError: the wrapped anchor key was altered.
        """
        wrapped = self.opened_meta.get("anchor_key", "")
        try:
            blob = bytes.fromhex(wrapped)
        except ValueError:
            raise IntegrityError("the store's wrapped anchor key was altered (not hex)") from None
        return CounterSeal(self._wrap.unwrap(blob, anchor_key_aad(self.store_id)), self.store_id)

    # -- owner keys ------------------------------------------------------------------------

    def new_owner_key(self, owner: str, version: int) -> tuple[bytes, KeyHandle]:
        """A fresh owner key of ``version`` (wrapped in the heads era): (its wrapping, to store; the key)."""
        aad = owner_key_aad(self.store_id, owner, version, HEADS_ERA)
        wrapped = self._wrap.wrap_new(aad)
        return wrapped, self._wrap.unwrap(wrapped, aad)

    def unwrap_owner_key(self, wrapped: object, owner: str, version: int) -> KeyHandle:
        """The owner key of ``version`` from its stored wrapping (of either era).

        Raises:
            IntegrityError: the wrapping was altered (or is another owner's or version's).
            WrongKeyError: another process rotated the master key meanwhile.
        """
        try:
            return self._unwrap_either(wrapped, owner, version)[0]
        except IntegrityError:
            self.check_current()
            raise

    def _unwrap_either(self, wrapped: object, owner: str, version: int) -> tuple[KeyHandle, bool]:
        """(the key, whether its wrapping carries the heads era): that AAD first,
        a wrapping from before heads second."""
        try:
            return self._wrap.unwrap(wrapped, owner_key_aad(self.store_id, owner, version, HEADS_ERA)), True
        except IntegrityError:
            return self._wrap.unwrap(wrapped, owner_key_aad(self.store_id, owner, version)), False

    def mark_owner_keys(self, conn: Conn, *, refuse_marked: bool) -> int:
        """Wrap again, in the heads era, every owner key wrapped before heads (in the
        caller's transaction: the one that seals ``store_meta.turn_heads``). A key
        whose wrapping opens under neither AAD is left as it is (its owner's
        reads refuse it). Returns how many keys were wrapped again.

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
        """Raise WrongKeyError when another process has rotated the master key
        since this store was opened: nothing may be wrapped under the old one."""
        params = ("key_check",)
        rows = (
            conn.query(keys_sql.META_VALUE_SQL, params)
            if conn is not None
            else self._db.query(keys_sql.META_VALUE_SQL, params)
        )
        if not rows or rows[0]["value"] != self._key_check:
            raise WrongKeyError("the master key was rotated since this store was opened; open it with the new key")

    # -- rotation ----------------------------------------------------------------------------

    def rotate(self, new_keyring: Keyring, progress: Progress | None) -> int:
        """Re-wrap every owner key (and the anchor key) under ``new_keyring``'s
        master key, in one transaction; afterwards only the new key opens the
        store. Returns how many owner keys were re-wrapped.

        Raises:
            InvalidArgumentError: the new master key is the current one.
            WrongKeyError: this master key is no longer the store's.
            StoreBusyError: the write lock was not obtained in time.
        """
        new_master, kdf = master_key(new_keyring, None, new=True)
        new_check = key_check(new_master, self.store_id)
        if secrets.compare_digest(new_check, self._key_check):
            raise InvalidArgumentError("the new master key is the current one")
        new_wrap = Wrapper.for_master(new_master, self.store_id)
        del new_master
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
            for row in conn.query(keys_sql.META_VALUE_SQL, ("anchor_key",)):
                aad = anchor_key_aad(self.store_id)
                rewrapped = self._wrap.rewrap(bytes.fromhex(row["value"]), aad, new_wrap, aad).hex()
                conn.execute(keys_sql.SET_META_SQL, (rewrapped, "anchor_key"))
            conn.executemany(
                keys_sql.SET_META_SQL,
                [(new_check, "key_check"), (json.dumps(kdf), "kdf"), (str(len(rows)), "master_wrap_count")],
            )
        self._wrap, self._key_check, self.keyring = new_wrap, new_check, new_keyring
        return len(rows)
