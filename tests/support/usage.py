"""Each owner's usage total as its usage head holds it, and what it must equal."""

from __future__ import annotations

from typing import Any

from securepad import Scratchpad
from securepad.store import parts
from securepad.tables.entries.entries import every_row
from securepad.tables.heads.heads import USAGE_HEAD, Tally


def totals(pad: Scratchpad) -> dict[str, Any]:
    """Each owner's usage total as its usage head holds it (opened: authenticated)."""
    heads = parts(pad).heads.all_heads()
    return {owner: by_turn.get(USAGE_HEAD) for owner, by_turn in heads.items()}


def turns(pad: Scratchpad, field: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for owner, by_turn in parts(pad).heads.all_heads().items():
        for head in by_turn.values():
            if isinstance(head, Tally):
                found[owner] = found.get(owner, 0) + int(getattr(head, field))
    return found


def reserved(pad: Scratchpad) -> dict[str, int]:
    """The sum of each owner's turns' reservations (what its usage head must hold)."""
    return turns(pad, "r")


def exact(pad: Scratchpad) -> None:
    """The usage heads hold the turns' reservations, which cover the turns'
    bytes, which are the entries' stored bytes."""
    owners = {owner: total for owner, total in totals(pad).items() if total is not None}
    assert owners == {owner: reserved(pad).get(owner, 0) for owner in owners}
    assert {o: b for o, b in turns(pad, "b").items() if b} == stored(pad)
    assert all(owners[owner] >= used for owner, used in stored(pad).items())


def stored(pad: Scratchpad) -> dict[str, int]:
    """The sum of the entries' stored_bytes by owner (what the total must equal)."""
    found: dict[str, int] = {}
    for row in every_row(parts(pad).db):
        found[row["owner_user_id"]] = found.get(row["owner_user_id"], 0) + int(row["stored_bytes"])
    return found
