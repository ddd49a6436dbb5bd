"""Load-independent counts: a psycopg connection's round trips to the server,
and the statements SQLite compiles on an apsw connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import apsw
from psycopg import Connection

T = TypeVar("T")


class CountingConnection(Connection[Any]):
    """A psycopg connection that counts its waits for the server (round trips)."""

    waits = 0

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        CountingConnection.waits += 1
        return super().wait(gen, *args, **kwargs)


def trips(call: Callable[[], object]) -> int:
    """How many round trips ``call`` made on counting connections."""
    return counted(call)[1]


def counted(call: Callable[[], T]) -> tuple[T, int]:
    """What ``call`` returned, and how many round trips it made on counting connections."""
    before = CountingConnection.waits
    result = call()
    return result, CountingConnection.waits - before


def compiled(conn: apsw.Connection, call: Callable[[], object]) -> list[tuple[int, str | None, str | None]]:
    """What SQLite authorized while it compiled ``call``'s statements on ``conn``:
    (action, first and second argument) for each check, in order. SQLite asks
    its authorizer only while it compiles, so a statement taken from the
    statement cache and run as compiled adds nothing. Setting the authorizer
    expires every compiled statement: ``call`` runs once first, uncounted."""
    seen: list[tuple[int, str | None, str | None]] = []
    conn.set_authorizer(lambda action, first, second, *_: seen.append((action, first, second)) or apsw.SQLITE_OK)
    try:
        call()
        seen.clear()
        call()
    finally:
        conn.set_authorizer(None)
    return seen
