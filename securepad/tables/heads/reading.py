"""What a read of a turn sends beside its rows: the turn's head rows, its
inventory and the **freshness token** of the inventory it has cached
(``cache``). One statement returns the head rows, the token computed again
after the read's rows, and the inventory, which the database leaves out
(without reading it) when the token is the one sent:

* SQLite's is per turn: the reading connection's ``PRAGMA data_version`` (it
  moves with every commit of any other connection) with the turn's sealed
  head, then, when the data version moved, the exact text of the turn's
  inventory rows. This process's own writes edit the cached inventory and
  keep the head they sealed (``Heads.change``). A read that sends a cached
  token sends the token's statement alone, and the whole one only when the
  token moved (``_SQLITE_QUICK``).
* PostgreSQL's is the server's snapshot, then the turn's sealed head with the
  server's SHA-256 of the inventory's rows; a read that sends a cached token
  calls the schema's read function instead (``pg_read_functions``).

What each token trusts is in SECURITY.md ("Tampering: the turn heads").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...storage.base import Backend, Params, Rows
from ...storage.postgres.functions import ENTRY_TURN_SQL, PG_CALLS, PG_FRESHNESS, PG_INVENTORY_SQL, PG_NO_FRESHNESS
from .cache import HeadCache
from .statements import OWNER_HEAD, entry_turn_params
from .tally import Head

__all__ = [
    "ENTRY_TURN_SQL",
    "InventoryReads",
    "without_token",
]

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
