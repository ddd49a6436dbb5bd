"""Owner heads: what they say, and the turns they count, verified.

An owner head of format 2 seals the number of turns it counts, a keyed multiset
digest of their ids (the sum, mod 2**256, of one ``CounterSeal.owner_term`` per
turn) and the owner's turn counter: a new turn adds its term and an emptied turn
subtracts its own, so sealing it costs the same at 10 turns as at 10,000. Which
turns it counts is answered by the owner's head rows (their clear turn ids, one
statement, nothing opened): the ids whose terms add up to the digest are the
owner's turns (``resolve``). An owner head of format 1 lists the turns (a sealed
JSON list): the list decides, and the next write that changes it writes format 2.
The shape of the sealed body alone tells the formats apart; no clear value does.

``Known``: an owner head this process verified, with its turns, kept by its
sealed bytes; the next one this process seals shares the set and applies its
change once a stored row shows those bytes (the write committed).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from ...crypto.primitives import Wrapper
from ...errors import IntegrityError
from .tally import MOD

__all__ = [
    "NO_TURNS",
    "PRESENT_SQL",
    "HeadsNotCounted",
    "Known",
    "OwnerBody",
    "digest_body",
    "owner_body",
    "parse_owner",
    "present_ids",
    "resolve",
]

OWNER_FORMAT = 2

# The owner head's sealed fields and, beside them, the clear turn ids of the owner's other
# head rows as one JSON array (one statement: the ids and the owner head they are checked
# against are of one snapshot; one row, whatever the owner's turns). On SQLite an id that is
# not text (a blob put in the file) is a null in the array, never its text.
_PRESENT_SQL = (
    "SELECT key_version, sealed, (SELECT {aggregate} FROM turn_heads WHERE owner_user_id = ?"
    " AND turn_id NOT IN (?, ?)) AS ids FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?"
)
PRESENT_SQL = {
    "sqlite": _PRESENT_SQL.format(aggregate="json_group_array(CASE WHEN typeof(turn_id) = 'text' THEN turn_id END)"),
    "postgresql": _PRESENT_SQL.format(aggregate="json_agg(turn_id)"),
}


def present_ids(found: object) -> set[str]:
    """The turn ids of ``PRESENT_SQL``'s ``ids`` (JSON text, or decoded; None: no row); raises IntegrityError."""
    ids: Any = json.loads(found) if isinstance(found, (str, bytes)) else found
    if ids is None:
        return set()
    try:
        "".join(ids)  # every id is text (in C: a TypeError at the first that is not)
    except TypeError:
        ids = None
    if not isinstance(ids, list):
        raise IntegrityError("a turn head's clear turn id is malformed (tampering)")
    return set(ids)


Term = Callable[[str, str], int]


class HeadsNotCounted(IntegrityError):
    """The owner's turn heads are not the ones its owner head counts (``resolve``): a turn
    removed whole, or heads added; which turn cannot be told from the digest."""


def owner_body(turns: Iterable[str], created: int | None) -> bytes:
    """An owner head's body of format 1: the turns listed and the turn counter (None: from before it)."""
    body: dict[str, Any] = {"t": sorted(turns)}
    if created is not None:
        body["c"] = created
    return json.dumps(body).encode()


def digest_body(count: int, digest: int, created: int) -> bytes:
    """An owner head's body of format 2: turns counted, their digest and the owner's turn counter."""
    return json.dumps({"c": created, "f": OWNER_FORMAT, "n": count, "s": format(digest, "064x")}).encode()


NO_TURNS = digest_body(0, 0, 0)


@dataclass(frozen=True)
class OwnerBody:
    """What an owner head says: format 1 ``listed`` turns, or format 2 ``count`` and ``digest``."""

    created: int | None
    listed: frozenset[str] | None = None
    count: int = 0
    digest: int = 0


def parse_owner(raw: bytes) -> OwnerBody:
    """An owner head's opened body, either format; raises IntegrityError."""
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and "t" in body:
            turns, created = body["t"], body.get("c")
            if isinstance(turns, list) and all(isinstance(turn, str) for turn in turns) and _natural_or_none(created):
                return OwnerBody(created, frozenset(turns), len(set(turns)))
        elif isinstance(body, dict) and body.get("f") == OWNER_FORMAT:
            count, digest, created = body["n"], int(body["s"], 16), body["c"]
            if _natural(count) and _natural(created) and 0 <= digest < MOD and len(body["s"]) == 64:
                return OwnerBody(created, None, count, digest)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    raise IntegrityError("an owner head is malformed")


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _natural_or_none(value: object) -> bool:
    return value is None or _natural(value)


class Known:
    """An owner head this process verified: its clear key version, sealed bytes and the
    owner key they opened under, what it says, and the turns it counts (``turns``).

    ``pending``: the change (added, removed) from the owner head this one was composed
    from, whose ``turns`` it shares; applied at ``settled`` (a stored row showed these
    bytes: the write committed). The one it came from is no longer kept by then."""

    __slots__ = ("body", "digest", "pending", "sealed", "turns", "version", "wrapper")

    def __init__(
        self,
        version: int,
        sealed: bytes,
        wrapper: Wrapper,
        body: OwnerBody,
        turns: set[str],
        digest: int | None,
        pending: tuple[frozenset[str], frozenset[str]] | None = None,
    ) -> None:
        self.version, self.sealed, self.wrapper, self.body = version, sealed, wrapper, body
        self.turns = turns
        self.digest = digest  # the sum of the turns' terms (None: not yet summed, format 1)
        self.pending = pending

    def matches(self, version: object, sealed: bytes, wrapper: Wrapper) -> bool:
        return version == self.version and sealed == self.sealed and wrapper is self.wrapper

    def settled(self) -> Known:
        """This one, its pending change applied to ``turns``."""
        pending = self.pending
        if pending is not None:
            self.turns.update(pending[0])
            self.turns.difference_update(pending[1])
            self.pending = None
        return self

    def base(self) -> tuple[frozenset[str], int] | None:
        """Its turns (a copy) and the sum of their terms, when summed: ``resolve``'s ``base``."""
        digest = self.digest
        return None if digest is None else (frozenset(self.settled().turns), digest)

    def summed(self, term: Term, owner: str) -> int:
        """The digest of the turns counted (summed once for an owner head of format 1)."""
        if self.digest is None:
            self.digest = sum(term(owner, turn) for turn in self.settled().turns) % MOD
        return self.digest


def resolve(
    body: OwnerBody,
    present: set[str],
    asked: Collection[str],
    term: Term,
    owner: str,
    base: tuple[frozenset[str], int] | None = None,
) -> set[str]:
    """The turns an owner head counts, given the owner's head rows' turn ids ``present``.

    Format 1: its list. Format 2: ``present`` when their terms add up to its digest;
    with the ``asked`` turns absent from ``present`` when they make it add up (each
    one's head and rows were removed: its reads and writes say so); without the one
    present head that makes it add up (a head it does not count: ``verify`` names it).
    ``base``: turns and the sum of their terms known here (an owner head verified
    before): the sum of ``present`` from the turns that differ, and from every turn
    when that one does not add up.

    Raises:
        IntegrityError: the heads present do not add up to the digest, so a turn head
            was removed or added; which turn cannot be told.
    """
    if body.listed is not None:
        return set(body.listed)
    if base is not None and len(present) == body.count:
        turns, digest = base
        digest += sum(term(owner, turn) for turn in present - turns) - sum(
            term(owner, turn) for turn in turns - present
        )
        if digest % MOD == body.digest:
            return present
    terms = {turn: term(owner, turn) for turn in present}
    total = sum(terms.values()) % MOD
    if (len(present), total) == (body.count, body.digest):
        return present
    missing = [turn for turn in asked if turn not in present]
    if (
        missing
        and len(present) + len(missing) == body.count
        and (total + sum(term(owner, turn) for turn in missing)) % MOD == body.digest
    ):
        return present | set(missing)
    if len(present) == body.count + 1:
        for turn, value in terms.items():
            if (total - value) % MOD == body.digest:
                return present - {turn}
    raise HeadsNotCounted(
        f"owner {owner!r}'s owner head counts {body.count} turns, and its {len(present)} turn heads are not the"
        " ones it counts: a turn and its head were removed, or a head added (tampering)"
    )
