"""A psycopg connection that counts its round trips to the server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
