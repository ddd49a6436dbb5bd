"""The schema: every table, index and server function, in ONE migration list.

``MIGRATIONS[v]`` brings a store of schema ``v - 1`` to schema ``v`` on both
dialects: SQL written once (column types as ``{big}``, ``{real}``, ``{blob}``;
``{norowid}`` for SQLite's ``WITHOUT ROWID``) and steps of one dialect alone
(row-level security, grants and server functions on PostgreSQL; triggers and
table rebuilds on SQLite).

Stores older than the one list count in their dialect's own numbering;
``BEFORE`` maps it to this list (docs/decisions/0012-one-schema.md), and a
store of the one list carries ``NUMBERING_KEY`` in ``store_meta``. The version
decides which statements run, never what is trusted (SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import SecurepadError
from .postgres.functions import pg_read_functions, pg_scoped_read_functions
from .postgres.roles import ADMIN_ROLE, APP_ROLE

__all__ = ["BEFORE", "MIGRATIONS", "NUMBERING_KEY", "SCHEMA_VERSION", "check_known", "steps", "version_of"]

SQLITE, POSTGRES = "sqlite", "postgres"
# The column types (and table options) of each dialect.
_TYPES = {
    SQLITE: {"big": "INTEGER", "real": "REAL", "blob": "BLOB", "norowid": " WITHOUT ROWID"},
    POSTGRES: {"big": "BIGINT", "real": "DOUBLE PRECISION", "blob": "BYTEA", "norowid": ""},
}

# A step's part: SQL for both dialects, or SQL by dialect.
Part = str | Mapping[str, str]
Step = tuple[Part, ...]

_OWNER = "current_setting('securepad.owner', true)"


def _owner_rows(*tables: str) -> str:
    """Row-level security: the application role sees one owner's rows, the one
    named by the transaction's ``securepad.owner`` setting."""
    return "".join(
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;\n"
        f"CREATE POLICY owner_rows ON {table} TO {APP_ROLE}\n"
        f"    USING (owner_user_id = {_OWNER}) WITH CHECK (owner_user_id = {_OWNER});\n"
        for table in tables
    )


def _functions(created: dict[str, str], arguments: str = "text, text, bytea, text, text, text") -> str:
    """Server functions, EXECUTE for the application role alone."""
    return "".join(
        f"{create}GRANT EXECUTE ON FUNCTION {name}({arguments}) TO {APP_ROLE};\n" for name, create in created.items()
    )


# Compaction checkpoints and compaction marks (``tables.records``): one shape.
_RECORDS = "".join(
    f"""
    CREATE TABLE {table}(
        id            TEXT PRIMARY KEY,
        owner_user_id TEXT NOT NULL,
        actor         TEXT NOT NULL,
        channel       TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        key_version   INTEGER NOT NULL,
        created_at    {{real}} NOT NULL,
        expires_at    {{real}} NOT NULL,
        wrapped_key   {{blob}} NOT NULL,
        sealed        {{blob}} NOT NULL,
        UNIQUE (owner_user_id, turn_id, seq)
    ){{norowid}};
    CREATE INDEX {table}_expires ON {table}(expires_at);"""
    for table in ("checkpoints", "compaction_marks")
)
# The entry's clear columns of schema 1, in their order.
_ENTRY_COLUMNS = """
        owner_user_id  TEXT NOT NULL,
        actor          TEXT NOT NULL,
        channel        TEXT NOT NULL,
        turn_id        TEXT NOT NULL,
        step_num       INTEGER NOT NULL,
        executor_name  TEXT NOT NULL,
        content_kind   TEXT NOT NULL,
        size_bytes     {big} NOT NULL,
        size_chars     {big} NOT NULL,
        segment_count  INTEGER NOT NULL,
        key_version    INTEGER NOT NULL,
        created_at     {real} NOT NULL,
        expires_at     {real} NOT NULL,
        wrapped_key    {blob} NOT NULL,
        nonce_prefix   {blob} NOT NULL,
        commitment     {blob} NOT NULL,
        sealed_meta    {blob} NOT NULL"""
_ENTRY_NAMES = (
    "id, owner_user_id, actor, channel, turn_id, step_num, executor_name, content_kind, size_bytes, size_chars,"
    " segment_count, key_version, created_at, expires_at, wrapped_key, nonce_prefix, commitment, sealed_meta,"
    " stored_bytes"
)
# SQLite's per-owner byte count (schemas 5 to 11), kept by triggers.
_USAGE_ADD = """
        INSERT INTO owner_usage(owner_user_id, stored_bytes) VALUES (NEW.owner_user_id, NEW.stored_bytes)
            ON CONFLICT(owner_user_id) DO UPDATE SET stored_bytes = stored_bytes + excluded.stored_bytes;"""
_USAGE_SUBTRACT = """
        UPDATE owner_usage SET stored_bytes = stored_bytes - OLD.stored_bytes WHERE owner_user_id = OLD.owner_user_id;
        DELETE FROM owner_usage WHERE owner_user_id = OLD.owner_user_id AND stored_bytes <= 0;"""
_USAGE_MOVE = _USAGE_SUBTRACT + _USAGE_ADD
_USAGE_TRIGGERS = f"""
    CREATE TRIGGER owner_usage_insert AFTER INSERT ON entries BEGIN{_USAGE_ADD}
    END;
    CREATE TRIGGER owner_usage_delete AFTER DELETE ON entries BEGIN{_USAGE_SUBTRACT}
    END;
    CREATE TRIGGER owner_usage_update AFTER UPDATE OF owner_user_id, stored_bytes ON entries BEGIN{_USAGE_MOVE}
    END;
"""
# PostgreSQL's per-owner byte count (schemas 5 to 11), as SQLite's triggers keep it.
_PG_USAGE_TRIGGER = """
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
"""


def _flag(key: str, value: str) -> str:
    return (
        f"INSERT INTO store_meta(key, value) VALUES ('{key}', '{value}')"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value;\n"
    )


MIGRATIONS: tuple[Step, ...] = (
    (),  # 0: no store
    # 1: store metadata, owner keys, entries and their segments.
    (
        f"""
    CREATE TABLE store_meta(
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ){{norowid}};
    CREATE TABLE owner_keys(
        owner_user_id TEXT NOT NULL,
        version       INTEGER NOT NULL,
        wrapped       {{blob}} NOT NULL,
        created_at    {{real}} NOT NULL,
        PRIMARY KEY (owner_user_id, version)
    ){{norowid}};
    CREATE TABLE entries(
        id             TEXT PRIMARY KEY,{_ENTRY_COLUMNS}
    ){{norowid}};
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    CREATE INDEX entries_expires ON entries(expires_at);
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, size_bytes);
    CREATE TABLE segments(
        entry_id TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        data     {{blob}} NOT NULL,
        PRIMARY KEY (entry_id, seq)
    ){{norowid}};
    """,
    ),
    # 2: the random-nonce encryptions under each owner key (item-key wraps),
    # counted so that rotation is advised long before the 2^32 limit.
    (
        "ALTER TABLE owner_keys ADD COLUMN wrap_count {big} NOT NULL DEFAULT 0;\n",
        {
            SQLITE: "INSERT OR IGNORE INTO store_meta(key, value)"
            " SELECT 'master_wrap_count', CAST(COUNT(*) AS TEXT) FROM owner_keys;\n",
            POSTGRES: "INSERT INTO store_meta(key, value) VALUES ('master_wrap_count', '0');\n",
        },
    ),
    # 3: turn records (``tables.records``), sealed like entries.
    (_RECORDS,),
    # 4: what an entry stores in all, for the size limit and the owner quota.
    (
        """
    ALTER TABLE entries ADD COLUMN stored_bytes {big} NOT NULL DEFAULT 0;
    UPDATE entries SET stored_bytes = size_bytes;
    DROP INDEX entries_owner_usage;
    CREATE INDEX entries_owner_usage ON entries(owner_user_id, expires_at, stored_bytes);
    """,
    ),
    # 5: bytes stored per owner, kept by triggers; on PostgreSQL, row-level
    # security for the application role (segments carry their entry's owner,
    # from the transaction's owner setting) and its grants.
    (
        """
    CREATE TABLE owner_usage(
        owner_user_id TEXT PRIMARY KEY,
        stored_bytes  {big} NOT NULL
    ){norowid};
    INSERT INTO owner_usage(owner_user_id, stored_bytes)
        SELECT owner_user_id, SUM(stored_bytes) FROM entries GROUP BY owner_user_id;
    """,
        {
            SQLITE: _USAGE_TRIGGERS,
            POSTGRES: f"ALTER TABLE segments ADD COLUMN owner_user_id TEXT NOT NULL DEFAULT {_OWNER};\n"
            + _PG_USAGE_TRIGGER
            + _owner_rows("owner_keys", "entries", "checkpoints", "compaction_marks", "owner_usage")
            + f"""
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
        },
    ),
    # 6: SQLite: entries and segments become rowid tables, so that a put
    # appends to the last leaf instead of a random one, and the indexes no put
    # or listing reads go (one transaction: a failure leaves schema 5).
    # PostgreSQL: every key of an owner's table starts with owner_user_id,
    # ready to be distributed by owner (store_meta and schema_version hold no
    # owner's rows).
    (
        {
            SQLITE: f"""
    CREATE TABLE entries_v6(
        id             TEXT PRIMARY KEY,{_ENTRY_COLUMNS.format(**_TYPES[SQLITE])},
        stored_bytes   INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO entries_v6({_ENTRY_NAMES}) SELECT {_ENTRY_NAMES} FROM entries ORDER BY created_at, id;
    CREATE TABLE segments_v6(
        entry_id TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        data     BLOB NOT NULL,
        PRIMARY KEY (entry_id, seq)
    );
    INSERT INTO segments_v6(entry_id, seq, data)
        SELECT s.entry_id, s.seq, s.data FROM segments s LEFT JOIN entries_v6 e ON e.id = s.entry_id
        ORDER BY e.rowid, s.seq;
    DROP TABLE entries;
    DROP TABLE segments;
    ALTER TABLE entries_v6 RENAME TO entries;
    ALTER TABLE segments_v6 RENAME TO segments;
    CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);
    {_USAGE_TRIGGERS}""",
            POSTGRES: f"""
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
        },
    ),
    # 7: sealed turn heads (``tables.heads``): one row per (owner, turn) and
    # one per owner; an older store builds them on its next open with the key.
    (
        """
    CREATE TABLE turn_heads(
        owner_user_id TEXT NOT NULL,
        turn_id       TEXT NOT NULL,
        key_version   INTEGER NOT NULL,
        sealed        {blob} NOT NULL,
        PRIMARY KEY (owner_user_id, turn_id)
    ){norowid};
    """,
        _flag("turn_heads", "pending"),
        {POSTGRES: _owner_rows("turn_heads") + f"GRANT SELECT, INSERT, UPDATE, DELETE ON turn_heads TO {APP_ROLE};\n"},
    ),
    # 8: row-level security forced on every table with an owner_rows policy
    # (a table added later with that policy must be forced there too), and
    # the admin role's explicit housekeeping policy.
    (
        {
            POSTGRES: f"""
    DO $$ DECLARE t text; BEGIN
        FOR t IN SELECT tablename FROM pg_policies
                 WHERE schemaname = current_schema() AND policyname = 'owner_rows' LOOP
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
            EXECUTE format('CREATE POLICY housekeeping ON %I TO {ADMIN_ROLE} USING (true) WITH CHECK (true)', t);
        END LOOP;
    END $$;
    """
        },
    ),
    # 9: a one-segment entry keeps its sealed segment in its own row; rows
    # written before keep theirs in segments, and reads take either.
    ("ALTER TABLE entries ADD COLUMN only_segment {blob};\n",),
    # 10: the listing part of an entry (``crypto.ListingKey``), NULL in rows
    # written before it; an extension of a turn re-seals it.
    (
        {
            SQLITE: "ALTER TABLE entries ADD COLUMN sealed_listing BLOB;\n",
            POSTGRES: "ALTER TABLE entries ADD COLUMN IF NOT EXISTS sealed_listing BYTEA;\n"
            f"GRANT UPDATE (sealed_listing) ON entries TO {APP_ROLE};\n",
        },
    ),
    # 11: constant-size turn heads (format 2): heads of format 1 are converted
    # on the next open with the key (``tables.heads.build``).
    ("UPDATE store_meta SET value = 'convert' WHERE key = 'turn_heads' AND value = 'built';\n",),
    # 12: no per-put counter row: each owner's usage lives in its sealed owner
    # head, which the next open with the key seeds from the owner's entries.
    (
        {
            SQLITE: "DROP TRIGGER IF EXISTS owner_usage_insert; DROP TRIGGER IF EXISTS owner_usage_delete;"
            " DROP TRIGGER IF EXISTS owner_usage_update;\n",
            POSTGRES: "DROP TRIGGER IF EXISTS owner_usage_track ON entries;"
            " DROP FUNCTION IF EXISTS owner_usage_track();\n",
        },
        "DROP TABLE IF EXISTS owner_usage;\n",
        _flag("owner_usage", "seed"),
    ),
    # 13: a turn's entries through their own index on a young store
    # (docs/decisions/0010-young-store-plans.md): made again, it is the newest.
    (
        {
            POSTGRES: "DROP INDEX entries_owner_turn;\n"
            "CREATE INDEX entries_owner_turn ON entries(owner_user_id, turn_id, step_num);\n"
        },
    ),
    # 14: the functions a warm read calls (``postgres.functions``;
    # docs/decisions/0004-verified-inventory-cache.md), SECURITY INVOKER.
    ({POSTGRES: _functions(pg_read_functions())},),
    # 15: every statement's generic plan right on a young store
    # (docs/decisions/0010-young-store-plans.md): with the id first, the key
    # is no choice for a statement that names no id, and it is the newest
    # index of its table (a later migration that creates an index on these
    # tables must make the key again after it). The owner stays in every key.
    (
        {
            POSTGRES: """
    ALTER TABLE entries DROP CONSTRAINT entries_pkey, ADD PRIMARY KEY (id, owner_user_id);
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_pkey, ADD PRIMARY KEY (id, owner_user_id);
    ALTER TABLE compaction_marks DROP CONSTRAINT compaction_marks_pkey, ADD PRIMARY KEY (id, owner_user_id);
    """
        },
    ),
    # 16: sealed bytes stored as they are: ciphertext does not compress, and
    # EXTERNAL skips the server's attempt on every put (rows stored stay).
    (
        {
            POSTGRES: """
    ALTER TABLE entries ALTER COLUMN only_segment SET STORAGE EXTERNAL,
        ALTER COLUMN sealed_meta SET STORAGE EXTERNAL, ALTER COLUMN sealed_listing SET STORAGE EXTERNAL;
    ALTER TABLE segments ALTER COLUMN data SET STORAGE EXTERNAL;
    ALTER TABLE checkpoints ALTER COLUMN sealed SET STORAGE EXTERNAL;
    ALTER TABLE compaction_marks ALTER COLUMN sealed SET STORAGE EXTERNAL;
    ALTER TABLE turn_heads ALTER COLUMN sealed SET STORAGE EXTERNAL;
    """
        },
    ),
    # 17: both read functions replaced by ones that run a lean statement first
    # when the snapshot moved (same signature, settings, owner and grants).
    ({POSTGRES: _functions(pg_read_functions(lean=True))},),
    # 18: SQLite: a turn's index holds the id, expiry and size of each entry
    # (the freshness token's rows' text reads them from it; the actor and
    # channel, which may be long, stay out: ``tables.quota``). PostgreSQL: the
    # entry's read function finds the id's turn within the caller's scope.
    (
        {
            SQLITE: "DROP INDEX IF EXISTS entries_owner_turn;\n"
            "CREATE INDEX entries_owner_turn"
            " ON entries(owner_user_id, turn_id, step_num, id, expires_at, stored_bytes);\n",
            POSTGRES: _functions(pg_scoped_read_functions(), "text, text, bytea, text, text, text, text, text"),
        },
    ),
)
SCHEMA_VERSION = len(MIGRATIONS) - 1

# Each dialect's numbering from before the one list: BEFORE[dialect][old] is
# the version of the one list with the same schema.
BEFORE = {
    SQLITE: (0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 18),
    POSTGRES: (0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18),
}
# The store_meta row of a store numbered by the one list.
NUMBERING_KEY = "schema_numbering"
NUMBERING_SQL = f"SELECT value FROM store_meta WHERE key = '{NUMBERING_KEY}'"
MARK_SQL = _flag(NUMBERING_KEY, "one list")


def version_of(dialect: str, stored: int, marked: bool) -> int:
    """A store's version in the one list: a store without the numbering mark
    counts in its dialect's numbering from before it (``BEFORE``)."""
    before = BEFORE[dialect]
    return before[stored] if not marked and 0 < stored < len(before) else stored


def check_known(version: int, target: int) -> None:
    """Raises SecurepadError when a store's version is past ``target``, this code's."""
    if version > target:
        raise SecurepadError(f"store schema version {version} is newer than this securepad understands ({target})")


def steps(dialect: str, version: int, target: int) -> list[tuple[int, str]]:
    """(version, SQL) of each migration from ``version`` to ``target``, in ``dialect``.

    Raises:
        SecurepadError: ``version`` is newer than ``target``.
    """
    check_known(version, target)
    types = _TYPES[dialect]
    return [
        (v, "".join(part.format(**types) if isinstance(part, str) else part.get(dialect, "") for part in MIGRATIONS[v]))
        for v in range(version + 1, target + 1)
    ]
