"""``drop_turn``'s failure paths: a refused drop leaves the store as it was,
and leaves the turn refusing writes as before it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from securepad import AsyncScratchpad, IntegrityError, Keyring, Scratchpad
from securepad.tables.heads.heads import OWNER_HEAD
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import Raw, as_admin, on_sqlite, record_turn, tail_truncation

LATER = NOW + 100


@pytest.fixture
def store(store_location: Any, keyring: Keyring, backend: str) -> Iterator[dict[str, Any]]:
    with Scratchpad.open(store_location, keyring=keyring) as pad:
        ids = record_turn(pad, ALICE, "t1", 5)
        record_turn(pad, ALICE, "t2", 2)
    yield {"where": store_location, "keyring": keyring, "ids": ids, "backend": backend}


def _raw(s: dict[str, Any]) -> AbstractContextManager[Raw]:
    return on_sqlite(s["where"]) if s["backend"] == "sqlite" else as_admin(s["where"])


def _count(s: dict[str, Any], sql: str) -> int:
    with _raw(s) as raw:
        return int(raw.execute(sql)[0][0])


def _owner_head_swapped(raw: Raw) -> None:
    """The owner head's sealed body replaced by another head's: it no longer opens."""
    raw.execute(
        "UPDATE turn_heads SET sealed = (SELECT sealed FROM turn_heads WHERE owner_user_id = 'alice'"
        " AND turn_id = 't2') WHERE owner_user_id = 'alice' AND turn_id = ?",
        (OWNER_HEAD,),
    )


def test_a_drop_refused_for_a_tampered_owner_head_keeps_the_turn_refusing_writes(store: dict[str, Any]) -> None:
    with _raw(store) as raw:
        tail_truncation(raw, store)
    with Scratchpad.open(store["where"], keyring=store["keyring"]) as pad:
        with pytest.raises(IntegrityError):
            pad.turn(ALICE, "t1", now=LATER).history(now=LATER)  # found tampered in this process
        with _raw(store) as raw:
            _owner_head_swapped(raw)
        entries = _count(store, "SELECT COUNT(*) FROM entries WHERE turn_id = 't1'")
        heads = _count(store, "SELECT COUNT(*) FROM turn_heads")
        with pytest.raises(IntegrityError):
            pad.drop_turn("alice", "t1")
        assert _count(store, "SELECT COUNT(*) FROM entries WHERE turn_id = 't1'") == entries  # nothing lost
        assert _count(store, "SELECT COUNT(*) FROM turn_heads") == heads
        with pytest.raises(IntegrityError):  # a write into the turn (its own head opens) is still refused
            pad.put(ALICE, "t1", 9, "fetch", "after the refused drop", now=LATER)


def test_the_async_drop_removes_the_turn(store: dict[str, Any]) -> None:
    import asyncio

    async def run() -> dict[str, Any]:
        async with await AsyncScratchpad.open(store["where"], keyring=store["keyring"]) as pad:
            return await pad.drop_turn("alice", "t1")

    removed = asyncio.run(run())
    assert (removed["entries"], removed["turn_heads"]) == (len(store["ids"]), 1)
    with Scratchpad.open(store["where"], keyring=store["keyring"]) as pad:
        assert pad.turn(ALICE, "t1", now=LATER).history(now=LATER) == []
        report = pad.verify(now=LATER)
        assert report["ok"], report["problems"]


def test_two_turns_whose_heads_were_swapped_can_each_be_dropped(store: dict[str, Any]) -> None:
    with _raw(store) as raw:
        for old, new in (("t1", "swap"), ("t2", "t1"), ("swap", "t2")):
            raw.execute("UPDATE turn_heads SET turn_id = ? WHERE owner_user_id = 'alice' AND turn_id = ?", (new, old))
    with Scratchpad.open(store["where"], keyring=store["keyring"]) as pad:
        pad.put(ALICE, "t3", 1, "fetch", "a turn left whole", now=LATER)
        for turn in ("t1", "t2"):
            with pytest.raises(IntegrityError):
                pad.turn(ALICE, turn, now=LATER).history(now=LATER)
        assert pad.drop_turn("alice", "t1")["turn_heads"] == 1  # the other one failing to open too
        assert pad.drop_turn("alice", "t2")["turn_heads"] == 1
        report = pad.verify(now=LATER)
        assert report["ok"], report["problems"]
        assert len(pad.turn(ALICE, "t3", now=LATER).history(now=LATER)) == 1
