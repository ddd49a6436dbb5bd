"""Opening an older store upgrades it in place, and says so once: a warning on the
``securepad`` logger and ``Scratchpad.schema_upgrade`` in Python, one
``warning:`` line from the command line."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from securepad import Keyring, Scratchpad
from securepad.storage.sqlite import SCHEMA_VERSION
from tests.support.cli_runner import Cli, ok

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OLD = int.from_bytes((FIXTURES / "store_v1.db").read_bytes()[60:64], "big")  # its user_version


def _old_store(where: Path) -> tuple[Path, Path]:
    db, key = where / "old.db", where / "old.key"
    shutil.copy(FIXTURES / "store_v1.db", db)
    db.chmod(0o600)
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    return db, key


@pytest.mark.sqlite_only
def test_the_command_line_says_once_that_it_upgraded_a_store(cli: Cli, tmp_path: Path) -> None:
    db, key = _old_store(tmp_path)
    first = ok(cli("--db", str(db), "--key-file", str(key), "--json", "stats"))
    notices = [line for line in first.stderr.splitlines() if line.startswith("warning: ")]
    assert len(notices) == 1 and f"schema {OLD} \u2192 {SCHEMA_VERSION}" in notices[0]
    assert "refuses it now" in notices[0] and str(db) in notices[0]
    assert first.stdout.startswith("{")  # the JSON result stays clean
    again = ok(cli("--db", str(db), "--key-file", str(key), "stats"))
    assert "warning:" not in again.stderr


def test_the_library_logs_the_upgrade_and_returns_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db, key = _old_store(tmp_path)
    with (
        caplog.at_level(logging.WARNING, logger="securepad"),
        Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad,
    ):
        assert pad.schema_upgrade == {"from": OLD, "to": SCHEMA_VERSION}
        assert pad.upgrade_notice is not None and f"schema {OLD} " in pad.upgrade_notice
    assert [r.getMessage() for r in caplog.records if r.name == "securepad"] == [pad.upgrade_notice]
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as reopened:
        assert reopened.schema_upgrade is None and reopened.upgrade_notice is None


def test_a_new_store_is_not_an_upgrade(pad: Scratchpad) -> None:
    assert pad.schema_upgrade is None


def test_postgresql_says_once_that_it_upgraded_a_store(pg_cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store made one schema behind (migrations stopped one short, as an older
    securepad left it): the command that upgrades it says so, the next does not."""
    from securepad.storage.postgres import migrate

    assert pg_cli.store is not None
    current = migrate.SCHEMA_VERSION
    with monkeypatch.context() as patch:
        patch.setattr(migrate, "SCHEMA_VERSION", current - 1)
        ok(pg_cli("init"))
    first = ok(pg_cli("stats"))
    notices = [line for line in first.stderr.splitlines() if line.startswith("warning: ")]
    assert len(notices) == 1 and f"schema {current - 1} \u2192 {current}" in notices[0]
    assert "warning:" not in ok(pg_cli("stats")).stderr
