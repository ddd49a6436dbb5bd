"""The kept PostgreSQL store of the tests (``tests.support.pristine``): a
store written to is emptied and kept, with its identity and key; any other
change drops it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from securepad import Keyring, NotFoundError, Scratchpad
from tests.support.principals import ALICE, BOB
from tests.support.pristine import PristineStore

pytestmark = pytest.mark.slow

SCHEMA = "pristine_probe"


@pytest.fixture
def kept(pg_dsn: str, tmp_path: Path) -> Iterator[PristineStore]:
    """A store made in a schema of its own and taken as the pristine one."""
    store = PristineStore(pg_dsn, SCHEMA)
    key_file = tmp_path / "made" / "key"
    with Scratchpad.open(pg_dsn, keyring=Keyring.from_key_file(key_file), schema=SCHEMA):
        store.adopt(key_file)
    try:
        yield store
    finally:
        store.close()


def _open(kept: PristineStore, key_file: Path) -> Scratchpad:
    assert kept.place_key(key_file)
    return Scratchpad.open(kept.dsn, keyring=Keyring.from_key_file(key_file), schema=SCHEMA)


def _schema_exists(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone() is not None


def test_a_store_written_to_is_emptied_and_kept_with_its_identity(kept: PristineStore, tmp_path: Path) -> None:
    with _open(kept, tmp_path / "first" / "key") as pad:
        store_id = pad.store_id
        entry = pad.put(ALICE, "t1", 1, "shell", "x" * 5000)["scratchpad_id"]
        pad.put_many(BOB, "t2", [(step, "shell", "y") for step in range(1, 4)])
        pad.turn(ALICE, "t1").checkpoint(facts=["made"])
    kept.give_back()
    assert kept.kept and _schema_exists(kept.dsn)
    with _open(kept, tmp_path / "second" / "key") as pad:
        assert pad.store_id == store_id
        with pytest.raises(NotFoundError):
            pad.get(ALICE, entry)
        assert pad.stats()["entries"] == 0
    kept.give_back()
    assert kept.kept


@pytest.mark.parametrize(
    "change",
    [
        f"ALTER TABLE {SCHEMA}.entries NO FORCE ROW LEVEL SECURITY",
        f"DROP POLICY housekeeping ON {SCHEMA}.turn_heads",
        f"REVOKE DELETE ON {SCHEMA}.segments FROM securepad_app",
        f"CREATE INDEX spare ON {SCHEMA}.entries(actor)",
        f"ALTER TABLE {SCHEMA}.owner_keys ADD COLUMN spare TEXT",
        f"CREATE TABLE {SCHEMA}.spare(x INTEGER)",
        f"CREATE OR REPLACE FUNCTION {SCHEMA}.spare() RETURNS INTEGER LANGUAGE sql AS 'SELECT 1'",
        f"INSERT INTO {SCHEMA}.store_meta(key, value) VALUES ('spare', '1')",
        f"UPDATE {SCHEMA}.store_meta SET value = 'f' || value WHERE key = 'key_check'",
        f"DELETE FROM {SCHEMA}.schema_version WHERE version = 1",
        f"ANALYZE {SCHEMA}.store_meta",
    ],
    ids=[
        "rls-forced",
        "policy",
        "grant",
        "index",
        "column",
        "table",
        "function",
        "meta-row",
        "identity",
        "version",
        "statistics",
    ],
)
def test_any_other_change_drops_the_store(kept: PristineStore, pg_dsn: str, change: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(change)
    kept.give_back()
    assert not kept.kept and not _schema_exists(pg_dsn)


def test_a_rotated_master_key_drops_the_store(kept: PristineStore, tmp_path: Path) -> None:
    with _open(kept, tmp_path / "first" / "key") as pad:
        pad.put(ALICE, "t1", 1, "shell", "x")
        pad.rotate_master_key(Keyring.from_key_file(tmp_path / "new" / "key"))
    kept.give_back()
    assert not kept.kept and not _schema_exists(kept.dsn)


def test_a_store_written_to_before_it_was_taken_is_not_kept(pg_dsn: str, tmp_path: Path) -> None:
    store = PristineStore(pg_dsn, SCHEMA)
    key_file = tmp_path / "key"
    try:
        with Scratchpad.open(pg_dsn, keyring=Keyring.from_key_file(key_file), schema=SCHEMA) as pad:
            pad.put(ALICE, "t1", 1, "shell", "x")
            store.adopt(key_file)
        assert not store.kept and not store.place_key(tmp_path / "other")
    finally:
        store.close()
