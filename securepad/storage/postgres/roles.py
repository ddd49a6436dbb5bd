"""The PostgreSQL backend's two role names, importable without psycopg (an optional dependency)."""

from __future__ import annotations

__all__ = ["ADMIN_ROLE", "APP_ROLE"]

# The login the application uses: row-level security holds it to one owner.
APP_ROLE = "securepad_app"
# The tables' owner: migrations and store-wide housekeeping.
ADMIN_ROLE = "securepad_admin"
