"""The schema 7 store in tests/fixtures (store_v7.db, its key, its anchor, and
store_v7.json: what it returned when written), and private copies of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.paths import FIXTURES

EXPECTED = json.loads((FIXTURES / "store_v7.json").read_text())
NOW = EXPECTED["now"]


def copy_v7(directory: Path) -> tuple[Path, Path]:
    """A private copy of the v7 store and its key (0600, as a store of one's own is)."""
    directory.mkdir(parents=True, exist_ok=True)
    db, key = directory / "store.db", directory / "keys" / "key"
    shutil.copy(FIXTURES / "store_v7.db", db)
    db.chmod(0o600)
    key.parent.mkdir(exist_ok=True)
    key.write_bytes((FIXTURES / "store_v7.key").read_bytes())
    key.chmod(0o600)
    # The anchor the store's write counter was raised against, where the key file's store looks for it.
    anchor = key.parent / f"anchor-{EXPECTED['store_id']}"
    anchor.write_bytes((FIXTURES / "store_v7.anchor").read_bytes())
    anchor.chmod(0o600)
    return db, key
