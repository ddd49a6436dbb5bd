"""``securepad bench`` reports to a person: a summary within 80 columns, securepad
beside each baseline and where the files are; the targets only with --targets
(and always in the JSON), the full tables only with --tables."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from securepad.cli import main

SAVED = Path(__file__).resolve().parent.parent.parent / "docs" / "bench-results" / "full.json"


def _run(*args: str) -> str:
    result = CliRunner().invoke(main, ["bench", "--from-json", str(SAVED), *args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_summary_fits_80_columns_and_names_its_files() -> None:
    text = _run()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and len(lines) <= 60
    saved = json.loads(SAVED.read_text())
    header = next(line for line in lines if "securepad" in line and "raw-apsw" in line)
    # each backend the run measured, in its order: the sealed floor headed "floor", a
    # name too long for six columns cut with an ellipsis
    names = [
        "floor" if name == "sealed-floor" else name for name, info in saved["backends"].items() if info["available"]
    ]
    assert len(header.split()) == len(names) and "sealed-floor" in saved["backends"]
    for shown, name in zip(header.split(), names, strict=True):
        assert shown == name or (shown.endswith("\u2026") and name.startswith(shown[:-1])), (shown, name)
    assert "results: " in text and SAVED.name in text
    assert "**miss**" not in text and "| target |" not in text
    met = sum(1 for t in saved["targets"] if t["passed"])
    assert f"targets: {met} of {len(saved['targets'])} met" in text


def test_targets_only_on_request_and_within_80_columns() -> None:
    text = _run("--targets")
    saved = json.loads(SAVED.read_text())
    listed = text.split("targets (ratios measured in this run)\n", 1)[1]
    assert max(len(line) for line in listed.splitlines()) <= 80
    assert sum(1 for line in listed.splitlines() if line.startswith(("pass ", "miss ", "n/a "))) == len(
        saved["targets"]
    )


def test_the_full_tables_on_request() -> None:
    assert "### put: sequential" in _run("--tables")
    assert "### put" not in _run()
