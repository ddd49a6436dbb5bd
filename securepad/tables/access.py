"""The one authorized access path to the sealed tables.

Every read, listing, resolve, delete, stats and record fetch of a principal
goes through ``Access``: the policy's scope is part of the SQL, the call
carries ``owner=`` (PostgreSQL's row-level security), each fetched row is
checked against the scope again, and the re-fetch after a possible owner-key
rotation (``open_each``) stays inside the same scope and re-checks the row it
gets. The policy decides who may see what (``Policy.scope_columns``); this
module is where that decision is enforced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from ..errors import IntegrityError, InvalidArgumentError
from ..policy import Policy
from ..principal import Principal
from ..storage.base import Backend, Conn, Params, Rows

__all__ = ["SEALED_TABLES", "Access", "audit_log", "check_principal"]

T = TypeVar("T")

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
        """``SELECT columns FROM table WHERE where AND <scope> tail``, each row re-checked.

        ``params`` go with ``where``, ``tail_params`` with ``tail`` (ORDER BY,
        LIMIT). ``conn`` runs the query inside the caller's write transaction.

        Raises:
            NotFoundError: a row outside the principal's scope (the query let it through).
        """
        sql, args = self.rows_sql(principal, table, columns, where, params, tail, tail_params)
        rows = conn.query(sql, args) if conn is not None else self._db.query(sql, args, owner=principal.owner_user_id)
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

    def open_each(
        self,
        principal: Principal,
        table: str,
        columns: str,
        rows: Iterable[dict[str, Any]],
        opener: Callable[[dict[str, Any]], T],
    ) -> Iterator[T]:
        """Each row (from ``rows``) authorized again and opened by ``opener``, as the caller gets to it.

        When opening fails, an owner-key rotation may have re-wrapped the row
        and retired its old key between the two queries: the row is fetched
        once more, by id within the principal's scope, re-checked, and opened
        if (and only if) exactly one row came back with another key version.

        Raises:
            NotFoundError: a row outside the principal's scope.
            IntegrityError: a row fails authentication.
        """
        for row in rows:
            self.policy.authorize_row(principal, row)
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
