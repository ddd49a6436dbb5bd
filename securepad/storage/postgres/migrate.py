"""PostgreSQL's roles, schema and migrations (see ``_pg`` for how they are used).

The tables mirror SQLite's (``_db``) in PostgreSQL's types, plus row-level
security for the application role; ``migrate`` creates the roles and schema
when missing and brings the tables to ``SCHEMA_VERSION``, one migration at a
time per database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from ...errors import SecurepadError
from ...tables.heads.reading import pg_lean_read_functions, pg_read_functions, pg_scoped_read_functions
from .roles import ADMIN_ROLE, APP_ROLE

__all__ = ["ADMIN_ROLE", "APP_ROLE", "MIGRATIONS", "SCHEMA_VERSION", "lock_key", "migrate", "reason"]

SCHEMA_VERSION = 14

_OWNER = "current_setting('securepad.owner', true)"
_OWNER_TABLES = ("owner_keys", "entries", "checkpoints", "compaction_marks", "owner_usage")

# The SQLite schema at version 5, in PostgreSQL's types. Segments also carry
# their entry's owner (filled from the transaction's owner setting), so that
# row-level security can hold them even after their entry row is deleted.
MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE store_meta(
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    INSERT INTO store_meta(key, value) VALUES ('master_wrap_count', '0');
    CREATE TABLE owner_keys(
        owner_user_id TEXT NOT NULL,
        version       INTEGER NOT NULL,
        wrapped       BYTEA NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        wrap_count    BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (owner_user_id, version)
    );
    CREATE TABLE entries(
        id             TEXT PRIMARY KEY,
        owner_user_id  TEXT NOT NULL,
        actor          TEXT NOT NULL,
        channel        TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        step_num       INTEGER NOT NULL,
        executor_name  TEXT NOT NULL,
        content_kind   TEXT NOT NULL,
        size_bytes     BIGINT NOT NULL,
        size_chars     BIGINT NOT NULL,
        segment_count  INTEGER NOT NULL,
        key_version    INTEGER NOT NULL,
        created_at     DOUBLE PRECISION NOT NULL,
        expires_at     DOUBLE PRECISION NOT NULL,
        wrapped_key    BYTEA NOT NULL,
        nonce_prefix   BYTEA NOT NULL,
        commitment     BYTEA NOT NULL,
        sealed_meta    BYTEA NOT NULL,
        stored_bytes   BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    CREATE INDEX entries_expires ON entries(expires_at);
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, stored_bytes);
    CREATE TABLE segments(
        entry_id      TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        data          BYTEA NOT NULL,
        owner_user_id TEXT NOT NULL DEFAULT {_OWNER},
        PRIMARY KEY (entry_id, seq)
    );
    CREATE TABLE checkpoints(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        expires_at    DOUBLE PRECISION NOT NULL,
        wrapped_key   BYTEA NOT NULL,
        sealed        BYTEA NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    );
    CREATE INDEX checkpoints_expires ON checkpoints(expires_at);
    CREATE TABLE compaction_marks(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        expires_at    DOUBLE PRECISION NOT NULL,
        wrapped_key   BYTEA NOT NULL,
        sealed        BYTEA NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    );
    CREATE INDEX compaction_marks_expires ON compaction_marks(expires_at);
    CREATE TABLE owner_usage(
        owner_user_id TEXT PRIMARY KEY,
        stored_bytes  BIGINT NOT NULL
    );
    -- Bytes stored per owner, as SQLite's triggers keep them (schema 5 there).
    CREATE FUNCTION owner_usage_track() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP IN ('DELETE', 'UPDATE') THEN
            UPDATE owner_usage SET stored_bytes = stored_bytes - OLD.stored_bytes
                WHERE owner_user_id = OLD.owner_user_id;
            DELETE FROM owner_usage WHERE owner_user_id = OLD.owner_user_id AND stored_bytes <= 0;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO owner_usage(owner_user_id, stored_bytes) VALUES (NEW.owner_user_id, NEW.stored_bytes)
                ON CONFLICT (owner_user_id)
                DO UPDATE SET stored_bytes = owner_usage.stored_bytes + excluded.stored_bytes;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER owner_usage_track AFTER INSERT OR DELETE OR UPDATE OF owner_user_id, stored_bytes
        ON entries FOR EACH ROW EXECUTE FUNCTION owner_usage_track();

    -- Row-level security: the application role sees one owner's rows, the
    -- one named by the transaction's securepad.owner setting.
    {
        "".join(
            f'''
    ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON {table} TO {APP_ROLE}
        USING (owner_user_id = {_OWNER}) WITH CHECK (owner_user_id = {_OWNER});'''
            for table in _OWNER_TABLES
        )
    }
    ALTER TABLE segments ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON segments TO {APP_ROLE}
        USING (owner_user_id = {_OWNER})
        WITH CHECK (owner_user_id = {_OWNER}
                    AND EXISTS (SELECT 1 FROM entries e WHERE e.id = segments.entry_id));
    -- Everyone's store metadata is readable (the key check, the format); the
    -- application may only count the master key's wraps.
    ALTER TABLE store_meta ENABLE ROW LEVEL SECURITY;
    CREATE POLICY read_meta ON store_meta FOR SELECT TO {APP_ROLE} USING (true);
    CREATE POLICY count_wraps ON store_meta FOR UPDATE TO {APP_ROLE}
        USING (key = 'master_wrap_count') WITH CHECK (key = 'master_wrap_count');

    GRANT SELECT ON store_meta TO {APP_ROLE};
    GRANT UPDATE (value) ON store_meta TO {APP_ROLE};
    GRANT SELECT, INSERT ON owner_keys TO {APP_ROLE};
    GRANT UPDATE (wrap_count) ON owner_keys TO {APP_ROLE};
    GRANT SELECT, INSERT, DELETE ON entries, segments, checkpoints, compaction_marks TO {APP_ROLE};
    GRANT UPDATE (expires_at, sealed_meta) ON entries TO {APP_ROLE};
    GRANT UPDATE (expires_at, sealed) ON checkpoints, compaction_marks TO {APP_ROLE};
    GRANT SELECT, INSERT, UPDATE, DELETE ON owner_usage TO {APP_ROLE};
    """,
    # Ready to be distributed by owner: every primary key and unique
    # constraint of an owner's table starts with owner_user_id, so that a
    # distributed PostgreSQL (Citus and the like) can shard the tables by owner
    # with each owner's rows, and each unique check, on one node. store_meta and
    # schema_version hold no owner's rows (reference tables there).
    2: f"""
    ALTER TABLE entries DROP CONSTRAINT entries_pkey, ADD PRIMARY KEY (owner_user_id, id);
    ALTER TABLE segments DROP CONSTRAINT segments_pkey, ADD PRIMARY KEY (owner_user_id, entry_id, seq);
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_pkey, ADD PRIMARY KEY (owner_user_id, id);
    ALTER TABLE compaction_marks DROP CONSTRAINT compaction_marks_pkey, ADD PRIMARY KEY (owner_user_id, id);
    DROP POLICY owner_rows ON segments;
    CREATE POLICY owner_rows ON segments TO {APP_ROLE}
        USING (owner_user_id = {_OWNER})
        WITH CHECK (owner_user_id = {_OWNER}
                    AND EXISTS (SELECT 1 FROM entries e
                                WHERE e.owner_user_id = segments.owner_user_id AND e.id = segments.entry_id));
    """,
    # Sealed turn heads (heads.py): one row per (owner, turn) and
    # one per owner; a store from before them builds them on its next open.
    3: f"""
    CREATE TABLE turn_heads(
        owner_user_id TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        key_version   INTEGER NOT NULL,
        sealed        BYTEA NOT NULL,
        PRIMARY KEY (owner_user_id, turn_id)
    );
    ALTER TABLE turn_heads ENABLE ROW LEVEL SECURITY;
    CREATE POLICY owner_rows ON turn_heads TO {APP_ROLE}
        USING (owner_user_id = {_OWNER}) WITH CHECK (owner_user_id = {_OWNER});
    GRANT SELECT, INSERT, UPDATE, DELETE ON turn_heads TO {APP_ROLE};
    INSERT INTO store_meta(key, value) VALUES ('turn_heads', 'pending')
        ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    """,
    # Row-level security forced: the tables' owner is held to the
    # policies too, and the admin role gets an explicit housekeeping policy,
    # on every table that has an owner_rows policy (so a table added by a
    # later migration with that policy must be forced there as well).
    4: f"""
    DO $$ DECLARE t text; BEGIN
        FOR t IN SELECT tablename FROM pg_policies
                 WHERE schemaname = current_schema() AND policyname = 'owner_rows' LOOP
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
            EXECUTE format('CREATE POLICY housekeeping ON %I TO {ADMIN_ROLE} USING (true) WITH CHECK (true)', t);
        END LOOP;
    END $$;
    """,
    # The put path (SQLite's migration 8): a one-segment entry keeps
    # its sealed segment in its own row; rows written before keep theirs in segments.
    5: """
    ALTER TABLE entries ADD COLUMN only_segment BYTEA;
    """,
    # The listing part of an entry (crypto.ListingKey), as SQLite's
    # migration 9; an extension of a turn re-seals it.
    6: f"""
    ALTER TABLE entries ADD COLUMN IF NOT EXISTS sealed_listing BYTEA;
    GRANT UPDATE (sealed_listing) ON entries TO {APP_ROLE};
    """,
    # Constant-size turn heads (heads.py format 2): heads of format 1
    # are converted to tallies on the next open with the key (head_build.HeadBuilder).
    7: """
    UPDATE store_meta SET value = 'convert' WHERE key = 'turn_heads' AND value = 'built';
    """,
    # No per-put counter row (SQLite's migration 11): the usage
    # totals move into the sealed owner heads, given at the next open with the key.
    8: """
    DROP TRIGGER IF EXISTS owner_usage_track ON entries;
    DROP FUNCTION IF EXISTS owner_usage_track();
    DROP TABLE IF EXISTS owner_usage;
    INSERT INTO store_meta(key, value) VALUES ('owner_usage', 'seed')
        ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    """,
    # A turn's entries through their own index on a young store
    # (docs/decisions/0010-young-store-plans.md). A connection's prepared
    # statements keep the generic plan made at their sixth run; on a store
    # that autovacuum has not analyzed yet (its first minute, or its first 50
    # rows), the planner sees a tiny table and the costs of the owner-only
    # primary key (owner_user_id, id) and of this index tie: it keeps the
    # newest index, which migration 2 made the primary key. A put's step check
    # then read every entry of the owner (518 rows a put in the CPU benchmark,
    # 43% of the server's CPU). Made again here, this index is the newest.
    9: """
    DROP INDEX entries_owner_turn;
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    """,
    # A warm read that the server does not plan in full
    # (docs/decisions/0004-verified-inventory-cache.md): the functions a read with a
    # cached token calls (head_reads), SECURITY INVOKER, owned by the admin
    # role, EXECUTE for the application role alone.
    10: "".join(
        f"{create}GRANT EXECUTE ON FUNCTION {name}(text, text, bytea, text, text, text) TO {APP_ROLE};\n"
        for name, create in pg_read_functions().items()
    ),
    # Every statement's generic plan right on a young store
    # (docs/decisions/0010-young-store-plans.md). On a table
    # that autovacuum has not analyzed yet the planner's row estimates clamp
    # to one, so two indexes whose leading columns a query binds cost the
    # same, and the newest one wins. With the primary key (owner_user_id, id)
    # beside the other owner-leading indexes, either the fetch of an entry by
    # id took a turn's index (reading every entry of the owner: 87 rows for
    # one in tests/storage/postgres/test_young_plans.py) or the turn's statements took the
    # key (migration 9 chose the former). With the id first, the key is no
    # choice at all for a statement that does not name an id (a key whose
    # leading column is unbound is a whole-index scan, never a tie): a turn's
    # checkpoints and marks take their unique (owner_user_id, turn_id, seq),
    # the only index that leads with the owner, whatever the ages. Left to
    # age, and said here: a statement that names an id and the owner also
    # matches the owner-leading indexes on their first column, and the key
    # wins the tie as the newest index of its table (made here, so a later
    # migration that creates an index on these tables must make the key
    # again after it); a turn's entries take entries_owner_turn over
    # entries_owner_usage, newer since migration 9. The owner is still in
    # every key (distributing by owner: the shard column must be in each
    # unique constraint, not first). The tables are locked while their keys
    # are rebuilt.
    11: """
    ALTER TABLE entries DROP CONSTRAINT entries_pkey, ADD PRIMARY KEY (id, owner_user_id);
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_pkey, ADD PRIMARY KEY (id, owner_user_id);
    ALTER TABLE compaction_marks DROP CONSTRAINT compaction_marks_pkey, ADD PRIMARY KEY (id, owner_user_id);
    """,
    # Sealed bytes are stored as they are (python -m benchmarks.pg_cpu
    # measures it): ciphertext does not compress, yet a row over 2 KiB (an
    # entry with its 4 KiB segment) made the server try pglz on its biggest
    # value before moving it out of line, on every put (2% of the server's CPU
    # per put, about 5 us of the INSERT's 55 to 69). EXTERNAL keeps the
    # out-of-line storage and skips the attempt; rows already stored are not
    # rewritten.
    12: """
    ALTER TABLE entries ALTER COLUMN only_segment SET STORAGE EXTERNAL,
        ALTER COLUMN sealed_meta SET STORAGE EXTERNAL, ALTER COLUMN sealed_listing SET STORAGE EXTERNAL;
    ALTER TABLE segments ALTER COLUMN data SET STORAGE EXTERNAL;
    ALTER TABLE checkpoints ALTER COLUMN sealed SET STORAGE EXTERNAL;
    ALTER TABLE compaction_marks ALTER COLUMN sealed SET STORAGE EXTERNAL;
    ALTER TABLE turn_heads ALTER COLUMN sealed SET STORAGE EXTERNAL;
    """,
    # A warm read after a commit elsewhere without the whole statement
    # (docs/decisions/0004-verified-inventory-cache.md): both read
    # functions replaced (head_reads: ``pg_lean_read_functions``), a lean
    # statement first (the turn's head and digest) when the snapshot moved.
    # Same signature, SECURITY INVOKER, search_path, owner (the admin role
    # replaces its own functions, which keep their privileges); the REVOKE
    # from PUBLIC and the GRANT to the application role as migration 10's.
    13: "".join(
        f"{create}GRANT EXECUTE ON FUNCTION {name}(text, text, bytea, text, text, text) TO {APP_ROLE};\n"
        for name, create in pg_lean_read_functions().items()
    ),
    # The turn of an id found within the caller's scope (head_reads:
    # ``pg_scoped_read_functions``): the entry's read function looked the id's
    # turn up whoever its owner, held to the owner's rows by row-level
    # security alone; it now names the owner, and the channel and actor the
    # policy's scope names (two more arguments, NULL otherwise), as SQLite's
    # statement does. Dropped and created again (its arguments change), same
    # settings, owner and grants as migration 13's.
    14: "".join(
        f"{create}GRANT EXECUTE ON FUNCTION {name}(text, text, bytea, text, text, text, text, text) TO {APP_ROLE};\n"
        for name, create in pg_scoped_read_functions().items()
    ),
}


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def reason(exc: BaseException) -> str:
    """The exception's message on one line (psycopg's span several: the command
    line prints an error as one line), or its class name when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__


def migrate(
    schema: str, app_version: Callable[[], int | None], admin_pool: Callable[[], ConnectionPool[Any]]
) -> tuple[int, int] | None:
    """Create the roles and schema when missing, then bring the tables to SCHEMA_VERSION.

    A store already at SCHEMA_VERSION opens with the application role
    alone: a process that serves principals needs no admin login. Returns
    (old, new) when an existing store was upgraded, else None.
    """
    version = app_version()
    if version == SCHEMA_VERSION:
        return None
    if version is not None and version > SCHEMA_VERSION:
        raise SecurepadError(
            f"store schema version {version} is newer than this securepad understands ({SCHEMA_VERSION})"
        )
    pool = admin_pool()
    try:
        with pool.connection() as conn, conn.transaction():
            # One migration at a time per database (roles are cluster-wide: a
            # racing creation in another database is tolerated below).
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("securepad-migrate"),))
            existing = {
                r[0]
                for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname IN (%s, %s)", (APP_ROLE, ADMIN_ROLE))
            }
            for role in (APP_ROLE, ADMIN_ROLE):
                if role not in existing:
                    conn.execute(
                        f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN NOBYPASSRLS;"
                        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
                    )
            has_schema = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
            if has_schema is None:
                conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {ADMIN_ROLE}")
                conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {APP_ROLE}")
            conn.execute(
                "SELECT set_config('role', %s, true), set_config('search_path', %s, true)",
                (ADMIN_ROLE, schema),
            )
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)")
            conn.execute(f"GRANT SELECT ON schema_version TO {APP_ROLE}")
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0]) if row is not None and row[0] is not None else 0
            if version > SCHEMA_VERSION:
                raise SecurepadError(
                    f"store schema version {version} is newer than this securepad understands ({SCHEMA_VERSION})"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                conn.execute(MIGRATIONS[target])
                # Never prepared: psycopg prepares a statement on its sixth run, and
                # behind a transaction pooler the name would outlive this server session.
                conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (target,), prepare=False)
            upgraded = (version, SCHEMA_VERSION) if 0 < version < SCHEMA_VERSION else None
    except pg_errors.InsufficientPrivilege as exc:
        raise SecurepadError(
            f"cannot set up the store in schema {schema}: {reason(exc)}"
            " (see the README's PostgreSQL section for the roles and grants it needs)"
        ) from None
    except psycopg.Error as exc:
        raise SecurepadError(f"cannot set up the store in schema {schema}: {reason(exc)}") from None
    return upgraded
