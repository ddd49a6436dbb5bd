"""The migration guide from SQLiteSession / EncryptedSession: its example runs as
written, prints what the guide shows, and is the example file itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "openai_session_migration.py"
GUIDE = (ROOT / "docs" / "integrations" / "openai-agents-session.md").read_text(encoding="utf-8")


def _run(tmp_path: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []  # everything it made lived in its own temporary directory
    return result.stdout


def test_the_example_runs_and_prints_what_the_guide_shows(tmp_path: Path) -> None:
    shown = re.search(r"It prints:\n\n```\n(.*?)```", GUIDE, re.S)
    assert shown is not None
    assert _run(tmp_path) == shown.group(1)


def test_the_guide_shows_the_example_as_it_is() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks
