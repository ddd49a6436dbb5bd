"""``get_tuple`` of the latest fetches the thread's newest row alone: in a process
that keeps the thread's verified inventory, an edit of the file by another
connection is refused all the same (the inventory is read again and checked
against the turn's sealed head, ``HeadChecks.check_newest``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from securepad import IntegrityError, Keyring, Principal, Scratchpad
from tests.support.tamper_edits import edit_file

from .test_langgraph_saver_costs import config, fill

pytestmark = pytest.mark.xdist_group("langgraph")


@pytest.fixture
def warm(db_path: Path, keyring: Keyring, alice: Principal) -> Iterator[tuple[Any, list[str]]]:
    from securepad.integrations.langgraph import SecurepadSaver

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        saver = SecurepadSaver(pad, alice)
        fill(saver, "t", 5)
        assert saver.get_tuple(config("t")) is not None  # the thread's inventory verified and kept
        listed = pad.list_for_turn(alice, saver.records.turn(alice, "thread", "t"))
        yield saver, [item["scratchpad_id"] for item in listed]


@pytest.mark.parametrize("which", [0, 2, -1], ids=["oldest", "middle", "newest"])
def test_a_checkpoint_deleted_anywhere_is_refused_in_a_warm_process(
    warm: tuple[Any, list[str]], db_path: Path, which: int
) -> None:
    saver, ids = warm
    assert edit_file(db_path, "DELETE FROM entries WHERE id = ?", ids[which]) == 1
    with pytest.raises(IntegrityError):
        saver.get_tuple(config("t"))


def test_the_newest_served_as_expired_is_refused_in_a_warm_process(warm: tuple[Any, list[str]], db_path: Path) -> None:
    saver, ids = warm
    assert edit_file(db_path, "UPDATE entries SET expires_at = 1 WHERE id = ?", ids[-1]) == 1
    with pytest.raises(IntegrityError):
        saver.get_tuple(config("t"))


def test_an_older_row_moved_above_the_newest_is_refused_in_a_warm_process(
    warm: tuple[Any, list[str]], db_path: Path
) -> None:
    saver, ids = warm
    assert edit_file(db_path, "UPDATE entries SET step_num = 99 WHERE id = ?", ids[0]) == 1
    with pytest.raises(IntegrityError):
        saver.get_tuple(config("t"))
