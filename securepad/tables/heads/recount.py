"""Counting an owner's turns anew: the operator's way out of an owner head that the
owner's heads no longer add up to (a turn removed whole, whose id a digest cannot name).

The owner's turns become the turns whose heads are present and open under the owner's
key: the owner head is sealed over their count and digest, the usage head over the sum
of their reservations, both with a turn counter no lower than any of them saw (so the
counters' checks of heads put back from an older copy still hold). A head row that
does not open under the owner's key (another head's bytes under a forged id, an id that
is not text, a garbled head) is no head of the owner's: it is not counted, and it is
deleted with the recount, or the owner's heads would not add up again (two such rows)
and ``drop_turn`` of its id, which needs them to add up, could not remove it. Its
turn's rows, if any, stay: with no head and not counted, their reads are refused and
``verify`` names them until ``drop_turn`` removes them. Only the operator's call runs
this (``Scratchpad.recount_turns``); no write or read does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import IntegrityError
from ...storage.base import Conn
from . import reading
from .members import Term, digest_body, parse_owner
from .owner import OwnerHeads, owner_removed, usage_body, usage_counts
from .reading import OWNER_HEAD, USAGE_HEAD
from .tally import MOD, Tally

__all__ = ["Recount", "recount"]


@dataclass
class Recount:
    """What a recount found and did: the turns counted before and after, the turn counter
    sealed, the reservation sealed before and after, and the head rows deleted as not the owner's."""

    before: int
    after: int
    created: int
    reserved_before: int
    reserved_after: int
    deleted: list[Any] = field(default_factory=list)  # as stored: text, or what SQLite kept instead
    resealed: bool = False

    def report(self) -> dict[str, Any]:
        return {
            "turns_before": self.before,
            "turns_after": self.after,
            "turns_created": self.created,
            "reserved_bytes_before": self.reserved_before,
            "reserved_bytes_after": self.reserved_after,
            "heads_deleted": [turn if isinstance(turn, str) else repr(turn) for turn in self.deleted],
            "resealed": self.resealed,
        }


def recount(owners: OwnerHeads, conn: Conn, owner: str, term: Term) -> Recount:
    """Seal the owner head and usage head anew over the owner's heads present in ``conn``
    (the caller's transaction, under the owner's exclusive lock), and delete the head rows
    that do not open under the owner's key; nothing is written when the heads already add
    up and nothing is to be deleted.

    Raises:
        IntegrityError: the owner head is missing, or it or the usage head fails authentication.
    """
    found: dict[str, Tally] = {}
    deleted: list[Any] = []
    special: dict[str, dict[str, Any]] = {}
    for row in conn.query(reading.OWNER_HEADS_SQL, (owner,)):
        turn_id = row["turn_id"]
        if turn_id in (OWNER_HEAD, USAGE_HEAD):
            special[turn_id] = row
            continue
        try:
            if not isinstance(turn_id, str):
                raise IntegrityError("a turn head's clear turn id is not text")
            found[turn_id] = owners.tally(row, owner, turn_id)
        except IntegrityError:
            deleted.append(turn_id)
    if OWNER_HEAD not in special:
        raise owner_removed(owner)
    said = parse_owner(owners.open_body(special[OWNER_HEAD], owner, OWNER_HEAD))
    usage = special.get(USAGE_HEAD)
    reserved, counted = (0, None) if usage is None else usage_counts(owners.open_body(usage, owner, USAGE_HEAD))
    seen = (said.created or 0, counted or 0, len(found), *(tally.o for tally in found.values()))
    done = Recount(said.count, len(found), max(seen), reserved, sum(tally.r for tally in found.values()), deleted)
    digest = sum(term(owner, turn) for turn in found) % MOD
    owner_same = said.listed is None and (said.count, said.digest, said.created) == (done.after, digest, done.created)
    usage_same = usage is not None and (reserved, counted) == (done.reserved_after, done.created)
    if owner_same and usage_same and not deleted:
        return done  # the heads add up and the counters agree: nothing to seal
    for turn_id in deleted:
        conn.defer(reading.DELETE_HEAD_SQL, (owner, turn_id))
    bodies = [
        (OWNER_HEAD, digest_body(done.after, digest, done.created)),
        (USAGE_HEAD, usage_body(done.reserved_after, done.created)),
    ]
    owners.write_bodies(conn, owner, bodies)
    done.resealed = True
    return done
