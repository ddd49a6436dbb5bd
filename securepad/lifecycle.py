"""Key lifecycle: master-key rotation, owner-key rotation, crypto-shredding.

Each operation is crash-safe by construction: it is a sequence of SQLite
transactions, each of which leaves a store that opens with the right key and
serves every entry; running the operation again finishes what an
interrupted run started.

* Master rotation re-wraps owner keys only, in one transaction (the
  cryptography is a few microseconds per owner).
* Owner rotation adds a new owner-key version (new puts use it at once),
  re-wraps the owner's item keys in batches, then retires (deletes) the old
  versions: they are the ``min_decryption_version`` cut-off.
* Forgetting an owner deletes its keys and entries with ``secure_delete`` on
  and truncates the WAL, so neither ciphertext nor wrapped keys remain.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ._records import TABLES as _RECORD_TABLES
from ._records import record_key_aad
from .crypto import derive, item_key_aad, owner_key_aad, unwrap_key, wrap_key
from .errors import InvalidArgumentError, NotFoundError
from .keys import KEY_BYTES, Keyring
from .principal import check_identifier

if TYPE_CHECKING:
    from .store import Scratchpad

from ._backend import insert_owner_key as _insert_owner_key

__all__ = ["Progress", "forget_owner", "rotate_master_key", "rotate_owner_key"]

# Progress callback: (done, total).
Progress = Callable[[int, int], None]

# Item keys re-wrapped per transaction during an owner rotation: small enough
# that concurrent writers wait milliseconds, large enough to amortize commits.
REWRAP_BATCH = 500
# Passes over an owner's rows per table in one rotation (see rotate_owner_key).
MAX_PASSES = 3

# Every table whose rows hold an item key wrapped by an owner key, with the
# AAD of that wrapping: rotation re-wraps them all before retiring a version.
_WRAPPED_TABLES: tuple[tuple[str, Callable[[str, str, int], bytes]], ...] = (
    ("entries", item_key_aad),
    *((table, record_key_aad) for table in _RECORD_TABLES),
)


def rotate_master_key(pad: Scratchpad, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
    """Re-wrap every owner key under the master key of ``new_keyring``.

    The new keyring may use another source (key file to passphrase...). After
    it returns, only the new master key opens the store; ``pad`` keeps working.

    Raises:
        InvalidArgumentError: the new master key is the current one.
        WrongKeyError: ``pad``'s master key is no longer the store's.
        StoreBusyError: the write lock was not obtained in time.
    """
    store_id = pad.store_id.encode()
    new_master, kdf = new_keyring._master_key(None, new=True)
    new_check = derive(new_master, "key-check", store_id).hex()
    if secrets.compare_digest(new_check, pad._key_check):
        raise InvalidArgumentError("the new master key is the current one")
    new_wrap = AESGCM(derive(new_master, "owner-wrap", store_id))
    started = time.perf_counter()
    with pad._db.transaction(admin=True) as conn:
        pad._check_master_current(conn)
        rows = conn.query("SELECT owner_user_id, version, wrapped FROM owner_keys")
        updates = []
        for done, row in enumerate(rows, 1):
            aad = owner_key_aad(pad.store_id, row["owner_user_id"], row["version"])
            key = unwrap_key(pad._wrap, row["wrapped"], aad)
            updates.append((wrap_key(new_wrap, key, aad), row["owner_user_id"], row["version"]))
            if progress is not None and (done % 256 == 0 or done == len(rows)):
                progress(done, len(rows))
        conn.executemany("UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = ? AND version = ?", updates)
        conn.executemany(
            "UPDATE store_meta SET value = ? WHERE key = ?",
            [(new_check, "key_check"), (json.dumps(kdf), "kdf"), (str(len(rows)), "master_wrap_count")],
        )
    pad._wrap, pad._key_check, pad.keyring = new_wrap, new_check, new_keyring
    pad._db.checkpoint()
    return {"owner_keys_rewrapped": len(rows), "source": new_keyring.kind, "seconds": time.perf_counter() - started}


def rotate_owner_key(
    pad: Scratchpad,
    owner_user_id: str,
    *,
    progress: Progress | None = None,
    batch: int = REWRAP_BATCH,
) -> dict[str, Any]:
    """Give an owner a new key version, re-wrap its item keys, retire the old versions.

    New puts use the new version as soon as it exists, in every process. If
    a previous rotation was interrupted (several versions exist), this one
    finishes it instead of adding yet another version.

    Raises:
        NotFoundError: the owner has no key (never stored anything, or forgotten).
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    started = time.perf_counter()
    versions = _versions(pad, owner_user_id)
    if not versions:
        raise NotFoundError(f"owner {owner_user_id!r} has no key")
    if len(versions) == 1:
        new_version = versions[-1] + 1
        wrapped = wrap_key(
            pad._wrap, secrets.token_bytes(KEY_BYTES), owner_key_aad(pad.store_id, owner_user_id, new_version)
        )
        with pad._db.transaction(owner_user_id, admin=True) as conn:
            pad._check_master_current(conn)
            _insert_owner_key(conn, owner_user_id, new_version, wrapped, time.time())
        versions = _versions(pad, owner_user_id)
    new_version = versions[-1]
    pad._forget_cached_keys(owner_user_id)
    new_cipher = pad._owner_cipher(owner_user_id, new_version)
    total = _count_old(pad, owner_user_id, new_version)
    done = 0
    for table, aad_of in _WRAPPED_TABLES:
        # List the ids once, then fetch them by id: paging with LIMIT over
        # "key_version < new" rescanned every re-wrapped row on each batch,
        # which made a rotation quadratic in the owner's entries. A pass more
        # picks up rows whose compare-and-set lost a race; what is still left
        # after that is reported (complete=False) and finished by a rerun.
        for _ in range(MAX_PASSES):
            ids = [
                row["id"]
                for row in pad._db.query(
                    f"SELECT id FROM {table} WHERE owner_user_id = ? AND key_version < ?",
                    (owner_user_id, new_version),
                    owner=owner_user_id,
                    admin=True,
                )
            ]
            if not ids:
                break
            for first in range(0, len(ids), batch):
                chunk = ids[first : first + batch]
                # By primary key only, so the engine cannot pick the owner index and
                # scan the owner's rows per chunk; owner and version are checked here.
                fetched = pad._db.query(
                    f"SELECT id, owner_user_id, key_version, wrapped_key FROM {table}"
                    f" WHERE id IN ({', '.join('?' * len(chunk))})",
                    tuple(chunk),
                    owner=owner_user_id,
                    admin=True,
                )
                rows = [r for r in fetched if r["owner_user_id"] == owner_user_id and r["key_version"] < new_version]
                updates = []
                for row in rows:
                    old_cipher = pad._owner_cipher(owner_user_id, row["key_version"])
                    old_aad = aad_of(row["id"], owner_user_id, row["key_version"])
                    item_key = unwrap_key(old_cipher, row["wrapped_key"], old_aad)
                    new_wrapped = wrap_key(new_cipher, item_key, aad_of(row["id"], owner_user_id, new_version))
                    updates.append((new_wrapped, new_version, row["id"], row["key_version"], row["wrapped_key"]))
                with pad._db.transaction(owner_user_id, admin=True) as conn:
                    # Compare-and-set: a row changed meanwhile is left for the next pass.
                    conn.executemany(
                        f"UPDATE {table} SET wrapped_key = ?, key_version = ?"
                        " WHERE id = ? AND key_version = ? AND wrapped_key = ?",
                        updates,
                    )
                    conn.execute(
                        "UPDATE owner_keys SET wrap_count = wrap_count + ? WHERE owner_user_id = ? AND version = ?",
                        (len(updates), owner_user_id, new_version),
                    )
                done += len(rows)
                if progress is not None:
                    progress(min(done, total), total)
    with pad._db.transaction(owner_user_id, admin=True) as conn:
        left = 0
        for table, _ in _WRAPPED_TABLES:
            counted = conn.query(
                f"SELECT COUNT(*) AS n FROM {table} WHERE owner_user_id = ? AND key_version < ?",
                (owner_user_id, new_version),
            )
            left += int(counted[0]["n"])
        if left:  # a writer slipped in under an old version: finish it next run
            retired: list[int] = []
        else:
            retired = [v for v in versions if v < new_version]
            conn.execute("DELETE FROM owner_keys WHERE owner_user_id = ? AND version < ?", (owner_user_id, new_version))
    pad._forget_cached_keys(owner_user_id)
    pad._db.checkpoint()
    return {
        "owner_user_id": owner_user_id,
        "version": new_version,
        "item_keys_rewrapped": done,
        "retired_versions": retired,
        "complete": not left,
        "seconds": time.perf_counter() - started,
    }


def forget_owner(pad: Scratchpad, owner_user_id: str) -> dict[str, Any]:
    """Crypto-shred an owner: delete its keys, entries and segments, scrub the files.

    ``secure_delete`` overwrites the freed pages and the WAL is checkpointed
    and truncated, so neither the owner's ciphertext nor its wrapped keys
    remain in the database, WAL or journal files. Backups taken before keep
    both (see SECURITY.md).

    Raises:
        StoreBusyError: the write lock was not obtained in time.
    """
    check_identifier("owner_user_id", owner_user_id)
    return {"owner_user_id": owner_user_id, **pad._purge_owner(owner_user_id)}


def _versions(pad: Scratchpad, owner: str) -> list[int]:
    rows = pad._db.query(
        "SELECT version FROM owner_keys WHERE owner_user_id = ? ORDER BY version", (owner,), owner=owner, admin=True
    )
    return [int(r["version"]) for r in rows]


def _count_old(pad: Scratchpad, owner: str, version: int) -> int:
    total = 0
    for table, _ in _WRAPPED_TABLES:
        rows = pad._db.query(
            f"SELECT COUNT(*) AS n FROM {table} WHERE owner_user_id = ? AND key_version < ?",
            (owner, version),
            owner=owner,
            admin=True,
        )
        total += int(rows[0]["n"])
    return total
