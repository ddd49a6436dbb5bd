"""PostgreSQL's roles and schema, and the one migration list (``storage.schema``)
applied under an advisory lock: one migration at a time per database."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from ...errors import SecurepadError
from .. import schema
from ..schema import SCHEMA_VERSION
from .roles import ADMIN_ROLE, APP_ROLE

__all__ = ["ADMIN_ROLE", "APP_ROLE", "SCHEMA_VERSION", "lock_key", "migrate", "reason"]


@functools.lru_cache(maxsize=4096)
def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key (remembered: the same owners' and turns' keys at every transaction)."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def reason(exc: BaseException) -> str:
    """The exception's message on one line (psycopg's span several), or its class name."""
    return " ".join(str(exc).split()) or type(exc).__name__


def migrate(
    schema_name: str, app_version: Callable[[], int | None], admin_pool: Callable[[], ConnectionPool[Any]]
) -> tuple[int, int] | None:
    """Create the roles and schema when missing, then bring the tables to SCHEMA_VERSION
    (a store already there opens with the application role alone). Returns
    (old, new) when an existing store was upgraded, else None.

    Raises:
        SecurepadError: the store is newer than this code, or cannot be set up.
    """
    version = app_version()
    if version == SCHEMA_VERSION:
        return None
    if version is not None:
        schema.check_known(version, SCHEMA_VERSION)
    pool = admin_pool()
    try:
        with pool.connection() as conn, conn.transaction():
            _roles_and_schema(conn, schema_name)
            version = _stored_version(conn)
            for target, sql in schema.steps(schema.POSTGRES, version, SCHEMA_VERSION):
                conn.execute(sql)
                # Never prepared: psycopg prepares a statement on its sixth run, and
                # behind a transaction pooler the name would outlive this server session.
                conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (target,), prepare=False)
            conn.execute(schema.MARK_SQL)
    except pg_errors.InsufficientPrivilege as exc:
        raise SecurepadError(
            f"cannot set up the store in schema {schema_name}: {reason(exc)}"
            " (see docs/how-to/postgresql.md for the roles and grants it needs)"
        ) from None
    except psycopg.Error as exc:
        raise SecurepadError(f"cannot set up the store in schema {schema_name}: {reason(exc)}") from None
    return (version, SCHEMA_VERSION) if 0 < version < SCHEMA_VERSION else None


def _roles_and_schema(conn: psycopg.Connection[Any], schema_name: str) -> None:
    """Under the migration lock: the two roles and the schema when missing, then
    the admin role and the schema as the transaction's role and search path."""
    # One migration at a time per database; roles are cluster-wide, so a racing creation is tolerated.
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("securepad-migrate"),))
    existing = {
        r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname IN (%s, %s)", (APP_ROLE, ADMIN_ROLE))
    }
    for role in (APP_ROLE, ADMIN_ROLE):
        if role not in existing:
            conn.execute(
                f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN NOBYPASSRLS;"
                " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            )
    if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema_name,)).fetchone() is None:
        conn.execute(f"CREATE SCHEMA {schema_name} AUTHORIZATION {ADMIN_ROLE}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema_name} TO {APP_ROLE}")
    conn.execute("SELECT set_config('role', %s, true), set_config('search_path', %s, true)", (ADMIN_ROLE, schema_name))
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)")
    conn.execute(f"GRANT SELECT ON schema_version TO {APP_ROLE}")


def _stored_version(conn: psycopg.Connection[Any]) -> int:
    """The store's version in the one list; a store numbered before it gets the
    rows of the one list's versions up to its own."""
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    stored = int(row[0]) if row is not None and row[0] is not None else 0
    marked = stored > 0 and conn.execute(schema.NUMBERING_SQL).fetchone() is not None
    version = schema.version_of(schema.POSTGRES, stored, marked)
    if version != stored:
        conn.execute("DELETE FROM schema_version")
        conn.execute("INSERT INTO schema_version(version) SELECT generate_series(1, %s)", (version,), prepare=False)
    return version
