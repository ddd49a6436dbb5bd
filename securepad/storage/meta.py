"""The statements of the keys' tables: ``store_meta`` (the store's clear
metadata) and ``owner_keys`` (each owner's wrapped key versions)."""

from __future__ import annotations

from .base import Conn

__all__ = [
    "ADD_MASTER_WRAPS_SQL",
    "ALL_OWNER_KEYS_SQL",
    "ANY_OWNER_KEY_SQL",
    "COUNT_WRAPS_SQL",
    "DELETE_META_SQL",
    "DELETE_OWNER_KEYS_SQL",
    "INSERT_META_SQL",
    "META_SQL",
    "META_VALUE_SQL",
    "NEWEST_SQL",
    "NEWEST_VERSION_SQL",
    "OWNER_KEY_SQL",
    "RETIRE_OWNER_KEYS_SQL",
    "REWRAP_SQL",
    "SET_META_SQL",
    "VERSIONS_SQL",
    "insert_owner_key",
]

# store_meta
META_SQL = "SELECT key, value FROM store_meta"
META_VALUE_SQL = "SELECT value FROM store_meta WHERE key = ?"
INSERT_META_SQL = "INSERT INTO store_meta(key, value) VALUES (?, ?)"
SET_META_SQL = "UPDATE store_meta SET value = ? WHERE key = ?"
DELETE_META_SQL = "DELETE FROM store_meta WHERE key = ?"
# The master key's random-nonce wraps (owner keys wrapped), counted.
ADD_MASTER_WRAPS_SQL = (
    "UPDATE store_meta SET value = CAST(CAST(value AS BIGINT) + ? AS TEXT) WHERE key = 'master_wrap_count'"
)

# owner_keys
ANY_OWNER_KEY_SQL = "SELECT 1 FROM owner_keys LIMIT 1"
ALL_OWNER_KEYS_SQL = "SELECT owner_user_id, version, wrapped FROM owner_keys"
OWNER_KEY_SQL = "SELECT wrapped FROM owner_keys WHERE owner_user_id = ? AND version = ?"
REWRAP_SQL = "UPDATE owner_keys SET wrapped = ? WHERE owner_user_id = ? AND version = ?"
NEWEST_SQL = "SELECT MAX(version) AS v FROM owner_keys WHERE owner_user_id = ?"
# The owner's newest key version, as a scalar subquery with one parameter (the
# owner): the write transaction reads it in the statement that reads the quota.
NEWEST_VERSION_SQL = "(SELECT MAX(version) FROM owner_keys WHERE owner_user_id = ?)"
VERSIONS_SQL = "SELECT version FROM owner_keys WHERE owner_user_id = ? ORDER BY version"
RETIRE_OWNER_KEYS_SQL = "DELETE FROM owner_keys WHERE owner_user_id = ? AND version < ?"
DELETE_OWNER_KEYS_SQL = "DELETE FROM owner_keys WHERE owner_user_id = ?"
COUNT_WRAPS_SQL = "UPDATE owner_keys SET wrap_count = wrap_count + ? WHERE owner_user_id = ? AND version = ?"


def insert_owner_key(conn: Conn, owner: str, version: int, wrapped: bytes, now: float) -> bool:
    """Add an owner-key version (unless a racing process already did) and count
    the master key's random-nonce wrap; whether this call added it."""
    added = conn.execute(
        "INSERT INTO owner_keys(owner_user_id, version, wrapped, created_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (owner, version, wrapped, now),
    )
    if added:
        conn.execute(ADD_MASTER_WRAPS_SQL, (1,))
    return bool(added)
