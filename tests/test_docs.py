"""Every code example of the README and the docs site runs as written.

Python blocks run in a fresh interpreter; bash blocks run in bash with a fresh
HOME, in a scratch directory, with this environment's ``securepad`` first on
the PATH. A block preceded by ``<!-- not run: REASON -->`` is not run (it
installs packages or names a deployment's paths); the Python blocks of the
agent-loop and integration pages have tests of their own (test_examples.py,
test_docs_integrations.py), which check what they print.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
TESTED_ELSEWHERE = {DOCS / "how-to" / "agent-loop.md", *(DOCS / "integrations").glob("*.md")}
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
_BLOCK = re.compile(r"(<!-- not run: [^>]+ -->\n)?```(python|bash)\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for number, (skip, language, code) in enumerate(_BLOCK.findall(text), start=1):
            if not skip and (language == "bash" or page not in TESTED_ELSEWHERE):
                found.append((f"{page.relative_to(ROOT)}#{number}", language, code))
    return found


BLOCKS = _blocks()


@pytest.mark.parametrize(("where", "language", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_the_example_runs(where: str, language: str, code: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECUREPAD_", "XDG_"))}
    env |= {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    code = code.replace("/tmp/securepad-quickstart", str(work))
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=work, env=env, check=False)
    assert result.returncode == 0, (where, result.stdout[-2000:], result.stderr[-2000:])


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
