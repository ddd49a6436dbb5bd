"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TEXT = README.read_text(encoding="utf-8")
# Sections whose examples have tests of their own (test_examples.py, test_docs_integrations.py),
# and the PostgreSQL deployment sketch, which names a server that is not here (opening by DSN
# is tested in test_postgres_backend.py against the local server).
TESTED_ELSEWHERE = ("Wiring securepad into an agent loop", "Integrations", "Deploying on PostgreSQL")
SECTIONS = re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", TEXT, re.S | re.M)
BLOCKS = [
    block
    for heading, body in SECTIONS
    if heading not in TESTED_ELSEWHERE
    for block in re.findall(r"```python\n(.*?)```", body, re.S)
]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index: int, tmp_path: Path) -> None:
    code = BLOCKS[index].replace("/tmp/securepad-quickstart", str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_readme_starts_with_the_two_setup_commands() -> None:
    commands = re.findall(r"```bash\n(.*?)```", TEXT, re.S)[:2]
    assert "pip install ." in commands[0] and "securepad" in commands[0]
    assert "pip install '.[test]'" in commands[1] and "pytest" in commands[1]
