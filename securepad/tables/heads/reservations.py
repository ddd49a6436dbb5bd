"""The owner-wide part of a change under the owner's exclusive lock: the turn's
reservation (``quota``), the owner head and usage head; reclaiming reservations."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ...errors import IntegrityError
from ...storage.base import Conn
from . import reading
from .owner import OwnerHeads, check_counted, owner_removed, rolled_back, usage_body, usage_counts
from .quota import Room, record_room, reserve
from .reading import OWNER_HEAD, USAGE_HEAD, HeadCache
from .tally import Tally

__all__ = ["Reservations"]


class Reservations:
    """The owner-wide part of a change: reservations, the owner head and the usage head."""

    def __init__(self, owners: OwnerHeads, cache: HeadCache) -> None:
        self._owners = owners
        self._cache = cache

    def bodies(
        self,
        conn: Conn,
        owner: str,
        turn_id: str,
        by_turn: dict[str, dict[str, Any]],
        tally: Tally,
        added: int,
        room: Room | None,
        version: int | None,
    ) -> list[tuple[str, bytes]]:
        """What the change seals: the turn head with its reservation for the ``added`` bytes,
        the owner head when the turn is new, the usage head when the owner's total moved.

        Raises:
            IntegrityError: the owner's heads were removed, or one fails authentication.
            QuotaExceededError: ``room`` has none for what the write adds.
        """
        owners = self._owners
        if OWNER_HEAD not in by_turn:
            # Every owner with a key has an owner head (``first_owner_head``): none means they were removed.
            raise owner_removed(owner)
        usage = by_turn.get(USAGE_HEAD)
        total, counted = (None, None) if usage is None else usage_counts(owners.open_body(usage, owner, USAGE_HEAD))
        if counted is None and tally.o:
            # A usage head without the counter, for a turn that saw it: the owner head's counter decides.
            check_counted(tally, owners.owner_said(by_turn[OWNER_HEAD], owner).created or 0, owner, turn_id)
        else:
            check_counted(tally, counted, owner, turn_id)

        def reclaim(total: int) -> int:
            return self.reclaim(conn, owner, total, turn_id, version)

        reserved = reserve(tally, added, total, room, reclaim)
        if room is not None and room.records_adding:
            reserved = record_room(tally, reserved, room, reclaim)
        new_turn = turn_id not in by_turn
        bodies = []
        if new_turn:  # the owner's turn counter grows, in its owner head and usage head
            known = owners.members(conn, by_turn[OWNER_HEAD], owner, frozenset((turn_id,)))
            created = known.body.created
            if None not in (created, counted) and created != counted:
                raise rolled_back(owner, "its owner head and its usage head count different turns")
            counted = max(created if created is not None else known.body.count, counted or 0) + 1
            bodies = [(OWNER_HEAD, owners.compose(owner, known, counted, frozenset((turn_id,)), frozenset()))]
        if counted is not None:
            tally.o = max(tally.o, counted)
        bodies.insert(0, (turn_id, tally.dumps()))
        if reserved is not None and (reserved != total or new_turn):  # none: unknown, the quota sums
            bodies.append((USAGE_HEAD, usage_body(reserved, counted)))
        return bodies

    def _others(self, conn: Conn, owner: str, turn_id: str) -> Iterator[tuple[str, Tally]]:
        """The owner's other turns' tallies (a head that fails to open is left to its reads and ``verify``)."""
        for row in conn.query(reading.OTHER_TURNS_SQL, (owner, OWNER_HEAD, USAGE_HEAD, turn_id)):
            try:
                tally = self._owners.tally(row, owner, row["turn_id"])
            except IntegrityError:
                continue
            yield row["turn_id"], tally

    def reclaim(self, conn: Conn, owner: str, total: int, turn_id: str, version: int | None = None) -> int:
        """Give back the unused reservation of the owner's other turns (``r = b``), under the
        owner's exclusive lock; the owner's ``total`` less what was given back."""
        bodies: list[tuple[str, bytes]] = []
        for other, tally in self._others(conn, owner, turn_id):
            if tally.r > tally.b:
                total -= tally.r - tally.b
                tally.r = tally.b
                bodies.append((other, tally.dumps()))
                self._cache.drop(owner, other)
        if bodies:
            self._owners.write_bodies(conn, owner, bodies, version)
        return max(total, 0)

    def of_dropped(self, conn: Conn, owner: str, turn_id: str, by_turn: dict[str, dict[str, Any]]) -> int:
        """The reservation of a turn being dropped: its head's, or when that fails to open,
        the usage head's total less the other turns' (so that each can be dropped in turn).

        Raises:
            IntegrityError: the usage head fails authentication.
        """
        if turn_id in by_turn:
            with contextlib.suppress(IntegrityError):
                return self._owners.tally(by_turn[turn_id], owner, turn_id).r
        if USAGE_HEAD not in by_turn:
            return 0
        total = usage_counts(self._owners.open_body(by_turn[USAGE_HEAD], owner, USAGE_HEAD))[0]
        return total - sum(tally.r for _, tally in self._others(conn, owner, turn_id))
