"""The statements of the heads (but the inventory reads': ``reading``), and the
turn ids of the owner head and the usage head they name."""

from __future__ import annotations

from collections.abc import Sequence

from ...keys.keystore import NEWEST_VERSION_SQL
from ...storage.base import Params
from ...storage.postgres.functions import ENTRY_TURN_SQL

# The owner head lists the owner's turns; the usage head holds its reservations
# (no turn can have either id: ``check_identifier`` refuses "" and control characters).
OWNER_HEAD = ""
USAGE_HEAD = "\x01usage"

ALL_HEADS_SQL = "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
OWNER_HEADS_SQL = ALL_HEADS_SQL + " WHERE owner_user_id = ?"
# The owner's turn heads but one (reclaiming, dropping a turn).
OTHER_TURNS_SQL = ALL_HEADS_SQL + " WHERE owner_user_id = ? AND turn_id NOT IN (?, ?, ?)"
TURN_HEADS_SQL = ALL_HEADS_SQL + " WHERE turn_id NOT IN (?, ?)"
# A turn's head, its owner head and usage head (writers); ``turn`` is the placeholder of the turn's id.
_HEAD_SQL = ALL_HEADS_SQL + " WHERE owner_user_id = ? AND turn_id IN ({turn}, ?, ?) ORDER BY turn_id"
_TURN_HEAD_SQL = ALL_HEADS_SQL + " WHERE owner_user_id = ? AND turn_id = ?"
NEWEST_SQL = f"SELECT {NEWEST_VERSION_SQL} AS v"
UPSERT_SQL = (
    "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES {values}"
    " ON CONFLICT (owner_user_id, turn_id) DO UPDATE SET key_version = excluded.key_version,"
    " sealed = excluded.sealed"
)
FIRST_OWNER_HEAD_SQL = (
    "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES (?, ?, ?, ?), (?, ?, ?, ?)"
    " ON CONFLICT (owner_user_id, turn_id) DO NOTHING"
)
DELETE_HEAD_SQL = "DELETE FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?"
DELETE_OWNER_SQL = "DELETE FROM turn_heads WHERE owner_user_id = ?"
OWNERS_WITHOUT_HEADS_SQL = (
    "SELECT DISTINCT owner_user_id FROM owner_keys WHERE owner_user_id NOT IN"
    " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) ORDER BY owner_user_id"
)
KEYS_WITHOUT_HEADS_SQL = (
    "SELECT owner_user_id, MAX(version) AS v FROM owner_keys WHERE owner_user_id NOT IN"
    " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) GROUP BY owner_user_id"
)
# The heads of the owners with an owner head and no usage head (seeding usage heads).
UNSEEDED_SQL = (
    "SELECT h.owner_user_id, h.turn_id, h.key_version, h.sealed FROM turn_heads h"
    " WHERE h.turn_id != ? AND h.owner_user_id IN (SELECT o.owner_user_id FROM turn_heads o"
    " WHERE o.turn_id = ? AND NOT EXISTS (SELECT 1 FROM turn_heads u"
    " WHERE u.owner_user_id = o.owner_user_id AND u.turn_id = ?))"
)
META_SQL = "SELECT value FROM store_meta WHERE key = '{key}'"
DELETE_USAGE_META_SQL = "DELETE FROM store_meta WHERE key = 'owner_usage'"
ANY_HEAD_SQL = "SELECT 1 FROM turn_heads LIMIT 1"
ANY_USAGE_HEAD_SQL = "SELECT 1 FROM turn_heads WHERE turn_id = ? LIMIT 1"
SET_META_SQL = (
    "INSERT INTO store_meta(key, value) VALUES ('turn_heads', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

# The clear items of rows, by kind: what gc collects at a cutoff, one turn's rows.
ITEMS_SQL = (
    "SELECT 'e' AS k, owner_user_id, turn_id, id, step_num AS n, expires_at, stored_bytes, actor, channel"
    " FROM entries WHERE {where}"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM checkpoints"
    " WHERE {where}"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM compaction_marks"
    " WHERE {where}"
)
# The turns with expired rows (a quick gc's first look), and one turn's expired rows.
EXPIRED_TURNS_SQL = " UNION ".join(
    f"SELECT owner_user_id, turn_id FROM {table} WHERE expires_at <= ?"
    for table in ("entries", "checkpoints", "compaction_marks")
)
TURN_EXPIRED = "owner_user_id = ? AND turn_id = ? AND expires_at <= ?"

# The turn head rewritten only if it is still the one this process sealed last
# (its clear key version too: an edit of that alone would otherwise be
# overwritten unseen) and the key version is the owner's newest; the caller's
# INSERT ... SELECT takes its one row FROM head, so it inserts exactly when the
# head was rewritten.
ONCE_SQL = (
    "WITH head AS (UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?"
    f" AND key_version = ? AND sealed = ? AND ? = {NEWEST_VERSION_SQL}{{condition}} RETURNING 1) {{insert}} FROM head"
)


def select_sql(owner: str, turn_id: str) -> tuple[str, Params]:
    """The turn's head rows (the turn's, the owner and usage heads), as ``Heads.change`` reads them."""
    return _HEAD_SQL.format(turn="?"), (owner, turn_id, OWNER_HEAD, USAGE_HEAD)


def turn_select_sql(owner: str, turn_id: str) -> tuple[str, Params]:
    """The turn's head row alone: all a write under the owner's shared lock reads of the heads
    (it changes its turn's head only; a new turn, or one whose reservation is short, takes the
    exclusive lock and reads ``select_sql``'s rows)."""
    return _TURN_HEAD_SQL, (owner, turn_id)


def entry_turn_params(entry_id: str, scope: Sequence[tuple[str, str]]) -> tuple[str | None, ...]:
    """The parameters of ``ENTRY_TURN_SQL`` for ``entry_id`` within ``scope`` (``Policy.scope_columns``)."""
    columns = dict(scope)
    return (entry_id, columns["owner_user_id"], columns.get("channel"), columns.get("actor"))


def entry_select_sql(owner: str, entry_id: str, scope: Sequence[tuple[str, str]]) -> tuple[str, Params]:
    """``select_sql`` for the turn of entry ``entry_id``, found within ``scope`` (no default:
    no caller forgets the channel and actor a policy names)."""
    return _HEAD_SQL.format(turn=ENTRY_TURN_SQL), (owner, *entry_turn_params(entry_id, scope), OWNER_HEAD, USAGE_HEAD)


def newest_sql(owner: str) -> tuple[str, Params]:
    """The owner's newest key version, as ``Heads.change`` reads it without a version."""
    return NEWEST_SQL, (owner,)


def expired_sql(cutoff: float, kept: list[tuple[str, str]]) -> tuple[str, Params]:
    """The condition (and values) of what gc deletes at ``cutoff``: expired rows,
    but those of the turns ``Heads.prune`` left alone."""
    keep = " OR ".join(["(owner_user_id = ? AND turn_id = ?)"] * len(kept))
    return "expires_at <= ?" + (f" AND NOT ({keep})" if kept else ""), (cutoff, *(v for pair in kept for v in pair))


def beside_sql(one_row: tuple[str, Params], owner: str, turn_id: str) -> tuple[str, Params]:
    """The query ``one_row`` (one row of scalars) and the turn's head rows in one
    statement: each head row carries the scalars; with no head row, one row of
    the scalars and NULL head columns."""
    sql, params = one_row
    return (
        f"SELECT one.*, h.owner_user_id, h.turn_id, h.key_version, h.sealed FROM ({sql}) AS one"
        " LEFT JOIN turn_heads AS h ON h.owner_user_id = ? AND h.turn_id IN (?, ?, ?)",
        (*params, owner, turn_id, OWNER_HEAD, USAGE_HEAD),
    )
