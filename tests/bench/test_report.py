"""The targets a benchmark run prints: each with its figure from the run, met
or missed by its threshold, and "not measured" when the run lacks a figure."""

from __future__ import annotations

from typing import Any

import pytest

from securepad.bench import report


def _put(backend: str, size: int, ops: float) -> dict[str, Any]:
    return {"backend": backend, "size_bytes": size, "case": f"{size} B", "stats": {"ops_per_s": ops}}


def _concurrent(backend: str, case: str, ops: float) -> dict[str, Any]:
    put = {"ops_per_s": ops / 2, "p99": 0.001, "max": 0.002}
    return {
        "backend": backend,
        "case": case,
        "stats": {"ops_per_s": ops},
        "put": put,
        "error_count": 0,
        "lost_writes": 0,
        "acked_puts": 10,
    }


def _by_name(results: dict[str, Any]) -> dict[str, tuple[str, bool | None]]:
    return {t["target"]: (t["measured"], t["passed"]) for t in report.targets(results)}


def test_wall_targets_compare_with_raw_apsw_at_their_thresholds() -> None:
    """A put of 4 KiB and of 64 KiB must reach 0.8x raw apsw's rate, 1 MiB 0.85x;
    eight processes of 50/50 put/read 0.3x raw apsw's operations per second."""
    puts = [_put("securepad", 4096, 79), _put("raw-apsw", 4096, 100)]
    puts += [_put("securepad", 65536, 80), _put("raw-apsw", 65536, 100), _put("sealed-floor", 65536, 90)]
    conc = [_concurrent("securepad", "8x1", 300), _concurrent("raw-apsw", "8x1", 1000)]
    found = _by_name({"workloads": {"put": puts, "concurrent": conc}})
    assert found["put 4 KiB: securepad >= 0.8x raw plaintext"] == ("0.79x", False)
    assert found["put 64 KiB: securepad >= 0.8x raw plaintext"] == ("0.80x; sealed floor 0.90x", True)
    assert found["8x1: throughput >= 0.3x raw plaintext"] == ("0.30x (300 vs 1,000 ops/s)", True)
    assert found["put 1 MiB: securepad >= 0.85x raw plaintext"] == ("not measured in this run", None)
    assert found["2x4: throughput >= 0.5x raw plaintext"] == ("not measured in this run", None)


def test_postgresql_targets_against_sqlite() -> None:
    """``python -m benchmarks.postgres`` judges one owner at 0.6x, an owner per
    process at 0.8x SQLite's operations per second and CPU per put at 1.2x."""
    from benchmarks import postgres

    conc = [
        {"backend": "securepad", "stats": {"ops_per_s": 1000.0}},
        {"backend": "securepad-postgresql", "stats": {"ops_per_s": 610.0}},
    ]
    found = postgres.targets(conc, {"ratio": {"put": 1.94, "read": 2.1}})
    assert [(t["value"], t["met"]) for t in found] == [(0.61, True), (None, None), (1.94, False)]
    assert [t["target"].split(":")[0] for t in found] == [
        "one owner",
        "an owner per process",
        "CPU per put, client + server",
    ]


@pytest.mark.slow  # imports LangGraph and the OpenAI Agents SDK
def test_framework_targets_judge_every_cell_against_the_encrypted_peer() -> None:
    """``python -m benchmarks.frameworks`` judges every cell of a securepad saver
    against the same backend's saver with ``EncryptedSerializer`` (at most 1.0x),
    its graph run against the plain saver (1.5x) and the session against
    ``EncryptedSession`` (1.0x); a backend that did not run has no target."""
    from benchmarks import frameworks

    saver = {"SecurepadSaver (SQLite)": 1.0, "SqliteSaver + EncryptedSerializer": 2.0, "SqliteSaver": 0.5}
    results = {
        "checkpoints": {name: {"1 KiB": {"put_ms": ms, "get_ms": ms * 3}} for name, ms in saver.items()},
        "get_tuple_by_thread_length": {name: {"50": ms} for name, ms in saver.items()},
        "graph_100_steps": {name: {"run_ms": ms * 100} for name, ms in saver.items()},
        "sessions": {
            "SecurepadSession (SQLite)": {"1 KiB": {"add_ms": 1.1, "get_ms": 1.0}},
            "EncryptedSession (over SQLiteSession)": {"1 KiB": {"add_ms": 1.0, "get_ms": 1.0}},
        },
    }
    found = {t["target"]: (round(t["ratio"], 2), t["met"]) for t in frameworks.targets(results)}
    assert found == {
        "SecurepadSaver (SQLite) put 1 KiB": (0.5, True),
        "SecurepadSaver (SQLite) get 1 KiB": (0.5, True),
        "SecurepadSaver (SQLite) get_tuple, thread of 50": (0.5, True),
        "SecurepadSaver (SQLite) 100-step graph against SqliteSaver": (2.0, False),
        "SecurepadSession (SQLite) add 1 KiB": (1.1, False),
        "SecurepadSession (SQLite) get 1 KiB": (1.0, True),
    }
    assert "missed  SecurepadSaver (SQLite) 100-step graph" in frameworks.targets_text(frameworks.targets(results))


def test_summary_of_six_backends_fits_80_columns() -> None:
    """The sealed floor named beside the five default backends: every line of the
    summary still fits 80 columns, the floor's column headed "floor", a name too
    long for the narrower column cut with an ellipsis."""
    backends = ["securepad", "raw-apsw", "unhardened", "diskcache", "sqlcipher", "sealed-floor"]
    puts = [{**_put(b, 16 << 20, 6.0), "case": "16 MiB", "stats": {"median": 0.16981}} for b in backends]
    results = {
        "meta": {"mode": "full", "machine": {"summary": "2 cores"}, "elapsed_s": 1.0},
        "backends": {b: {"available": True} for b in backends},
        "workloads": {"put": puts},
    }
    lines = report.summary(results).splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[3].split() == ["securepad", "raw-apsw", "unharden\u2026", "diskcache", "sqlcipher", "floor"]
    assert lines[4].split()[:3] == ["16", "MiB", "169.81"]
