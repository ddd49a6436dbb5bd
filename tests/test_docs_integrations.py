"""Every Python example of the docs' integration pages runs as written and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The migration guides (SecurepadSaver, SecurepadSession) show an example of examples/ that
# tests/integrations/test_langgraph_saver_example.py and test_openai_session_example.py run and compare.
OWN_TESTS = {"langgraph-saver.md", "openai-agents-session.md"}
PAGES = sorted(
    page
    for page in (Path(__file__).resolve().parent.parent / "docs" / "integrations").glob("*.md")
    if page.name not in OWN_TESTS
)
# Each integration page's title and its Python example (the index page has none).
SECTIONS = {
    title: blocks[0]
    for page in PAGES
    if (text := page.read_text(encoding="utf-8"))
    and (title := text.splitlines()[0].removeprefix("# "))
    and (blocks := re.findall(r"```python\n(.*?)```", text, re.S))
}
EXPECTED = {
    "asyncio": ["738918 bytes stored as ", "line 50000: ERROR disk full", "step 2 cut and removed"],
    "MCP server": [
        "['scratchpad_read', 'scratchpad_list']",
        "50001:line 50000: ERROR disk full",
        "True unknown argument(s) 'owner'",
    ],
    "OpenAI Agents SDK": ["50001:line 50000: ERROR disk full"],
    "LangGraph / LangChain": ["text 738918 True", "line 50000: ERROR disk full"],
}


def test_every_integration_has_one_example() -> None:
    assert set(SECTIONS) == set(EXPECTED)
    assert sum(len(re.findall(r"```python\n", p.read_text(encoding="utf-8"))) for p in PAGES) == len(EXPECTED)


@pytest.mark.parametrize("heading", sorted(EXPECTED))
def test_the_example_runs_as_written(heading: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SECTIONS[heading]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for line in EXPECTED[heading]:
        assert line in result.stdout, (line, result.stdout)
    assert list(tmp_path.iterdir()) == []  # everything it made lived in its own temporary directory
