"""Edits from outside that a warm read's freshness token must see (SQLite).

SQLite's token holds, once another connection committed, the exact text of
the turn's inventory rows (``tables.heads.reading``): every value of every row, so
that an edit of a row the read does not fetch still sends the read to the
turn's full check, which refuses it, as a read with nothing cached would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError
from securepad.store import parts
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import as_admin, raw_file

LATER = NOW + 10
NO_BACKGROUND = Policy(anchor_sync="commit")
# A text column's value with a NUL and more after it: SQLite's ``quote`` stops at the NUL.
WITH_NUL = {"actor": "planner\x00x", "channel": "web\x00x"}


def _turn(pad: Scratchpad, steps: int) -> list[str]:
    batch = [(step, "fetch", f"observation {step}") for step in range(1, steps + 1)]
    return [view["scratchpad_id"] for view in pad.put_many(ALICE, "t", batch, ttl_seconds=3600, now=NOW)]


@pytest.fixture
def warm(db_path: Any, keyring: Keyring) -> Iterator[tuple[Scratchpad, list[str]]]:
    with Scratchpad.open(db_path, keyring=keyring, policy=NO_BACKGROUND) as pad:
        ids = _turn(pad, 3)
        pad.get(ALICE, ids[0], now=LATER)
        yield pad, ids


def _rows_text(pad: Scratchpad) -> str:
    sql, params = parts(pad).heads.reads.sql("?", "t", "alice")
    (token,) = [row for row in parts(pad).db.query(sql, params) if row["k"] == "v"]
    return str(token["channel"])


@pytest.mark.parametrize("column", sorted(WITH_NUL))
def test_a_text_value_with_a_nul_gives_another_rows_text(
    warm: tuple[Scratchpad, list[str]], db_path: Any, column: str
) -> None:
    pad, ids = warm
    before = _rows_text(pad)
    with raw_file(db_path) as conn:
        conn.execute(f"UPDATE entries SET {column} = ? WHERE id = ?", (WITH_NUL[column], ids[1]))
    assert _rows_text(pad) != before


@pytest.mark.parametrize("column", sorted(WITH_NUL))
def test_an_edit_after_a_nul_of_another_row_is_refused_by_a_warm_read(
    warm: tuple[Scratchpad, list[str]], db_path: Any, column: str
) -> None:
    """The edited row is not the one read: only the token can send the read to the full check."""
    pad, ids = warm
    with raw_file(db_path) as conn:
        conn.execute(f"UPDATE entries SET {column} = ? WHERE id = ?", (WITH_NUL[column], ids[1]))
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)


def test_a_turn_head_moved_to_another_key_version_is_refused_by_a_warm_read(
    warm: tuple[Scratchpad, list[str]], db_path: Any
) -> None:
    """The head's bytes unchanged, its key version edited: a read with nothing
    cached fails to open the head, and so does a warm one."""
    pad, ids = warm
    with raw_file(db_path) as conn:
        conn.execute(
            "UPDATE turn_heads SET key_version = key_version + 1 WHERE owner_user_id = 'alice' AND turn_id = 't'"
        )
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)


# Values that print as the stored one in most renderings: an expiry one ulp
# away, an id as a blob of the same bytes. (A number stored as another type
# of the same value is the same item to the head, warm or cold.)
SAME_LOOKING = {
    "expires_at": "expires_at + 1.1641532182693481e-10",
    "id": "CAST(id AS BLOB)",
}


@pytest.mark.parametrize("change", sorted(SAME_LOOKING))
def test_a_same_looking_value_of_another_row_is_refused_by_a_warm_read(
    warm: tuple[Scratchpad, list[str]], db_path: Any, change: str
) -> None:
    pad, ids = warm
    with raw_file(db_path) as conn:
        conn.execute(f"UPDATE entries SET {change} = {SAME_LOOKING[change]} WHERE id = ?", (ids[1],))
    with pytest.raises(IntegrityError):
        pad.get(ALICE, ids[0], now=LATER)


@pytest.mark.xfail(
    strict=True,
    reason="PostgreSQL's token holds the head's sealed bytes and the digest of the rows, not the head's key version",
)
def test_a_turn_head_moved_to_another_key_version_is_refused_by_a_warm_read_on_postgresql(
    pg_dsn: str, keyring: Keyring
) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        ids = _turn(pad, 3)
        pad.get(ALICE, ids[0], now=LATER)
        with as_admin(pg_dsn) as raw:
            raw.execute(
                "UPDATE turn_heads SET key_version = key_version + 1 WHERE owner_user_id = 'alice' AND turn_id = 't'"
            )
        with pytest.raises(IntegrityError):
            pad.get(ALICE, ids[0], now=LATER)
