"""What the store's calls read on a young PostgreSQL store, in rows, whatever
the machine's load (docs/decisions/0010-young-store-plans.md).

A connection's prepared statements (and a function's statements) keep the
generic plan made at their sixth run. On a store that autovacuum has not
analyzed yet, the planner's row estimates clamp to one and two indexes whose
first column a statement binds cost the same: the newest wins. Before schema
11 the entry fetch by id and owner took the turn's index and read every entry
of the owner, and a turn's checkpoints and compaction
marks read the owner's through their key (owner_user_id, id).

Each call below runs on a store of 60 entries of one owner in six turns (and
a checkpoint and a compaction mark a turn), with autovacuum held off and
every plan generic, and auto_explain (ANALYZE) reports each statement's plan,
the function's nested ones included. Left out, and said so: gc's expiry scan
(``expires_at <= ?``, every owner's rows, which ``Scratchpad.turn`` runs
first), the turn heads' ``turn_id IN (...)`` (the owner's heads, one a turn)
and put_many's ``step_num IN (...)`` (the turn's entries): an IN list on a
second column of an index is a filter in these plans.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from securepad import Scratchpad

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
from psycopg_pool import ConnectionPool  # noqa: E402  (needs psycopg)

from tests.support.principals import ALICE, BOB  # noqa: E402

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # about 4 KiB
TURNS = [f"t{turn}" for turn in range(1, 7)]
# The tables of the owners' rows whose scans are checked (turn_heads is left out: see above).
CHECKED = ("entries", "segments", "checkpoints", "compaction_marks", "owner_keys")
# The tables autovacuum is held off while a test runs.
YOUNG_TABLES = ("entries", "segments", "checkpoints", "compaction_marks", "turn_heads", "owner_keys")


class Explained:
    """auto_explain's plans of the statements that the store's one connection runs."""

    def __init__(self, pad: Scratchpad, pool: ConnectionPool[Any]) -> None:
        self.pad = pad
        self.plans: list[tuple[str, dict[str, Any]]] = []
        self._recording = False
        with pool.connection() as conn:
            try:
                conn.execute("LOAD 'auto_explain'")
            except psycopg.Error as exc:
                pytest.skip(f"auto_explain is not available: {exc}")
            for setting in (
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_level = notice",
                "auto_explain.log_analyze = on",
                "auto_explain.log_timing = off",
                "auto_explain.log_nested_statements = on",
                "auto_explain.log_format = json",
                # The generic plan from the first run: the one a sixth run would keep.
                "plan_cache_mode = force_generic_plan",
            ):
                conn.execute(f"SET {setting}")
            conn.add_notice_handler(self._notice)

    def _notice(self, diagnostic: Any) -> None:
        message = diagnostic.message_primary or ""
        if self._recording and message.startswith("duration:"):
            explained = json.loads(message.split("\n", 1)[1])
            self.plans.append((" ".join(explained["Query Text"].split()), explained["Plan"]))

    def scans(self, call: Callable[[], object]) -> list[dict[str, Any]]:
        """The scans of the checked tables that ``call`` runs (gc's expiry scan
        left out), each with the rows it read and returned and the index it took."""
        self.plans.clear()
        self._recording = True
        try:
            call()
        finally:
            self._recording = False
        found: list[dict[str, Any]] = []

        def walk(query: str, node: dict[str, Any]) -> None:
            if node.get("Relation Name") in CHECKED:
                loops = int(node.get("Actual Loops", 1))
                returned = int(node.get("Actual Rows", 0)) * loops
                removed = int(node.get("Rows Removed by Filter", 0)) + int(node.get("Rows Removed by Index Recheck", 0))
                found.append(
                    {
                        "table": node["Relation Name"],
                        "index": node.get("Index Name"),
                        "condition": f"{node.get('Index Cond', '')} {node.get('Filter', '')}",
                        "returned": returned,
                        "read": returned + removed,
                        "query": query[:160],
                    }
                )
            for child in node.get("Plans", []):
                walk(query, child)

        for query, plan in self.plans:
            if "WHERE expires_at <= " not in query:
                walk(query, plan)
        return found


@pytest.fixture
def young(pg_single: tuple[Scratchpad, ConnectionPool[Any]], pg_dsn: str) -> Iterator[tuple[Explained, dict[Any, str]]]:
    """A young store (autovacuum held off its tables) of 60 entries of alice's
    in six turns, text and json, a checkpoint and a compaction mark a turn,
    and bob's entry; the entries' ids by (turn, step)."""
    pad, pool = pg_single
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for table in YOUNG_TABLES:
            admin.execute(f"ALTER TABLE securepad.{table} SET (autovacuum_enabled = false)")
    explained = Explained(pad, pool)
    ids: dict[Any, str] = {}
    for turn in TURNS:
        listing = {"items": [{"n": n} for n in range(5)]}
        items = [(step, "shell", TEXT if step % 2 else listing) for step in range(1, 11)]
        for step, view in enumerate(pad.put_many(ALICE, turn, items), start=1):
            ids[turn, step] = view["scratchpad_id"]
        pad.turn(ALICE, turn).checkpoint(facts=["made"])
        pad.turn(ALICE, turn).mark_compaction()
    pad.put(BOB, "t1", 1, "shell", TEXT)
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        analyzed = admin.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'securepad'::regnamespace AND reltuples >= 0"
            " AND relname IN ('entries', 'checkpoints', 'compaction_marks')"
        ).fetchone()
    assert analyzed == (0,)  # never analyzed: the planner's young-store estimates
    yield explained, ids
    # The tables' own settings as the store made them: emptied, the store is
    # lent to the next test if it proves pristine (tests/support/pristine.py).
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for table in YOUNG_TABLES:
            admin.execute(f"ALTER TABLE securepad.{table} RESET (autovacuum_enabled)")


def _turn(round_: int) -> str:
    return TURNS[round_ % len(TURNS)]


# The calls checked, each given the store, the entries' ids and a round number
# (another entry or turn each round, so that no call repeats a row's lookup).
Call = Callable[[Scratchpad, dict[Any, str], int], object]
CALLS: dict[str, Call] = {
    "read head": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 1], "head", n=100),
    "read tail": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 3], "tail", n=100),
    "read range": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 5], "range", start=10, end=200),
    "read lines": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 7], "lines", start=2, end=5),
    "read grep": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 9], "grep", pattern="line 3"),
    "read full": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 2], "full"),
    "read of a turn": lambda pad, ids, r: pad.read(ALICE, ids[_turn(r), 4], "head", turn_id=_turn(r)),
    "get": lambda pad, ids, r: pad.get(ALICE, ids[_turn(r), 6]),
    "list": lambda pad, ids, r: pad.list_for_turn(ALICE, _turn(r)),
    "resolve": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).resolve("{{step2.items}}"),
    "put": lambda pad, ids, r: pad.put(ALICE, _turn(r), 100 + r, "shell", TEXT),
    "checkpoint": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).checkpoint(facts=[str(r)]),
    "latest checkpoint": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).latest_checkpoint(),
    "compaction mark": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).mark_compaction(),
    "reread report": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).reread_report(),
    "resume": lambda pad, ids, r: pad.turn(ALICE, _turn(r)).resume(),
    "delete": lambda pad, ids, r: pad.delete(ALICE, ids[_turn(r), 10 - r // len(TURNS)]),
}


@pytest.mark.parametrize("name", CALLS)
def test_a_call_on_a_young_store_reads_only_the_rows_it_returns(
    young: tuple[Explained, dict[Any, str]], name: str
) -> None:
    explained, ids = young
    call = CALLS[name]
    for round_ in range(6):  # the sixth run's plans are the ones kept
        call(explained.pad, ids, round_)
    scans = explained.scans(lambda: call(explained.pad, ids, 6))
    assert scans  # the call reads the tables checked
    assert [scan for scan in scans if scan["read"] > scan["returned"]] == []


def test_on_a_young_store_an_entry_by_id_takes_the_key(young: tuple[Explained, dict[Any, str]]) -> None:
    """The entry fetch (entries.py) and the function's entry-to-turn lookup take
    entries_pkey (id, owner_user_id) and read one row, with 60 entries of the owner."""
    explained, ids = young
    scans = explained.scans(lambda: explained.pad.read(ALICE, ids["t3", 5], "head", n=100))
    by_id = [scan for scan in scans if scan["table"] == "entries" and re.search(r"\bid = \$", scan["condition"])]
    assert by_id and all((scan["index"], scan["read"]) == ("entries_pkey", 1) for scan in by_id)


def test_schema_11_makes_each_key_by_id_the_newest_index_of_its_table(
    pg_single: tuple[Scratchpad, ConnectionPool[Any]],
) -> None:
    """Where age breaks the tie (a statement naming the id and the owner also
    binds the owner-leading indexes' first column), the key must be the newest."""
    _, pool = pg_single
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT DISTINCT ON (t.relname) t.relname, c.relname FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
            " WHERE t.relnamespace = 'securepad'::regnamespace"
            " AND t.relname IN ('entries', 'checkpoints', 'compaction_marks')"
            " ORDER BY t.relname, i.indexrelid DESC"
        ).fetchall()
    assert dict(rows) == {
        "entries": "entries_pkey",
        "checkpoints": "checkpoints_pkey",
        "compaction_marks": "compaction_marks_pkey",
    }
