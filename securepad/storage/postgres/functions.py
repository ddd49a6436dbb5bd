"""PostgreSQL's read of a turn on the server: the inventory statement and the
read functions the schema creates (``storage.schema``), which a warm read calls.

``tables.heads.reading`` sends these statements and calls these functions; what
their rows mean, and what a freshness token trusts, is said there and in
SECURITY.md ("Tampering: the turn heads").
"""

from __future__ import annotations

__all__ = [
    "ENTRY_TURN_SQL",
    "PG_CALLS",
    "PG_FRESHNESS",
    "PG_INVENTORY_SQL",
    "PG_NO_FRESHNESS",
    "pg_lean_read_functions",
    "pg_read_functions",
    "pg_scoped_read_functions",
]

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
PG_INVENTORY_SQL = (
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
# Other ways to write it (a bytea concatenation with length prefixes,
# ``record_send``, ``concat_ws``) cost the server the same within the noise
# (docs/performance.md); reading the rows is a quarter of it.
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
PG_FRESHNESS = (
    "SELECT t.turn_id, t.sealed, CASE WHEN t.sealed = p.sealed AND t.value = p.value THEN 1 ELSE 0 END AS same,"
    " t.value, t.snap FROM p, (SELECT s.turn_id, s.snap,"
    " CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT sealed FROM p) ELSE (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)) END AS sealed,"
    f" CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT value FROM p) ELSE {_PG_DIGEST} END AS value"
    f" FROM (SELECT (SELECT turn FROM p) AS turn_id, {_PG_SNAPSHOT} AS snap OFFSET 0) AS s OFFSET 0) AS t"
)
# The warm read as a server-side function (schema 14
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
# migration's), so its names never resolve elsewhere whoever calls it; the
# clause costs no server CPU measurable per call (docs/how-to/postgresql.md).
# A migration is never edited: a change to the statements above needs a new
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
# (docs/decisions/0004-verified-inventory-cache.md). Schema 17 replaces
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
# The snapshot is computed once (it reads the control file, ~10 us), before
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
PG_NO_FRESHNESS = (
    "SELECT NULL::text AS turn_id, NULL::bytea AS sealed, 0 AS same, NULL::text AS value, NULL::text AS snap"
)
# The turn of one entry of the principal's scope (``entry_select_sql``, a read
# or delete by id): the id, the owner, and the channel and actor when the
# policy's scope names them (NULL otherwise: ``entry_turn_params``). Another
# owner's id, or one outside the scope, finds no turn, exactly as an absent id:
# the statement then reads the owner's heads alone, whatever turn the id is
# of, so its work tells nothing of another owner's turn names.
ENTRY_TURN_SQL = (
    "(SELECT turn_id FROM entries WHERE id = ? AND owner_user_id = ?"
    " AND channel = COALESCE(?, channel) AND actor = COALESCE(?, actor))"
)
# What schemas 14 and 17 built the entry's read function from (the turn of
# an id whoever its owner; row-level security held it to the owner's rows):
# kept so that their text stays what existing stores ran.
_UNSCOPED_ENTRY_TURN_SQL = "(SELECT turn_id FROM entries WHERE id = ?)"
# The read functions by the turn expression of their statement (the turn
# given, or the turn of an entry), as schemas 14 and 17 created them: name,
# and the turn of the warm branch.
_PG_FUNCTIONS = {
    "?": ("turn_inventory", "$2"),
    _UNSCOPED_ENTRY_TURN_SQL: ("entry_turn_inventory", "(SELECT e.turn_id FROM entries AS e WHERE e.id = $2)"),
}
# The entry's read function as schema 18 replaces it: the turn of the id
# within the caller's scope (``ENTRY_TURN_SQL``), its channel and actor as two
# more arguments ($7, $8), NULL when the scope does not name them.
_PG_ARGUMENTS = "(text, text, bytea, text, text, text)"
_PG_SCOPED_ARGUMENTS = "(text, text, bytea, text, text, text, text, text)"
_PG_SCOPED_TURN = (
    "(SELECT e.turn_id FROM entries AS e WHERE e.id = {id} AND e.owner_user_id = $1"
    " AND e.channel = COALESCE($7, e.channel) AND e.actor = COALESCE($8, e.actor))"
)
# The function a read by id calls, by the turn expression of its statement.
PG_CALLS = {
    "?": "SELECT * FROM turn_inventory(?, ?, ?, ?, ?, ?)",
    ENTRY_TURN_SQL: "SELECT * FROM entry_turn_inventory(?, ?, ?, ?, ?, ?, ?, ?)",
}


def _numbered(sql: str) -> str:
    """``?`` placeholders as PL/pgSQL's ``$1``, ``$2``... in order."""
    pieces = sql.split("?")
    return "".join(piece + (f"${index}" if index < len(pieces) else "") for index, piece in enumerate(pieces, 1))


def pg_read_functions() -> dict[str, str]:
    """The functions a warm PostgreSQL read calls (name -> its ``CREATE
    FUNCTION`` and ``REVOKE``), for schema 14; the caller
    grants EXECUTE to the application role."""
    statement = PG_INVENTORY_SQL.replace("{token}", PG_FRESHNESS)
    return {
        name: _PG_READ_FUNCTION.format(name=name, warm_turn=warm_turn, statement=_numbered(statement.format(turn=turn)))
        for turn, (name, warm_turn) in _PG_FUNCTIONS.items()
    }


def pg_lean_read_functions() -> dict[str, str]:
    """The same functions with the lean statement first (name -> its ``CREATE
    OR REPLACE FUNCTION`` and ``REVOKE``), for schema 17: same
    signature, settings and owner; the caller grants EXECUTE again."""
    statement = PG_INVENTORY_SQL.replace("{token}", PG_FRESHNESS)
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
    for schema 18: the lean function of schema 17 with
    ``ENTRY_TURN_SQL``'s condition and two more arguments (the channel and
    actor, or NULL); the caller grants EXECUTE again."""
    name = "entry_turn_inventory"
    turn = _PG_SCOPED_TURN.format(id="?")
    statement = PG_INVENTORY_SQL.replace("{token}", PG_FRESHNESS)
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
