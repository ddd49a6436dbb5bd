"""The benchmark suite's smoke run: every workload on every backend that is
installed, on tiny sizes, through ``securepad bench``. It checks the shape of
the results, never a timing (benchmarks measure; tests do not)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from securepad.bench import hotpath, report
from securepad.cli import main
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

WORKLOADS = {"put", "read", "concurrent", "resume", "gc", "open", "hotpath"}
BACKENDS = {"securepad", "raw-apsw", "unhardened", "diskcache", "sqlcipher"}
FIGURES = ("median", "p90", "p99", "max")


def _stats_blocks(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [value for key, value in record.items() if key in ("stats", "put", "read")]


@pytest.mark.slow
def test_bench_tiny_run_writes_every_workload_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "results"
    args = ["bench", "--tiny", "--no-progress", "--out", str(out), "--workdir", str(tmp_path)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "targets: " in result.output and "(--targets lists them)" in result.output

    results = json.loads((out / "quick.json").read_text())
    assert results["failures"] == []
    assert set(results["backends"]) == BACKENDS
    available = {name for name, info in results["backends"].items() if info["available"]}
    skipped = {s["backend"] for s in results["skipped"]}
    assert available | skipped == BACKENDS and not available & skipped
    assert all(s["reason"] for s in results["skipped"])
    assert {"securepad", "raw-apsw", "unhardened"} <= available  # no optional dependency

    assert set(results["workloads"]) == WORKLOADS
    for workload, records in results["workloads"].items():
        if workload == "hotpath":
            _check_hotpath(records)
            continue
        assert {r["backend"] for r in records} == available, workload
        for record in records:
            blocks = _stats_blocks(record)
            assert blocks, (workload, record)
            for stats in blocks:
                for figure in FIGURES:
                    assert isinstance(stats[figure], float) and math.isfinite(stats[figure]), (workload, figure)
                assert stats["n"] >= 1 and stats["ops_per_s"] > 0

    for record in results["workloads"]["read"]:
        assert record["mode"] in ("head", "tail", "range") and record["peak_rss_delta_kib"] >= 0
    for record in results["workloads"]["resume"]:
        assert record["peak_rss_delta_kib"] >= 0
    for record in results["workloads"]["concurrent"]:
        assert record["error_count"] == sum(record["errors"].values())
        assert record["acked_puts"] == record["put"]["n"]
        if record["backend"] == "securepad":
            assert record["lost_writes"] == 0  # every acknowledged put reads back exactly

    assert results["targets"] and all({"target", "measured", "passed"} <= set(t) for t in results["targets"])
    assert results["meta"]["machine"]["nproc"] >= 1
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "quick.png").stat().st_size > 0


def _check_hotpath(records: list[dict[str, Any]]) -> None:
    """Every hot-path figure is measured or skipped with its reason; the load-independent ones are counts."""
    assert {r["section"] for r in records} == {"costs", "write", "tail", "listing"}
    for record in records:
        if "skipped" in record:
            assert record["skipped"], record
            continue
        if record["section"] == "costs":
            assert record["statements"] >= 3 and record["wal_frames"] >= 1 and record["raw_wal_frames"] >= 1
        else:
            assert record["stats"]["n"] >= 1 and record["stats"]["ops_per_s"] > 0, record
    stores = {(r["section"], r["store"]) for r in records}
    for section in ("write", "tail"):
        for store in ("securepad", *hotpath.PEERS):
            assert (section, store) in stores, (section, store)  # measured, or skipped with the reason
    writes = [r for r in records if r["section"] == "write" and r["store"] == "securepad"]
    assert {r["durability"] for r in writes} == {"normal", "full"}
    assert {r["mode"] for r in writes} >= {"single", "put_many 8", "put_many 64"}


def test_hotpath_targets_name_the_reason_of_a_missing_figure() -> None:
    """A securepad without put_many (or a durability setting), and a peer that is not
    installed: their targets say why they were not measured, and nothing is called met."""
    single = {"n": 10, "median": 0.001, "p99": 0.002, "ops_per_s": 1000.0, "obs_per_s": 1000.0}
    peer = {**single, "obs_per_s": 250.0}
    records: list[dict[str, Any]] = [
        {
            "section": "costs",
            "store": "securepad",
            "size_bytes": 4096,
            "case": "costs 4 KiB",
            "statements": 4,
            "wal_frames": 6,
            "raw_wal_frames": 3,
        },
        {
            "section": "write",
            "store": "securepad",
            "durability": "normal",
            "mode": "single",
            "case": "s",
            "stats": single,
        },
        {
            "section": "write",
            "store": "securepad",
            "durability": "normal",
            "mode": "put_many 64",
            "case": "m",
            "skipped": "put_many: not available (Scratchpad has no put_many)",
        },
        {
            "section": "write",
            "store": "securepad",
            "durability": "full",
            "mode": "single",
            "case": "f",
            "skipped": "durability setting: not available (Policy has no durability)",
        },
        {
            "section": "write",
            "store": "SQLiteSession",
            "durability": "theirs",
            "mode": "single",
            "case": "p",
            "stats": peer,
        },
        {
            "section": "write",
            "store": "EncryptedSession",
            "durability": "theirs",
            "mode": "single",
            "case": "e",
            "skipped": "EncryptedSession: not installed",
        },
    ]
    found = {t["target"]: (t["measured"], t["passed"]) for t in report.hotpath_targets(records)}
    assert found["put 4 KiB: <= 4 statements"] == ("4", True)
    assert found["put 4 KiB: <= 5 WAL frames"] == ("6 (raw apsw: 3)", False)
    assert found["put_many 64 x 4 KiB >= 5x the rate of single puts (normal)"] == (
        "put_many: not available (Scratchpad has no put_many)",
        None,
    )
    assert found["4 KiB write rate >= 3x SQLiteSession (normal vs theirs)"] == ("4.00x (1,000 vs 250 obs/s)", True)
    assert found["4 KiB write rate >= 3x EncryptedSession (normal vs theirs)"] == (
        "EncryptedSession: not installed",
        None,
    )
    assert found["4 KiB write rate >= 3x SQLiteSession (full vs theirs)"][1] is None
    assert "durability setting" in str(found["4 KiB write rate >= 3x SQLiteSession (full vs theirs)"][0])
    text = "\n".join(report.hotpath_markdown(records))
    assert "put_many: not available" in text and "| securepad | normal | single |" in text


def test_grep_worst_case_benchmark_runs_and_writes_its_figures(tmp_path: Path) -> None:
    """The grep worst-case benchmark on a tiny entry: every case within the bound, results under --out."""
    from benchmarks import grep_worst

    out = tmp_path / "results" / "grep_worst.json"
    assert grep_worst.main(["--mib", "0.05", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["within_bound"] and results["slowest_s"] <= results["bound_s"]
    assert [r["case"] for r in results["cases"]] == list(grep_worst.CASES)
    for record in results["cases"]:
        # ASCII text: a byte a character, and a last line without a break is searched with one.
        assert record["bytes_scanned"] <= record["text_chars"] + 1 and record["re2_calls"] >= 1


def test_faults_suite_runs_anywhere_and_writes_under_out(tmp_path: Path) -> None:
    """``python -m benchmarks.faults`` (the reliability page's figures) runs
    from any directory with the checkout on the path, imports nothing from the
    working directory (not even a ``tests`` package there), and writes its
    results to ``--out``."""
    work = tmp_path / "work"
    marker = tmp_path / "pwned"
    for package in ("tests", "benchmarks"):
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (work / "test_faults_sqlite.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    out = tmp_path / "results" / "faults.json"
    command = [sys.executable, "-P", "-m", "benchmarks.faults", "--quick", "--out", str(out), "threads", "damage"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not marker.exists()
    results = json.loads(out.read_text())
    assert results["threads"]["threads"] == 200 and results["threads"]["extra_fds"] < 200
    outcomes = results["damage"]["outcomes"]
    assert sum(outcomes.values()) == results["damage"]["trials"]
    assert not [name for name in outcomes if name.startswith("untyped")]
    wrong = subprocess.run([*command[:4], "nosuchpart"], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert wrong.returncode == 2 and "unknown part 'nosuchpart'" in wrong.stderr
