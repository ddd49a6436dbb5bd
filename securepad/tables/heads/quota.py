"""The quota's arithmetic of turn reservations (``owner``): what a write leaves as the
turn's reservation and the owner's total, granted, reclaimed near the limit, or refused.
Pure: no rows, no keys; giving back other turns' reservations is passed in as ``reclaim``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import QuotaExceededError
from .tally import Tally

__all__ = ["CHUNK", "LARGEST_CHUNK", "Room", "grant", "record_room", "refused", "reserve"]

# What a turn's first grant adds beyond what the write needs (a few dozen puts of a 4 KiB
# observation before the turn's next grant). A later grant adds as much as the turn holds,
# up to ``LARGEST_CHUNK``: a turn written fast takes the owner's exclusive lock a few times,
# not once every few dozen puts. Never more than an eighth of the room left (``grant``).
CHUNK = 256 * 1024
LARGEST_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Room:
    """What a write needs to check the quota: the owner's quota, its live records' cost,
    the exact sum over its live entries (the last word near the limit), the write's
    name for the refusal, and the cost of a record it adds."""

    quota: int
    records: int
    live: Callable[[], int]
    what: str
    records_adding: int = 0


def grant(quota: int, records: int, total: int, need: int, held: int = 0) -> int:
    """What a turn short of ``need`` bytes is granted: the need and a chunk, ``CHUNK`` or
    what the turn ``held`` reserved up to ``LARGEST_CHUNK`` (at most an eighth of the room left)."""
    chunk = max(CHUNK, min(held, LARGEST_CHUNK))
    return need + max(0, min(chunk, (quota - records - total - need) // 8))


def refused(room: Room, adding: int) -> QuotaExceededError:
    """The refusal of ``adding`` bytes: the new bytes and the quota only (the owner's
    total counts entries outside the caller's scope)."""
    return QuotaExceededError(
        f"owner quota exceeded: the {room.what} needs {adding} bytes on disk and owner_quota_bytes"
        f" {room.quota} has no room for it; delete entries or let them expire"
    )


def reserve(
    tally: Tally, added: int, total: int | None, room: Room | None, reclaim: Callable[[int], int]
) -> int | None:
    """Set ``tally.r`` after the turn's bytes changed by ``added``; the owner's new total
    (``total``: the usage head's, None unknown). Bytes past the reservation are
    granted or refused; ``reclaim(total)``: the total after other turns gave back.

    Raises:
        QuotaExceededError: no room for the bytes added (``room``).
    """
    if total is None:  # no usage head: no reservations; the live entries decide
        if added > 0 and room is not None and room.records + room.live() > room.quota:
            raise refused(room, added)
        tally.r = tally.b
        return None
    if added <= 0:
        given_back = min(-added, tally.r - tally.b)  # removed bytes leave the reservation too
        tally.r -= given_back
        return max(total - given_back, 0)
    if tally.b <= tally.r:
        return total
    need = tally.b - tally.r
    if room is None:  # the heads' build: what the store holds, no quota to check
        tally.r = tally.b
        return total + need
    if room.records + total + need > room.quota:
        # Other turns may hold reservations their entries do not use; so may this one.
        total = reclaim(total) - (tally.r - (tally.b - added))
        tally.r = tally.b - added
        need = added
        if room.records + total + need > room.quota:
            if room.records + room.live() > room.quota:
                raise refused(room, added)
            tally.r = tally.b  # fits the live entries only (expired ones await gc): no more than that
            return total + need
    granted = grant(room.quota, room.records, total, need, tally.r)
    tally.r += granted
    return total + granted


def record_room(tally: Tally, total: int | None, room: Room, reclaim: Callable[[int], int]) -> int | None:
    """Refuse a record (``room.records_adding``) that does not fit beside the live records and
    ``total``, after the unused reservations were given back; the owner's total after that.

    Raises:
        QuotaExceededError: no room, even counting the live entries only.
    """
    adding = room.records_adding
    if total is not None and room.records + total + adding > room.quota:
        total = reclaim(total) - (tally.r - tally.b)
        tally.r = tally.b
    if (total is None or room.records + total + adding > room.quota) and (
        room.records + room.live() + adding > room.quota
    ):
        raise refused(room, adding)
    return total
