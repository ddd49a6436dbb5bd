"""The store's prepared statements a PostgreSQL test's call ran, counted by the
server (``pg_prepared_statements``) on the one connection of the test's pool:
what a call runs, whatever the machine's load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg_pool import ConnectionPool


def runs(pool: ConnectionPool[Any]) -> dict[str, tuple[int, str]]:
    """name -> (times run, text) of the store's prepared statements on the pool's one connection."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT name, generic_plans + custom_plans, statement FROM pg_prepared_statements"
            " WHERE name LIKE 'securepad_%'"
        ).fetchall()
    return {name: (count, text) for name, count, text in rows}


def ran(pool: ConnectionPool[Any], call: Callable[[], object]) -> list[str]:
    """The texts of the prepared statements ``call()`` ran, each as often as it ran, sorted."""
    before = runs(pool)
    call()
    after = runs(pool)
    return sorted(text for name, (count, text) in after.items() for _ in range(count - before.get(name, (0, ""))[0]))
