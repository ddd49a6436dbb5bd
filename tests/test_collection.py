"""Collecting the suite imports no agent framework, and each framework's tests
carry their framework's pytest-xdist group.

Every pytest-xdist worker collects every test module, and the frameworks cost
seconds of CPU to import (the OpenAI Agents SDK about two, LangGraph with
LangChain and the MCP SDK about one each). A test module imports its framework
(and its ``securepad.integrations`` adapter) only inside the fixtures, tests and
helpers that use it, and marks those tests ``xdist_group`` with the framework's
group: ``-m "not slow"`` leaves them out (``tests/conftest.py``), and
``--dist=loadgroup`` (the test command's) keeps each framework on one worker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.collected_frameworks import FRAMEWORKS_AT_COLLECTION
from tests.support.paths import ROOT, TESTS

# Each framework's package (or adapter module) and the xdist group of its tests.
GROUPS = {
    "agents": "openai_agents",
    "openai": "openai_agents",
    "langgraph": "langgraph",
    "langchain_core": "langgraph",
    "langsmith": "langgraph",
    "mcp": "mcp",
    "securepad.integrations.langgraph": "langgraph",
    "securepad.integrations.langgraph_saver": "langgraph",
    "securepad.integrations.openai_agents": "openai_agents",
    "securepad.integrations.openai_session": "openai_agents",
    "securepad.integrations.mcp": "mcp",
}
# Scripts that write the fixtures: run by hand, never collected.
NOT_COLLECTED = TESTS / "fixtures"


def group_of(module: str) -> str | None:
    """The xdist group of the tests importing ``module``: ``None`` for a module of no framework."""
    for prefix in sorted(GROUPS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return GROUPS[prefix]
    return None


def imported_groups(node: ast.AST) -> set[str]:
    """The groups of the frameworks the imports under ``node`` name."""
    groups: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            groups.update(group for alias in sub.names if (group := group_of(alias.name)) is not None)
        elif isinstance(sub, ast.ImportFrom) and sub.module is not None and sub.level == 0:
            group = group_of(sub.module)
            if group is not None:
                groups.add(group)
    return groups


def marked_groups(nodes: list[ast.expr]) -> set[str]:
    """The names of the ``xdist_group`` marks among ``nodes`` (decorators, or ``pytestmark``'s value)."""
    return {
        sub.args[0].value
        for node in nodes
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "xdist_group"
        and sub.args
        and isinstance(sub.args[0], ast.Constant)
        and isinstance(sub.args[0].value, str)
    }


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def misplaced_imports(path: Path) -> list[str]:
    """What in the module at ``path`` breaks the rule: a framework imported when
    the module is imported, or a function importing one that runs in no group of
    the frameworks the module imports (a module mixing two runs in one of them:
    that worker imports both). A test's group is the module's ``pytestmark`` or
    its own mark; a helper's, any of the module's."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    module_marks = marked_groups([n.value for n in tree.body if isinstance(n, ast.Assign) and _names_pytestmark(n)])
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    tests = {n.name: marked_groups(n.decorator_list) for n in defined if n.name.startswith(("test", "Test"))}
    frameworks = set().union(*map(imported_groups, defined))
    found = [
        f"{where}:{node.lineno}: a framework imported with the module"
        for node in tree.body
        if node not in defined and not is_type_checking(node) and imported_groups(node)
    ]
    for node in defined:
        if not imported_groups(node):
            continue
        marks = module_marks | tests[node.name] if node.name in tests else module_marks.union(*tests.values())
        if not marks or not marks <= frameworks:
            found.append(f"{where}: {node.name} imports {sorted(imported_groups(node))}, runs in {sorted(marks)}")
    return found


def _names_pytestmark(node: ast.Assign) -> bool:
    return any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)


def test_framework_imports_are_lazy_and_their_tests_grouped() -> None:
    paths = [path for path in sorted(TESTS.rglob("*.py")) if not path.is_relative_to(NOT_COLLECTED)]
    assert TESTS / "integrations" / "test_openai_agents.py" in paths
    assert [problem for path in paths for problem in misplaced_imports(path)] == []


def test_the_check_sees_each_misplacement(tmp_path: Path) -> None:
    cases = {
        "eager.py": "from langgraph.graph import StateGraph\n",
        "unmarked.py": "def test_a():\n    from agents import Agent\n",
        "other_group.py": "import pytest\npytestmark = pytest.mark.xdist_group('mcp')\n"
        "def helper():\n    import securepad.integrations.langgraph_saver\n",
        "marked_helper.py": "import pytest\n@pytest.mark.xdist_group('mcp')\n"
        "def helper():\n    from mcp import Client\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert misplaced_imports(tmp_path / name), name
    fine = {
        "module_mark.py": "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.xdist_group('openai_agents')]\n"
        "def helper():\n    from agents.memory import SessionSettings\n",
        "test_mark.py": "import pytest\n@pytest.mark.xdist_group('langgraph')\ndef test_a():\n    import langgraph\n",
        "typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mcp import Client\n",
    }
    for name, text in fine.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert misplaced_imports(tmp_path / name) == [], name


def test_collecting_the_suite_imports_no_framework(pytestconfig: pytest.Config) -> None:
    """What this test process's own collection imported (``tests/conftest.py``
    records it once collection is over: under pytest-xdist each worker collects
    the whole suite)."""
    assert pytestconfig.stash[FRAMEWORKS_AT_COLLECTION] == []
