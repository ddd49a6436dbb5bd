"""The quota's arithmetic of turn reservations: what a write that
adds or removes a turn's bytes leaves as the turn's reservation and the
owner's total, granted, reclaimed near the limit, or refused.

The design, and why reservations are sealed in the heads rather than counted
by the server, is in ``head_owner``'s docstring and SECURITY.md ("Usage
heads"). ``heads.Heads.change`` calls ``reserve`` (a write of entries) and
``record_room`` (a checkpoint or mark), inside the write transaction under
the owner's exclusive lock; giving back other turns' unused reservations
(``Heads.reclaim``, which reads and rewrites their heads) is passed in as
``reclaim``. Everything here is pure: no rows, no keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import QuotaExceededError
from .tally import Tally

__all__ = ["CHUNK", "Room", "grant", "record_room", "refused", "reserve"]

# The most a grant adds beyond what the write needs: 256 KiB, about 55 puts of
# a 4 KiB observation (4.6 KiB on disk each) before the turn's next grant, so
# that ~2% of a steady writer's puts take the owner's exclusive lock; never
# more than an eighth of the room the quota still has (``grant``), so that
# near the limit turns do not strand the quota in reservations.
CHUNK = 256 * 1024


@dataclass(frozen=True)
class Room:
    """What a write that adds entries or a record needs to check the quota
    (``Heads.change``): the owner's quota, its live records' cost (before
    this write), the exact sum over its live entries (a query, the last word
    near the limit: it counts the rows the write inserted), the write's name
    for the refusal's message, and the cost of a record the write adds."""

    quota: int
    records: int
    live: Callable[[], int]
    what: str
    records_adding: int = 0


def grant(quota: int, records: int, total: int, need: int) -> int:
    """What a turn short of ``need`` bytes of reservation is granted, when the
    owner's reservations ``total`` and live ``records`` leave room for it: the
    need and a chunk (``CHUNK``, or an eighth of the room left, if less)."""
    return need + max(0, min(CHUNK, (quota - records - total - need) // 8))


def refused(room: Room, adding: int) -> QuotaExceededError:
    """The refusal of ``adding`` bytes. The message gives the new bytes and the
    quota only: the owner's total counts entries outside the caller's scope,
    which it must not learn of."""
    return QuotaExceededError(
        f"owner quota exceeded: the {room.what} needs {adding} bytes on disk and owner_quota_bytes"
        f" {room.quota} has no room for it; delete entries or let them expire"
    )


def reserve(
    tally: Tally, added: int, total: int | None, room: Room | None, reclaim: Callable[[int], int]
) -> int | None:
    """Set the turn's reservation ``tally.r`` after its bytes changed by
    ``added`` (``tally.b`` has them), under the owner's exclusive lock; the
    owner's new total reservation (``total`` the usage head's, None:
    unknown). A removal gives back what it took; bytes past the
    reservation are granted (``grant``) or refused. ``reclaim(total)``: the
    owner's total after the other turns gave back their unused reservations.

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
    granted = grant(room.quota, room.records, total, need)
    tally.r += granted
    return total + granted


def record_room(tally: Tally, total: int | None, room: Room, reclaim: Callable[[int], int]) -> int | None:
    """Refuse a record (``room.records_adding`` bytes: checked beside the live
    records and the reservations ``total``) that does not fit, after the
    owner's unused reservations, this turn's included, were given back;
    the owner's total reservation after that.

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
