"""Turn records: compaction checkpoints and compaction marks, sealed like entries.

A record is a small JSON payload that belongs to one turn of one owner. It
gets a random item key, wrapped by the owner's current key (the AAD binds the
record id, owner and key version, so an owner-key rotation re-wraps it like an
entry's item key), and its payload is sealed with AES-256-GCM under that item
key. The payload's AAD binds the table, record id, owner, actor, channel,
turn, sequence number and both times: a record moved to another owner, turn,
table or position, or given another expiry, fails authentication.

In clear: the id, owner, actor and channel (the policy's scope is part of
the query, as for entries), turn id, sequence number, key version and the two
times. Everything the runtime wrote is in the sealed payload.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ._backend import Conn, DuplicateKeyError
from .crypto import FORMAT_VERSION, lp, unwrap_key, wrap_key
from .errors import IntegrityError, StoreBusyError
from .keys import KEY_BYTES
from .principal import Principal

if TYPE_CHECKING:
    from .store import Scratchpad

__all__ = [
    "TABLES",
    "apply_extend",
    "delete_expired",
    "load",
    "prepare_extend",
    "record_key_aad",
    "save",
]

TABLES = ("checkpoints", "compaction_marks")
# The blobs are read as blobs whatever was written there: a value of another
# type is then an authentication failure, not a decoding error.
_COLUMNS = (
    "id, owner_user_id, actor, channel, turn_id, seq, key_version, created_at, expires_at,"
    " CAST(wrapped_key AS BLOB) AS wrapped_key, CAST(sealed AS BLOB) AS sealed"
)

# (expires_at, sealed, id, old sealed) per table: a compare-and-set update.
Updates = dict[str, list[tuple[float, bytes, str, bytes]]]


class _StaleOwnerKey(Exception):
    """The record was sealed for an owner-key version that is no longer the newest."""


# What a record's row costs on disk besides its sealed bytes (clear columns,
# its indexes): counted against the owner's quota with them.
RECORD_ROW_OVERHEAD = 256


def record_key_aad(record_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a record's wrapped item key: binds record, owner and owner-key version."""
    return lp("record-key", record_id, owner_user_id, str(key_version))


def _payload_aad(table: str, row: dict[str, Any]) -> bytes:
    return lp(
        "turn-record",
        str(FORMAT_VERSION),
        table,
        row["id"],
        row["owner_user_id"],
        row["actor"],
        row["channel"],
        row["turn_id"],
        str(row["seq"]),
        float(row["created_at"]).hex(),
        float(row["expires_at"]).hex(),
    )


def _seal_payload(item_key: bytes, table: str, row: dict[str, Any], body: bytes) -> bytes:
    nonce = secrets.token_bytes(12)
    return nonce + AESGCM(item_key).encrypt(nonce, body, _payload_aad(table, row))


def _check_table(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"unknown record table {table!r}")
    return table


def save(
    pad: Scratchpad,
    table: str,
    principal: Principal,
    turn_id: str,
    payload: dict[str, Any],
    ttl_seconds: int | None,
    now: float | None,
) -> dict[str, Any]:
    """Seal ``payload`` (outside the transaction) and append it to the turn's records.

    Returns the record's ``seq``, ``created_at`` and ``expires_at``.

    Raises:
        InvalidArgumentError: a bad ttl.
        QuotaExceededError: the record does not fit in the owner's quota.
        StoreBusyError: the write lock was not obtained in time, or the
            sequence number kept being taken by other writers.
    """
    _check_table(table)
    ttl = pad._ttl(ttl_seconds)
    created = pad._now(now)
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
    owner = principal.owner_user_id
    version, owner_cipher = pad._current_owner_key(owner)
    for _ in range(8):
        last = pad._db.query(
            f"SELECT COALESCE(MAX(seq), 0) AS seq FROM {table} WHERE owner_user_id = ? AND turn_id = ?",
            (owner, turn_id),
            owner=owner,
        )[0]["seq"]
        row: dict[str, Any] = {
            "id": secrets.token_hex(8),
            "owner_user_id": owner,
            "actor": principal.actor,
            "channel": principal.channel,
            "turn_id": turn_id,
            "seq": int(last) + 1,
            "key_version": version,
            "created_at": created,
            "expires_at": created + ttl,
        }
        item_key = secrets.token_bytes(KEY_BYTES)
        row["wrapped_key"] = wrap_key(owner_cipher, item_key, record_key_aad(row["id"], owner, version))
        row["sealed"] = _seal_payload(item_key, table, row, body)
        try:
            with pad._db.transaction(owner) as conn:
                newest = conn.query("SELECT MAX(version) AS v FROM owner_keys WHERE owner_user_id = ?", (owner,))[0][
                    "v"
                ]
                if newest != version:
                    raise _StaleOwnerKey
                cost = len(row["sealed"]) + len(row["wrapped_key"]) + RECORD_ROW_OVERHEAD
                pad._check_quota(conn, owner, cost, created, "record")
                conn.execute(
                    f"INSERT INTO {table}({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
                )
                conn.execute(
                    "UPDATE owner_keys SET wrap_count = wrap_count + 1 WHERE owner_user_id = ? AND version = ?",
                    (owner, version),
                )
                scope, params = pad.policy.scope_sql(principal)
                number = conn.query(
                    f"SELECT COUNT(*) AS n FROM {table} WHERE turn_id = ? AND seq <= ? AND {scope}",
                    (turn_id, row["seq"], *params),
                )[0]["n"]
        except DuplicateKeyError:
            continue  # another writer took this seq (or the id collided): seal again
        except _StaleOwnerKey:
            pad._forget_cached_keys(owner)
            version, owner_cipher = pad._current_owner_key(owner)
            continue
        return {"seq": int(number), "created_at": created, "expires_at": row["expires_at"]}
    raise StoreBusyError("could not store the turn record: other writers kept taking its place; try again")


def load(
    pad: Scratchpad,
    table: str,
    principal: Principal,
    turn_id: str,
    now: float | None,
    *,
    latest: bool = False,
) -> list[dict[str, Any]]:
    """The live records of a turn in the principal's scope, oldest first (only
    the newest with ``latest``), each as ``{"seq", "created_at", "expires_at", "payload"}``.

    ``seq`` numbers the records within the principal's scope (1, 2, ... in the
    order they were written, as ``save`` returned it): the stored sequence
    runs over the whole turn, and would tell of records in other scopes.

    Raises:
        IntegrityError: a record fails authentication.
    """
    _check_table(table)
    scope, params = pad.policy.scope_sql(principal)
    order = "seq DESC LIMIT 1" if latest else "seq"
    rows = pad._db.query(
        f"SELECT {_COLUMNS} FROM {table} WHERE turn_id = ? AND expires_at > ? AND {scope} ORDER BY {order}",
        (turn_id, pad._now(now), *params),
        owner=principal.owner_user_id,
    )
    # Every record of the scope (expired ones not yet collected too) numbers the scope's sequence.
    stored = pad._db.query(
        f"SELECT seq FROM {table} WHERE turn_id = ? AND {scope} ORDER BY seq",
        (turn_id, *params),
        owner=principal.owner_user_id,
    )
    numbers = {row["seq"]: index for index, row in enumerate(stored, 1)}
    loaded = []
    for row in rows:
        pad.policy.authorize_row(principal, row)
        _, payload = _open(pad, table, row)
        loaded.append(
            {
                "seq": numbers.get(row["seq"], len(numbers) + 1),
                "created_at": row["created_at"],
                "expires_at": row["expires_at"],
                "payload": payload,
            }
        )
    return loaded


def _open(pad: Scratchpad, table: str, row: dict[str, Any]) -> tuple[bytes, Any]:
    """The record's item key and payload.

    Raises:
        IntegrityError: the wrapped key or the payload fails authentication.
    """
    numbers = (row["seq"], row["key_version"], row["created_at"], row["expires_at"])
    if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in numbers):
        raise IntegrityError("a turn record's clear fields are malformed")
    try:
        item_key = _unwrap(pad, row)
    except IntegrityError:
        # An owner-key rotation may have re-wrapped the record and retired the
        # old key between our two queries: look at the row once more.
        again = pad._db.query(f"SELECT {_COLUMNS} FROM {table} WHERE id = ?", (row["id"],), owner=row["owner_user_id"])
        if not again or again[0]["key_version"] == row["key_version"]:
            raise
        row = again[0]
        item_key = _unwrap(pad, row)
    blob = row["sealed"]
    if not isinstance(blob, bytes) or len(blob) < 28:
        raise IntegrityError("a turn record is truncated")
    try:
        body = AESGCM(item_key).decrypt(blob[:12], blob[12:], _payload_aad(table, row))
    except InvalidTag:
        raise IntegrityError("a turn record failed authentication") from None
    return item_key, json.loads(body)


def _unwrap(pad: Scratchpad, row: dict[str, Any]) -> bytes:
    owner_cipher = pad._owner_cipher(row["owner_user_id"], row["key_version"])
    aad = record_key_aad(row["id"], row["owner_user_id"], row["key_version"])
    return unwrap_key(owner_cipher, row["wrapped_key"], aad)


def prepare_extend(pad: Scratchpad, principal: Principal, turn_id: str, target: float, now: float) -> Updates:
    """Re-sealed payloads (outside any transaction) for the turn's live records
    that expire before ``target``; ``apply_extend`` writes them.

    Raises:
        IntegrityError: a record fails authentication.
    """
    scope, params = pad.policy.scope_sql(principal)
    updates: Updates = {}
    for table in TABLES:
        rows = pad._db.query(
            f"SELECT {_COLUMNS} FROM {table} WHERE turn_id = ? AND expires_at > ? AND expires_at < ? AND {scope}",
            (turn_id, now, target, *params),
            owner=principal.owner_user_id,
        )
        for row in rows:
            pad.policy.authorize_row(principal, row)
            item_key, payload = _open(pad, table, row)
            body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
            sealed = _seal_payload(item_key, table, {**row, "expires_at": target}, body)
            updates.setdefault(table, []).append((target, sealed, row["id"], row["sealed"]))
    return updates


def apply_extend(conn: Conn, updates: Updates) -> int:
    """Write ``prepare_extend``'s updates inside the caller's transaction; a
    record changed meanwhile is left as it is. Returns how many were extended."""
    changed = 0
    for table, rows in updates.items():
        for update in rows:
            changed += conn.execute(
                f"UPDATE {_check_table(table)} SET expires_at = ?, sealed = ? WHERE id = ? AND sealed = ?", update
            )
    return changed


def delete_expired(conn: Conn, cutoff: float) -> int:
    """Delete expired records inside the caller's (gc) transaction."""
    return sum(conn.execute(f"DELETE FROM {table} WHERE expires_at <= ?", (cutoff,)) for table in TABLES)
