"""The turn listings: a turn's live entries, whether one was offloaded, its
highest step, whether a step is free; rows through ``access.Access``, opened by ``Opener.lister``."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...core.timeline import live
from ...errors import IntegrityError, InvalidArgumentError
from ...principal import Principal, check_identifier, check_step_num
from ...storage.base import Conn, Params, Rows
from ..access import Access, check_principal
from ..heads.heads import Head
from .open import COLUMNS, LISTED_COLUMNS, EntryParts, Opened, Opener, check_row_types

__all__ = ["Listings", "step_look"]

# check_step_free's columns and condition (turn, step).
_STEP_QUERY = ("expires_at", "turn_id = ? AND step_num = ?")
# A turn's rows come in its index's order, (step, id); a listing's order puts
# the entries of one step (other actors' or channels') in creation order
# (``_in_listing_order``), as SQL's sorter would, for few instructions a row.
_IN_STEP_ORDER = "ORDER BY step_num, id"
_LISTING_ORDER = operator.itemgetter("step_num", "created_at", "id")
_STEP = operator.itemgetter("step_num")
# The turn's format-1 rows (written before the listing part), every column.
_FORMAT_ONE = "turn_id = ? AND sealed_listing IS NULL"


class Listings:
    """The turn listings of one store."""

    def __init__(self, parts: EntryParts, opener: Opener) -> None:
        self._db, self._access = parts.db, parts.access
        self.heads, self.now = parts.heads, parts.timeline.read_time
        self._lister = opener.lister

    def turn_entries(self, principal: Principal, turn_id: str, now: float | None) -> list[Opened]:
        """The live entries of a turn in the principal's scope, authenticated, in
        step order, checked against the turn's head."""
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.now(now)
        order = _IN_STEP_ORDER

        def fetch(rows: Rows | None = None) -> list[Opened]:
            if rows is None:
                rows = self._access.rows(principal, "entries", LISTED_COLUMNS, "turn_id = ?", (turn_id,), order)
            return list(self._authenticate_rows(principal, turn_id, _in_listing_order(live(rows, current))))

        def check(head: Head, opened: list[Opened]) -> None:
            self.heads.checks.check_entries_in(head, principal, turn_id, [each.row for each in opened], current)

        # The turn's rows and its head rows: one round trip on PostgreSQL.
        head_sql = self.heads.read_sql(principal.owner_user_id, turn_id)
        (rows,), head_rows = self._access.rows_beside(
            principal, head_sql, ("entries", LISTED_COLUMNS, "turn_id = ?", (turn_id,), order)
        )
        return self.heads.inventories.checked(
            principal.owner_user_id, turn_id, fetch, check, first=(fetch(rows), head_rows)
        )

    def turn_newest_first(self, principal: Principal, turn_id: str, now: float | None) -> Iterator[Opened]:
        """The live entries of a turn in the principal's scope, highest step first,
        each authenticated and opened only when the caller reaches it: a caller
        that wants the newest few opens those alone. The whole turn's rows are
        checked against its head before the first is opened (one fetch beside
        the head's rows, as ``turn_entries``), so an entry removed, rolled back
        or served as expired anywhere in the turn is refused all the same.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: the turn's rows are not the ones its head lists, or
                an entry reached fails authentication.
        """
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.now(now)
        order = "ORDER BY step_num DESC, id DESC"

        def fetch(rows: Rows | None = None) -> list[dict[str, Any]]:
            if rows is None:
                rows = self._access.rows(principal, "entries", LISTED_COLUMNS, "turn_id = ?", (turn_id,), order)
            return live(rows, current)

        def check(head: Head, rows: list[dict[str, Any]]) -> None:
            self.heads.checks.check_entries_in(head, principal, turn_id, rows, current)

        head_sql = self.heads.read_sql(principal.owner_user_id, turn_id)
        (rows,), head_rows = self._access.rows_beside(
            principal, head_sql, ("entries", LISTED_COLUMNS, "turn_id = ?", (turn_id,), order)
        )
        checked = self.heads.inventories.checked(
            principal.owner_user_id, turn_id, fetch, check, first=(fetch(rows), head_rows)
        )
        return self._authenticate_rows(principal, turn_id, checked)

    def turn_offloads(self, principal: Principal, turn_id: str, now: float | None) -> bool:
        """Whether a live entry of the turn in the principal's scope was offloaded
        (no ``inline`` item): newest first, in doubling pages, until one is; the
        rows looked at are checked against the turn's head."""
        current = self.now(now)

        def fetch() -> tuple[bool, list[dict[str, Any]]]:
            seen = []
            rows = self._newest_first(principal, turn_id, LISTED_COLUMNS, now)
            for opened in self._authenticate_rows(principal, turn_id, rows):
                seen.append(opened.row)
                if "inline" not in opened.meta:
                    return True, seen
            return False, seen

        def check(head: Head, fetched: tuple[bool, list[dict[str, Any]]]) -> None:
            found, seen = fetched
            self.heads.checks.check_newest_first(head, principal, turn_id, seen, current, complete=not found)

        return self.heads.inventories.checked(principal.owner_user_id, turn_id, fetch, check)[0]

    def _newest_first(
        self, principal: Principal, turn_id: str, columns: str, now: float | None, conn: Conn | None = None
    ) -> Iterator[dict[str, Any]]:
        """The turn's live rows in the principal's scope, highest step first, in doubling pages."""
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.now(now)
        offset, size = 0, 8
        while True:
            # (step_num, id) follows entries_owner_turn, so a page reads only its own rows.
            rows = self._access.rows(
                principal,
                "entries",
                columns,
                "turn_id = ?",
                (turn_id,),
                "ORDER BY step_num DESC, id DESC LIMIT ? OFFSET ?",
                (size, offset),
                conn=conn,
            )
            yield from live(rows, current)
            if len(rows) < size:
                return
            offset, size = offset + size, size * 2

    def _authenticate_rows(
        self, principal: Principal, turn_id: str, rows: Iterable[dict[str, Any]]
    ) -> Iterator[Opened]:
        """Each row authorized again and opened as a listing shows it (``Access.open_each``)."""
        return self._access.open_each(
            principal, "entries", COLUMNS, rows, self._lister(self._format_one(principal, turn_id))
        )

    def _format_one(self, principal: Principal, turn_id: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A format-1 row with every column (its item key and metadata, which a
        listing does not select): the turn's format-1 rows in the principal's
        scope, fetched when the first is reached (one statement; none for a turn
        without them). Each must hold the values of the row listed, which is the
        one checked against the turn's head.

        The function raises IntegrityError when the row is gone or differs.
        """
        found: dict[str, dict[str, Any]] = {}

        def whole(row: dict[str, Any]) -> dict[str, Any]:
            if "wrapped_key" in row:  # fetched whole already (``open_each``'s fetch again by id)
                return row
            if not found:
                rows = self._access.rows(principal, "entries", COLUMNS, _FORMAT_ONE, (turn_id,))
                found.update((each["id"], each) for each in rows)
            full = found.get(row["id"])
            if full is None or any(full[column] != value for column, value in row.items()):
                raise IntegrityError(f"entry {row['id']} changed while its turn was listed")
            return full

        return whole

    def last_step(self, principal: Principal, turn_id: str, now: float | None, conn: Conn | None = None) -> int:
        """The highest step of the turn's live entries in the principal's scope,
        0 for none (a clear column: only a proposal); outside a write (``conn``)
        checked against the turn's head.

        Raises:
            IntegrityError: a clear step or expiry that is not a number, or a
                newest step that is not the head's.
        """
        if conn is not None:  # a write's guess, checked by the write itself
            for row in self._newest_first(principal, turn_id, "step_num, expires_at", now, conn):
                check_row_types({"step_num": row["step_num"]})
                return int(row["step_num"])
            return 0

        def fetch() -> dict[str, Any] | None:
            return next(self._newest_first(principal, turn_id, "id, step_num, expires_at", now), None)

        newest = self.heads.checked_last(principal, turn_id, fetch, self.now(now))
        if newest is None:
            return 0
        check_row_types({"step_num": newest["step_num"]})
        return int(newest["step_num"])

    def check_step_free(
        self,
        principal: Principal,
        turn_id: str,
        step_num: int,
        now: float | None,
        conn: Conn | None = None,
        taken: list[dict[str, Any]] | None = None,
    ) -> None:
        """Refuse a step a live entry of the turn in the principal's scope has
        (inside the put's write transaction with ``conn``); ``taken``: the
        lookup's rows when the caller, which checked its arguments, ran it already.

        Raises:
            InvalidArgumentError: a bad principal, turn id or step, or the step is taken.
        """
        rows = taken
        if rows is None:
            check_principal(principal)
            check_identifier("turn_id", turn_id)
            check_step_num(step_num)
            rows = self._access.rows(principal, "entries", *_STEP_QUERY, (turn_id, step_num), conn=conn)
        if live(rows, self.now(now)):
            raise InvalidArgumentError(f"step {step_num} is already recorded in turn {turn_id!r}")


def _in_listing_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (in (step, id) order) in a listing's order: step, creation, id.

    Raises:
        IntegrityError: a clear step or creation time that is not a number.
    """
    if len(set(map(_STEP, rows))) == len(rows):  # no step twice: the order is the steps'
        return rows
    try:
        rows.sort(key=_LISTING_ORDER)
    except TypeError:
        raise IntegrityError("the entry's clear step or creation time has the wrong type") from None
    return rows


def step_look(access: Access, principal: Principal) -> tuple[str, Params]:
    """``check_step_free``'s query for ``principal`` (for ``Conn.prefetch``): its SQL, the same
    for every turn and step, and the scope's parameters, which follow the turn's and the step's."""
    return access.rows_sql(principal, "entries", *_STEP_QUERY)
