"""What a read of a turn sends beside its rows: the turn's head rows, its
inventory and the **freshness token** of the inventory it has cached
(``HeadCache``). One statement returns the head rows, the token computed again
after the read's rows, and the inventory, which the database leaves out
(without reading it) when the token is the one sent:

* SQLite's is per turn: the reading connection's ``PRAGMA data_version`` (it
  moves with every commit of any other connection) with the turn's sealed
  head, then, when the data version moved, the exact text of the turn's
  inventory rows. This process's own writes edit the cached inventory and
  keep the head they sealed (``Heads.change``); a write that creates a turn
  keeps its whole inventory (``InventoryReads.seeded``). A read that sends a cached
  token sends the token's statement alone, and the whole one only when the
  token moved (``_SQLITE_QUICK``).
* PostgreSQL's is the server's snapshot, then the turn's sealed head with the
  server's SHA-256 of the inventory's rows; a read that sends a cached token
  calls the schema's read function instead (``pg_read_functions``).

What each token trusts is in SECURITY.md ("Tampering: the turn heads").

The heads' statements (the owner head and usage head's turn ids among them), and
the cache of inventories: turn inventories already verified against their heads, kept between reads.

Bounded (least recently used first out, by turns and by rows), safe to share
between threads, emptied in a forked child. Each owner has a bounded share:
an owner that holds more gives up its own entries before one that holds less,
so a tenant flooding the cache evicts only its own. An entry belongs to a
scope: the SQLite connection whose data version its token holds, or None.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...keys.keystore import NEWEST_VERSION_SQL
from ...storage import process
from ...storage.base import Backend, Params, Rows
from ...storage.postgres.functions import ENTRY_TURN_SQL, PG_CALLS, PG_FRESHNESS, PG_INVENTORY_SQL, PG_NO_FRESHNESS
from .tally import Head

__all__ = ["CACHE_ROWS", "CACHE_TURNS", "ENTRY_TURN_SQL", "HeadCache", "InventoryReads", "Verified", "without_token"]

# The owner head counts the owner's turns; the usage head holds its reservations
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
# ``ONCE_SQL`` on SQLite: the same two writes as two statements of one transaction, the
# parameters in the same order; the caller's INSERT (``... VALUES``: cheaper to run than
# ``... SELECT``) is rolled back with the transaction when the UPDATE did not rewrite the
# head (``Database.write_once``: the fewest rows either statement changed).
ONCE_SQLITE_SQL = (
    "UPDATE turn_heads SET key_version = ?, sealed = ? WHERE owner_user_id = ? AND turn_id = ?"
    f" AND key_version = ? AND sealed = ? AND ? = {NEWEST_VERSION_SQL}{{condition}}; {{insert}}"
)


def select_sql(owner: str, turn_id: str) -> tuple[str, Params]:
    """The turn's head rows (the turn's, the owner and usage heads), as ``Heads.change`` reads them."""
    return _HEAD_SQL.format(turn="?"), (owner, turn_id, OWNER_HEAD, USAGE_HEAD)


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


# A new turn's seed (``beside_sql`` with ``seed``, ``InventoryReads.seeded``): the connection's data
# version, read in the write's transaction, when the turn has neither a head nor a row of any kind
# (expired ones too), else NULL; an existing turn costs the head's one look.
_SEED = (
    "(SELECT CASE WHEN EXISTS (SELECT 1 FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?)"
    " OR EXISTS (SELECT 1 FROM entries WHERE owner_user_id = ? AND turn_id = ?)"
    " OR EXISTS (SELECT 1 FROM checkpoints WHERE owner_user_id = ? AND turn_id = ?)"
    " OR EXISTS (SELECT 1 FROM compaction_marks WHERE owner_user_id = ? AND turn_id = ?)"
    " THEN NULL ELSE (SELECT data_version FROM pragma_data_version()) END AS turn_seed) AS seed"
)


def beside_sql(
    one_row: tuple[str, Params], owner: str, turn_id: str, *, turn_only: bool = False, seed: bool = False
) -> tuple[str, Params]:
    """The query ``one_row`` (one row of scalars) and the turn's head rows (``turn_only``:
    the turn's own alone) in one statement: each head row carries the scalars; with no
    head row, one row of the scalars and NULL head columns. ``seed`` (SQLite): each row
    carries ``turn_seed`` too, the new turn's seed (``_SEED``)."""
    sql, params = one_row
    named = (turn_id,) if turn_only else (turn_id, OWNER_HEAD, USAGE_HEAD)
    seeded = (owner, turn_id) * 4 if seed else ()
    return _beside_text(sql, turn_only, seed), (*params, *seeded, owner, *named)


@functools.lru_cache(maxsize=64)
def _beside_text(sql: str, turn_only: bool, seed: bool) -> str:
    """``beside_sql``'s statement (composed once per query: every write sends one)."""
    heads = "= ?" if turn_only else "IN (?, ?, ?)"
    seeded = (", seed.turn_seed", f" CROSS JOIN {_SEED}") if seed else ("", "")
    return (
        f"SELECT one.*{seeded[0]}, h.owner_user_id, h.turn_id, h.key_version, h.sealed FROM ({sql}) AS one"
        f"{seeded[1]} LEFT JOIN turn_heads AS h ON h.owner_user_id = ? AND h.turn_id {heads}"
    )


# Turns kept at most, and inventory rows over all of them.
CACHE_TURNS = 256
CACHE_ROWS = 200_000

_Key = tuple[int, str, str]


class Verified(NamedTuple):
    """A turn's inventory as verified, and the token of the snapshot it was verified in."""

    token: tuple[Any, ...]
    head: Head
    scope: Callable[[], object]
    rows: int  # the inventory's rows when it was kept (what it holds of the cache's bound)


@dataclass
class _Share:
    """One owner's entries, least recently used first, and what they hold."""

    keys: OrderedDict[_Key, None] = field(default_factory=OrderedDict)
    rows: int = 0


class HeadCache:
    """Verified inventories by (scope, owner, turn), bounded per owner."""

    def __init__(self, turns: int = CACHE_TURNS, rows: int = CACHE_ROWS) -> None:
        self._turns, self._rows = turns, rows
        self._reset()

    def _reset(self) -> None:
        self._pid = process.pid
        # A new lock in a forked child: one held by another thread at the fork would never be released.
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, Verified] = OrderedDict()
        self._by_owner: dict[tuple[int, str], set[str]] = {}
        self._shares: dict[str, _Share] = {}
        self._held = 0

    def limit(self, turns: int, rows: int = CACHE_ROWS) -> None:
        """Keep at most ``turns`` turns and ``rows`` rows (0 turns: keep nothing, every read recounts)."""
        if self._pid != process.pid:  # a forked child starts empty
            self._reset()
        with self._lock:
            self._turns, self._rows = turns, rows
            self._evict(None)

    @property
    def enabled(self) -> bool:
        """Whether anything is kept (``limit`` above 0 turns)."""
        return self._turns > 0

    def held(self, owner: str) -> tuple[int, int]:
        """The turns and rows the owner's entries hold."""
        with self._lock:
            share = self._shares.get(owner)
            return (0, 0) if share is None else (len(share.keys), share.rows)

    def get(self, scope: object, owner: str, turn_id: str) -> Verified | None:
        """The turn's entry in ``scope``, if any (the caller compares its token)."""
        if self._pid != process.pid:  # a forked child starts empty
            self._reset()
        key = (id(scope), owner, turn_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.scope() is not scope:  # another object that got the same id
                self._remove(key)
                return None
            self._entries.move_to_end(key)
            self._shares[owner].keys.move_to_end(key)
            return entry

    def listing(self, scope: object, owner: str, entry_id: str) -> Verified | None:
        """The entry of one of the owner's turns in ``scope`` that lists the entry ``entry_id``, if any."""
        if self._pid != process.pid:  # a forked child starts empty
            self._reset()
        with self._lock:
            turns = list(self._by_owner.get((id(scope), owner), ()))
        for turn_id in turns:
            entry = self.get(scope, owner, turn_id)
            if entry is not None and entry_id in entry.head.e:
                return entry
        return None

    def put(self, scope: object, owner: str, turn_id: str, token: tuple[Any, ...], head: Head) -> None:
        if self._pid != process.pid:  # a forked child starts empty
            self._reset()
        if self._turns <= 0:
            return
        ref: Callable[[], object] = (lambda: None) if scope is None else weakref.ref(scope)
        rows = len(head.e) + len(head.c) + len(head.m)
        entry = Verified(token, head, ref, rows)
        key = (id(scope), owner, turn_id)
        with self._lock:
            if key in self._entries:  # not when a write puts back what it took
                self._remove(key)
            self._entries[key] = entry
            # Built only when missing (``setdefault`` would build one each time).
            (self._by_owner.get(key[:2]) or self._by_owner.setdefault(key[:2], set())).add(turn_id)
            share = self._shares.get(owner) or self._shares.setdefault(owner, _Share())
            share.keys[key] = None
            share.rows += rows
            self._held += rows
            if len(self._entries) > self._turns or self._held > self._rows:
                self._evict(owner)

    def drop(self, owner: str, turn_id: str) -> None:
        """Forget the turn in every scope (a write of this process changes it)."""
        self.take(None, owner, turn_id)

    def take(self, scope: object, owner: str, turn_id: str) -> Verified | None:
        """Forget the turn in every scope; its entry in ``scope``, if any (for a write to edit and put back)."""
        if self._pid != process.pid:  # a forked child starts empty
            self._reset()
        found = None
        with self._lock:
            share = self._shares.get(owner)
            for key in [key for key in share.keys if key[2] == turn_id] if share is not None else []:
                entry = self._entries[key]
                if key[0] == id(scope) and scope is not None and entry.scope() is scope:
                    found = entry
                self._remove(key)
        return found

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._held -= entry.rows
        share = self._shares[key[1]]
        del share.keys[key]
        share.rows -= entry.rows
        if not share.keys:
            del self._shares[key[1]]
        turns = self._by_owner.get(key[:2])
        if turns is not None:
            turns.discard(key[2])
            if not turns:
                del self._by_owner[key[:2]]

    def _evict(self, owner: str | None) -> None:
        """Within the bounds again after ``owner`` (None: nobody) added an entry."""
        share = None if owner is None else self._shares.get(owner)
        while self._entries:
            over_turns, over_rows = len(self._entries) > self._turns, self._held > self._rows
            if not (over_turns or over_rows):
                return
            oldest = next(iter(self._entries))
            if share is not None and share.keys and oldest[1] != owner:
                other = self._shares[oldest[1]]
                if (over_turns and len(other.keys) < len(share.keys)) or (over_rows and other.rows < share.rows):
                    # The newcomer's owner holds more: the owner that holds the most gives up its own
                    # least recently used entry (the newcomer's owner, or one holding more still).
                    biggest = max(self._shares.values(), key=lambda each: len(each.keys) if over_turns else each.rows)
                    oldest = next(iter(biggest.keys))
            self._remove(oldest)


# The turn's head rows and inventory in one statement (one snapshot, one round
# trip; expired rows not yet collected are part of the tally). The ``v`` row
# carries the token, with ``same`` (``n``) set when it is the one the read sent:
# every other row is then left out, unread (``stale``, ``fresh``).
_INVENTORY_SQL = (
    "WITH token AS MATERIALIZED ({token})"
    " SELECT 'h' AS k, owner_user_id, turn_id, key_version, sealed, NULL AS id, NULL AS n,"
    " NULL AS expires_at, NULL AS stored_bytes, NULL AS actor, NULL AS channel"
    " FROM {stale}turn_heads WHERE owner_user_id = ? AND turn_id IN ({turn}, ?){fresh}"
    " UNION ALL SELECT 'e', owner_user_id, turn_id, NULL, NULL, id, step_num, expires_at, stored_bytes, actor,"
    " channel FROM {stale}entries WHERE owner_user_id = ? AND turn_id = {turn}{fresh}"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, NULL, NULL, id, seq, expires_at, NULL, actor, channel"
    " FROM {stale}checkpoints WHERE owner_user_id = ? AND turn_id = {turn}{fresh}"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, NULL, NULL, id, seq, expires_at, NULL, actor, channel"
    " FROM {stale}compaction_marks WHERE owner_user_id = ? AND turn_id = {turn}{fresh}"
    " UNION ALL SELECT 'k', owner_user_id, '', MAX(version), NULL, NULL, NULL, NULL, NULL, NULL, NULL"
    " FROM {stale}owner_keys WHERE owner_user_id = ?{fresh} GROUP BY owner_user_id"
    " UNION ALL SELECT 'v', NULL, token.turn_id, NULL, token.sealed, NULL, token.same, NULL, NULL, token.value,"
    " token.snap FROM token ORDER BY k, turn_id, id"
)
# What a statement finds the turn by: the turn id given, or the turn of an entry (``ENTRY_TURN_SQL``).
_TURNS = ("?", ENTRY_TURN_SQL)
# How a SQLite branch reads nothing when the token is the same: a CROSS JOIN whose outer side is empty.
_SQLITE_STALE = ("(SELECT 1 FROM token WHERE same = 0) AS stale CROSS JOIN ", "")
# SQLite's token: the connection's data version, the turn's sealed head and
# the text of the turn's inventory rows (``_SQLITE_ROWS``, computed only when
# the data version moved or the head is not the one sent); the token is the
# one sent when the head is, and the data version or that text is. ``p``: what
# the read sent (data version, head, rows' text, owner, turn).
# * The data version moves with every commit of any other connection, never
#   with the connection's own, each of which kept the cached inventory edited
#   and the head it sealed.
# * The rows' text is exact: each value quoted, a text as its whole bytes (a
#   text cannot pass for a number nor a field for two), an expiry as its
#   integer part and its fraction in units of 2**-52 (exact from 1 to 2**53,
#   quoted outside), after the head's key version (a version edited fails to
#   open), read along the turn's index ``entries_owner_turn``.
_SQLITE_EXPIRY = (
    "CASE WHEN typeof(expires_at) = 'real' AND expires_at >= 1 AND expires_at < 9007199254740992"
    " THEN 'r' || CAST(expires_at AS INTEGER) || '.'"
    " || CAST((expires_at - CAST(expires_at AS INTEGER)) * 4503599627370496 AS INTEGER)"
    " ELSE 'q' || quote(expires_at) END"
)


# A column securepad writes as text (id, actor, channel): a text as its UTF-8 in hex,
# whole (``quote`` stops at a NUL), anything else (a raw edit) by ``quote``; the two never meet.
def _sqlite_exact(column: str) -> str:
    return f"CASE WHEN typeof({column}) = 'text' THEN 't' || hex({column}) ELSE quote({column}) END"


_E_ID, _ACTOR, _CHANNEL = (_sqlite_exact(column) for column in ("id", "actor", "channel"))
_SQLITE_ROWS = (
    "((SELECT 'k,' || quote(key_version) FROM turn_heads WHERE owner_user_id = p.owner AND turn_id = p.turn)"
    " || char(10) || (SELECT group_concat(r, char(10)) FROM ("
    f"SELECT 'e,' || {_E_ID} || ',' || quote(step_num) || ',' || {_SQLITE_EXPIRY} || ',' || quote(stored_bytes)"
    f" || ',' || {_ACTOR} || ',' || {_CHANNEL} AS r FROM entries WHERE owner_user_id = p.owner"
    " AND turn_id = p.turn"
    f" UNION ALL SELECT 'c,' || {_E_ID} || ',' || quote(seq) || ',' || {_SQLITE_EXPIRY} || ',' || {_ACTOR}"
    f" || ',' || {_CHANNEL} FROM checkpoints WHERE owner_user_id = p.owner AND turn_id = p.turn"
    f" UNION ALL SELECT 'm,' || {_E_ID} || ',' || quote(seq) || ',' || {_SQLITE_EXPIRY} || ',' || {_ACTOR}"
    f" || ',' || {_CHANNEL} FROM compaction_marks WHERE owner_user_id = p.owner AND turn_id = p.turn)))"
)
# A read's first statement on SQLite when it sends a cached token: the token
# alone, as a ``q`` row, never the inventory (``first_part_only``): the data
# version, the turn's sealed head and, only when the data version moved, the
# rows' text (``_SQLITE_ROWS``, its owner and turn written in: ``quick_params``).
# When it holds the inventory verified with it holds, exactly as when the
# whole statement finds the token the same; otherwise the read runs the whole
# statement (``Inventories.checked``). Opening and closing the whole
# statement's branches, even unread, costs a warm read more than the rest of
# the read together, and most reads find the token unchanged.
_SQLITE_QUICK = (
    "SELECT 'q' AS k, NULL AS turn_id, (SELECT sealed FROM turn_heads WHERE owner_user_id = ? AND turn_id = {turn})"
    " AS sealed, 0 AS n, data_version AS actor, CASE WHEN data_version IS ? THEN NULL ELSE {rows} END AS channel"
    " FROM pragma_data_version()"
)
_SQLITE_FRESHNESS = (
    "WITH p AS MATERIALIZED (SELECT ? AS version, ? AS sealed, ? AS rows_text, ? AS owner, {turn} AS turn),"
    " t AS MATERIALIZED (SELECT data_version AS version, (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = p.owner AND turn_id = p.turn) AS sealed FROM pragma_data_version(), p),"
    " f AS MATERIALIZED (SELECT t.version, t.sealed, CASE WHEN t.version IS p.version AND t.sealed IS p.sealed"
    " THEN NULL ELSE {rows} END AS rows_text FROM t, p)"
    " SELECT NULL AS turn_id, f.sealed AS sealed, CASE WHEN f.sealed IS p.sealed AND (f.version IS p.version"
    " OR f.rows_text = p.rows_text) THEN 1 ELSE 0 END AS same, f.version AS value, f.rows_text AS snap FROM f, p"
)


class InventoryReads:
    """The statements of a store's turn reads and the tokens in their rows (one per ``Heads``)."""

    def __init__(self, db: Backend, cache: HeadCache) -> None:
        self._db = db
        self.cache = cache
        self._sqlite = db.dialect == "sqlite"
        if self._sqlite:
            stale, fresh = _SQLITE_STALE
            template = _INVENTORY_SQL.replace("{stale}", stale).replace("{fresh}", fresh)
            inventory = template.replace("{token}", _SQLITE_FRESHNESS.replace("{rows}", _SQLITE_ROWS))
            # With the cache off, no rows' text (nothing would keep it).
            bare = template.replace("{token}", _SQLITE_FRESHNESS.replace("{rows}", "NULL"))
        else:
            inventory = PG_INVENTORY_SQL.replace("{token}", PG_FRESHNESS)
            # With the cache off, PostgreSQL's statement computes no digest (nothing would keep it).
            bare = PG_INVENTORY_SQL.replace("{token}", PG_NO_FRESHNESS)
        written_in = _SQLITE_ROWS.replace("p.owner", "?").replace("p.turn", "{turn}")
        quick = _SQLITE_QUICK.replace("{rows}", written_in) if self._sqlite else ""
        self._templates = {"inventory": inventory, "bare": bare, "quick": quick}
        # Each statement written out once per turn expression of the reads (the text is long).
        self._written = {
            (name, turn): text.format(turn=turn) for name, text in self._templates.items() for turn in _TURNS
        }

    def _statement(self, name: str, turn: str) -> str:
        found = self._written.get((name, turn))
        return self._templates[name].format(turn=turn) if found is None else found

    def keep(self, scope: object, owner: str, turn_id: str, rows: Rows, head: Head) -> None:
        """Cache ``head``, verified from ``rows`` (a turn with a head only)."""
        token, _ = self.token(rows, turn_id)
        if token is not None and any(row["k"] == "h" and row["turn_id"] == turn_id for row in rows):
            self.cache.put(scope, owner, turn_id, token, head)

    def token(self, rows: Rows, turn_id: str) -> tuple[tuple[Any, ...] | None, bool]:
        """The freshness token in the rows' ``v`` row (None on PostgreSQL for a turn without
        head), and whether the statement found it the one sent (the inventory left out),
        or in SQLite's ``q`` row, the token alone (``first_part_only``)."""
        for row in rows:
            if row["k"] in ("v", "q"):
                same = bool(row["n"])
                if self._sqlite:
                    return (row["actor"], row["sealed"], row["channel"]), same
                if row["turn_id"] != turn_id or row["sealed"] is None:
                    return None, same
                return (row["turn_id"], bytes(row["sealed"]), row["actor"], row["channel"]), same
        return None, False

    @staticmethod
    def first_part_only(rows: Rows) -> bool:
        """Whether ``rows`` are SQLite's token alone: no inventory, whatever the token."""
        return len(rows) == 1 and rows[0]["k"] == "q"

    @property
    def keeps_writes(self) -> bool:
        """Whether a write keeps the turn's cached inventory, edited, instead of dropping it: on
        SQLite, whose token holds the sealed head (PostgreSQL's holds the server's digest)."""
        return self._sqlite

    def seeded(self, rows: Rows | None, turn_id: str) -> tuple[Any, ...] | None:
        """The token of a new turn's inventory, empty before its first write, from the
        write's head rows (``beside_sql`` with ``seed``): its data version, no head yet
        (``written`` adds the one the write seals); None when the turn had a head or a
        row, or nothing would keep it. Its own commit leaves the data version where the
        write read it, so a read finds that inventory fresh only if no other connection
        committed since and that head is stored."""
        if not self._sqlite or not self.cache.enabled or not rows:
            return None
        version = rows[0].get("turn_seed")
        if version is None or any(row["turn_id"] == turn_id for row in rows):
            return None
        return (version, None, None)

    @staticmethod
    def sealed_of(token: tuple[Any, ...]) -> bytes | None:
        """The turn head a SQLite token was taken with (``keeps_writes``)."""
        return None if token[1] is None else bytes(token[1])

    def kept(self, cached: tuple[Any, ...], token: tuple[Any, ...]) -> tuple[Any, ...]:
        """The token to keep once a read with ``token`` found ``cached`` fresh (SQLite's rows' text kept)."""
        if self._sqlite and token[2] is None:
            return (*token[:2], cached[2])
        return token

    @staticmethod
    def written(token: tuple[Any, ...], sealed: bytes) -> tuple[Any, ...]:
        """A SQLite token after this connection's write sealed the turn's head ``sealed``: the
        same data version (its own commits do not move it), the new head. A read finds it
        fresh only if no other connection committed since and that head is stored (AES-GCM
        seals each head under a fresh nonce); the rows' text is left for a read to compute."""
        return (token[0], sealed, None)

    def holds(self, cached: tuple[Any, ...], token: tuple[Any, ...]) -> bool:
        """Whether the inventory verified with ``cached`` is the one of a read with ``token``:
        PostgreSQL's head and digest equal (the snapshot may differ); SQLite's head equal,
        and its data version or its rows' text."""
        if self._sqlite:
            version, sealed, rows_text = token
            return sealed == cached[1] and (version == cached[0] or (rows_text is not None and rows_text == cached[2]))
        return cached[:3] == token[:3]

    def read_sql(self, owner: str, turn_id: str) -> tuple[str, Params]:
        """What a read of the turn sends with its rows (``Backend.queries``): head rows, token, inventory."""
        entry = self.cache.get(self._db.read_scope(), owner, turn_id)
        return self.sql("?", turn_id, owner, None if entry is None else entry.token, function=True)

    def entry_read_sql(self, owner: str, entry_id: str, scope: Sequence[tuple[str, str]]) -> tuple[str, Params]:
        """``read_sql`` for the turn of entry ``entry_id``, found within ``scope`` (no default)."""
        entry = self.cache.listing(self._db.read_scope(), owner, entry_id)
        if entry is not None:
            # An entry of the owner outside the scope is read as an absent one: without a token.
            actor, channel = entry.head.e[entry_id][3:5]
            wanted = dict(scope)
            if wanted.get("actor", actor) != actor or wanted.get("channel", channel) != channel:
                entry = None
        token = None if entry is None else entry.token
        return self.sql(ENTRY_TURN_SQL, entry_id, owner, token, function=True, scope=scope)

    def sql(
        self,
        turn: str,
        value: str,
        owner: str,
        token: tuple[Any, ...] | None = None,
        *,
        function: bool = False,
        kept: bool = True,
        scope: Sequence[tuple[str, str]] | None = None,
    ) -> tuple[str, Params]:
        """The statement of ``read_sql`` for ``turn`` (``?`` for the turn id ``value``, or
        ``ENTRY_TURN_SQL`` for entry ``value`` within ``scope``); ``token``: the cached
        inventory's. ``function``: with a token, on PostgreSQL a call of the read
        function (the same rows), on SQLite the token alone (``first_part_only``).
        ``kept``: False when nothing will cache it (no token)."""
        by_entry = turn == ENTRY_TURN_SQL
        found = entry_turn_params(value, scope or (("owner_user_id", owner),)) if by_entry else (value,)
        if self._sqlite:
            if function and token is not None and self.cache.enabled and kept:
                return self._statement("quick", turn), (owner, *found, token[0], *(owner, *found) * 4)
            sent: Params = (None, None, None) if token is None else token
            statement = self._statement("inventory" if self.cache.enabled and kept else "bare", turn)
            turn_params = (owner, *found, OWNER_HEAD, *(owner, *found) * 3, owner)
            return statement, (*sent, owner, *found, *turn_params)
        sealed, digest, snap = (None, None, None) if token is None else token[1:]
        params = (owner, *found, sealed, digest, snap, OWNER_HEAD)
        if not self.cache.enabled or not kept:
            return self._statement("bare", turn), params
        if function and token is not None:
            return PG_CALLS[turn], (owner, value, sealed, digest, snap, OWNER_HEAD, *found[2:])
        return self._statement("inventory", turn), params


def without_token(rows: Rows) -> Rows:
    """The inventory without its token (which moves with any commit, of any turn)."""
    return [row for row in rows if row["k"] != "v"]
