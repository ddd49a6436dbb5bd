"""The WAL-load and gc benchmarks on tiny sizes: the shape of what they
report, never a timing (benchmarks measure; tests do not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gc_scrub, wal_load

pytestmark = pytest.mark.slow


def test_wal_load_reports_refusals_and_the_wal_peak(tmp_path: Path) -> None:
    result = wal_load.run(processes=1, threads=2, seconds=1, size=1024, limit_mb=4, where=tmp_path)
    assert result["ops"] == result["puts"] + result["reads"] > 0
    assert result["puts_refused"] == 0 and result["errors"] == {}
    assert 0 < result["wal_peak_mb"] <= 4
    assert set(result["checkpoints"]) == {"passive", "restart", "truncate"}


def test_gc_scrub_reports_memory_and_wal_for_both_gcs(tmp_path: Path) -> None:
    result = gc_scrub.run(2, tmp_path)
    one, third = result["one_entry"], result["a_third"]
    assert one["deleted"] == 1 and one["rebuilt"] is False
    assert third["deleted"] > 1 and third["rebuilt"] is True
    assert third["file_after_mb"] < third["file_before_mb"]
    assert all(key in one for key in ("rss_peak_mb", "wal_peak_mb", "seconds"))
