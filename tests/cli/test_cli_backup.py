"""``backup`` writes a consistent 0600 copy of a live store; ``restore`` checks a
backup, keeps the store it replaces, adopts the anchor knowingly and verifies.
A PostgreSQL store is sent to pg_dump / pg_restore."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Principal, Scratchpad
from securepad.audit.drills import flip_segment_byte
from tests.support.cli_runner import Cli, as_json, ok, put


def _ids(cli: Cli) -> list[str]:
    return [e["scratchpad_id"] for e in as_json(cli("--json", "list", "--owner", "bob", "--turn", "t"))]


@pytest.mark.sqlite_only
def test_backup_then_restore_brings_the_store_back_and_keeps_the_replaced_one(cli: Cli) -> None:
    ok(cli("init"))
    first = put(cli, 1)
    made = as_json(cli("--json", "backup", "b.db"))
    assert made["backup"] == "b.db" and (Path("b.db").stat().st_mode & 0o777) == 0o600
    refused = cli("backup", "b.db")
    assert refused.exit_code == 1 and "never written over a file" in refused.stderr
    second = put(cli, 2)
    # A plain copy put back is refused as a rollback ...
    shutil.copy(cli.db, "now.db")
    Path(f"{cli.db}-wal").unlink(missing_ok=True)
    cli.db.write_bytes(Path("b.db").read_bytes())
    assert "IntegrityError" in cli("stats").stderr
    cli.db.write_bytes(Path("now.db").read_bytes())
    assert _ids(cli) == [first, second]
    # ... restore adopts it knowingly, verified, and keeps what it replaced.
    declined = cli("restore", "b.db", input="n\n")
    assert declined.exit_code == 1 and _ids(cli) == [first, second]
    result = as_json(cli("--json", "restore", "b.db", "--yes"))
    assert result["verify"]["ok"] and result["replaced"] == f"{cli.db}.replaced-1"
    assert _ids(cli) == [first]
    with Scratchpad.open(result["replaced"], keyring=Keyring.from_key_file(cli.key), anchor=False) as replaced:
        assert replaced.stats()["entries"] == 2
    assert sorted(p.name for p in cli.db.parent.iterdir() if ".restore-" in p.name) == []  # no staged copy left


@pytest.mark.sqlite_only
def test_restore_into_an_absent_store(cli: Cli, tmp_path: Path) -> None:
    ok(cli("init"))
    entry = put(cli, 1)
    ok(cli("backup", "b.db"))
    target = tmp_path / "elsewhere" / "new.db"
    result = as_json(cli("--json", "--db", str(target), "restore", "b.db"))
    assert result["replaced"] is None and result["verify"]["entries"] == 1
    assert "hello" in ok(cli("--db", str(target), "get", "--owner", "bob", entry)).stdout


@pytest.mark.sqlite_only
def test_a_tampered_backup_changes_nothing(cli: Cli) -> None:
    ok(cli("init"))
    entry = put(cli, 1)
    ok(cli("backup", "b.db"))
    put(cli, 2)
    flip_segment_byte(Path("b.db"), entry)
    result = cli("restore", "b.db", "--yes")
    assert result.exit_code == 1 and "error: IntegrityError:" in result.stderr
    assert "nothing was changed" in result.stderr
    assert len(_ids(cli)) == 2 and not Path(f"{cli.db}.replaced-1").exists()


@pytest.mark.sqlite_only
def test_restore_refuses_a_live_store_and_a_wrong_key(cli: Cli) -> None:
    ok(cli("init"))
    put(cli, 1)
    with Scratchpad.open(cli.db, keyring=Keyring.from_key_file(cli.key)) as pad:
        pad.put(Principal("bob", "w", "w"), "w", 1, "x", "in the WAL")
        assert Path(f"{cli.db}-wal").stat().st_size > 0
        live = cli("--db", "x.db", "restore", str(cli.db))
    assert live.exit_code == 1 and "write-ahead log" in live.stderr and not Path("x.db").exists()
    ok(cli("backup", "b.db"))
    Keyring.create_key_file("other.key")
    wrong = cli("--db", "y.db", "--key-file", "other.key", "restore", "b.db")
    assert wrong.exit_code == 1 and "WrongKeyError" in wrong.stderr and not Path("y.db").exists()
    missing = cli("restore", "nothing.db", "--yes")
    assert missing.exit_code == 1 and "no backup file" in missing.stderr


@pytest.mark.sqlite_only
def test_backup_is_consistent_while_another_connection_writes(cli: Cli) -> None:
    ok(cli("init"))
    bob = Principal("bob", "w", "w")
    stop = threading.Event()
    with Scratchpad.open(cli.db, keyring=Keyring.from_key_file(cli.key)) as pad:

        def write() -> None:
            step = 100
            while not stop.is_set():
                pad.put(bob, "w", step, "x", "y" * 3000)
                step += 1

        writer = threading.Thread(target=write)
        writer.start()
        try:
            for n in range(3):
                ok(cli("backup", f"b{n}.db"))
        finally:
            stop.set()
            writer.join()
    for n in range(3):
        with Scratchpad.open(f"b{n}.db", keyring=Keyring.from_key_file(cli.key), anchor=False) as copy:
            assert copy.verify()["ok"]


def test_postgresql_is_sent_to_pg_dump(pg_cli: Cli) -> None:
    cli = pg_cli
    ok(cli("init"))
    result = cli("backup", "b.db")
    assert result.exit_code == 1 and "pg_dump" in result.stderr and not Path("b.db").exists()
    restored = cli("restore", "b.db")
    assert restored.exit_code == 1 and "pg_restore" in restored.stderr


def test_the_library_restore_refuses_a_failing_backup(tmp_path: Path, keyring: Keyring, bob: Principal) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as pad:
        entry = pad.put(bob, "t", 1, "x", "hello")["scratchpad_id"]
        pad.backup(tmp_path / "b.db")
    flip_segment_byte(tmp_path / "b.db", entry)
    with pytest.raises(IntegrityError, match="nothing was changed"):
        Scratchpad.restore(tmp_path / "s.db", tmp_path / "b.db", keyring=keyring)


def test_no_write_commits_between_the_copy_kept_aside_and_the_restore(
    tmp_path: Path, keyring: Keyring, bob: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store a restore replaces is copied aside under the write lock the
    replacement holds: a writer of another connection cannot commit in between,
    so no write is lost from both files."""
    import apsw

    from securepad.storage import sqlite

    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as pad:
        pad.put(bob, "t", 1, "x", "kept")
        pad.backup(tmp_path / "b.db")
        pad.put(bob, "t", 2, "x", "written after the backup")
    refused: list[type[BaseException]] = []
    copy_as_read = sqlite._copy_as_read

    def copy_while_another_connection_writes(path: Path, dest: Path, error: Any) -> None:
        other = apsw.Connection(str(tmp_path / "s.db"))
        other.setbusytimeout(0)
        try:
            other.execute("BEGIN IMMEDIATE")
        except apsw.BusyError as exc:
            refused.append(type(exc))
        else:  # pragma: no cover - the lock was not held
            other.execute("ROLLBACK")
        finally:
            other.close()
        copy_as_read(path, dest, error)

    monkeypatch.setattr(sqlite, "_copy_as_read", copy_while_another_connection_writes)
    result = Scratchpad.restore(tmp_path / "s.db", tmp_path / "b.db", keyring=keyring)
    assert refused == [apsw.BusyError]
    with Scratchpad.open(result["replaced"], keyring=keyring, anchor=False) as replaced:
        assert replaced.stats()["entries"] == 2
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as restored:
        assert restored.stats()["entries"] == 1
