"""The load-independent costs of a put into a given turn, of a listing, and the WAL's frames
(``securepad.bench.costs`` counts them)."""

from __future__ import annotations

from typing import Any

from securepad import Principal, Scratchpad
from securepad.bench.costs import frames_in, measure, put_costs
from securepad.store import sqlite_of

__all__ = ["listing_costs", "put_costs", "turn_put_costs", "wal_frames"]


def wal_frames(pad: Scratchpad) -> int:
    """Frames now in the store's write-ahead log (0 after a truncating checkpoint)."""
    return frames_in(sqlite_of(pad).conn)


def turn_put_costs(pad: Scratchpad, principal: Principal, turn_id: str, step: int) -> dict[str, int]:
    """The costs of one put of 4 KiB at ``step`` into ``turn_id``, keys as ``put_costs``'."""
    return measure(pad, lambda: pad.put(principal, turn_id, step, "tool", "x" * 4096, now=1_000_000.0))


def listing_costs(pad: Scratchpad, principal: Principal, turn_id: str) -> dict[str, int]:
    """The costs of one ``list_for_turn``, with ``entries`` the number of entries listed."""
    listed: list[dict[str, Any]] = []
    counts = measure(pad, lambda: listed.extend(pad.list_for_turn(principal, turn_id)))
    counts["entries"] = len(listed)
    return counts
