"""``securepad bench --costs``: its smoke runs, on tiny counts. They check what
is reported and the load-independent counts, never a timing or an
instruction count (benchmarks measure; tests do not)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from securepad.bench import instructions
from securepad.cli import main

pytestmark = pytest.mark.slow

ALL = {"securepad": set(instructions.OPERATIONS), "sealed-floor": {"put", "read", "listing"}}
ALL["raw-apsw"] = ALL["sealed-floor"]


def _costs(tmp_path: Path, *options: str) -> tuple[int, str, dict[str, Any] | None]:
    out = tmp_path / "results"
    args = ["bench", "--costs", "--tiny", "--out", str(out), "--workdir", str(tmp_path), *options]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    written = out / "costs.json"
    return result.exit_code, result.output, json.loads(written.read_text()) if written.exists() else None


def _check_shape(results: dict[str, Any]) -> None:
    assert {name: set(figures) for name, figures in results["figures"].items()} == ALL
    for figures in results["figures"].values():
        assert all(isinstance(value, float) for value in figures.values())
    assert [t["operation"] for t in results["targets"]] == ["put", "read", "put_many", "listing"]
    for target in results["targets"]:
        assert isinstance(target["ratio"], float) and isinstance(target["met"], bool)
    # What does not depend on the machine: the floor is one INSERT and one UPSERT
    # in one transaction, and one statement per read, with securepad's key work.
    floor = results["work"]["sealed-floor"]
    assert floor["put"]["statements"] == 4 and floor["read"]["statements"] == 1
    assert [floor["put"][k] for k in ("key_derivations", "key_unwraps", "header_digests")] == [1, 0, 1]
    assert [floor["read"][k] for k in ("key_derivations", "key_unwraps", "header_digests")] == [1, 1, 1]
    assert results["work"]["securepad"]["listing"]["wal_frames"] == 0
    assert results["work"]["raw-apsw"]["put"]["statements"] == 3  # BEGIN, INSERT, COMMIT
    # An anchor sync, counted alone: the counter's transaction (BEGIN, UPDATE, COMMIT), no key work.
    sync = results["work"]["securepad"]["anchor_sync"]
    assert sync["statements"] == 3 and sync["wal_frames"] >= 1
    assert [sync[k] for k in ("key_derivations", "key_unwraps", "header_digests")] == [0, 0, 0]
    assert results["anchor_sync"] == "close"


def test_costs_in_cpu_time_when_chosen(tmp_path: Path) -> None:
    code, output, results = _costs(tmp_path, "--costs-method", "cpu")
    assert code == 0, output
    assert results is not None and results["method"] == "cpu"
    _check_shape(results)
    assert "CPU time" in output and "targets (securepad against its yardstick)" in output
    for label in instructions.labels(instructions.TINY_LISTED).values():
        assert label in output


def test_costs_fall_back_to_cpu_time_without_valgrind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no valgrind on it
    code, output, results = _costs(tmp_path)
    assert code == 0, output
    assert results is not None and results["method"] == "cpu" and results["valgrind"] is False
    assert "valgrind is not installed" in output


def test_callgrind_asked_for_without_valgrind_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code, output, results = _costs(tmp_path, "--costs-method", "callgrind")
    assert code == 1 and "valgrind is not installed" in output and results is None


def test_an_unknown_method_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown method"):
        instructions.measure(tmp_path, method="perf", tiny=True)
    code, output, _ = _costs(tmp_path, "--costs-method", "perf")
    assert code == 2 and "perf" in output


def test_costs_of_the_operations_chosen(tmp_path: Path) -> None:
    code, output, results = _costs(tmp_path, "--costs-method", "cpu", "--costs-ops", "listing")
    assert code == 0, output
    assert results is not None
    assert {name: set(figures) for name, figures in results["figures"].items()} == {name: {"listing"} for name in ALL}
    assert {name: set(counted) for name, counted in results["work"].items()} == {name: {"listing"} for name in ALL}
    met = {target["operation"]: target["met"] for target in results["targets"]}
    assert isinstance(met.pop("listing"), bool) and set(met.values()) == {None}
    (tmp_path / "sync").mkdir()
    code, output, results = _costs(tmp_path / "sync", "--costs-method", "cpu", "--costs-ops", "anchor_sync")
    assert code == 0, output
    assert results is not None  # a sync is measured after a put, less the put: the put is measured too
    assert {name: set(figures) for name, figures in results["figures"].items()} == {"securepad": {"put", "anchor_sync"}}
    assert "securepad's anchor syncs only as the harness calls it" in output
    (tmp_path / "again").mkdir()
    code, output, results = _costs(tmp_path / "again", "--costs-ops", "put,lisitng")
    assert code == 2 and "lisitng" in output and results is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_costs_in_instructions_under_callgrind(tmp_path: Path) -> None:
    results = instructions.measure(tmp_path, tiny=True, backends=("raw-apsw",))
    assert results["method"] == "callgrind" and results["unit"] == "instructions"
    assert set(results["figures"]["raw-apsw"]) == ALL["raw-apsw"]
    assert all(isinstance(value, float) for value in results["figures"]["raw-apsw"].values())
    assert "callgrind" in instructions.report(results)
