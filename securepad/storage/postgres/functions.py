"""PostgreSQL's read of a turn on the server: the inventory statement and the
read functions the schema creates, which a warm read calls.

What their rows mean, and what a freshness token trusts, is said in
``tables.heads.reading`` and SECURITY.md ("Tampering: the turn heads").
"""

from __future__ import annotations

__all__ = [
    "ENTRY_TURN_SQL",
    "PG_CALLS",
    "PG_FRESHNESS",
    "PG_INVENTORY_SQL",
    "PG_NO_FRESHNESS",
    "pg_read_functions",
    "pg_scoped_read_functions",
]

# Each value sent once (``p``: owner, turn, the sent token's head, digest and
# snapshot); the turn's clear columns read by one scan per table (``inv``),
# computed only when the token's snapshot is not the one sent. The lean
# statement (``_PG_LEAN``) opens with the same two CTEs, so both read the
# turn's rows by the same plan, in the same order.
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
# SHA-256 over the inventory's rows, each as a row value's text (unambiguous;
# the expiry as its 8 bytes, exact whatever ``extra_float_digits`` says), one a
# line, in scan order: equal digests mean equal inventories, and a turn read in
# another order is only a miss.
_PG_DIGEST = (
    "(SELECT encode(sha256(convert_to(string_agg(ROW(r.k, r.id, r.n, float8send(r.expires_at), r.stored_bytes,"
    " r.actor, r.channel)::text, chr(10)), 'UTF8')), 'hex') FROM inv AS r)"
)
# The statement's snapshot, with the postmaster's start time and the cluster's
# identifier: equal to the cached one, no transaction has ended since in any
# database of this server lifetime, so no row can differ.
_PG_SNAPSHOT = (
    "concat_ws(' ', extract(epoch FROM pg_postmaster_start_time()), (pg_control_system()).system_identifier,"
    " pg_current_snapshot())"
)
# The token: the snapshot, the turn's head and the digest. When the snapshot is
# the one sent, head and digest are not evaluated (initplans in a CASE branch
# not taken); otherwise ``same`` says whether they are the ones sent. OFFSET 0:
# each expression is computed once, not once per use.
PG_FRESHNESS = (
    "SELECT t.turn_id, t.sealed, CASE WHEN t.sealed = p.sealed AND t.value = p.value THEN 1 ELSE 0 END AS same,"
    " t.value, t.snap FROM p, (SELECT s.turn_id, s.snap,"
    " CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT sealed FROM p) ELSE (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)) END AS sealed,"
    f" CASE WHEN s.snap = (SELECT snap FROM p) THEN (SELECT value FROM p) ELSE {_PG_DIGEST} END AS value"
    f" FROM (SELECT (SELECT turn FROM p) AS turn_id, {_PG_SNAPSHOT} AS snap OFFSET 0) AS s OFFSET 0) AS t"
)
# The warm read as a server-side function: the statement's plan makes the
# server open every scan at each execution though a warm read runs none, so
# the function compares the snapshot first and returns the token row alone
# when it is the one sent, else runs the statement
# (docs/decisions/0004-verified-inventory-cache.md). STABLE: one snapshot per
# call. SECURITY INVOKER: row-level security applies as to the statement. Its
# search_path is the migration's, whoever calls it. A migration is never
# edited: a change to these statements needs a new migration that replaces
# the functions (tests pin their text).
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
# A commit anywhere moves the snapshot, and most leave the turn alone: the
# lean function first runs a lean statement (the same CTEs, so the same rows
# in the same order, not materialized; the digest only when the head is the
# one sent). When head and digest are the ones sent it returns the row the
# statement would, with the new snapshot; otherwise it runs the statement.
_PG_LEAN = (
    _PG_TURN_ROWS.replace(" inv AS MATERIALIZED (", " inv AS NOT MATERIALIZED (")
    + " h AS MATERIALIZED (SELECT (SELECT turn FROM p) AS turn_id, (SELECT sealed FROM turn_heads"
    " WHERE owner_user_id = (SELECT owner FROM p) AND turn_id = (SELECT turn FROM p)) AS sealed)"
    f" SELECT h.turn_id, h.sealed, CASE WHEN h.sealed = (SELECT sealed FROM p) THEN {_PG_DIGEST} END AS value"
    " FROM h"
)
# The snapshot is computed once (it reads the control file), and is the lean answer's.
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
# The turn of one entry of the principal's scope (the channel and actor NULL
# when the scope does not name them). An id outside the scope finds no turn,
# exactly as an absent id, so the statement's work tells nothing of others' turns.
ENTRY_TURN_SQL = (
    "(SELECT turn_id FROM entries WHERE id = ? AND owner_user_id = ?"
    " AND channel = COALESCE(?, channel) AND actor = COALESCE(?, actor))"
)
# The read functions of schemas 14 and 17 by the turn expression of their
# statement: name, and the turn of the warm branch (their text stays what
# existing stores ran).
_UNSCOPED_ENTRY_TURN_SQL = "(SELECT turn_id FROM entries WHERE id = ?)"
_PG_FUNCTIONS = {
    "?": ("turn_inventory", "$2"),
    _UNSCOPED_ENTRY_TURN_SQL: ("entry_turn_inventory", "(SELECT e.turn_id FROM entries AS e WHERE e.id = $2)"),
}
# Schema 18's entry read function: the id's turn within the caller's scope,
# its channel and actor as two more arguments ($7, $8).
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


# The statement a read sends, whose text the functions run when the snapshot moved.
_STATEMENT = PG_INVENTORY_SQL.replace("{token}", PG_FRESHNESS)


def _numbered(sql: str) -> str:
    """``?`` placeholders as PL/pgSQL's ``$1``, ``$2``... in order."""
    pieces = sql.split("?")
    return "".join(piece + (f"${index}" if index < len(pieces) else "") for index, piece in enumerate(pieces, 1))


def _function(template: str, name: str, turn: str, warm_turn: str) -> str:
    """The read function ``name`` of ``template``, its statements reading ``turn`` (its warm branch: ``warm_turn``)."""
    lean, statement = (_numbered(sql.format(turn=turn)) for sql in (_PG_LEAN, _STATEMENT))
    return template.format(name=name, warm_turn=warm_turn, lean=lean, statement=statement)


def pg_read_functions(*, lean: bool = False) -> dict[str, str]:
    """Schema 14's read functions (``lean``: schema 17's, the lean statement first, with the same
    signature, settings and owner): name -> ``CREATE FUNCTION`` and ``REVOKE``."""
    template = _PG_LEAN_READ_FUNCTION if lean else _PG_READ_FUNCTION
    return {name: _function(template, name, turn, warm) for turn, (name, warm) in _PG_FUNCTIONS.items()}


def pg_scoped_read_functions() -> dict[str, str]:
    """Schema 18's entry read function (``DROP``, ``CREATE``, ``REVOKE``):
    schema 17's, with the id's turn found within the caller's scope."""
    name = "entry_turn_inventory"
    create = _PG_LEAN_READ_FUNCTION.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION").replace(
        _PG_ARGUMENTS, _PG_SCOPED_ARGUMENTS
    )
    turns = (_PG_SCOPED_TURN.format(id="?"), _PG_SCOPED_TURN.format(id="$2"))
    return {name: f"DROP FUNCTION {name}{_PG_ARGUMENTS};\n" + _function(create, name, *turns)}
