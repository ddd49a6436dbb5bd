"""A path that is not a store is named as such: never advised a chmod, never
replaced by a new store; only ``init`` creates a store, and never over a file."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest

from securepad import Scratchpad, StoreCorruptError
from tests.support.cli_runner import Cli, ok


@pytest.mark.sqlite_only
@pytest.mark.parametrize("content", [b"x", b"some notes\n" * 20, b"SQLite format 3"])
@pytest.mark.parametrize("command", [["stats"], ["init"], ["gc"]])
def test_a_file_that_is_not_a_store_is_named_and_left_alone(cli: Cli, content: bytes, command: list[str]) -> None:
    notes = Path("notes.txt")
    notes.write_bytes(content)
    notes.chmod(0o644)
    result = cli("--db", str(notes), *command)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: StoreCorruptError: ") and "not a securepad store" in result.stderr
    assert "chmod" not in result.stderr
    assert notes.read_bytes() == content and (notes.stat().st_mode & 0o777) == 0o644
    assert not Path("notes.txt-wal").exists() and not cli.key.exists()  # and no key made for it


@pytest.mark.sqlite_only
@pytest.mark.parametrize("command", [["stats"], ["init"]])
def test_an_empty_file_is_not_a_store_and_init_does_not_write_over_it(cli: Cli, command: list[str]) -> None:
    empty = Path("empty.db")
    empty.touch(mode=0o644)
    result = cli("--db", str(empty), *command)
    assert result.exit_code == 1 and "is an empty file, not a securepad store" in result.stderr
    assert empty.stat().st_size == 0 and not cli.key.exists()


@pytest.mark.sqlite_only
def test_another_programs_sqlite_database_is_not_migrated(cli: Cli) -> None:
    other = Path("app.sqlite")
    conn = apsw.Connection(str(other))
    conn.execute("CREATE TABLE accounts(name TEXT)")
    conn.close()
    before = other.read_bytes()
    result = cli("--db", str(other), "init")
    assert result.exit_code == 1 and "a SQLite database but not a securepad store" in result.stderr
    assert other.read_bytes() == before


@pytest.mark.sqlite_only
def test_a_real_store_with_loose_mode_is_still_advised_to_chmod(cli: Cli) -> None:
    ok(cli("init"))
    cli.db.chmod(0o644)
    result = cli("stats")
    assert result.exit_code == 1 and f"chmod 600 {cli.db}" in result.stderr


def test_the_library_refuses_a_non_store_file_before_judging_its_mode(tmp_path: Path, keyring: object) -> None:
    target = tmp_path / "system.conf"
    target.write_bytes(b"k")
    os.chmod(target, 0o644)
    with pytest.raises(StoreCorruptError, match="not a securepad store"):
        Scratchpad.open(target, keyring=keyring)  # type: ignore[arg-type]
    assert target.read_bytes() == b"k"


@pytest.mark.sqlite_only
def test_a_file_in_a_shared_directory_is_named_before_its_directory(cli: Cli, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    (shared / "notes.txt").write_text("not a store\n")
    result = cli("--db", str(shared / "notes.txt"), "stats")
    assert result.exit_code == 1 and "not a securepad store" in result.stderr and "chmod" not in result.stderr
