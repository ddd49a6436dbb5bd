"""The audit's checks of a PostgreSQL store: the server's own line of defence.

The checks read what the server enforces (roles, forced row-level security,
grants and functions as ``docs/how-to/postgresql.md`` documents them), count
rows as the application role without the owner setting, and tamper with the
audit owners' rows in place (then restore them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..storage.postgres.roles import ADMIN_ROLE, APP_ROLE
from ..store import parts
from . import drills
from ._support import OWNER_TABLES, CheckFailed, Context, Steps, expect_refused

__all__ = ["DEPLOYMENT", "RAW_QUERY", "TAMPER", "owner_tables"]

# The application role's documented rights: table -> privileges on the whole
# table, and the columns it may UPDATE where it may not update the whole row.
TABLE_GRANTS: dict[str, frozenset[str]] = {
    "schema_version": frozenset({"SELECT"}),
    "store_meta": frozenset({"SELECT"}),
    "owner_keys": frozenset({"SELECT", "INSERT"}),
    "entries": frozenset({"SELECT", "INSERT", "DELETE"}),
    "segments": frozenset({"SELECT", "INSERT", "DELETE"}),
    "checkpoints": frozenset({"SELECT", "INSERT", "DELETE"}),
    "compaction_marks": frozenset({"SELECT", "INSERT", "DELETE"}),
    "turn_heads": frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"}),
}
UPDATE_COLUMNS: dict[str, frozenset[str]] = {
    "store_meta": frozenset({"value"}),
    "owner_keys": frozenset({"wrap_count"}),
    "entries": frozenset({"expires_at", "sealed_meta", "sealed_listing"}),
    "checkpoints": frozenset({"expires_at", "sealed"}),
    "compaction_marks": frozenset({"expires_at", "sealed"}),
}
# The schema's functions (a warm read's): each SECURITY INVOKER with its
# search_path pinned, owned by the admin role, EXECUTE for the application role alone.
FUNCTIONS = frozenset({"turn_inventory", "entry_turn_inventory"})
_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
_COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
_OWNER_EXPR = "(owner_user_id = current_setting('securepad.owner'::text, true))"

DEPLOYMENT = Steps("deployment")
RAW_QUERY = Steps("isolation")
TAMPER = Steps("tamper")


def _admin(ctx: Context, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    return parts(ctx.pad).db.query(sql, params, admin=True)


def _app(ctx: Context, sql: str, params: tuple[Any, ...] = (), owner: str | None = None) -> list[dict[str, Any]]:
    return parts(ctx.pad).db.query(sql, params, owner=owner)


def owner_tables(ctx: Context) -> tuple[str, ...]:
    """OWNER_TABLES and every other table of the store's schema with an owner_user_id column (row-level
    security holds each)."""
    rows = _admin(
        ctx,
        "SELECT c.relname AS name FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        " AND a.attname = 'owner_user_id' AND NOT a.attisdropped ORDER BY c.relname",
    )
    return (*OWNER_TABLES, *(r["name"] for r in rows if r["name"] not in OWNER_TABLES))


# -- deployment ------------------------------------------------------------------------


def _flagged(row: dict[str, Any], **problems: str) -> list[str]:
    """The problem of each flag that is set in ``row``, in the order given."""
    return [text for flag, text in problems.items() if row[flag]]


@DEPLOYMENT(
    "application role privileges",
    f"read {APP_ROLE}'s attributes, memberships, ownerships and CREATE rights in pg_roles and pg_class",
)
def _app_role(ctx: Context) -> str:
    rows = _admin(
        ctx,
        "SELECT r.rolsuper AS superuser, r.rolbypassrls AS bypassrls, r.rolcreaterole AS createrole,"
        " r.rolcreatedb AS createdb, pg_has_role(r.rolname, ?, 'USAGE') AS admin,"
        " has_schema_privilege(r.rolname, current_schema(), 'CREATE') AS schema_create,"
        " has_database_privilege(r.rolname, current_database(), 'CREATE') AS db_create,"
        " (SELECT COUNT(*) FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace"
        "  AND pg_has_role(r.rolname, c.relowner, 'USAGE')) AS owned,"
        " current_schema() AS schema, session_user AS login"
        " FROM pg_roles r WHERE r.rolname = ?",
        (ADMIN_ROLE, APP_ROLE),
    )
    if not rows:
        raise CheckFailed(f"the application role {APP_ROLE} does not exist")
    r = rows[0]
    problems = _flagged(
        r,
        bypassrls="has BYPASSRLS (row-level security does not hold it)",
        superuser="is a superuser",
        createrole="has CREATEROLE",
        createdb="has CREATEDB",
        admin=f"can act as {ADMIN_ROLE}",
        schema_create=f"may CREATE in schema {r['schema']} (DDL)",
        db_create="may CREATE schemas in the database (DDL)",
    )
    if r["owned"]:
        problems.append(f"owns {r['owned']} tables or objects of schema {r['schema']}")
    if problems:
        raise CheckFailed(f"{APP_ROLE} " + "; ".join(problems))
    return (
        f"{APP_ROLE}: no BYPASSRLS, not superuser, no CREATEROLE/CREATEDB, not a member of {ADMIN_ROLE}, owns"
        f" nothing in schema {r['schema']}, may create nothing there or in the database"
        f" (this connection logs in as {r['login']})"
    )


@DEPLOYMENT(
    "application login privileges",
    "read the application connection's login (session_user) in pg_roles: superuser, BYPASSRLS,"
    " CREATEROLE, and the roles with superuser or BYPASSRLS that it may SET ROLE to",
)
def _login(ctx: Context) -> str:
    """Row-level security holds ``securepad_app`` only while the session stays
    in it: a login that is (or may become) a superuser or BYPASSRLS role
    leaves it with one ``RESET ROLE``."""
    rows = _app(
        ctx,
        "SELECT l.rolname AS login, l.rolsuper AS superuser, l.rolbypassrls AS bypassrls,"
        " l.rolcreaterole AS createrole,"
        " (SELECT string_agg(r.rolname, ', ' ORDER BY r.rolname) FROM pg_roles r"
        "  WHERE (r.rolsuper OR r.rolbypassrls) AND r.oid <> l.oid AND pg_has_role(l.oid, r.oid, 'MEMBER')) AS via"
        " FROM pg_roles l WHERE l.rolname = session_user",
    )
    if not rows:
        raise CheckFailed("the login of the application's connection is not in pg_roles")
    r = rows[0]
    # Before PostgreSQL 16 CREATEROLE grants any role that is not a
    # superuser, to itself too: a BYPASSRLS role is one GRANT away.
    problems = _flagged(
        r,
        superuser="is a superuser",
        bypassrls="has BYPASSRLS",
        createrole="has CREATEROLE (it may grant itself a role with BYPASSRLS)",
    )
    if r["via"]:
        problems.append(f"may SET ROLE to {r['via']} (superuser or BYPASSRLS)")
    if problems:
        raise CheckFailed(
            f"the application's login {r['login']} " + "; ".join(problems) + f": it bypasses row-level security"
            f" with RESET ROLE, whatever {APP_ROLE} may do; connect as a login that is only a member of"
            f" {APP_ROLE} (and {ADMIN_ROLE} for housekeeping) (docs/how-to/postgresql.md)"
        )
    return (
        f"the application's login {r['login']}: not superuser, no BYPASSRLS, no CREATEROLE, and may become"
        " no role that is or has either: it cannot leave row-level security"
    )


@DEPLOYMENT(
    "row-level security forced", "read relrowsecurity, relforcerowsecurity and pg_policies for every owner table"
)
def _rls_forced(ctx: Context) -> str:
    tables_ = owner_tables(ctx)
    rows = _admin(
        ctx,
        "SELECT c.relname AS name, c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced"
        " FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'",
    )
    tables = {r["name"]: r for r in rows}
    policies: dict[str, dict[str, Any]] = {}
    for p in _admin(
        ctx,
        "SELECT tablename AS t, policyname AS name, roles::text[] AS roles, cmd, qual, with_check"
        " FROM pg_policies WHERE schemaname = current_schema()",
    ):
        policies.setdefault(p["t"], {})[p["name"]] = p
    problems = []
    for table in tables_:
        row = tables.get(table)
        if row is None:
            problems.append(f"{table} is missing")
            continue
        if not row["enabled"]:
            problems.append(f"{table}: row-level security disabled")
        if not row["forced"]:
            problems.append(f"{table}: row-level security not forced (the tables' owner is not held)")
        problems += _policy_problems(table, policies.get(table, {}))
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{len(tables_)} owner tables ({', '.join(tables_)}): row-level security enabled and forced;"
        f" each has exactly owner_rows for {APP_ROLE} (USING and WITH CHECK owner_user_id = the owner setting)"
        f" and housekeeping for {ADMIN_ROLE}"
    )


def _policy_problems(table: str, found: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    if set(found) != {"owner_rows", "housekeeping"}:
        problems.append(f"{table}: policies {sorted(found)}, expected owner_rows and housekeeping")
    rows = found.get("owner_rows")
    if rows is not None:
        if list(rows["roles"]) != [APP_ROLE] or rows["cmd"] != "ALL":
            problems.append(f"{table}.owner_rows applies to {rows['roles']} for {rows['cmd']}")
        check = str(rows["with_check"])
        # segments' check also asks for the entry row: (owner condition AND (EXISTS ...)).
        if rows["qual"] != _OWNER_EXPR or not (check == _OWNER_EXPR or check.startswith(f"({_OWNER_EXPR} AND ")):
            problems.append(f"{table}.owner_rows is USING {rows['qual']} WITH CHECK {rows['with_check']}")
    keeping = found.get("housekeeping")
    if keeping is not None and list(keeping["roles"]) != [ADMIN_ROLE]:
        problems.append(f"{table}.housekeeping applies to {keeping['roles']}")
    return problems


def _held(function: str, target: str, privileges: tuple[str, ...]) -> str:
    """SELECT columns: whether the role (one parameter each) holds each privilege on ``target``."""
    return ", ".join(f"{function}(?, {target}, '{p}') AS {p.lower()}" for p in privileges)


@DEPLOYMENT(
    "column grants as documented",
    f"has_table_privilege and has_column_privilege of {APP_ROLE} on every table and column",
)
def _grants(ctx: Context) -> str:
    tables = _admin(
        ctx,
        f"SELECT c.oid::bigint AS oid, c.relname AS name, {_held('has_table_privilege', 'c.oid', _TABLE_PRIVILEGES)}"
        " FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p')",
        (APP_ROLE,) * len(_TABLE_PRIVILEGES),
    )
    problems = []
    checked = 0
    for t in tables:
        name = t["name"]
        if name not in TABLE_GRANTS:
            problems.append(f"{name}: not in the documented grants")
            continue
        have = {p for p in _TABLE_PRIVILEGES if t[p.lower()]}
        if have != TABLE_GRANTS[name]:
            problems.append(f"{name}: {sorted(have)} on the table, documented {sorted(TABLE_GRANTS[name])}")
        columns = _admin(
            ctx,
            f"SELECT a.attname AS col, {_held('has_column_privilege', 'a.attrelid, a.attnum', _COLUMN_PRIVILEGES)}"
            " FROM pg_attribute a WHERE a.attrelid = ?::oid AND a.attnum > 0 AND NOT a.attisdropped",
            (*([APP_ROLE] * len(_COLUMN_PRIVILEGES)), t["oid"]),
        )
        for col in columns:
            checked += 1
            expected = set(TABLE_GRANTS[name]) & set(_COLUMN_PRIVILEGES)
            if col["col"] in UPDATE_COLUMNS.get(name, ()):
                expected.add("UPDATE")
            have_col = {p for p in _COLUMN_PRIVILEGES if col[p.lower()]}
            if have_col != expected:
                problems.append(f"{name}.{col['col']}: {sorted(have_col)}, documented {sorted(expected)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{len(tables)} tables and {checked} columns: {APP_ROLE} holds exactly the documented privileges"
        " (no TRUNCATE, REFERENCES or TRIGGER; UPDATE only on the documented columns)"
    )


@DEPLOYMENT(
    "functions as documented",
    "read prosecdef, proconfig, the owner and EXECUTE of the application role and PUBLIC"
    " for every function of the schema",
)
def _functions(ctx: Context) -> str:
    found = _admin(
        ctx,
        "SELECT p.proname AS name, p.prosecdef AS definer, pg_get_userbyid(p.proowner) AS owner,"
        " has_function_privilege(?, p.oid, 'EXECUTE') AS app,"
        " EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a"
        " WHERE a.grantee = 0) AS public,"
        " coalesce(p.proconfig = ARRAY['search_path=' || current_schema()], false) AS pinned"
        " FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace",
        (APP_ROLE,),
    )
    problems = []
    for f in found:
        name = f["name"]
        if name not in FUNCTIONS:
            problems.append(f"{name}: not a documented function")
            continue
        if f["definer"]:
            problems.append(f"{name}: SECURITY DEFINER")
        if not f["pinned"]:
            problems.append(f"{name}: search_path not pinned to the schema")
        if f["owner"] != ADMIN_ROLE:
            problems.append(f"{name}: owned by {f['owner']}")
        if not f["app"] or f["public"]:
            problems.append(f"{name}: EXECUTE for {APP_ROLE} {f['app']}, for PUBLIC {f['public']}")
    missing = FUNCTIONS - {f["name"] for f in found}
    if missing:
        problems.append(f"missing: {sorted(missing)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{len(found)} functions, each SECURITY INVOKER with the schema as search_path, owned by {ADMIN_ROLE},"
        f" EXECUTE for {APP_ROLE} and not for PUBLIC"
    )


# -- the raw query ---------------------------------------------------------------------


@RAW_QUERY(
    "raw query without owner",
    f"count every owner table's rows as {APP_ROLE} with no owner setting, and as one audit owner",
)
def _raw_query(ctx: Context) -> str:
    tables_ = owner_tables(ctx)
    t = ctx.tenants
    counts = " + ".join(f"(SELECT COUNT(*) FROM {table})" for table in tables_)
    total = _admin(ctx, f"SELECT {counts} AS n")[0]["n"]
    unset = _app(ctx, f"SELECT {counts} AS n")[0]["n"]
    if unset:
        raise CheckFailed(f"{APP_ROLE} without the owner setting saw {unset} of {total} rows")
    owner_a, _ = t.owners
    others = " + ".join(f"(SELECT COUNT(*) FROM {table} WHERE owner_user_id <> ?)" for table in tables_)
    own = " + ".join(f"(SELECT COUNT(*) FROM {table})" for table in tables_)
    row = _app(ctx, f"SELECT {others} AS others, {own} AS own", (owner_a,) * len(tables_), owner=owner_a)[0]
    if row["others"] or not row["own"]:
        raise CheckFailed(f"{APP_ROLE} as {owner_a} saw {row['others']} rows of others and {row['own']} in all")
    return (
        f"SELECT COUNT(*) of every owner table as {APP_ROLE}: without the owner setting 0 of {total} rows;"
        f" with owner {owner_a}, its own {row['own']} rows and no other's"
    )


# -- tampered rows ---------------------------------------------------------------------


# An edit of audit rows: the statement, its parameters, and those that put the rows back.
Edit = tuple[str, tuple[Any, ...], tuple[Any, ...]]


@contextmanager
def _tampered(ctx: Context, *edits: Edit) -> Iterator[None]:
    """Edit audit rows in place (one admin transaction), then put them back."""
    db = parts(ctx.pad).db
    with db.transaction(admin=True) as conn:
        for sql, params, _ in edits:
            if conn.execute(sql, params) < 1:
                raise CheckFailed(f"the edit {sql!r} changed no row")
    try:
        yield
    finally:
        with db.transaction(admin=True) as conn:
            for sql, _, undo in edits:
                conn.execute(sql, undo)


def _first_segment(ctx: Context, entry_id: str) -> tuple[bytes, str]:
    """An entry's segment 0 and the UPDATE that replaces it (parameters: data, entry id), wherever it is kept."""
    data = bytes(_admin(ctx, f"SELECT {drills.SEGMENT_SQL} AS data", (entry_id, 0, entry_id, 0))[0]["data"])
    if _in_row(ctx, entry_id):
        return data, "UPDATE entries SET only_segment = ? WHERE id = ?"
    return data, "UPDATE segments SET data = ? WHERE entry_id = ? AND seq = 0"


def _in_row(ctx: Context, entry_id: str) -> bool:
    """Whether the entry keeps its one segment in its row (``only_segment``)."""
    return bool(
        _admin(ctx, "SELECT only_segment IS NOT NULL AS kept FROM entries WHERE id = ?", (entry_id,))[0]["kept"]
    )


@TAMPER("tamper: flipped bit", "flip one bit of a segment row of an audit entry, read the entry")
def _flipped(ctx: Context) -> str:
    t = ctx.tenants
    text = t.ids["text"]
    data, sql = _first_segment(ctx, text)
    bad = bytes([data[0] ^ 1]) + data[1:]
    with _tampered(ctx, (sql, (bad, text), (data, text))):
        got = expect_refused("get after one flipped bit", ctx.pad.get, t.a, text)
        read = expect_refused("head read after one flipped bit", ctx.pad.read, t.a, text, mode="head", n=10)
    return f"one bit flipped in segment 0 of the text entry's row: get -> {got}, head read -> {read}"


@TAMPER("tamper: segment moved", "replace a segment's data with another owner's")
def _segment_moved(ctx: Context) -> str:
    t = ctx.tenants
    binary, theirs = t.ids["binary"], t.ids["b_text"]
    (mine, sql), (other, _) = _first_segment(ctx, binary), _first_segment(ctx, theirs)
    with _tampered(ctx, (sql, (other, binary), (mine, binary))):
        got = expect_refused("segment from another owner", ctx.pad.get, t.a, binary)
    return f"segment 0 of a's binary entry replaced by owner b's: {got}"


@TAMPER("tamper: item key swapped", "copy another entry's wrapped item key into an audit entry's row")
def _item_key_swapped(ctx: Context) -> str:
    t = ctx.tenants
    text, json_ = t.ids["text"], t.ids["json"]
    keys = {
        r["id"]: bytes(r["k"])
        for r in _admin(ctx, "SELECT id, wrapped_key AS k FROM entries WHERE id IN (?, ?)", (text, json_))
    }
    sql = "UPDATE entries SET wrapped_key = ? WHERE id = ?"
    with _tampered(ctx, (sql, (keys[text], json_), (keys[json_], json_))):
        got = expect_refused("another entry's wrapped item key", ctx.pad.get, t.a, json_)
    return f"the json entry given the text entry's wrapped item key: {got}"


@TAMPER("tamper: row moved to another owner", "relabel owner a's row and segments as owner b's")
def _row_moved(ctx: Context) -> str:
    t = ctx.tenants
    text = t.ids["text"]
    owner_a, owner_b = t.owners
    entry = "UPDATE entries SET owner_user_id = ? WHERE id = ?"
    segments = "UPDATE segments SET owner_user_id = ? WHERE entry_id = ?"
    edits: list[Edit] = [(sql, (owner_b, text), (owner_a, text)) for sql in (entry, segments)]
    if _in_row(ctx, text):  # its one segment moves with the row
        edits = edits[:1]
    with _tampered(ctx, *edits):
        taken = expect_refused("b reads a's row relabelled as b's", ctx.pad.get, t.b, text)
        ctx.expect_not_found("a asks for its relabelled row", ctx.pad.get, t.a, text)
    return f"a's row (and its segments) relabelled as owner b's: b's get -> {taken}, a's get -> NotFoundError"
