"""An integral clear column edited to a fraction is refused, never rounded.

SQLite keeps whatever number an edit writes, whatever the column's declared
type: ``stored_bytes`` set to its value plus 0.5 used to give the row the
digest term of the genuine one (the term took ``int()`` of it), so every read
and ``securepad verify`` passed. Each integral column that enters a head's term
or a check (an entry's step and stored bytes, a record's sequence number and
key version) is now refused when it is not an integer, with IntegrityError on
the read path and as a problem in ``verify``. PostgreSQL's integer columns
cannot hold a fraction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Scratchpad
from securepad.tables.heads.tally import term
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import on_sqlite


def _store(db_path: Path, keyring: Keyring) -> str:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids = [
            str(pad.put(ALICE, "t1", step, "shell", f"output {step}\n" * 50, now=NOW)["scratchpad_id"])
            for step in (1, 2)
        ]
        pad.turn(ALICE, "t1", now=NOW).checkpoint(facts=["kept"], now=NOW)
    return ids[0]


def _edit(db_path: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    with on_sqlite(db_path) as raw:
        raw.execute(sql, params)
        assert raw.conn.changes() == 1


EDITS = {
    "stored_bytes": "UPDATE entries SET stored_bytes = stored_bytes + 0.5 WHERE id = ?",
    "step_num": "UPDATE entries SET step_num = step_num + 0.25 WHERE id = ?",
}


@pytest.mark.parametrize("column", sorted(EDITS))
def test_an_entry_column_edited_to_a_fraction_is_refused_on_every_read_and_by_verify(
    db_path: Path, keyring: Keyring, column: str
) -> None:
    entry_id = _store(db_path, keyring)
    _edit(db_path, EDITS[column], (entry_id,))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, entry_id, now=NOW)
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t1", now=NOW).history(now=NOW)
        report = pad.verify(now=NOW)
    assert report["ok"] is False
    assert any(problem["id"] == entry_id or problem["turn"] == "t1" for problem in report["problems"])


def test_a_fraction_that_rounds_to_the_genuine_value_is_refused(db_path: Path, keyring: Keyring) -> None:
    """The attack exactly: 0.5 more than the genuine stored bytes, which ``int()`` rounds back."""
    entry_id = _store(db_path, keyring)
    with on_sqlite(db_path) as raw:
        genuine = raw.execute("SELECT stored_bytes FROM entries WHERE id = ?", (entry_id,))[0][0]
    _edit(db_path, "UPDATE entries SET stored_bytes = ? WHERE id = ?", (genuine + 0.5, entry_id))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.get(ALICE, entry_id, now=NOW)
        assert pad.verify(now=NOW)["ok"] is False
    _edit(db_path, "UPDATE entries SET stored_bytes = ? WHERE id = ?", (genuine, entry_id))
    with Scratchpad.open(db_path, keyring=keyring) as pad:  # the edit undone reads again
        assert pad.get(ALICE, entry_id, now=NOW).scratchpad_id == entry_id
        assert pad.verify(now=NOW)["ok"] is True


@pytest.mark.parametrize("column", ["seq", "key_version"])
def test_a_record_column_edited_to_a_fraction_is_refused_by_reads_and_verify(
    db_path: Path, keyring: Keyring, column: str
) -> None:
    _store(db_path, keyring)
    _edit(db_path, f"UPDATE checkpoints SET {column} = {column} + 0.5")
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t1", now=NOW).latest_checkpoint(now=NOW)
        assert pad.verify(now=NOW)["ok"] is False


@pytest.mark.parametrize(
    "kind, item",
    [("e", (1, NOW, 10.5, "planner", "web")), ("e", (1.5, NOW, 10, "a", "c")), ("c", (2.0, NOW, "a", "c"))],
)
def test_a_head_term_refuses_a_non_integer_in_an_integral_position(
    db_path: Path, keyring: Keyring, kind: str, item: tuple[Any, ...]
) -> None:
    from securepad.store import parts

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        seal = parts(pad).keys.counter_seal
    with pytest.raises(IntegrityError, match="not an integer"):
        term(seal, "alice", "t1", kind, "0" * 16, item)
    whole = tuple(
        int(value) if position != 1 and isinstance(value, float) else value for position, value in enumerate(item)
    )
    assert isinstance(term(seal, "alice", "t1", kind, "0" * 16, whole), int)  # the integers themselves pass
