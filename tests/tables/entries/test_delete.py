"""Deleting one entry: only the caller's, and its ciphertext leaves the files."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from click.testing import CliRunner

from securepad import Principal, Scratchpad
from securepad.cli import main
from securepad.errors import NotFoundError


def _files(db_path: Path) -> bytes:
    return b"".join(Path(f"{db_path}{s}").read_bytes() for s in ("", "-wal", "-shm") if Path(f"{db_path}{s}").exists())


def test_delete_scrubs_the_entry_from_the_files(
    pad: Scratchpad, alice: Principal, bob: Principal, db_path: Path
) -> None:
    entry_id = pad.put(alice, "t", 1, "tool", "to be deleted " * 5000)["scratchpad_id"]
    kept = pad.put(alice, "t", 2, "tool", "kept")["scratchpad_id"]
    raw = apsw.Connection(str(db_path))
    pieces = [bytes(d)[:48] for (d,) in raw.execute("SELECT data FROM segments WHERE entry_id = ?", (entry_id,))]  # type: ignore[misc]
    raw.close()
    assert all(piece in _files(db_path) for piece in pieces)
    with pytest.raises(NotFoundError):
        pad.delete(bob, entry_id)  # not bob's: refused like an absent id, nothing deleted
    pad.delete(alice, entry_id)
    with pytest.raises(NotFoundError):
        pad.get(alice, entry_id)
    with pytest.raises(NotFoundError):
        pad.delete(alice, entry_id)
    assert pad.get(alice, kept).observation == "kept"
    assert not any(piece in _files(db_path) for piece in pieces)


def test_cli_names_the_public_error_class(tmp_path: Path) -> None:
    store = ["--db", str(tmp_path / "s.db"), "--key-file", str(tmp_path / "key")]
    assert CliRunner().invoke(main, [*store, "init"]).exit_code == 0
    result = CliRunner().invoke(main, [*store, "read", "--owner", "a", "0" * 16])
    assert result.exit_code == 1
    assert "NotFoundError: no such entry" in result.output
