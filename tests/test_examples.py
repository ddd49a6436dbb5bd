"""The agent-loop example and the docs page that shows it run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "agent_loop.py"
# The docs' agent-loop page.
DOC_TEXT = (ROOT / "docs" / "how-to" / "agent-loop.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", DOC_TEXT, re.S)


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False
    )


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The example run once, in a directory of its own; the tests that check its output share it."""
    where = tmp_path_factory.mktemp("agent-loop")
    return run_python([str(EXAMPLE)], where), where


def test_agent_loop_example_runs(example_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, where = example_run
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "20001:2024-05-01T15:33:20 ERROR disk /var full" in out
    assert "20002:2024-05-01T15:33:21 ERROR upload 2231 failed: no space" in out
    assert "step 2: wrote 1086916 bytes through {{step1.content}}" in out
    assert "bad call: mode 'grep' needs pattern" in out
    assert list(where.iterdir()) == []  # everything it made lived in its own temporary directory


def test_the_doc_shows_the_example_as_it_is() -> None:
    assert BLOCKS[0] == EXAMPLE.read_text(encoding="utf-8")


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_of_the_doc_runs(index: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The first block is the example (the test above): its run stands for the block's."""
    if BLOCKS[index] == EXAMPLE.read_text(encoding="utf-8"):
        result, _ = request.getfixturevalue("example_run")
    else:
        result = run_python(["-c", BLOCKS[index]], tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_doc_output_is_the_examples_output(example_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """The output shown in the doc is what the example prints, but for the random
    id and the history's size (it holds the temporary directory's path)."""
    heading = r"Its output \(the id differs each run, and so does the history's size: it holds the temporary"
    heading += r" directory's path\):\n\n```\n(.*?)```"
    shown = re.search(heading, DOC_TEXT, re.S)
    assert shown is not None
    result, _ = example_run
    varying = re.compile(r"stored as [0-9a-f]{16}|, \d+ characters$", re.M)
    assert varying.sub("", result.stdout) == varying.sub("", shown.group(1))
