"""A row's cost against the quota counts its clear identifiers, in the row and
in its indexes.

Identifiers (owner, actor, channel, turn, executor) may have 256 characters,
up to 1 KiB of UTF-8 each; the row holds them in clear and its indexes repeat
the owner, the turn and the id. Counted as a fixed overhead only, an owner
with 256-character identifiers stored about three times its quota on disk.
The cost of an entry is kept in its row (``stored_bytes``, bound by its
turn's head), so rows written under the former rule keep the cost they were
counted with, and the sealed totals stay the sums of their rows.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import Keyring, Policy, Principal, QuotaExceededError, Scratchpad
from securepad.store import parts, sqlite_of
from securepad.tables.access import RECORD_ROW_OVERHEAD, records_used_sql
from securepad.tables.entries.prepare import ENTRY_ROW_OVERHEAD, identifier_cost
from securepad.tables.quota import record_cost
from tests.support.fixture_v7 import EXPECTED, NOW, copy_v7
from tests.support.principals import AGENT_ALICE as V7_ALICE

LONG = 256
WIDE = Principal("o" * LONG, "a" * LONG, "c" * LONG)
WIDE_TURN = "t" * LONG
WIDE_EXECUTOR = "e" * LONG


def _on_disk(pad: Scratchpad) -> Callable[[], int]:
    """The bytes an owner's entries take on disk: on SQLite the file's pages
    (after a checkpoint); on PostgreSQL the relations of the entries (table,
    its indexes and TOAST, and the segments'), leaving out the heads, whose
    rows a put rewrites (dead versions that vacuum takes back)."""
    db = parts(pad).db
    if db.dialect == "sqlite":

        def pages() -> int:
            store = sqlite_of(pad)
            assert store.checkpoint()
            conn = store.conn
            return int(conn.execute("PRAGMA page_count").fetchall()[0][0]) * int(  # type: ignore[arg-type]
                conn.execute("PRAGMA page_size").fetchall()[0][0]  # type: ignore[arg-type]
            )

        return pages

    def relations() -> int:
        rows = db.query(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) AS n FROM pg_class AS c"
            " WHERE c.relnamespace = 'securepad'::regnamespace AND c.relkind = 'r'"
            " AND c.relname IN ('entries', 'segments')",
            admin=True,
        )
        return int(rows[0]["n"])

    return relations


def _counted(pad: Scratchpad, owner: str) -> int:
    rows = parts(pad).db.query(
        "SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS n FROM entries WHERE owner_user_id = ?",
        (owner,),
        admin=True,
    )
    return int(rows[0]["n"])


def test_an_owner_with_long_identifiers_is_counted_what_its_entries_take_on_disk(pad: Scratchpad) -> None:
    """300 small entries under 256-character identifiers: the disk grows by
    no more than the quota counts (it grew by about three times as much)."""
    pad.put(WIDE, WIDE_TURN, 1, WIDE_EXECUTOR, "first")
    size = _on_disk(pad)
    before, counted_before = size(), _counted(pad, WIDE.owner_user_id)
    for step in range(2, 302):
        pad.put(WIDE, WIDE_TURN, step, WIDE_EXECUTOR, f"output {step}")
    grown, counted = size() - before, _counted(pad, WIDE.owner_user_id) - counted_before
    assert grown <= counted, (grown, counted)


def test_a_quota_bounds_the_disk_an_owner_with_long_identifiers_takes(db_path: Path, keyring: Keyring) -> None:
    """Filled to its quota with small entries, the owner's entries take no more than the quota on disk."""
    quota = 256 * 1024
    policy = Policy.from_dict({"limits": {"owner_quota_bytes": quota, "max_entry_bytes": 64 * 1024}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        pad.put(WIDE, WIDE_TURN, 1, WIDE_EXECUTOR, "first")
        size = _on_disk(pad)
        before = size()
        stored = 1
        with pytest.raises(QuotaExceededError):
            for step in range(2, 10_000):
                pad.put(WIDE, WIDE_TURN, step, WIDE_EXECUTOR, f"output {step}")
                stored += 1
        assert size() - before <= quota
        assert stored < 100  # about 3.7 KiB an entry; it was about 1 KiB
        assert pad.verify()["ok"] is True


def test_an_entrys_cost_grows_with_each_identifier_byte() -> None:
    short = identifier_cost("0" * 16, "o", "t", "a", "c", "e", 0)
    assert identifier_cost("0" * 16, "o" * 2, "t", "a", "c", "e", 0) - short == 1 + 4  # the row, 3 index keys x 1.5
    assert identifier_cost("0" * 16, "o", "t" * 2, "a", "c", "e", 0) - short == 1 + 1  # the row, 1 index key x 1.5
    assert identifier_cost("0" * 16, "o", "t", "aé", "c", "e", 0) - short == 2  # UTF-8 bytes, in the row only
    assert identifier_cost("0" * 16, "o", "t", "a", "c", "e", 3) - short == 3 * 2 * 17  # segment rows: id and owner


@pytest.mark.slow
@given(
    identifiers=st.lists(
        st.tuples(*[st.text(st.characters(codec="utf-8", categories=["L", "N", "S"]), min_size=1, max_size=40)] * 3),
        min_size=1,
        max_size=4,
    )
)
def test_the_records_cost_in_sql_is_the_sum_of_their_costs(tmp_path_factory: Any, identifiers: Any) -> None:
    """``records_used_sql`` (the quota's statement) and ``record_cost`` (a new
    record's check) count the same, identifier bytes included, whatever the
    characters (SQLite's ``length`` counts characters, ``octet_length`` bytes)."""
    directory = tmp_path_factory.mktemp("records")
    keyring = Keyring.from_key_file(directory / "key")
    (directory / "data").mkdir(mode=0o700)
    with Scratchpad.open(directory / "data" / "store.db", keyring=keyring) as pad:
        owner = "ö" + identifiers[0][0]
        for actor, channel, turn in identifiers:
            pad.turn(Principal(owner, actor, channel), turn).checkpoint(facts=["x"])
        rows = parts(pad).db.query(
            "SELECT id, owner_user_id, actor, channel, turn_id, sealed, wrapped_key FROM checkpoints", admin=True
        )
        sql, params = records_used_sql(owner, 0.0)
        total = parts(pad).db.query(f"SELECT {sql} AS n", params, admin=True)[0]["n"]
    assert total == sum(record_cost(row) for row in rows)
    assert all(record_cost(row) > len(row["sealed"]) + len(row["wrapped_key"]) + RECORD_ROW_OVERHEAD for row in rows)


def test_a_store_counted_under_the_former_rule_stays_consistent(tmp_path: Path) -> None:
    """A store whose entries were counted without their identifiers (schema 7):
    its old rows keep their cost, a delete gives back what each was counted,
    new rows count their identifiers, and verify finds every turn's and the
    owner's totals the sums of their rows."""
    db, key = copy_v7(tmp_path / "v7")
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key), clock=lambda: NOW) as pad:
        old_id = EXPECTED["entries"]["small_text"]["id"]
        old_cost = parts(pad).db.query("SELECT stored_bytes FROM entries WHERE id = ?", (old_id,), admin=True)[0]
        assert pad.verify(now=NOW)["ok"] is True
        pad.delete(V7_ALICE, old_id)
        view = pad.put(V7_ALICE, "turn-fixture", 900, "shell", "a one-segment text\nwith two lines", now=NOW)
        new_cost = parts(pad).db.query(
            "SELECT stored_bytes FROM entries WHERE id = ?", (view["scratchpad_id"],), admin=True
        )[0]
        identifiers = identifier_cost(view["scratchpad_id"], "alice", "turn-fixture", "agent", "web", "shell", 0)
        assert new_cost["stored_bytes"] > identifiers + ENTRY_ROW_OVERHEAD  # the identifiers, now counted
        assert old_cost["stored_bytes"] > 0
        report = pad.verify(now=NOW)
        assert report["ok"] is True, report["problems"]
    shutil.rmtree(tmp_path / "v7")


def test_the_fixed_overhead_is_unchanged() -> None:
    """The fixed part stays what it was; the identifiers come on top of it."""
    assert (ENTRY_ROW_OVERHEAD, RECORD_ROW_OVERHEAD) == (512, 256)
