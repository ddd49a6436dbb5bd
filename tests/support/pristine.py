"""A PostgreSQL store kept between the tests of one process, and the proof that
it is pristine before each reuse.

Making a store (the whole migration list) and dropping its schema are most of
a short PostgreSQL test's cost. ``PristineStore`` keeps one schema made by
``Scratchpad.open`` (and not yet written to: ``adopt``) and lends it to the
next test that wants a new store, only when it is, again, what a new store is:

- its catalog (tables, columns, indexes, constraints, triggers, row-level
  security policies and flags, functions and their source and settings,
  owners, grants, sequences, types) has the digest taken right after it was
  made; else nothing is emptied and the schema is dropped;
- then the rows of every owner's table (a table with an ``owner_user_id``
  column) are truncated, the master key's wrap count is set back to its
  first value, and the cumulative statistics of the schema's tables are reset;
- then every table's rows, every relation's size, the planner's figures
  (``pg_class``) and the absence of column statistics (``pg_statistic``) have
  the digest taken when it was made: the store's identity rows
  (``store_meta``: its id, key check, anchor key, formats) and
  ``schema_version`` are as they were, so a test that rotated the master key or
  changed any of them leaves a schema that is dropped.

Any difference or error drops the schema: the next test makes a new store.
Nothing here deletes or re-creates a store's identity: a kept store is only
ever opened again with the key it was made with (``place_key`` writes that
key's file, as ``Keyring`` writes one: mode 0600 in a 0700 directory).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["PristineStore"]

# The catalog of a schema, as text rows: every object a migration makes or a
# test could change, named (no OIDs, which differ from store to store).
_CATALOG = """
SELECT 'namespace', n.nspname, n.nspowner::regrole::text, n.nspacl::text
    FROM pg_namespace n WHERE n.oid = %(ns)s
UNION ALL SELECT 'class', c.relname,
    concat_ws(' ', c.relkind, c.relowner::regrole, c.relpersistence, c.relrowsecurity, c.relforcerowsecurity,
              c.relreplident, c.reloptions::text, c.relispartition, c.reltoastrelid <> 0),
    c.relacl::text
    FROM pg_class c WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'column', a.attrelid::regclass::text || '.' || a.attname,
    concat_ws(' ', a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attisdropped, a.attstorage,
              a.attidentity, a.attgenerated, a.attcollation, a.attoptions::text,
              pg_get_expr(d.adbin, d.adrelid)),
    a.attacl::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = %(ns)s AND a.attnum > 0
UNION ALL SELECT 'index', i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid),
    concat_ws(' ', i.indisprimary, i.indisunique, i.indisvalid, i.indisready, i.indislive, i.indisclustered)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'constraint', co.conrelid::regclass::text || '.' || co.conname, pg_get_constraintdef(co.oid),
    concat_ws(' ', co.condeferrable, co.condeferred, co.convalidated)
    FROM pg_constraint co WHERE co.connamespace = %(ns)s
UNION ALL SELECT 'trigger', t.tgrelid::regclass::text || '.' || t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'rule', r.ev_class::regclass::text || '.' || r.rulename, pg_get_ruledef(r.oid), r.ev_enabled::text
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'policy', p.polrelid::regclass::text || '.' || p.polname,
    concat_ws(' ', p.polcmd, p.polpermissive, p.polroles::regrole[]::text,
              pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid)),
    NULL
    FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'function', p.oid::regprocedure::text,
    concat_ws(' ', p.proowner::regrole, p.prokind, p.prosecdef, p.provolatile, p.proleakproof, p.proisstrict,
              p.proconfig::text, p.prorettype::regtype, p.prolang, md5(p.prosrc)),
    p.proacl::text
    FROM pg_proc p WHERE p.pronamespace = %(ns)s
UNION ALL SELECT 'sequence', s.seqrelid::regclass::text,
    concat_ws(' ', s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle),
    NULL
    FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'type', t.typname, concat_ws(' ', t.typtype, t.typowner::regrole), t.typacl::text
    FROM pg_type t WHERE t.typnamespace = %(ns)s
UNION ALL SELECT 'statistics object', s.stxname, pg_get_statisticsobjdef(s.oid), NULL
    FROM pg_statistic_ext s WHERE s.stxnamespace = %(ns)s
UNION ALL SELECT 'default acl', d.defaclobjtype::text, d.defaclrole::regrole::text, d.defaclacl::text
    FROM pg_default_acl d WHERE d.defaclnamespace = %(ns)s
"""

# The schema's relations with their toast tables and toast indexes: each one's
# size and planner figures, and whether columns of it have statistics. An
# index's own figures are left out: TRUNCATE marks them unknown where CREATE
# INDEX counted them, and the planner takes a (non-partial) index's pages from
# its file and its tuples from its table.
_RELATIONS = """
WITH own AS (SELECT oid FROM pg_class WHERE relnamespace = %(ns)s),
rel AS (
    SELECT oid FROM own
    UNION SELECT c.reltoastrelid FROM pg_class c JOIN own USING (oid) WHERE c.reltoastrelid <> 0
    UNION SELECT i.indexrelid FROM pg_index i
        JOIN pg_class c ON c.reltoastrelid = i.indrelid JOIN own ON own.oid = c.oid
)
SELECT c.oid, c.relname, c.relkind, pg_relation_size(c.oid),
    CASE WHEN c.relkind <> 'i' THEN c.relpages END, CASE WHEN c.relkind <> 'i' THEN c.reltuples END,
    c.relallvisible, EXISTS (SELECT 1 FROM pg_statistic s WHERE s.starelid = c.oid)
FROM pg_class c JOIN rel USING (oid)
"""


class PristineStore:
    """A store schema made once and lent again to each test that needs a new
    store, while it proves pristine (see the module's docstring)."""

    def __init__(self, dsn: str, schema: str = "securepad") -> None:
        self.dsn = dsn
        self.schema = schema
        self.key: bytes | None = None  # the kept store's key file; None: no store kept
        self._catalog = self._content = ""
        self._wrap_count: str | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self.made = self.reused = self.dropped = 0

    @property
    def kept(self) -> bool:
        return self.key is not None

    def place_key(self, key_file: Path) -> bool:
        """Write the kept store's key at ``key_file`` (absent); whether a store is kept."""
        if self.key is None:
            return False
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.key)
        self.reused += 1
        return True

    def adopt(self, key_file: Path) -> None:
        """Take the store just made with the key in ``key_file`` as the pristine
        one, unless a row was already written to an owner's table."""
        self.key = None
        conn = self._connect()
        if _written(conn, self.schema):
            return
        self._catalog = _catalog_digest(conn, self.schema)
        row = conn.execute(f"SELECT value FROM {self.schema}.store_meta WHERE key = 'master_wrap_count'").fetchone()
        self._wrap_count = None if row is None else row[0]
        self._content = _content_digest(conn, self.schema)
        self.made += 1
        self.key = key_file.read_bytes()

    def give_back(self) -> None:
        """After a test: keep the store when it is pristine again, else drop it."""
        try:
            kept = self._restore()
        except psycopg.Error:
            self.disconnect()
            kept = False
        if not kept:
            self.drop()

    def drop(self) -> None:
        """Drop the schema (kept or not) and forget the kept store."""
        self.key = None
        try:
            self._connect().execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        except psycopg.OperationalError:  # the connection was lost: once more on a new one
            self.disconnect()
            self._connect().execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.dropped += 1

    def close(self) -> None:
        """Drop the schema and close this process's connection."""
        self.drop()
        self.disconnect()

    def disconnect(self) -> None:
        """Close this process's connection (made again when needed)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _restore(self) -> bool:
        if self.key is None:
            return False
        conn = self._connect()
        if _catalog_digest(conn, self.schema) != self._catalog:
            return False
        with conn.transaction():
            _empty(conn, self.schema, self._wrap_count)
        return _content_digest(conn, self.schema) == self._content

    def _connect(self) -> psycopg.Connection[Any]:
        """This process's own connection to the database (made again after an error)."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn


def _namespace(conn: psycopg.Connection[Any], schema: str) -> int | None:
    row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return None if row is None else int(row[0])


def _digest(rows: list[tuple[Any, ...]]) -> str:
    return hashlib.sha256(repr(sorted(rows, key=repr)).encode()).hexdigest()


def _catalog_digest(conn: psycopg.Connection[Any], schema: str) -> str:
    ns = _namespace(conn, schema)
    return "" if ns is None else _digest(conn.execute(_CATALOG, {"ns": ns}).fetchall())


def _written(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The schema's tables of owners' rows (an ``owner_user_id`` column) whose
    file holds pages: a row was written to them since they were made or emptied."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'"
        " AND pg_relation_size(c.oid) > 0 AND EXISTS (SELECT 1 FROM pg_attribute a"
        "  WHERE a.attrelid = c.oid AND a.attname = 'owner_user_id' AND NOT a.attisdropped)",
        (schema,),
    ).fetchall()
    return [row[0] for row in rows]


def _empty(conn: psycopg.Connection[Any], schema: str, wrap_count: str | None) -> None:
    """Truncate every owner's table written to (new empty files, as a new
    table's), set the master key's wrap count back, reset the tables' counters."""
    conn.execute("SET LOCAL synchronous_commit = off")  # a test database: no need to wait for the disk
    # A session left holding a lock on the store fails the check (the schema is dropped), not the run.
    conn.execute("SET LOCAL lock_timeout = '5s'")
    written = _written(conn, schema)
    if written:
        conn.execute("TRUNCATE " + ", ".join(f"{schema}.{name}" for name in written))
    if wrap_count is not None:
        conn.execute(
            f"UPDATE {schema}.store_meta SET value = %s WHERE key = 'master_wrap_count' AND value <> %s",
            (wrap_count, wrap_count),
        )
    conn.execute(
        "SELECT pg_stat_reset_single_table_counters(oid) FROM pg_class WHERE relnamespace = %s::regnamespace", (schema,)
    )


def _content_digest(conn: psycopg.Connection[Any], schema: str) -> str:
    """Every table's rows, and every relation's size, planner figures and statistics."""
    ns = _namespace(conn, schema)
    if ns is None:
        return ""
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s AND relkind IN ('r', 'p') ORDER BY 1", (ns,)
        ).fetchall()
    ]
    rows = (
        conn.execute(
            " UNION ALL ".join(
                f"SELECT '{name}', md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), ''))"
                f" FROM {schema}.{name} t"
                for name in tables
            )
        ).fetchall()
        if tables
        else []
    )
    figures = [row[1:] for row in conn.execute(_RELATIONS, {"ns": ns}).fetchall()]
    return _digest(rows + figures)
