"""The sealed floor: a yardstick keeps the guarantees it is the floor of.

It must round-trip what it stores, refuse a row or head edited on disk, and
stay right when another process writes the same turn, or its figures would
measure a cheaper thing than securepad's guarantees.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import IntegrityError
from securepad.bench.backends import open_backend
from securepad.bench.data import text
from securepad.bench.floor import SealedFloorBackend
from securepad.core.shaping import SEGMENT_BYTES

pytestmark = pytest.mark.slow


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[SealedFloorBackend]:
    backend = SealedFloorBackend(tmp_path / "floor")
    yield backend
    backend.close()


def _statements(backend: SealedFloorBackend, call: object) -> int:
    seen: list[str] = []
    backend.conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda event: seen.append(event["sql"]))
    try:
        call()  # type: ignore[operator]
    finally:
        backend.conn.trace_v2(0, None)
    return len(seen)


@given(st.text(max_size=300), st.integers(0, 400), st.integers(0, 400))
def test_every_read_mode_returns_the_slice_of_what_was_put(tmp_path: Path, content: str, n: int, start: int) -> None:
    backend = SealedFloorBackend(tmp_path / f"floor-{len(content)}-{n}-{start}")
    try:
        entry_id = backend.put("t", 1, content)
        assert backend.get(entry_id) == content
        assert backend.read(entry_id, "head", n) == content[:n]
        assert backend.read(entry_id, "tail", n) == (content[-n:] if n else "")
        assert backend.read(entry_id, "range", n, start) == content[start : start + n]
    finally:
        backend.close()


@pytest.mark.parametrize("size", [SEGMENT_BYTES, SEGMENT_BYTES + 1, 3 * SEGMENT_BYTES + 5])
def test_a_long_entry_reads_back_by_segments(floor: SealedFloorBackend, size: int) -> None:
    content = text(size, salt=size)
    entry_id = floor.put("t", 1, content)
    assert floor.get(entry_id) == content
    for n in (0, 1, 2000, SEGMENT_BYTES + 7):
        assert floor.read(entry_id, "tail", n) == (content[-n:] if n else "")
        assert floor.read(entry_id, "range", n, size // 2) == content[size // 2 : size // 2 + n]


def test_a_put_is_one_insert_and_one_upsert_and_a_warm_read_one_statement(floor: SealedFloorBackend) -> None:
    first = floor.put("t", 1, "first")
    # BEGIN IMMEDIATE, INSERT, the head's UPSERT, COMMIT
    assert _statements(floor, lambda: floor.put("t", 2, "second")) == 4
    floor.read(first, "tail", 3)
    assert _statements(floor, lambda: floor.read(first, "tail", 3)) == 1


def test_the_listing_shows_each_view_in_step_order(floor: SealedFloorBackend) -> None:
    for step in (3, 1, 2):
        floor.put("t", step, f"observation {step}")
    history, tools = floor.resume("t")
    assert [(view["step_num"], view["summary"]) for view in history] == [
        (1, "observation 1"),
        (2, "observation 2"),
        (3, "observation 3"),
    ]
    assert tools
    assert floor.resume("empty") == ([], [])


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE entries SET step_num = 9 WHERE id = ?",
        "UPDATE entries SET expires_at = expires_at + 1000 WHERE id = ?",
        "UPDATE entries SET size_chars = size_chars + 1 WHERE id = ?",
        "UPDATE entries SET content = zeroblob(length(content)) WHERE id = ?",
    ],
)
def test_a_row_edited_on_disk_fails_a_warm_and_a_cold_read(tmp_path: Path, edit: str) -> None:
    writer = SealedFloorBackend(tmp_path / "floor")
    entry_id = writer.put("t", 1, "genuine")
    writer.conn.execute(edit, (entry_id,))
    fresh = SealedFloorBackend(tmp_path / "floor", create=False)
    try:
        for backend in (writer, fresh):
            with pytest.raises(IntegrityError):
                backend.read(entry_id, "head", 10)
    finally:
        writer.close()
        fresh.close()


def test_a_deleted_row_or_an_older_head_is_seen(tmp_path: Path) -> None:
    floor = SealedFloorBackend(tmp_path / "floor")
    try:
        kept = floor.put("t", 1, "kept")
        old_head = floor.conn.execute("SELECT sealed, seq FROM heads").fetchall()[0]
        gone = floor.put("t", 2, "gone")
        floor.conn.execute("DELETE FROM entries WHERE id = ?", (gone,))
        with pytest.raises(IntegrityError, match="fewer entries"):
            floor.resume("t")  # the warm listing counts the head's live entries
        fresh = SealedFloorBackend(tmp_path / "floor", create=False)
        with pytest.raises(IntegrityError, match="differs from its head"):
            fresh.read(kept, "head", 4)  # the cold read recounts the turn
        fresh.close()
        floor.conn.execute("UPDATE heads SET sealed = ?, seq = ?", old_head)
        with pytest.raises(IntegrityError, match="rolled back"):
            floor.read(kept, "head", 4)
    finally:
        floor.close()


def test_two_processes_writing_one_turn_keep_its_head_whole(tmp_path: Path) -> None:
    first = SealedFloorBackend(tmp_path / "floor")
    second = open_backend("sealed-floor", tmp_path / "floor", create=False)
    try:
        ids = [first.put("t", 1, "a"), second.put("t", 2, "b"), first.put("t", 3, "c"), second.put("t", 4, "d")]
        for backend in (first, second):
            assert [backend.get(entry_id) for entry_id in ids] == ["a", "b", "c", "d"]
            assert [view["step_num"] for view in backend.resume("t")[0]] == [1, 2, 3, 4]
    finally:
        first.close()
        second.close()


def test_gc_removes_the_expired_entries_and_their_terms(floor: SealedFloorBackend) -> None:
    floor.fill_expired(5, 100, now=2_000_000_000.0)
    live = floor.put("gc-turn", 99, "live", now=2_000_000_000.0)
    assert floor.gc(2_000_000_000.0) == 5
    assert floor.get(live) == "live"
    fresh = SealedFloorBackend(floor.root, create=False)
    try:
        assert fresh.get(live) == "live"  # a cold read recounts the turn against the head gc wrote
    finally:
        fresh.close()


@pytest.mark.slow
def test_the_suite_runs_the_floor_through_every_workload_when_named(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from securepad.cli import main

    out = tmp_path / "results"
    args = ["bench", "--tiny", "--backends", "sealed-floor", "--no-progress", "--no-chart", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--workdir", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "quick.json").read_text())
    assert results["failures"] == [] and results["backends"]["sealed-floor"]["available"]
    for workload in ("put", "read", "concurrent", "resume", "gc", "open"):
        assert any(r["backend"] == "sealed-floor" for r in results["workloads"][workload]), workload
    assert all(r["lost_writes"] == 0 for r in results["workloads"]["concurrent"])
