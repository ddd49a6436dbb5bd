"""Every code example of the README and the docs site runs as written, twice.

Python blocks run in a fresh interpreter; bash blocks run in bash with a fresh
HOME, in a scratch directory, with this environment's ``securepad`` first on
the PATH. Each Python block runs twice in the same HOME and directory, so an
example that only works once (a fixed store, step or owner it leaves behind)
fails; each bash block runs alone in a fresh HOME, then all of them together in
one HOME, each after every other one, so that no example reads what another
one left or works only once. The tutorial's
Python steps continue one another and run as one program. A block preceded
by ``<!-- not run: REASON -->`` is not run (it installs packages or names a
deployment's paths); the Python blocks of the agent-loop and integration
pages have tests of their own (test_examples.py, test_docs_integrations.py),
which check what they print.

The PostgreSQL guide's blocks run in order against the local server, as a
reader would run them from zero, in a database and with logins of their own
(their names are made unique for the run, and dropped afterwards).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
POSTGRESQL_GUIDE = DOCS / "how-to" / "postgresql.md"
TESTED_ELSEWHERE = {DOCS / "how-to" / "agent-loop.md", *(DOCS / "integrations").glob("*.md")}
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
STEPS = {DOCS / "tutorial.md"}
# The bash blocks that leave nothing where another example could find it: all
# their files are in directories of their own that ``mktemp -d`` made
# (test_the_example_runs_twice checks it of each).
SELF_CONTAINED = {
    "docs/how-to/aws-kms.md#1",
    "docs/how-to/backup.md#1",
    "docs/how-to/keys.md#1",
    "docs/how-to/pkcs11.md#1",
}
_BLOCK = re.compile(r"(<!-- not run: [^>]+ -->\n)?```(python|bash)\n(.*?)```", re.S)


def _page_blocks(page: Path) -> list[tuple[str, str, str]]:
    """The blocks of a page that run: (where, language, code). The tutorial's
    Python steps continue one another, so they run as one program, in order."""
    text = page.read_text(encoding="utf-8")
    blocks = [
        (f"{page.relative_to(ROOT)}#{number}", language, code)
        for number, (skip, language, code) in enumerate(_BLOCK.findall(text), start=1)
        if not skip and (language == "bash" or page not in TESTED_ELSEWHERE)
    ]
    if page in STEPS:
        steps = "\n".join(code for _, language, code in blocks if language == "python")
        blocks = [(f"{page.relative_to(ROOT)}#steps", "python", steps)] + [b for b in blocks if b[1] == "bash"]
    return blocks


BLOCKS = [block for page in PAGES if page != POSTGRESQL_GUIDE for block in _page_blocks(page)]


def _environment(home: Path) -> dict[str, str]:
    """The reader's environment; the examples' ``mktemp -d`` directories go beside HOME, with the test's files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECUREPAD_", "XDG_", "PG"))}
    scratch = home.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env | {"HOME": str(home), "TMPDIR": str(scratch), "PATH": path}


def _run(where: str, language: str, code: str, home: Path, work: Path) -> str:
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=work, env=_environment(home), check=False
    )
    assert result.returncode == 0, (where, result.stdout[-2000:], result.stderr[-2000:])
    return result.stdout


def _home_and_work(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(parents=True)
    work.mkdir()
    (tmp_path / "tmp").mkdir()  # TMPDIR
    return home, work


_MKTEMP = re.compile(r"tmp\.[A-Za-z0-9]{10}")


def _under(path: Path, directories: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in directories)


def _findable(home: Path, work: Path) -> list[tuple[str, int, int]]:
    """What another example could find (each file's path, size and time of change):
    everything in HOME and in the working directory, and everything in TMPDIR but
    the directories ``mktemp -d`` makes there (``tmp.`` and ten random characters:
    no other example can name one)."""
    scratch = home.parent / "tmp"
    unguessable = [path for path in scratch.iterdir() if path.is_dir() and _MKTEMP.fullmatch(path.name)]
    found = [*home.rglob("*"), *work.rglob("*"), *(p for p in scratch.rglob("*") if not _under(p, unguessable))]
    stats = [(str(path.relative_to(home.parent)), path.lstat()) for path in found]
    return sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "language", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_the_example_runs_twice(where: str, language: str, code: str, tmp_path: Path) -> None:
    """A bash block's second run is in the next test, after every other bash block."""
    home, work = _home_and_work(tmp_path)
    for _ in range(2 if language == "python" else 1):
        _run(where, language, code, home, work)
    if where in SELF_CONTAINED:
        assert _findable(home, work) == [], where


@pytest.mark.slow
def test_the_command_line_examples_run_in_any_order_in_one_home(tmp_path: Path) -> None:
    """No command-line example reads an entry, a step or a key that another one
    made, nor works only once: every block runs here where every other block
    has already run. The blocks that leave something behind run in page order,
    then every block runs backwards, so each of those runs both before and
    after each other block, the second time where it ran itself. A
    self-contained block runs once, in the second round: its own earlier run,
    or one before any other block, would leave nothing that this home's other
    runs could find, so this home is the same as if it had."""
    home, work = _home_and_work(tmp_path)
    bash = [block for block in BLOCKS if block[1] == "bash"]
    assert len(bash) >= 4
    assert {where for where, _, _ in bash} >= SELF_CONTAINED
    leave_something = [block for block in bash if block[0] not in SELF_CONTAINED]
    for where, language, code in [*leave_something, *reversed(bash)]:
        before = _findable(home, work)
        _run(where, language, code, home, work)
        assert where not in SELF_CONTAINED or _findable(home, work) == before, where


@pytest.fixture
def postgresql_server(pg_dsn: str) -> Iterator[object]:
    """A connection to the local server as a role that may create databases and
    roles (``pg_dsn`` holds the tests' roles lock shared meanwhile: no test
    changes the store's roles while the guide runs)."""
    import psycopg

    missing = [tool for tool in ("createdb", "psql") if shutil.which(tool) is None]
    if missing:
        reason = f"the PostgreSQL guide needs the client tools {', '.join(missing)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with psycopg.connect(pg_dsn, autocommit=True) as server:
        yield server


@pytest.mark.slow
def test_the_postgresql_guide_runs_from_zero_twice(postgresql_server: object, tmp_path: Path) -> None:
    """The guide's blocks in order, twice, each time with a new database and new logins."""
    import psycopg

    assert isinstance(postgresql_server, psycopg.Connection)
    blocks = _page_blocks(POSTGRESQL_GUIDE)
    assert [language for _, language, _ in blocks] == ["bash", "python", "python", "bash"]
    for attempt in range(2):
        name = f"securepad_doc_{secrets.token_hex(4)}"
        names = {
            r"\bagents\b": name,
            r"\bagent_runtime\b": f"{name}_app",
            r"\bsecurepad_ops\b": f"{name}_ops",
            r"\bsecurepad_auditor\b": f"{name}_aud",
        }
        home, work = _home_and_work(tmp_path / str(attempt))
        try:
            outputs = []
            for where, language, code in blocks:
                for pattern, replacement in names.items():
                    code = re.sub(pattern, replacement, code)
                outputs.append(_run(where, language, code, home, work))
        finally:
            postgresql_server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            for login in ("app", "ops", "aud"):
                postgresql_server.execute(f"DROP ROLE IF EXISTS {name}_{login}")
        ran = "".join(outputs)
        assert "20001:line 20000: ERROR disk full" in ran
        assert "bob refused: no such entry" in ran
        assert 'permission denied to set role "securepad_admin"' in ran.split("housekeeping refused:")[1]
        assert "entries: 1\n" in ran  # the run's own entry, in a database of its own
        assert re.search(r"^(\d+) of \1 checks passed$", ran, re.M), ran


def test_the_postgresql_guide_is_a_guide() -> None:
    text = POSTGRESQL_GUIDE.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^## (.*)$", text, re.M)
    for step in ("Create the database", "Run the application", "Housekeeping", "PgBouncer", "TLS"):
        assert any(step in heading for heading in headings), step


def test_the_performance_page_gives_todays_figures_and_every_target() -> None:
    """One page of current figures, each with the command that reproduces it,
    and a table of every target with today's figure and whether it is met."""
    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    targets = text.split("## The targets, today")[1].split("\n## ")[0]
    rows = [line for line in targets.splitlines() if line.startswith("| ") and not line.startswith("| target")]
    assert len(rows) >= 17
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[2] in ("yes", "no") or re.fullmatch(r"\d of \d", cells[2]), row
        assert cells[3].startswith("`securepad bench") or cells[3].startswith("`python -m benchmarks."), row


def test_every_page_has_its_examples_counted() -> None:
    """A block the pattern misses (a typo in the fence or the marker) would go untested."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert len(re.findall(r"^```(?:python|bash)$", text, re.M)) == len(_BLOCK.findall(text)), page


def test_readme_starts_with_the_two_setup_commands() -> None:
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)[:2]
    assert "pip install ." in commands[0] and "securepad" in commands[0]
    assert "pip install '.[test]'" in commands[1] and "pytest" in commands[1]


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 200
    for page in (
        "how-to/reads.md",
        "how-to/keys.md",
        "how-to/policies.md",
        "integrations/index.md",
        "how-to/postgresql.md",
        "how-to/audit.md",
        "reference/cli.md",
        "reference/api.md",
    ):
        assert f"docs/{page}" in README, page
        assert (DOCS / page).is_file(), page
    assert "pip install securepad" not in README and "securepad[" not in README


def test_the_docs_navigation_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, page


def test_the_audit_page_counts_the_checks_there_are(tmp_path: Path) -> None:
    from securepad import Keyring, Scratchpad
    from securepad.audit import Audit

    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_key_file(tmp_path / "key")) as pad:
        count = len(Audit(pad).checks)
    text = (DOCS / "how-to" / "audit.md").read_text(encoding="utf-8")
    stated = re.findall(r"(\d+) rows in all|all (\d+) checks passed|of (\d+) checks FAILED|\"checks\": (\d+)", text)
    assert len(stated) == 4 and {int(n) for group in stated for n in group if n} == {count}


# What a page never says: the product speaks of itself, not of how it was built.
# Issue and stop numbers, commit ids, branches, dates, clock times and machine
# load belong in the commit log, the changelog and the decision records' figures.
HISTORY = {
    "a stop number": re.compile(r"\b[Ss]tops? \d+"),
    "an issue number": re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/])#\d{1,4}\b"),
    "a commit id": re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)(?:[0-9a-f]{7,12}|[0-9a-f]{40})(?![\w-])"),
    "a branch": re.compile(r"\b[Bb]ranch(?:es)? [a-z]*\d|\bon main\b|\bmain at\b"),
    "the machine's load": re.compile(r"\bload average|\bload \d"),
    "a clock time": re.compile(r"\b\d{1,2}:\d\d(?::\d\d)? UTC\b"),
    "a date": re.compile(
        r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (?:January|February|March|April|May|June|July|August|September"
        r"|October|November|December) 20\d\d\b"
    ),
}
# Dates and times inside code blocks are example data (a log line), not history.
PROSE_ONLY = {"a date", "a clock time"}
HISTORY_FREE = [
    *(ROOT / name for name in ("README.md", "SECURITY.md", "ARCHITECTURE.md")),
    *sorted(DOCS.rglob("*.md")),
]


def _history_in(text: str) -> list[tuple[str, str]]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found = []
    for what, pattern in HISTORY.items():
        for match in pattern.finditer(prose if what in PROSE_ONLY else text):
            found.append((what, match.group(0)))
    return found


@pytest.mark.parametrize("page", HISTORY_FREE, ids=[str(p.relative_to(ROOT)) for p in HISTORY_FREE])
def test_no_page_tells_how_it_was_built(page: Path) -> None:
    assert _history_in(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "sentence",
    [
        "Stop" + " 25's runs",
        "since issue " + "14",
        "as in #13",
        "main at 879317b",
        "on branch " + "i17b",
        "load " + "average 2.6",
        "12:05 UTC",
        "on 1 December 2026",
        "run 2026-12-01",
    ],
)
def test_the_history_guard_sees_each_kind(sentence: str) -> None:
    assert _history_in(sentence) != []


@pytest.mark.parametrize(
    "module_name",
    [
        "securepad",
        "securepad.audit",
        pytest.param("securepad.integrations.langgraph", marks=pytest.mark.xdist_group("langgraph")),
        pytest.param("securepad.integrations.langgraph_saver", marks=pytest.mark.xdist_group("langgraph")),
        pytest.param("securepad.integrations.openai_agents", marks=pytest.mark.xdist_group("openai_agents")),
        pytest.param("securepad.integrations.openai_session", marks=pytest.mark.xdist_group("openai_agents")),
        pytest.param("securepad.integrations.mcp", marks=pytest.mark.xdist_group("mcp")),
    ],
)
def test_the_api_reference_has_every_public_class_and_function(module_name: str) -> None:
    import inspect

    module = pytest.importorskip(module_name)
    api = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    # ``::: a.b.Name`` documents one name; ``::: a.b`` with ``members: [...]`` in its options documents those.
    documented = set(re.findall(r"^::: ([\w.]+)$", api, re.M))
    for block, members in re.findall(r"^::: ([\w.]+)\n(?:[ ]+.*\n)*?[ ]+members: \[([^\]]*)\]", api, re.M):
        documented = (documented - {block}) | {f"{block}.{name.strip()}" for name in members.split(",")}
    for name in module.__all__:
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        places = {f"{module_name}.{name}", f"{value.__module__}.{name}", value.__module__}
        assert places & documented, f"{module_name}.{name}"


def _comments_and_docstrings(source: str) -> str:
    """The comments and docstrings of a Python file, one after another."""
    import ast
    import io
    import tokenize

    parts = [
        tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                parts.append(docstring)
    return "\n".join(parts)


CODE = sorted(
    path
    for path in [*(ROOT / "securepad").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    if path != Path(__file__).resolve()
)


def test_no_comment_or_docstring_names_an_issue_or_a_stop() -> None:
    """The code names a concept ("the one-message put"), not the issue or stop that made it."""
    found = []
    kinds = ("a stop number", "an issue number")
    for path in CODE:
        source = path.read_text(encoding="utf-8")
        if not any(HISTORY[what].search(source) for what in kinds):
            continue  # not in the file at all, so not in its comments and docstrings
        text = _comments_and_docstrings(source)
        for what in kinds:
            found += [(str(path.relative_to(ROOT)), match.group(0)) for match in HISTORY[what].finditer(text)]
    assert found == []


def test_the_code_guard_reads_comments_and_docstrings_only() -> None:
    issue, stop, other = "issue " + "15", "stop " + "25", "issue " + "3"
    source = f'"""Module ({issue})."""\n\n\ndef f() -> str:\n    # {stop}\n    return "{other}"\n'
    text = _comments_and_docstrings(source)
    assert issue in text and stop in text and other not in text


def test_the_architecture_map_is_short_and_names_only_what_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    named = set(
        re.findall(
            r"`((?:securepad/|tests/|core/|crypto/|storage/|keys/|tables/|maintenance/|bench/|integrations/)[\w/]*\.py)`",
            text,
        )
    )
    assert named
    package = ROOT / "securepad"
    missing = [p for p in sorted(named) if not (ROOT / p).exists() and not (package / p).exists()]
    assert missing == []
    for question in ("Where is the owner check for a read?", "Where is an entry sealed?", "Where is the schema?"):
        assert f"| {question} |" in text
