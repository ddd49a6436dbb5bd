"""``verify`` names what a digest lets it name.

A turn head is a count and a keyed digest: it cannot say which row is gone.
But verify knows the steps of the turn's authenticated entries and the
highest step the head recorded, so for a turn whose entries differ from its
head it lists the steps present, the head's last step and the steps of
1..last with no authenticated entry ("removed, altered, or expired and
collected; or never recorded": a digest cannot tell these apart), and names
the head's newest entry as removed when it is gone before its sealed expiry.
Both in ``pad.verify()``, ``securepad --json verify`` and the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from securepad import Keyring, Scratchpad
from securepad.cli import ENVIRONMENT, main
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import as_admin, delete_entry, on_sqlite

LATER = NOW + 100


def _edit(backend: str, where: Any) -> Any:
    return on_sqlite(where) if backend == "sqlite" else as_admin(str(where))


def _record(pad: Scratchpad, steps: int, *, short: tuple[int, ...] = ()) -> list[str]:
    return [
        pad.put(ALICE, "t", step, "tool", f"step {step}", ttl_seconds=10 if step in short else 3600, now=NOW)[
            "scratchpad_id"
        ]
        for step in range(1, steps + 1)
    ]


def _turn_problem(pad: Scratchpad, now: float = LATER) -> dict[str, Any]:
    report = pad.verify(now=now)
    assert not report["ok"]
    (problem,) = [p for p in report["problems"] if p["what"] == "turn"]
    return problem


def test_a_truncated_tail_is_named(store_location: Any, backend: str, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = _record(pad, 5)
        with _edit(backend, store_location) as raw:
            for entry_id in ids[3:]:
                delete_entry(raw, entry_id)
        problem = _turn_problem(pad)
    assert (problem["owner_user_id"], problem["turn_id"]) == ("alice", "t")
    assert problem["steps"] == [[1, 3]]
    assert problem["last_step"] == 5
    assert problem["missing_steps"] == [[4, 5]]
    assert problem["newest_removed"] == 5  # the head's newest, gone before its sealed expiry
    assert "no authenticated entry for steps 4-5" in problem["problem"]
    assert "(step 5) is gone before its sealed expiry: removed" in problem["problem"]


def test_a_deleted_middle_step_is_named(store_location: Any, backend: str, keyring: Keyring) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = _record(pad, 5)
        with _edit(backend, store_location) as raw:
            delete_entry(raw, ids[2])
        problem = _turn_problem(pad)
    assert (problem["steps"], problem["last_step"], problem["missing_steps"]) == ([[1, 2], [4, 5]], 5, [[3, 3]])
    assert problem["newest_removed"] is None
    assert "no authenticated entry for step 3 (removed, altered, or expired and collected" in problem["problem"]


def test_an_altered_row_is_not_counted_as_present(store_location: Any, backend: str, keyring: Keyring) -> None:
    """Steps present are those of authenticated entries only: a row moved to
    another step is named on its own and leaves its steps missing here."""
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = _record(pad, 4)
        with _edit(backend, store_location) as raw:
            raw.execute("UPDATE entries SET step_num = 9 WHERE id = ?", (ids[1],))
        report = pad.verify(now=LATER)
    (turn,) = [p for p in report["problems"] if p["what"] == "turn"]
    assert turn["missing_steps"] == [[2, 2]]
    assert turn["steps"] == [[1, 1], [3, 4]]
    assert [p["id"] for p in report["problems"] if p["what"] == "entry"] == [ids[1]]


def test_expired_and_collected_steps_are_no_problem_but_gaps_are_worded_so(
    store_location: Any, backend: str, keyring: Keyring
) -> None:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = _record(pad, 4, short=(2,))
        assert pad.gc(now=NOW + 20) == 1  # step 2 expired and went: legitimate
        assert pad.verify(now=NOW + 20)["ok"]
        with _edit(backend, store_location) as raw:
            delete_entry(raw, ids[2])  # step 3 removed before its expiry
        problem = _turn_problem(pad, NOW + 20)
    # The digest cannot tell the collected step 2 from the removed step 3: both are listed, worded so.
    assert (problem["steps"], problem["missing_steps"], problem["newest_removed"]) == ([[1, 1], [4, 4]], [[2, 3]], None)


def test_other_differences_carry_no_step_fields(store_location: Any, backend: str, keyring: Keyring) -> None:
    """A checkpoint removed: the turn's entries agree with the head (its newest
    step deleted through the API is no difference), so no steps are listed."""
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = _record(pad, 3)
        pad.delete(ALICE, ids[2], now=NOW)
        pad.turn(ALICE, "t", now=NOW).checkpoint(facts=["a"], now=NOW)
        with _edit(backend, store_location) as raw:
            raw.execute("DELETE FROM checkpoints WHERE owner_user_id = 'alice'")
        problem = _turn_problem(pad)
    assert "steps" not in problem and "steps present" not in problem["problem"]


@pytest.mark.slow
@pytest.mark.sqlite_only
@given(removed=st.sets(st.integers(min_value=1, max_value=8), min_size=1))
def test_the_missing_steps_are_exactly_the_removed_ones(
    tmp_path_factory: pytest.TempPathFactory, removed: set[int]
) -> None:
    where = tmp_path_factory.mktemp("verify")
    keyring = Keyring.from_key_file(where / "key")
    with Scratchpad.open(where / "data" / "store.db", keyring=keyring) as pad:
        ids = _record(pad, 8)
        with on_sqlite(where / "data" / "store.db") as raw:
            for step in removed:
                delete_entry(raw, ids[step - 1])
        problem = _turn_problem(pad)
    assert _expand(problem["missing_steps"]) == sorted(removed)
    assert _expand(problem["steps"]) == sorted(set(range(1, 9)) - removed)
    assert problem["newest_removed"] == (8 if 8 in removed else None)


def _expand(runs: list[list[int]]) -> list[int]:
    return [step for first, last in runs for step in range(first, last + 1)]


# -- the command line ------------------------------------------------------------------------------


def _cli(db: Path, key: Path, *args: str) -> Any:
    env: dict[str, str | None] = {var: None for var, _, _ in ENVIRONMENT}
    env |= {"SECUREPAD_DB": str(db), "SECUREPAD_KEY_FILE": str(key)}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_the_json_and_the_table_name_the_missing_steps(db_path: Path, key_file: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = [
            pad.put(ALICE, "t", step, "tool", f"step {step}", ttl_seconds=3600)["scratchpad_id"] for step in (1, 2, 3)
        ]
    with on_sqlite(db_path) as raw:
        delete_entry(raw, ids[1])
    result = _cli(db_path, key_file, "--json", "verify")
    assert result.exit_code == 1
    (turn,) = [p for p in json.loads(result.stdout)["problems"] if p["what"] == "turn"]
    assert (turn["turn_id"], turn["steps"], turn["last_step"], turn["missing_steps"]) == (
        "t",
        [[1, 1], [3, 3]],
        3,
        [[2, 2]],
    )
    table = _cli(db_path, key_file, "verify")
    assert table.exit_code == 1 and "verify FAILED" in table.stdout
    cells = " ".join(line.split("│")[-2].strip() for line in table.stdout.splitlines() if line.startswith("│"))
    assert (
        "steps present: 1, 3; the head's last step: 3; no authenticated entry for step 2 (removed, altered,"
        " or expired and collected; or never recorded)"
    ) in cells
