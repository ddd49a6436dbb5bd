"""The one module that reads the sealed tables (entries, segments, checkpoints, compaction marks).

A principal's reads go through ``Access``: the policy's scope is in the SQL
(``rows_sql``), the call carries ``owner=`` (PostgreSQL's row-level security),
and every row fetched is checked again (``authorized``), a read's first fetch
with its turn's head rows (``rows_beside``) and a re-fetch after an owner-key
rotation (``open_each``) included. The module's functions are the reads no
principal makes: a write's own checks, the segments of an authorized entry,
housekeeping.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from ..errors import IntegrityError, InvalidArgumentError
from ..keys.keystore import NEWEST_VERSION_SQL
from ..policy import Policy
from ..principal import Principal
from ..storage.base import Backend, Conn, Params, Rows

__all__ = [
    "ONLY_SEGMENT",
    "RECORD_ROW_OVERHEAD",
    "SEALED_TABLES",
    "Access",
    "Query",
    "audit_log",
    "check_principal",
    "quota_sql",
]

T = TypeVar("T")
# A scoped query of ``Access``: (table, columns, where, params, tail).
Query = tuple[str, str, str, Params, str]

# The tables whose rows a principal reaches; each has owner_user_id, actor, channel and id.
SEALED_TABLES = ("entries", "checkpoints", "compaction_marks")
# What authorize_row looks at, selected with every row.
_SCOPE_COLUMNS = "owner_user_id, actor, channel"

audit_log = logging.getLogger("securepad.audit")
# A library does not print: applications attach handlers to "securepad.audit" to keep the log.
audit_log.addHandler(logging.NullHandler())


def check_principal(principal: object) -> Principal:
    """Raises InvalidArgumentError unless ``principal`` is a ``Principal``."""
    if not isinstance(principal, Principal):
        raise InvalidArgumentError("principal must be a securepad.Principal")
    return principal


def _table(table: str) -> str:
    if table not in SEALED_TABLES:
        raise ValueError(f"unknown sealed table {table!r}")
    return table


class Access:
    """Scoped, re-checked queries of the sealed tables for one store."""

    def __init__(self, db: Backend, policy: Policy) -> None:
        self._db = db
        self.policy = policy

    def rows(
        self,
        principal: Principal,
        table: str,
        columns: str,
        where: str,
        params: Params = (),
        tail: str = "",
        tail_params: Params = (),
        *,
        conn: Conn | None = None,
    ) -> Rows:
        """``SELECT columns FROM table WHERE where AND <scope> tail`` (``tail_params``
        with ``tail``), inside the caller's transaction with ``conn``; each row re-checked.

        Raises:
            NotFoundError: a row outside the principal's scope (the query let it through).
        """
        sql, args = self.rows_sql(principal, table, columns, where, params, tail, tail_params)
        rows = conn.query(sql, args) if conn is not None else self._db.query(sql, args, owner=principal.owner_user_id)
        return self.authorized(principal, rows)

    def authorized(self, principal: Principal, rows: Rows) -> Rows:
        """The owner check of every row a read fetched: ``rows``, each within the principal's scope.

        Raises:
            NotFoundError: a row outside the scope.
        """
        for row in rows:
            self.policy.authorize_row(principal, row)
        return rows

    def rows_sql(
        self,
        principal: Principal,
        table: str,
        columns: str,
        where: str,
        params: Params = (),
        tail: str = "",
        tail_params: Params = (),
    ) -> tuple[str, Params]:
        """The SQL and parameters that ``rows`` runs (for ``Conn.prefetch``)."""
        check_principal(principal)
        scope, scope_params = self.policy.scope_sql(principal)
        sql = f"SELECT {_SCOPE_COLUMNS}, {columns} FROM {_table(table)} WHERE {where} AND {scope} {tail}"
        return sql, (*params, *scope_params, *tail_params)

    def rows_beside(self, principal: Principal, head: tuple[str, Params], *queries: Query) -> tuple[list[Rows], Rows]:
        """A read's first fetch: each scoped query (as ``rows``) and the head's
        statement ``head`` together (one round trip on PostgreSQL).

        Raises:
            NotFoundError: a row outside the principal's scope.
        """
        *scoped, head_rows = self._db.queries(
            *(self.rows_sql(principal, *query) for query in queries), head, owner=principal.owner_user_id
        )
        return [self.authorized(principal, rows) for rows in scoped], head_rows

    def open_each(
        self,
        principal: Principal,
        table: str,
        columns: str,
        rows: Iterable[dict[str, Any]],
        opener: Callable[[dict[str, Any]], T],
    ) -> Iterator[T]:
        """Each row authorized again and opened by ``opener``, lazily. When opening
        fails (a rotation may have re-wrapped it meanwhile), the row is fetched
        again by id in the scope and opened if it came back with another key version.

        Raises:
            NotFoundError: a row outside the principal's scope.
            IntegrityError: a row fails authentication.
        """
        authorize = self.policy.authorize_row  # ``authorized``'s check, a row at a time
        for row in rows:
            authorize(principal, row)
            try:
                opened = opener(row)
            except IntegrityError:
                again = self.rows(principal, table, columns, "id = ?", (row["id"],))
                if len(again) != 1 or again[0]["key_version"] == row["key_version"]:
                    raise
                opened = opener(again[0])
            yield opened

    def delete(self, conn: Conn, principal: Principal, table: str, row_id: str) -> int:
        """Delete one row of the principal's scope inside the caller's transaction; how many went."""
        check_principal(principal)
        scope, params = self.policy.scope_sql(principal)
        return conn.execute(f"DELETE FROM {_table(table)} WHERE id = ? AND {scope}", (row_id, *params))

    def aggregate(
        self, principal: Principal, table: str, expressions: str, where: str, params: Params = ()
    ) -> dict[str, Any]:
        """One row of aggregates (``COUNT``, ``SUM``...) over the principal's scope."""
        check_principal(principal)
        scope, scope_params = self.policy.scope_sql(principal)
        rows = self._db.query(
            f"SELECT {expressions} FROM {_table(table)} WHERE {where} AND {scope}",
            (*params, *scope_params),
            owner=principal.owner_user_id,
        )
        return rows[0]

    def denied(self, principal: Principal, what: str) -> None:
        """Log a refused access when the policy asks for it."""
        if self.policy.log_denied:
            audit_log.warning(
                "denied: owner=%r actor=%r channel=%r id=%r",
                principal.owner_user_id,
                principal.actor,
                principal.channel,
                what[:64],
            )


# -- the reads no principal makes ----------------------------------------------------------

# A one-segment entry's segment: in its row (schema 8 on), or in segments (rows written before).
ONLY_SEGMENT = (
    "COALESCE(only_segment, (SELECT data FROM segments WHERE segments.entry_id = entries.id AND segments.seq = 0))"
)
# What a record's row costs on disk besides its sealed bytes and clear
# identifiers (its other clear columns, its indexes' cells).
RECORD_ROW_OVERHEAD = 256
# A record's clear identifiers as UTF-8 bytes, weighted in halves: each once in
# the row; the id, the owner and turn again in the indexes (the owner once more
# on PostgreSQL), index keys counted one and a half times (pages split half full).
RECORD_IDENTIFIER_WEIGHTS = (("id", 5), ("owner_user_id", 8), ("turn_id", 5), ("actor", 2), ("channel", 2))
_IDENTIFIERS_SQL = (
    "(" + " + ".join(f"octet_length({column}) * {weight}" for column, weight in RECORD_IDENTIFIER_WEIGHTS) + ") / 2"
)
_RECORD_TABLES = SEALED_TABLES[1:]


def segments(db: Backend, entry_id: str, owner: str, first: int, last: int) -> Rows:
    """Segments ``first`` to ``last`` of an entry the caller authorized."""
    return db.query(
        "SELECT seq, data FROM segments WHERE entry_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (entry_id, first, last),
        owner=owner,
    )


def only_segment(db: Backend, entry_id: str, owner: str) -> Rows:
    """The sealed segment of a one-segment entry the caller authorized, wherever it is kept."""
    return db.query(
        f"SELECT {ONLY_SEGMENT} AS data FROM entries WHERE id = ? AND owner_user_id = ?", (entry_id, owner), owner=owner
    )


def stored_sql(table: str, owner: str, row_id: str) -> tuple[str, Params]:
    """Whether a row of the owner is stored (a write whose COMMIT's answer was lost)."""
    return f"SELECT id FROM {_table(table)} WHERE id = ? AND owner_user_id = ?", (row_id, owner)


def stored_entries(conn: Conn, owner: str, ids: list[str]) -> Rows:
    """Which of the owner's entries ``ids`` are stored (a batch whose COMMIT's answer was lost)."""
    return conn.query(
        f"SELECT id FROM entries WHERE owner_user_id = ? AND id IN ({', '.join('?' * len(ids))})", (owner, *ids)
    )


def last_record_seq(db: Backend, table: str, owner: str, turn_id: str) -> int:
    """The highest sequence number of a turn's records (0 for none)."""
    return int(
        db.query(
            f"SELECT COALESCE(MAX(seq), 0) AS seq FROM {_table(table)} WHERE owner_user_id = ? AND turn_id = ?",
            (owner, turn_id),
            owner=owner,
        )[0]["seq"]
    )


def live_entry_bytes(conn: Conn, owner: str, now: float) -> int:
    """What the owner's live entries cost (their ``stored_bytes``), inside its write transaction."""
    rows = conn.query(
        "SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS used FROM entries"
        " WHERE owner_user_id = ? AND expires_at > ?",
        (owner, now),
    )
    return int(rows[0]["used"])


def records_used_sql(owner: str, now: float) -> tuple[str, Params]:
    """What the owner's live records cost on disk, as one SQL expression and its
    parameters (for the statement that reads the rest of the quota)."""
    parts = " UNION ALL ".join(
        f"SELECT length(sealed) + length(wrapped_key) + {_IDENTIFIERS_SQL} AS n FROM {table}"
        " WHERE owner_user_id = ? AND expires_at > ?"
        for table in _RECORD_TABLES
    )
    sql = f"(SELECT CAST(COALESCE(SUM(n + {RECORD_ROW_OVERHEAD}), 0) AS BIGINT) FROM ({parts}) AS records)"
    return sql, tuple(value for _ in _RECORD_TABLES for value in (owner, now))


def quota_sql(
    owner: str, now: float, step: tuple[str, Params] | None = None, *, records: bool = True
) -> tuple[str, Params]:
    """``room``'s one query: the owner's newest key version, its live records'
    cost (``used``; NULL without ``records``: the shared lock checks no quota)
    and with ``step``, the latest expiry of the entries at the step."""
    params = tuple(value for _ in _RECORD_TABLES for value in (owner, now)) if records else ()
    if step is None:
        return _quota_text(records, None), (owner, *params)
    return _quota_text(records, step[0]), (owner, *params, *step[1])


@functools.lru_cache(maxsize=64)
def _quota_text(records: bool, step: str | None) -> str:
    """``quota_sql``'s statement (composed once per shape: every put sends one)."""
    used = records_used_sql("", 0.0)[0] if records else "NULL"
    sql = f"SELECT {NEWEST_VERSION_SQL} AS newest, {used} AS used"
    return sql if step is None else f"{sql}, (SELECT MAX(expires_at) FROM ({step}) AS taken) AS step_expires"


def segments_in_rows(conn: Conn, where: str, params: Params) -> int:
    """How many entries matching ``where`` keep their one segment in their row."""
    return int(
        conn.query(f"SELECT COUNT(*) AS n FROM entries WHERE {where} AND only_segment IS NOT NULL", params)[0]["n"]
    )


def every_row(db: Backend, table: str, columns: str, order: str) -> Rows:
    """Every row of a sealed table, in ``order`` (housekeeping: ``verify``)."""
    return db.query(f"SELECT {_SCOPE_COLUMNS}, {columns} FROM {_table(table)} ORDER BY {order}", admin=True)


def store_totals(db: Backend, now: float) -> dict[str, Any]:
    """The store-wide entry counts and sizes at ``now`` (``Scratchpad.stats``)."""
    return db.query(
        "SELECT COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
        " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes,"
        " COUNT(DISTINCT owner_user_id) AS owners,"
        " COUNT(CASE WHEN expires_at <= ? THEN 1 END) AS expired_pending_gc FROM entries",
        (now,),
        admin=True,
    )[0]


def below_version(db: Backend, table: str, columns: str, owner: str, version: int) -> Rows:
    """The owner's rows of ``table`` under a key version below ``version`` (rotation)."""
    return db.query(
        f"SELECT {columns} FROM {_table(table)} WHERE owner_user_id = ? AND key_version < ?",
        (owner, version),
        owner=owner,
        admin=True,
    )


def count_below_sql(table: str, owner: str, version: int) -> tuple[str, Params]:
    """How many of the owner's rows of ``table`` are under a key version below ``version``."""
    return f"SELECT COUNT(*) AS n FROM {_table(table)} WHERE owner_user_id = ? AND key_version < ?", (owner, version)


def by_ids(db: Backend, table: str, columns: str, ids: list[str], owner: str) -> Rows:
    """Rows of ``table`` by primary key only (the caller checks owner and version: rotation)."""
    return db.query(
        f"SELECT {columns} FROM {_table(table)} WHERE id IN ({', '.join('?' * len(ids))})",
        tuple(ids),
        owner=owner,
        admin=True,
    )


def wrapping_of(db: Backend, table: str, row_id: str, owner: str) -> Rows:
    """A row's key version and wrapped key as they are now (rotation)."""
    return db.query(
        f"SELECT key_version, wrapped_key FROM {_table(table)} WHERE id = ?", (row_id,), owner=owner, admin=True
    )
