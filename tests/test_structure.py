"""The layering rules of ARCHITECTURE.md, checked by reading the code (``ast``).

- no import circle inside ``securepad/`` (imports under ``TYPE_CHECKING`` count);
- no module imports another module's underscore names (``from .x import _y``);
- no module reads an underscore attribute of an object of another module's
  class (``obj._attr`` where no class of the reading module defines ``_attr``);
- ``AESGCM``, ``HKDF``, ``HMAC`` (and anything of ``cryptography``'s hazmat
  layer) appear only in ``crypto/``;
- a module imports only its own layer and the layers below it (``LAYERS``);
- SQL appears only under ``storage/`` and ``tables/`` (and in the audit's
  drills, which edit the SQLite file as an attacker would, and the benchmark
  suite's baselines).
- one authorized fetch: in ``tables/``, only ``access.py`` reads the sealed tables.
- sizes a reader takes in at one sitting: no module over 600 lines, no class
  over 300, no function over 60 (``SIZE_LIMITS``).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import securepad

PACKAGE = Path(securepad.__file__).resolve().parent
MODULES = {
    ".".join(("securepad", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
    for path in sorted(PACKAGE.rglob("*.py"))
}


class _Trees(Mapping[str, ast.Module]):
    """Each module's syntax tree, parsed when a test first reads one (not at
    collection, which every pytest-xdist worker repeats)."""

    @functools.cached_property
    def _parsed(self) -> dict[str, ast.Module]:
        return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}

    def __getitem__(self, module: str) -> ast.Module:
        return self._parsed[module]

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


TREES = _Trees()

CRYPTO_NAMES = {"AESGCM", "HKDF", "HMAC", "hmac"}
CRYPTO_PACKAGE = "securepad.crypto"
# SQL lives under storage/ and tables/, with two stated exceptions: the
# audit's drills, which edit the SQLite file as an attacker would, and the
# benchmark suite's baselines (raw SQLite, sqlite3, diskcache, SQLCipher).
SQL_FOLDERS = ("securepad.storage.", "securepad.tables.")
SQL_EXCEPTIONS = {"securepad.audit.drills"}
SQL_PREFIXES = ("securepad.bench.",)
# Modules that still hold SQL elsewhere, each to move it below: the list only shrinks.
SQL_ELSEWHERE = {
    "securepad.audit",
    "securepad.audit._api",
    "securepad.audit._files",
    "securepad.audit._postgres",
}
# namedtuple's public methods start with an underscore (to stay clear of field names).
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}
SQL_STARTS = ("SELECT ", "DELETE FROM ", "INSERT INTO ", "UPDATE ", "CREATE TABLE ", "DROP TABLE ")


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import of ``module``."""
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                # ``from . import x`` imports the module x.
                if f"{target}.{alias.name}" in MODULES:
                    yield f"{target}.{alias.name}", None, node.lineno
                else:
                    yield target, alias.name, node.lineno


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            if target in MODULES and target != module and not module.startswith(f"{target}."):
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_detector_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = [
        f"{module}:{line} imports {name} from {target}"
        for module in MODULES
        for target, name, line in _imports(module)
        if target.startswith("securepad") and name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def _own_private_attributes(tree: ast.Module) -> set[str]:
    """Underscore attributes the module's own classes define: assigned on self,
    declared in __slots__, or defined as methods, properties and class attributes."""
    names: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("_"):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id.startswith("_"):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
                names.add(node.value)  # __slots__ entries
    return names


def test_no_module_reads_private_attributes_of_another_modules_objects() -> None:
    offenders = []
    for module, tree in TREES.items():
        own = _own_private_attributes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if node.attr in NAMEDTUPLE_API:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in own:
                offenders.append(f"{module}:{node.lineno} reads .{node.attr}")
    assert offenders == []


def test_raw_crypto_primitives_only_in_crypto() -> None:
    offenders = [
        f"{module}:{line} imports {name or target}"
        for module in MODULES
        if not module.startswith(CRYPTO_PACKAGE)
        for target, name, line in _imports(module)
        if target.startswith("cryptography.hazmat") or name in CRYPTO_NAMES or target in CRYPTO_NAMES
    ]
    assert offenders == []
    uses = [
        f"{module}:{node.lineno}"
        for module, tree in TREES.items()
        if not module.startswith(CRYPTO_PACKAGE)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id in CRYPTO_NAMES
    ]
    assert uses == []


# What the command line may import of the package: the public names of
# ``securepad``, and the modules documented as public.
CLI_PUBLIC = ("securepad.errors", "securepad.audit", "securepad.integrations", "securepad.bench", "securepad.cli")


def _cli_private_imports(imports: dict[str, list[tuple[str, str | None, int]]]) -> list[str]:
    return [
        f"{module}:{line} imports {target}{'.' + name if name else ''}"
        for module, found in imports.items()
        for target, name, line in found
        if target.startswith("securepad")
        and not target.startswith(CLI_PUBLIC)
        and not (target == "securepad" and name in securepad.__all__)
    ]


def test_the_cli_imports_public_names_only() -> None:
    cli = {module: list(_imports(module)) for module in MODULES if module.startswith("securepad.cli")}
    assert cli and _cli_private_imports(cli) == []


def test_the_cli_rule_sees_a_private_import() -> None:
    found = {"securepad.cli.x": [("securepad.storage.postgres.database", "describe", 1), ("securepad", "_log", 2)]}
    assert len(_cli_private_imports(found)) == 2
    assert (
        _cli_private_imports({"securepad.cli.x": [("securepad", "Scratchpad", 1), ("securepad.errors", None, 2)]}) == []
    )


def _may_hold_sql(module: str) -> bool:
    return module.startswith(SQL_FOLDERS + SQL_PREFIXES) or module in SQL_EXCEPTIONS


def _holding_sql() -> set[str]:
    return {
        module
        for module, tree in TREES.items()
        if not _may_hold_sql(module)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip().upper().startswith(SQL_STARTS)
    }


def test_sql_only_under_storage_and_tables() -> None:
    assert sorted(_holding_sql() - SQL_ELSEWHERE) == []


def test_the_list_of_sql_elsewhere_only_shrinks() -> None:
    assert sorted(SQL_ELSEWHERE - _holding_sql()) == []


# The one module of tables/ that reads the sealed tables.
FETCH_MODULE = "securepad.tables.access"
# A SELECT that reads a sealed table: its name (or a table substituted into an
# f-string, ``{}``) after FROM or JOIN, anywhere in the statement.
_SEALED_SELECT = re.compile(
    r"\bSELECT\b.*\b(?:FROM|JOIN)\s+(?:(?:entries|segments|checkpoints|compaction_marks)\b|\{\})",
    re.IGNORECASE | re.DOTALL,
)
_WRITES = ("INSERT ", "UPDATE ", "DELETE ")


def _sql_text(node: ast.AST) -> str | None:
    """The text of a string literal; an f-string's substitutions read as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    return None


def _sealed_selects(tree: ast.Module) -> list[int]:
    """The lines of the string literals of ``tree`` that read a sealed table.

    Covered: every string literal and f-string that holds ``SELECT`` and, after
    it, ``FROM`` or ``JOIN`` followed by ``entries``, ``segments``,
    ``checkpoints``, ``compaction_marks`` or a substituted name (``{table}``):
    a statement, a sub-query or a fragment. Not covered: a literal that begins
    with INSERT, UPDATE or DELETE (a write, its sub-queries with it), SQL
    assembled from several literals, and reads of other tables (the heads,
    the owner keys)."""
    lines = set()
    for node in ast.walk(tree):
        text = _sql_text(node)
        if text is None or text.lstrip().upper().startswith(_WRITES):
            continue
        if _SEALED_SELECT.search(text):
            lines.add(node.lineno)
    return sorted(lines)


def test_only_access_reads_the_sealed_tables() -> None:
    """One authorized fetch: no module of ``securepad/tables/`` but
    ``tables/access.py`` reads entries, segments, checkpoints or compaction
    marks (``_sealed_selects`` says what a read is). The heads' own statements
    (``tables/heads/``, which read the sealed tables' clear columns to check a
    turn's head) are outside the rule."""
    offenders = [
        f"{module}:{line}"
        for module, tree in TREES.items()
        if module.startswith("securepad.tables.")
        and module != FETCH_MODULE
        and not module.startswith("securepad.tables.heads.")
        for line in _sealed_selects(tree)
    ]
    assert offenders == []
    assert _sealed_selects(TREES[FETCH_MODULE])


def test_the_fetch_rule_sees_a_read_of_a_sealed_table() -> None:
    source = (
        "def f(db, conn, table):\n"
        "    db.query(f'SELECT id FROM {table} WHERE turn_id = ?')\n"
        "    db.query('SELECT seq, data FROM segments WHERE entry_id = ?')\n"
        "    x = 'COALESCE(s, (SELECT data FROM segments WHERE seq = 0))'\n"
        "    conn.execute('DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries)')\n"
        "    conn.execute('INSERT INTO entries(id) VALUES (?)')\n"
        "    db.query('SELECT sealed FROM turn_heads WHERE owner_user_id = ?')\n"
        "    db.query(f'SELECT MAX(e) FROM ({x}) AS taken')\n"
    )
    assert _sealed_selects(ast.parse(source)) == [2, 3, 4]


@pytest.mark.parametrize(
    "module",
    [
        "securepad.store",
        "securepad._assembly",
        "securepad.turn",
        "securepad.aio",
        "securepad.core.read_modes",
        "securepad.keys.master",
        "securepad.keys.keystore",
    ],
)
def test_the_faces_pure_layers_and_keys_hold_no_sql(module: str) -> None:
    assert not _may_hold_sql(module) and module not in SQL_ELSEWHERE


def test_the_cli_and_the_audit_import_without_the_postgresql_extra() -> None:
    """`pip install securepad` (no extras) must run `securepad audit`: psycopg is optional."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import securepad.cli.commands, securepad.audit, securepad.maintenance.verify"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


# The layers, lowest first. A module imports only its own layer and the layers
# below it (ARCHITECTURE.md, "The tree"). A layer is a folder or, at the top of
# the package, a module; the faces (the store, the turn, their assembly and the
# async face) are one layer.
LAYERS: list[tuple[str, ...]] = [
    ("securepad.errors",),
    ("securepad.principal",),
    ("securepad.core",),
    ("securepad.crypto",),
    ("securepad.storage",),
    ("securepad.policy",),
    ("securepad.keys",),
    ("securepad.tables",),
    ("securepad.maintenance",),
    (
        "securepad._assembly",
        "securepad._housekeeping",
        "securepad._place",
        "securepad.store",
        "securepad.turn",
        "securepad._steps",
        "securepad.aio",
    ),
    ("securepad.audit", "securepad.integrations", "securepad.mcp_server"),
    ("securepad.bench",),
    ("securepad.cli",),
    ("securepad", "securepad.__main__"),
]


def _layer(module: str) -> int:
    """The rank of ``module``'s layer (the longest prefix that names one)."""
    best = (-1, -1)
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(f"{name}.")) and len(name) > best[1]:
                best = (rank, len(name))
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return best[0]


# Arrows that still point up, each to be removed by moving the code to the
# layer that owns the decision. The list only shrinks.
UPWARD: set[tuple[str, str]] = set()


def _upward_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for module, targets in _graph().items():
        for target in targets:
            if target.startswith("securepad") and _layer(target) > _layer(module):
                arrows.add((module, target))
    return arrows


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    assert _upward_arrows() - UPWARD == set()


def test_the_list_of_upward_arrows_only_shrinks() -> None:
    assert UPWARD - _upward_arrows() == set()


def test_the_layer_rule_sees_an_upward_arrow() -> None:
    assert _layer("securepad.tables.heads.heads") > _layer("securepad.storage.sqlite")
    assert _layer("securepad.storage.schema") < _layer("securepad.tables.heads.reading")


# What one reader takes in at one sitting (STYLE.md, "Keep files small enough
# to read in one sitting"): lines of a module, a class, a function or method
# (from its ``def`` or ``class`` line to its last, docstring included).
SIZE_LIMITS = {"module": 600, "class": 300, "function": 60}


def _sizes(name: str, tree: ast.Module, lines: int) -> Iterator[tuple[str, str, int]]:
    """(kind, where, lines) of the module and of every class and function in it."""
    yield "module", name, lines
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield kind, f"{name}:{node.lineno} {node.name}", (node.end_lineno or node.lineno) - node.lineno + 1


def _oversized(sizes: Iterator[tuple[str, str, int]]) -> list[str]:
    return [f"{where}: {kind} of {size} lines" for kind, where, size in sizes if size > SIZE_LIMITS[kind]]


def test_no_module_class_or_function_is_over_its_size_limit() -> None:
    offenders = [
        found
        for name, path in MODULES.items()
        for found in _oversized(_sizes(name, TREES[name], len(path.read_text().splitlines())))
    ]
    assert offenders == []


def test_the_size_rule_sees_a_long_class_and_a_long_method() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    source = f"class A:\n    def f(self) -> None:\n{body}\n" + "\n".join(f"    y{i} = {i}" for i in range(239))
    found = _oversized(_sizes("m", ast.parse(source), 10))
    assert found == ["m:1 A: class of 301 lines", "m:2 f: function of 61 lines"]
    assert _oversized(_sizes("m", ast.parse("x = 1\n"), 601)) == ["m: module of 601 lines"]
