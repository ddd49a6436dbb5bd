"""What a read of a turn sends beside its rows: the turn's head rows, its
inventory and the **freshness token** of the inventory it has cached
(``cache``). One statement returns the head rows, the token computed again
after the read's rows, and the inventory, which the database leaves out
(without reading it) when the token is the one sent:

* SQLite's is per turn: the reading connection's ``PRAGMA data_version`` (it
  moves with every commit of any other connection) with the turn's sealed
  head, then, when the data version moved, the exact text of the turn's
  inventory rows. This process's own writes edit the cached inventory and
  keep the head they sealed (``Heads.change``).
* PostgreSQL's is the server's snapshot, then the turn's sealed head with the
  server's SHA-256 of the inventory's rows; a read that sends a cached token
  calls the schema's read function instead (``pg_read_functions``).

What each token trusts is in SECURITY.md ("Tampering: the turn heads").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...storage.base import Backend, Params, Rows
from .cache import HeadCache
from .statements import ENTRY_TURN_SQL, OWNER_HEAD, entry_turn_params
from .tally import Head

__all__ = [
    "ENTRY_TURN_SQL",
    "InventoryReads",
    "pg_lean_read_functions",
    "pg_read_functions",
    "pg_scoped_read_functions",
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
_SQLITE_FRESHNESS = (
    "WITH p AS MATERIALIZED (SELECT ? AS version, ? AS sealed, ? AS rows_text, ? AS owner, {turn} AS turn),"
    " t AS MATERIALIZED (SELECT data_version AS version, (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = p.owner AND turn_id = p.turn) AS sealed FROM pragma_data_version(), p),"
    " f AS MATERIALIZED (SELECT t.version, t.sealed, CASE WHEN t.version IS p.version AND t.sealed IS p.sealed"
    " THEN NULL ELSE {rows} END AS rows_text FROM t, p)"
    " SELECT NULL AS turn_id, f.sealed AS sealed, CASE WHEN f.sealed IS p.sealed AND (f.version IS p.version"
    " OR f.rows_text = p.rows_text) THEN 1 ELSE 0 END AS same, f.version AS value, f.rows_text AS snap FROM f, p"
)
# PostgreSQL's statement: the same rows, each value sent once (``p``:
# owner, turn, and the sent token's head, digest and snapshot), the turn's
# clear columns read by one scan per table (``inv``), which both the digest
# and the inventory read; and a plan whose parts the warm read never runs.
# ``inv`` is computed only when something reads it: when the token's snapshot
# is the one sent, nothing does (the digest is in a CASE branch not taken, the
# other rows behind one-time filters on ``same``), and the head is not read.
# Its first two CTEs (``_PG_TURN_ROWS``) open the lean statement of the read
# functions too (``_PG_LEAN``), so that both read the turn's rows by the same
# plan, in the same order.
_PG_TURN_ROWS = (
    "WITH p AS MATERIALIZED (SELECT ?::text AS owner, {turn}::text AS turn, ?::bytea AS sealed, ?::text AS value,"
    " ?::text AS snap),"
    " inv AS MATERIALIZED ("
    "SELECT 'e' AS k, owner_user_id, turn_id, id, step_num AS n, expires_at, stored_bytes, actor, channel"
    " FROM entries WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM checkpoints"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM compaction_marks"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)),"
)
_PG_INVENTORY_SQL = (
    _PG_TURN_ROWS + " token AS MATERIALIZED ({token})"
    " SELECT 'h' AS k, owner_user_id, turn_id, key_version, sealed, NULL AS id, NULL AS n,"
    " NULL AS expires_at, NULL AS stored_bytes, NULL AS actor, NULL AS channel"
    " FROM turn_heads WHERE owner_user_id = (SELECT owner FROM p) AND turn_id IN ((SELECT turn FROM p), ?)"
    " AND (SELECT same FROM token) = 0"
    " UNION ALL SELECT k, owner_user_id, turn_id, NULL, NULL, id, n, expires_at, stored_bytes, actor, channel"
    " FROM inv WHERE (SELECT same FROM token) = 0"
    " UNION ALL SELECT 'k', owner_user_id, '', MAX(version), NULL, NULL, NULL, NULL, NULL, NULL, NULL"
    " FROM owner_keys WHERE owner_user_id = (SELECT owner FROM p) AND (SELECT same FROM token) = 0"
    " GROUP BY owner_user_id"
    " UNION ALL SELECT 'v', NULL, token.turn_id, NULL, token.sealed, NULL, token.same, NULL, NULL, token.value,"
    " token.snap FROM token ORDER BY k, turn_id, id"
)
# The server's SHA-256 over the inventory's rows (``inv``), each as a row
# value's text (fields quoted where needed, so unambiguous; the expiry as its 8
# bytes, exact whatever ``extra_float_digits`` says), one a line. The rows come
# in the order of the scans, not sorted: equal digests mean equal sequences of
# rows, so equal inventories, whatever the order; a turn read in another order
# (another plan) is only a miss. Owner and turn are the statement's (``p``).
_PG_DIGEST = (
    "(SELECT encode(sha256(convert_to(string_agg(ROW(r.k, r.id, r.n, float8send(r.expires_at), r.stored_bytes,"
    " r.actor, r.channel)::text, chr(10)), 'UTF8')), 'hex') FROM inv AS r)"
)
# The server's snapshot of the statement, with what tells one server lifetime
# from another: the postmaster's start time (exact, as epoch seconds) and the
# cluster's system identifier. Equal to the one of the statement that fetched
# the cached inventory, no transaction has ended since (xmin:xmax:xip would
# differ), in any database of the server: no row can differ (SECURITY.md,
# "Tampering: the turn heads").
_PG_SNAPSHOT = (
    "concat_ws(' ', extract(epoch FROM pg_postmaster_start_time()), (pg_control_system()).system_identifier,"
    " pg_current_snapshot())"
)
# PostgreSQL's token: the snapshot above, then the turn's head and the digest.
# When the snapshot is the one sent, neither the head nor the digest is
# evaluated (each is an uncorrelated subquery, an initplan the server runs only
# when its CASE branch is taken) and the statement returns the head and digest
# sent with it; otherwise both are computed, and ``same`` says whether they are
# the ones sent (a commit elsewhere that left this turn alone: the read still
# fetches no inventory, and its cache takes the new snapshot). OFFSET 0: each
# expression is computed once, not once per use.
_PG_FRESHNESS = (
    "SELECT t.turn_id, t.sealed, CASE WHEN t.sealed = p.sealed AND t.value = p.value THEN 1 ELSE 0 END AS same,"
    " t.value, t.snap FROM p, (SELECT s.turn_id, s.snap,"
    " CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT sealed FROM p) ELSE (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)) END AS sealed,"
    f" CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT value FROM p) ELSE {_PG_DIGEST} END AS value"
    f" FROM (SELECT (SELECT turn FROM p) AS turn_id, {_PG_SNAPSHOT} AS snap OFFSET 0) AS s OFFSET 0) AS t"
)
# The warm read as a server-side function (PostgreSQL's migration 10
# creates both, EXECUTE granted to the application role alone): a read that
# sends a cached token calls it instead of the statement. The statement's
# plan holds every scan of the head, the digest and the inventory, and the
# server opens, locks and initializes all of them at every execution though a
# warm read runs none (docs/decisions/0004-verified-inventory-cache.md); the
# function compares the snapshot first and returns the token row alone when
# it is the one sent (so the head and digest sent, as the statement does),
# and otherwise runs the statement itself, the same rows in the same order.
# PL/pgSQL keeps the statement's plan per server session; STABLE: the whole
# call sees the calling statement's snapshot, as the one statement did.
# SECURITY INVOKER (the default): it runs as the application role, so
# row-level security and the owner setting apply as to the statement. Its
# search_path is pinned to the store's schema (``FROM CURRENT``: the
# migration's), so its names never resolve elsewhere whoever calls it.
# Migrations are never edited: a change to the statements above needs a new
# migration that replaces these functions (``CREATE OR REPLACE FUNCTION``);
# tests/tables/heads/test_reading_token_postgres.py pins their text so that such a change cannot go unnoticed.
_PG_FUNCTION_SIGNATURE = (
    "{name}(text, text, bytea, text, text, text) RETURNS TABLE(k text, owner_user_id text,"
    " turn_id text, key_version integer, sealed bytea, id text, n integer, expires_at double precision,"
    " stored_bytes bigint, actor text, channel text) LANGUAGE plpgsql STABLE SECURITY INVOKER"
    " SET search_path FROM CURRENT AS $body$\n"
    "#variable_conflict use_column\n"
)
_PG_WARM = (
    "  IF $5 = {snapshot} THEN\n"
    "    k := 'v'; turn_id := {warm_turn}; sealed := $3; n := 1; actor := $4; channel := $5;\n"
    "    RETURN NEXT;\n"
    "    RETURN;\n"
    "  END IF;\n"
)
_PG_FUNCTION_TAIL = (
    "  RETURN QUERY {statement};\n"
    "END $body$;\n"
    "REVOKE ALL ON FUNCTION {name}(text, text, bytea, text, text, text) FROM PUBLIC;\n"
)
_PG_READ_FUNCTION = (
    "CREATE FUNCTION "
    + _PG_FUNCTION_SIGNATURE
    + "BEGIN\n"
    + _PG_WARM.replace("{snapshot}", _PG_SNAPSHOT)
    + _PG_FUNCTION_TAIL
)
# When the snapshot moved, the function above runs the whole statement, and
# the server starts every node of its plan (48: every scan of the head, the
# digest and the inventory, the UNION ALL of the four branches) to return, as
# a rule, the token row alone: a commit anywhere on the server moves the
# snapshot, and most leave the turn alone
# (docs/decisions/0004-verified-inventory-cache.md). Migration 13 replaces
# both functions with this one, which first runs
# a lean statement: the turn's rows by the statement's own CTEs
# (``_PG_TURN_ROWS``: the same scans, so the same rows in the same order),
# the head, and the digest, evaluated only when the head is the one sent (a
# changed turn has another head: its digest is computed once, by the
# statement). Read by the digest alone, the rows are not materialized: the
# digest reads them from the scans (the Append of the three, in order), not
# from a tuple store written first (a fifth of the server's CPU for a
# 1,000-entry turn, docs/how-to/postgresql.md). When both are the ones sent,
# it returns the row the statement would return in that case: the turn, the
# head, ``same`` set, the digest and the new snapshot (the one the statement
# would compute: a STABLE function's statements all see the caller's).
# Otherwise it runs the statement, as before; so the digest is what it was,
# over the same rows, and a row edited, deleted or inserted still gives
# another digest, hence the inventory.
_PG_LEAN = (
    _PG_TURN_ROWS.replace(" inv AS MATERIALIZED (", " inv AS NOT MATERIALIZED (")
    + " h AS MATERIALIZED (SELECT (SELECT turn FROM p) AS turn_id, (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)) AS sealed)"
    f" SELECT h.turn_id, h.sealed, CASE WHEN h.sealed = (SELECT sealed FROM p) THEN {_PG_DIGEST} END AS value"
    " FROM h"
)
# The snapshot is computed once, before
# the warm comparison, and is the lean answer's.
_PG_LEAN_READ_FUNCTION = (
    "CREATE OR REPLACE FUNCTION " + _PG_FUNCTION_SIGNATURE + "DECLARE\n"
    f"  server_snapshot text := {_PG_SNAPSHOT};\n"
    "BEGIN\n"
    + _PG_WARM.replace("{snapshot}", "server_snapshot")
    + "  SELECT l.turn_id, l.sealed, l.value INTO turn_id, sealed, actor FROM ({lean}) AS l;\n"
    "  IF sealed = $3 AND actor = $4 THEN\n"
    "    k := 'v'; n := 1; channel := server_snapshot;\n"
    "    RETURN NEXT;\n"
    "    RETURN;\n"
    "  END IF;\n" + _PG_FUNCTION_TAIL
)
# With the cache off (``Heads.cache_limit(0)``): no token, so no digest.
_PG_NO_FRESHNESS = (
    "SELECT NULL::text AS turn_id, NULL::bytea AS sealed, 0 AS same, NULL::text AS value, NULL::text AS snap"
)
# What migrations 10 and 13 built the entry's read function from (the turn of
# an id whoever its owner; row-level security held it to the owner's rows):
# kept so that their text stays what existing stores ran.
_UNSCOPED_ENTRY_TURN_SQL = "(SELECT turn_id FROM entries WHERE id = ?)"
# The read functions by the turn expression of their statement (the turn
# given, or the turn of an entry), as migrations 10 and 13 created them: name,
# and the turn of the warm branch.
_PG_FUNCTIONS = {
    "?": ("turn_inventory", "$2"),
    _UNSCOPED_ENTRY_TURN_SQL: ("entry_turn_inventory", "(SELECT e.turn_id FROM entries AS e WHERE e.id = $2)"),
}
# The entry's read function as migration 14 replaces it: the turn of the id
# within the caller's scope (``ENTRY_TURN_SQL``), its channel and actor as two
# more arguments ($7, $8), NULL when the scope does not name them.
_PG_ARGUMENTS = "(text, text, bytea, text, text, text)"
_PG_SCOPED_ARGUMENTS = "(text, text, bytea, text, text, text, text, text)"
_PG_SCOPED_TURN = (
    "(SELECT e.turn_id FROM entries AS e WHERE e.id = {id} AND e.owner_user_id = $1"
    " AND e.channel = COALESCE($7, e.channel) AND e.actor = COALESCE($8, e.actor))"
)
# The function a read by id calls, by the turn expression of its statement.
_PG_CALLS = {
    "?": "SELECT * FROM turn_inventory(?, ?, ?, ?, ?, ?)",
    ENTRY_TURN_SQL: "SELECT * FROM entry_turn_inventory(?, ?, ?, ?, ?, ?, ?, ?)",
}


def _numbered(sql: str) -> str:
    """``?`` placeholders as PL/pgSQL's ``$1``, ``$2``... in order."""
    pieces = sql.split("?")
    return "".join(piece + (f"${index}" if index < len(pieces) else "") for index, piece in enumerate(pieces, 1))


def pg_read_functions() -> dict[str, str]:
    """The functions a warm PostgreSQL read calls (name -> its ``CREATE
    FUNCTION`` and ``REVOKE``), for the schema's migration 10; the caller
    grants EXECUTE to the application role."""
    statement = _PG_INVENTORY_SQL.replace("{token}", _PG_FRESHNESS)
    return {
        name: _PG_READ_FUNCTION.format(name=name, warm_turn=warm_turn, statement=_numbered(statement.format(turn=turn)))
        for turn, (name, warm_turn) in _PG_FUNCTIONS.items()
    }


def pg_lean_read_functions() -> dict[str, str]:
    """The same functions with the lean statement first (name -> its ``CREATE
    OR REPLACE FUNCTION`` and ``REVOKE``), for the schema's migration 13: same
    signature, settings and owner; the caller grants EXECUTE again."""
    statement = _PG_INVENTORY_SQL.replace("{token}", _PG_FRESHNESS)
    return {
        name: _PG_LEAN_READ_FUNCTION.format(
            name=name,
            warm_turn=warm_turn,
            lean=_numbered(_PG_LEAN.format(turn=turn)),
            statement=_numbered(statement.format(turn=turn)),
        )
        for turn, (name, warm_turn) in _PG_FUNCTIONS.items()
    }


def pg_scoped_read_functions() -> dict[str, str]:
    """The entry's read function with the turn of the id found within the
    caller's scope (name -> its ``DROP``, ``CREATE FUNCTION`` and ``REVOKE``),
    for the schema's migration 14: the lean function of migration 13 with
    ``ENTRY_TURN_SQL``'s condition and two more arguments (the channel and
    actor, or NULL); the caller grants EXECUTE again."""
    name = "entry_turn_inventory"
    turn = _PG_SCOPED_TURN.format(id="?")
    statement = _PG_INVENTORY_SQL.replace("{token}", _PG_FRESHNESS)
    create = _PG_LEAN_READ_FUNCTION.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION").replace(
        _PG_ARGUMENTS, _PG_SCOPED_ARGUMENTS
    )
    return {
        name: f"DROP FUNCTION {name}{_PG_ARGUMENTS};\n"
        + create.format(
            name=name,
            warm_turn=_PG_SCOPED_TURN.format(id="$2"),
            lean=_numbered(_PG_LEAN.format(turn=turn)),
            statement=_numbered(statement.format(turn=turn)),
        )
    }


class InventoryReads:
    """The statements of a store's turn reads and the tokens in their rows (one per ``Heads``)."""

    def __init__(self, db: Backend, cache: HeadCache) -> None:
        self._db = db
        self.cache = cache
        self._sqlite = db.dialect == "sqlite"
        if self._sqlite:
            stale, fresh = _SQLITE_STALE
            template = _INVENTORY_SQL.replace("{stale}", stale).replace("{fresh}", fresh)
            self._inventory = template.replace("{token}", _SQLITE_FRESHNESS.replace("{rows}", _SQLITE_ROWS))
            # With the cache off, no rows' text (nothing would keep it).
            self._bare = template.replace("{token}", _SQLITE_FRESHNESS.replace("{rows}", "NULL"))
        else:
            self._inventory = _PG_INVENTORY_SQL.replace("{token}", _PG_FRESHNESS)
            # With the cache off, PostgreSQL's statement computes no digest (nothing would keep it).
            self._bare = _PG_INVENTORY_SQL.replace("{token}", _PG_NO_FRESHNESS)

    def keep(self, scope: object, owner: str, turn_id: str, rows: Rows, head: Head) -> None:
        """Cache ``head``, verified from ``rows`` (a turn with a head only)."""
        token, _ = self.token(rows, turn_id)
        if token is not None and any(row["k"] == "h" and row["turn_id"] == turn_id for row in rows):
            self.cache.put(scope, owner, turn_id, token, head)

    def token(self, rows: Rows, turn_id: str) -> tuple[tuple[Any, ...] | None, bool]:
        """The freshness token in the rows' ``v`` row (None on PostgreSQL for a turn without
        head), and whether the statement found it the one sent (the inventory left out)."""
        for row in rows:
            if row["k"] == "v":
                same = bool(row["n"])
                if self._sqlite:
                    return (row["actor"], row["sealed"], row["channel"]), same
                if row["turn_id"] != turn_id or row["sealed"] is None:
                    return None, same
                return (row["turn_id"], bytes(row["sealed"]), row["actor"], row["channel"]), same
        return None, False

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
        inventory's. ``function``: on PostgreSQL with a token, a call of the read
        function (the same rows). ``kept``: False when nothing will cache it (no token)."""
        by_entry = turn == ENTRY_TURN_SQL
        found = entry_turn_params(value, scope or (("owner_user_id", owner),)) if by_entry else (value,)
        if self._sqlite:
            sent: Params = (None, None, None) if token is None else token
            statement = self._inventory if self.cache.enabled and kept else self._bare
            turn_params = (owner, *found, OWNER_HEAD, *(owner, *found) * 3, owner)
            return statement.format(turn=turn), (*sent, owner, *found, *turn_params)
        sealed, digest, snap = (None, None, None) if token is None else token[1:]
        params = (owner, *found, sealed, digest, snap, OWNER_HEAD)
        if not self.cache.enabled or not kept:
            return self._bare.format(turn=turn), params
        if function and token is not None:
            return _PG_CALLS[turn], (owner, value, sealed, digest, snap, OWNER_HEAD, *found[2:])
        return self._inventory.format(turn=turn), params


def without_token(rows: Rows) -> Rows:
    """The inventory without its token (which moves with any commit, of any turn)."""
    return [row for row in rows if row["k"] != "v"]
