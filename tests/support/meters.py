"""What a call sends and fetches, counted: the tests' and the benchmarks' meter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from securepad import Scratchpad
from securepad.store import parts

__all__ = ["ReadMeter"]


class ReadMeter:
    """Statements, rows and calls to the database (round trips on PostgreSQL)
    of the calls made while it counts: it wraps the store's ``query`` and
    ``queries`` (one statement each on SQLite, one message on PostgreSQL)."""

    def __init__(self, pad: Scratchpad) -> None:
        self.statements = self.rows = self.calls = 0
        self._depth = 0
        db = parts(pad).db
        query, queries = db.query, db.queries

        def counted_queries(*statements: tuple[str, Any], **kwargs: Any) -> list[Any]:
            return self._count(lambda: queries(*statements, **kwargs), len(statements))

        def counted_query(sql: str, params: Any = (), **kwargs: Any) -> Any:
            return self._count(lambda: [query(sql, params, **kwargs)], 1)[0]

        db.queries = counted_queries  # type: ignore[method-assign]
        db.query = counted_query  # type: ignore[method-assign]

    def _count(self, call: Callable[[], list[Any]], statements: int) -> list[Any]:
        self._depth += 1
        try:
            results = call()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self.calls += 1
            self.statements += statements
            self.rows += sum(len(rows) for rows in results)
        return results

    def counts(self, call: Callable[[], Any]) -> dict[str, int]:
        """What ``call`` sent and fetched."""
        before = (self.statements, self.rows, self.calls)
        call()
        return {
            "statements": self.statements - before[0],
            "rows": self.rows - before[1],
            "calls": self.calls - before[2],
        }
