"""Sealing heads; the owner heads (each owner's turns, ``members``) and usage heads (its quota reservations).

A usage head holds the owner's total reservation R, the sum of its turns'
``r`` (each turn's share of the quota, at least its entries' bytes ``b``),
all sealed under the owner's key; a write never takes R (with the live
records) above the quota, and a put within its turn's reservation takes the
owner's lock shared (``reservations`` has the rest). The owner head and the
usage head count the turns the owner created; each tally holds the count it
last saw (``Tally.o``): heads that count fewer, or disagree, were put back
from an older copy, and a write refuses (``counter_problems`` names them).

The turn heads this process sealed last: a put in one message (``Heads.change_once``),
and a write that finds the stored head to be the one recorded (``OwnerHeads.edited_tally``).

The one-message statement writes only if the stored head is still the one sealed here
(AES-GCM seals each head under a fresh nonce, so no other write seals the same
bytes); a stale record only makes it write nothing, and the put reads the head.
A write in a transaction compares the head it read with the record: the same
bytes are the same head, so its tally is the recorded one, with no decryption
and no parsing. Bounded; a writer takes its record out, so no two threads edit one tally.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...crypto.primitives import Wrapper, head_aad
from ...errors import IntegrityError
from ...keys.keystore import Keystore, LRUCache
from ...storage.base import Backend, Conn, Params, Rows
from . import reading
from .members import NO_TURNS, PRESENT_SQL, Known, OwnerBody, digest_body, parse_owner, present_ids, resolve
from .reading import ONCE_SQL, ONCE_SQLITE_SQL, OWNER_HEAD, USAGE_HEAD
from .tally import MOD, Head, HeadEdit, Tally

__all__ = ["NO_TURNS", "LastSealed", "Once", "Sealed", "counter_problems", "once_sql"]

# Turns whose last sealed head is kept (emptied when full: a lost record costs one put a read).
_TURNS = 1024


@dataclass(slots=True)  # one per put: no instance dict
class Sealed:
    """A turn head as this process sealed it (``tally``: ``body`` opened, when the writer had it)."""

    version: int
    sealed: bytes
    body: bytes
    tally: Tally | None = None

    def matches(self, version: object, sealed: object) -> bool:
        """Whether a stored head (its clear key version and sealed bytes) is this one."""
        return version == self.version and bytes(sealed) == self.sealed  # type: ignore[call-overload]

    def opened(self) -> Tally:
        """The tally the head holds (parsed from ``body`` when not kept)."""
        return self.tally if self.tally is not None else Tally.loads(self.body)


class LastSealed:
    """(owner, turn) -> the ``Sealed`` head this process wrote last."""

    def __init__(self) -> None:
        self._heads: dict[tuple[str, str], Sealed] = {}

    def record(self, owner: str, turn_id: str, head: Sealed) -> None:
        """``head`` is the one this process sealed last for the turn."""
        if len(self._heads) >= _TURNS:
            self._heads.clear()
        self._heads[(owner, turn_id)] = head

    def attach(self, owner: str, turn_id: str, body: bytes, tally: Tally) -> None:
        """Keep ``tally`` with the record of the head just sealed from ``body``, so the next put need not parse it."""
        head = self._heads.get((owner, turn_id))
        if head is not None and head.body is body:
            head.tally = tally

    def has(self, owner: str, turn_id: str) -> bool:
        """Whether a head of the turn is recorded (``take`` may still find none: another thread took it)."""
        return (owner, turn_id) in self._heads

    def peek(self, owner: str, turn_id: str) -> Sealed | None:
        """The record, left in place (a writer reads it before sealing, then ``following`` takes it
        only if it is still this one)."""
        return self._heads.get((owner, turn_id))

    def take(self, owner: str, turn_id: str) -> Sealed | None:
        """The record, removed: the caller edits its tally, and records the next head if it writes one."""
        return self._heads.pop((owner, turn_id), None)

    def following(
        self,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        term: Callable[[str, str, tuple[Any, ...]], int],
        wrapper: Wrapper,
        version: int,
        kept: tuple[bytes | None, Head] | None = None,
        expect: Sealed | None = None,
    ) -> tuple[Sealed, Sealed, int, int] | None:
        """The turn's record taken out, the head that follows it once ``edit`` is applied,
        sealed under ``version``, the reservation left unused and the highest step the
        record counts; None without a record, or when the owner's usage head must
        change. The record stays out. ``kept``: a verified inventory and the head it
        was verified with, edited too when that head is the record. ``expect``: the record
        the caller ``peek``ed and sealed from; None when another took its place."""
        last = self.take(owner, turn_id)
        if last is None or (expect is not None and last is not expect):
            return None
        tally = last.opened()
        recorded = tally.last  # before ``edit`` raises it
        change = HeadEdit(tally, term, kept[1] if kept is not None and kept[0] == last.sealed else None)
        edit(change)
        tally.b = max(tally.b, 0)
        if tally.b > tally.r or change.bytes < 0:
            return None
        body = tally.dumps()
        head = Sealed(version, wrapper.seal(body, head_aad(owner, turn_id, version)), body, tally)
        return last, head, tally.r - tally.b, recorded


@dataclass(slots=True)  # one per put: no instance dict
class Once:
    """A write of one turn in one statement (``Heads.change_once``): SQL, head, reservation left."""

    sql: str
    params: Params
    head: Sealed
    spare: int
    # The turn's verified inventory, edited, with the token it was verified with: kept again once written.
    kept: tuple[tuple[Any, ...], Head] | None = None


@functools.lru_cache(maxsize=16)
def _once_text(dialect: str, condition: str | None, insert: str) -> str:
    """``once_sql``'s statement: the same put after put into a turn (made once)."""
    template = ONCE_SQLITE_SQL if dialect == "sqlite" else ONCE_SQL
    return template.format(condition="" if condition is None else f" AND {condition}", insert=insert)


def once_sql(
    insert: tuple[str, Params],
    owner: str,
    turn_id: str,
    head: Sealed,
    expected: Sealed,
    condition: tuple[str, Params] | None = None,
    dialect: str = "postgresql",
) -> tuple[str, Params]:
    """``insert`` (``INSERT ... SELECT`` of one row, without ``FROM``) and ``head`` written
    when the stored head is ``expected`` and ``condition`` holds; the row count says if it wrote
    (on SQLite two statements, the row count the last one's)."""
    more_params = condition[1] if condition is not None else ()
    return (
        _once_text(dialect, None if condition is None else condition[0], insert[0]),
        (
            head.version,
            head.sealed,
            owner,
            turn_id,
            expected.version,
            expected.sealed,
            head.version,
            owner,
            *more_params,
            *insert[1],
        ),
    )


# Owner heads kept verified (``OwnerHeads.members``): one per owner in use is enough.
_OWNER_HEADS_KEPT = 64


def usage_body(total: int, created: int | None = None) -> bytes:
    """A usage head's body: the total, with the owner's turn counter as a JSON
    array (a bare number without the counter); not an object, so that the
    heads' format-1 conversion, which skips what it cannot read, leaves it."""
    return (str(total) if created is None else json.dumps([total, created])).encode()


def usage_of(body: bytes) -> int:
    """A usage head's total."""
    return usage_counts(body)[0]


def usage_counts(body: bytes) -> tuple[int, int | None]:
    """A usage head's total and turn counter (None: a usage head from before it); raises IntegrityError."""
    try:
        found = json.loads(body)
    except ValueError:
        found = None
    total, created = found, None
    if isinstance(found, list) and len(found) == 2 and _natural(found[1]):
        total, created = found
    if not _natural(total):
        raise IntegrityError("a usage head is malformed")
    return total, created


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class OwnerHeads:
    """Opening and sealing the heads of one store; the owner heads."""

    def __init__(self, db: Backend, keys: Keystore) -> None:
        self._db = db
        self._keys = keys
        self._term = keys.counter_seal.owner_term
        # The turn heads sealed here last (``LastSealed``): every turn head a transaction writes goes
        # through ``write_bodies``; a put in one message records its own. A write whose stored head
        # is the one recorded edits the recorded tally (``edited_tally``) rather than opening the head.
        self.last = LastSealed()
        # owner -> the owner head verified last (``members``, a ``Known``). One per owner: each
        # new turn seals another owner head, which replaces it here (sharing its turns).
        self._owner_heads: LRUCache[str, Known] = LRUCache(_OWNER_HEADS_KEPT)
        # (owner, body) -> the owner head an owner head composed here follows, and the change,
        # until ``write_bodies`` seals it.
        self._composed: dict[tuple[str, bytes], tuple[Known, frozenset[str], frozenset[str], OwnerBody]] = {}
        # owner -> the turns this process found removed whole (``turn_tally``): an owner head of
        # format 2 cannot name them, ``all_heads`` asks for them so that ``verify`` does.
        self._lost: LRUCache[str, frozenset[str]] = LRUCache(_OWNER_HEADS_KEPT)

    def compose(self, owner: str, known: Known, created: int, added: frozenset[str], removed: frozenset[str]) -> bytes:
        """The body of the owner head that follows ``known`` (verified: ``members``) once the turns
        ``added`` join and ``removed`` leave, counting ``created`` turns created (format 2): the
        terms of the turns that change added or subtracted, whatever the owner's turns."""
        turns = known.settled().turns
        added, removed = added - turns, removed & turns
        digest = known.summed(self._term, owner)
        digest += sum(self._term(owner, turn) for turn in added) - sum(self._term(owner, turn) for turn in removed)
        count = len(turns) + len(added) - len(removed)
        parsed = OwnerBody(created, None, count, digest % MOD)
        body = digest_body(count, parsed.digest, created)
        if len(self._composed) >= _OWNER_HEADS_KEPT:
            self._composed.clear()
        self._composed[(owner, body)] = (known, added, removed, parsed)
        return body

    def recounted(self, owner: str) -> None:
        """Forget what this process knew of the owner's turns, once a recount committed."""
        self._owner_heads.pop(owner)
        self._lost.pop(owner)

    def open_body(self, row: dict[str, Any], owner: str, turn_id: str) -> bytes:
        """A head's body, opened; raises IntegrityError when it fails authentication."""
        version, wrapper = self._sealed_under(row, owner, turn_id)
        return wrapper.open(row["sealed"], head_aad(owner, turn_id, version))

    def _sealed_under(self, row: dict[str, Any], owner: str, turn_id: str) -> tuple[int, Wrapper]:
        """The key version a head row names and the owner's key of that version, once its
        clear fields are the turn's and the owner's; raises IntegrityError otherwise."""
        version = row["key_version"]
        if not isinstance(version, int) or isinstance(version, bool) or row["turn_id"] != turn_id:
            raise IntegrityError("a turn head's clear fields are malformed")
        if row["owner_user_id"] != owner:
            raise IntegrityError("a turn head belongs to another owner")
        return version, self._keys.owner_wrapper(owner, version)

    def owner_said(self, row: dict[str, Any], owner: str) -> OwnerBody:
        """What an owner head says (its turn counter, its format's turns), opened or known."""
        known = self._known(row, owner)
        if known is not None:
            return known.body
        version, wrapper = self._sealed_under(row, owner, OWNER_HEAD)
        return parse_owner(wrapper.open(row["sealed"], head_aad(owner, OWNER_HEAD, version)))

    def _known(self, row: dict[str, Any], owner: str) -> Known | None:
        """The owner head ``row`` as this process verified it, if it did; an owner head of
        format 1, opened (its list decides). Bytes that opened under the owner's key version open
        to the same body again while that key is the owner's: a key forgotten (the owner
        crypto-shredded, then written again) is another key of the same version, under which
        the bytes must open anew. The clear fields and the key are checked at each call."""
        version, wrapper = self._sealed_under(row, owner, OWNER_HEAD)
        sealed = bytes(row["sealed"])
        found = self._owner_heads.get(owner)
        if found is not None and found.matches(version, sealed, wrapper):
            return found.settled()
        body = parse_owner(wrapper.open(sealed, head_aad(owner, OWNER_HEAD, version)))
        if body.listed is None:
            return None
        known = Known(version, sealed, wrapper, body, set(body.listed), None)
        self._owner_heads[owner] = known
        return known

    def members(self, conn: Conn | None, row: dict[str, Any], owner: str, asked: frozenset[str]) -> Known:
        """The owner head ``row`` verified: the turns it counts (``resolve``; the owner's head
        rows read, ``scan``, unless this process verified or sealed it).

        Raises:
            IntegrityError: it fails authentication, or the owner's heads are not the ones it counts.
        """
        known = self._known(row, owner)
        return known if known is not None else self.scan(conn, owner, asked)[0]

    def scan(self, conn: Conn | None, owner: str, asked: frozenset[str]) -> tuple[Known, set[str]]:
        """The owner head verified against the owner's head rows as one statement finds them,
        and the turns with a head in it; ``conn``: the caller's transaction (None: a read).

        Raises:
            IntegrityError: the owner head is missing or fails authentication, or the owner's
                heads are not the ones it counts (``resolve``).
        """
        sql, params = PRESENT_SQL[self._db.dialect], (owner, OWNER_HEAD, USAGE_HEAD, owner, OWNER_HEAD)
        rows = conn.query(sql, params) if conn is not None else self._db.query(sql, params, owner=owner)
        if not rows:
            raise owner_removed(owner)
        head = {"owner_user_id": owner, "turn_id": OWNER_HEAD, **rows[0]}
        present = present_ids(head.pop("ids"))
        version, wrapper = self._sealed_under(head, owner, OWNER_HEAD)
        sealed = bytes(head["sealed"])
        body = parse_owner(wrapper.open(sealed, head_aad(owner, OWNER_HEAD, version)))
        before = self._owner_heads.get(owner)  # the owner head verified here before, if any: what differs is summed
        base = None if before is None or before.wrapper is not wrapper else before.base()
        turns = resolve(body, present, asked, self._term, owner, base)
        known = Known(version, sealed, wrapper, body, turns, None if body.listed is not None else body.digest)
        self._owner_heads[owner] = known
        return known, present

    def owner_turns(self, row: dict[str, Any], owner: str) -> tuple[set[str], int | None]:
        """The turns an owner head counts (verified: ``members``), and its turn counter (None: from before it)."""
        known = self.members(None, row, owner, frozenset())
        return set(known.settled().turns), known.body.created

    def tally(self, row: dict[str, Any], owner: str, turn_id: str) -> Tally:
        """A turn head's tally; raises IntegrityError when it fails authentication."""
        return Tally.loads(self.open_body(row, owner, turn_id))

    def turn_tally(
        self, by_turn: dict[str, dict[str, Any]], owner: str, turn_id: str, conn: Conn | None = None
    ) -> Tally:
        """The turn's tally, or an empty one for a turn the owner never wrote (``conn``: the
        caller's transaction; None: a read). An owner head that counts the turn, known here, is
        checked again against the heads as they are (another reader's snapshot may be older).

        Raises:
            IntegrityError: a head fails authentication, the owner head counts the turn but it
                has no head, or the owner's heads are not the ones it counts.
        """
        if turn_id in by_turn:
            return self.tally(by_turn[turn_id], owner, turn_id)
        if OWNER_HEAD in by_turn:
            known = self._known(by_turn[OWNER_HEAD], owner)
            if known is None or turn_id in known.turns:
                known, present = self.scan(conn, owner, frozenset((turn_id,)))
                if turn_id in known.turns and turn_id not in present:
                    self._lost[owner] = (self._lost.get(owner) or frozenset()) | {turn_id}
                    raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
        return Tally()

    def edited_tally(
        self, by_turn: dict[str, dict[str, Any]], owner: str, turn_id: str, conn: Conn | None = None
    ) -> Tally:
        """``turn_tally`` for a write that edits it: the tally of the head this process sealed
        last, when the stored head is that one (its sealed bytes and clear key version: AES-GCM
        seals each head under a fresh nonce, so no other writer stores those bytes), else
        opened. The record is taken out either way: a write that fails leaves none, and the
        next one opens the head.

        Raises:
            IntegrityError: as ``turn_tally``.
        """
        last = self.last.take(owner, turn_id)
        row = by_turn.get(turn_id)
        if last is not None and row is not None and last.matches(row["key_version"], row["sealed"]):
            return last.opened()
        return self.turn_tally(by_turn, owner, turn_id, conn)

    @staticmethod
    def heads_of(conn: Conn, owner: str, turn_id: str, rows: Rows | None) -> dict[str, dict[str, Any]]:
        """The turn's head rows by turn id: ``rows``, or read by ``select_sql``'s statement (prefetched)."""
        if rows is None:
            rows = conn.query(*reading.select_sql(owner, turn_id))
        return {row["turn_id"]: row for row in rows}

    def write_body(self, conn: Conn, owner: str, turn_id: str, body: bytes, version: int | None = None) -> None:
        """``write_bodies`` of one head."""
        self.write_bodies(conn, owner, [(turn_id, body)], version)

    def write_bodies(
        self,
        conn: Conn,
        owner: str,
        bodies: list[tuple[str, bytes]],
        version: int | None = None,
        insert: tuple[str, Params] | None = None,
    ) -> list[bytes]:
        """Seal and upsert heads of the owner in one statement under ``version`` (the newest by
        default); the sealed heads. ``insert`` (the caller's rows) goes first: on PostgreSQL in
        the same statement (a data-modifying ``WITH``), on SQLite before it.

        Raises:
            IntegrityError: the owner has no key.
        """
        if version is None:
            found = conn.query(reading.NEWEST_SQL, (owner,))[0]["v"]
            version = None if found is None else int(found)
        if version is None:
            raise IntegrityError(f"owner {owner!r} has no key to seal its turn head with")
        wrapper = self._keys.owner_wrapper(owner, version)
        params: list[Any] = []
        written: list[bytes] = []
        for turn_id, body in bodies:
            sealed = wrapper.seal(body, head_aad(owner, turn_id, version))
            params += [owner, turn_id, version, sealed]
            written.append(sealed)
            composed = self._composed.pop((owner, body), None) if turn_id == OWNER_HEAD else None
            if composed is not None:  # these bytes open to that body under this key: known verified
                known, added, removed, parsed = composed
                pending = (added, removed)
                self._owner_heads[owner] = Known(version, sealed, wrapper, parsed, known.turns, parsed.digest, pending)
            if turn_id not in (OWNER_HEAD, USAGE_HEAD):
                self.last.record(owner, turn_id, Sealed(version, sealed, body))
        upsert = reading.UPSERT_SQL.format(values=", ".join(["(?, ?, ?, ?)"] * len(bodies)))
        if insert is None:
            conn.defer(upsert, tuple(params))
        elif self._db.dialect == "postgresql":
            conn.defer(f"WITH written AS ({insert[0]}) {upsert}", (*insert[1], *params))
        else:
            conn.defer(*insert)
            conn.defer(upsert, tuple(params))
        self._keys.count_wraps_later(owner, version, len(bodies))
        return written

    def delete_head(self, conn: Conn, owner: str, turn_id: str) -> None:
        """Delete a turn's head (a turn left empty), in the caller's transaction."""
        conn.defer(reading.DELETE_HEAD_SQL, (owner, turn_id))
        self.last.take(owner, turn_id)

    def drop(
        self, conn: Conn, owner: str, dropped: dict[str, int], by_turn: dict[str, dict[str, Any]], version: int | None
    ) -> None:
        """Emptied turns (heads deleted) dropped from the owner head, their reservations
        (``dropped``) from the usage head: no clear trace of their ids stays.

        Raises:
            IntegrityError: the owner's heads were removed, or one fails authentication.
        """
        if OWNER_HEAD not in by_turn:
            raise owner_removed(owner)
        gone = frozenset(dropped)
        known = self.members(conn, by_turn[OWNER_HEAD], owner, gone)
        usage = by_turn.get(USAGE_HEAD)
        total, counted = (0, None) if usage is None else usage_counts(self.open_body(usage, owner, USAGE_HEAD))
        # An owner head from before the counter counts as many turns as it lists (or as the usage head counts).
        created = next(found for found in (known.body.created, counted, known.body.count) if found is not None)
        bodies = [(OWNER_HEAD, self.compose(owner, known, created, frozenset(), gone))]
        if usage is not None:
            bodies.append((USAGE_HEAD, usage_body(max(total - sum(dropped.values()), 0), counted)))
        self.write_bodies(conn, owner, bodies, version)

    def first_owner_head(self, conn: Conn, owner: str, version: int, wrapper: Wrapper) -> None:
        """The empty owner head and usage head of an owner's first key (``Keystore.on_first_key``),
        so that an owner whose turns and heads were removed is told from one that never wrote."""
        params: list[Any] = []
        for turn_id, body in ((OWNER_HEAD, NO_TURNS), (USAGE_HEAD, usage_body(0, 0))):
            params += [owner, turn_id, version, wrapper.seal(body, head_aad(owner, turn_id, version))]
        conn.defer(reading.FIRST_OWNER_HEAD_SQL, tuple(params))
        self._keys.count_wraps_later(owner, version, 2)

    def all_heads(self) -> dict[str, dict[str, Tally | set[str] | int | IntegrityError]]:
        """Every head of the store, opened (``verify``): ``{owner: {turn: Tally}}``, the owner
        head as the set of turns it counts (``resolve``, against the owner's head rows read
        here, with the turns this process found removed), the usage head as its total, a
        head that fails to open (or an owner head its heads do not add up to) as its error."""
        found: dict[str, dict[str, Tally | set[str] | int | IntegrityError]] = {}
        owner_rows: dict[str, dict[str, Any]] = {}
        malformed: set[str] = set()
        for row in self._db.query(reading.ALL_HEADS_SQL, admin=True):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            opened: Tally | set[str] | int | IntegrityError
            if not isinstance(turn_id, str):  # SQLite keeps a blob in a text column: named, never a turn's id
                turn_id = repr(turn_id)
                malformed.add(turn_id)
                found.setdefault(owner, {})[turn_id] = IntegrityError("a turn head's clear turn id is not text")
                continue
            try:
                if turn_id == OWNER_HEAD:
                    owner_rows[owner] = row
                    continue
                if turn_id == USAGE_HEAD:
                    opened = usage_of(self.open_body(row, owner, turn_id))
                else:
                    opened = self.tally(row, owner, turn_id)
            except IntegrityError as exc:
                opened = exc
            found.setdefault(owner, {})[turn_id] = opened
        for owner, row in owner_rows.items():
            by_turn = found.setdefault(owner, {})
            present = set(by_turn) - {USAGE_HEAD} - malformed
            asked = self._lost.get(owner) or frozenset()
            try:
                by_turn[OWNER_HEAD] = resolve(self.owner_said(row, owner), present, asked, self._term, owner)
            except IntegrityError as exc:
                by_turn[OWNER_HEAD] = exc
        return found

    def owners_without_heads(self) -> list[str]:
        """Owners with a key but no owner head (``verify``): their heads were removed."""
        rows = self._db.query(reading.OWNERS_WITHOUT_HEADS_SQL, (OWNER_HEAD,), admin=True)
        return [str(row["owner_user_id"]) for row in rows]


def counter_problems(owners: OwnerHeads, db: Backend) -> list[tuple[str, str | None, str]]:
    """(owner, turn or None, what) for each owner whose owner head and usage head count
    different turns, or whose usage head counts fewer turns than a turn head saw: put
    back from an older copy (``verify``). Heads that fail to open are ``OwnerHeads.all_heads``'."""
    created: dict[str, int | None] = {}
    counted: dict[str, int | None] = {}
    seen: dict[str, tuple[int, str]] = {}
    for row in db.query(reading.ALL_HEADS_SQL, admin=True):
        owner, turn_id = row["owner_user_id"], row["turn_id"]
        if not isinstance(turn_id, str):  # named by ``all_heads``
            continue
        with contextlib.suppress(IntegrityError):
            if turn_id == OWNER_HEAD:
                created[owner] = owners.owner_said(row, owner).created
            elif turn_id == USAGE_HEAD:
                counted[owner] = usage_counts(owners.open_body(row, owner, turn_id))[1]
            else:
                seen[owner] = max(seen.get(owner, (0, "")), (owners.tally(row, owner, turn_id).o, turn_id))
    problems: list[tuple[str, str | None, str]] = []
    for owner in sorted(set(created) | set(counted)):
        made, count = created.get(owner), counted.get(owner)
        if made is not None and count is not None and made != count:
            problems.append((owner, None, f"its owner head counts {made} turns created, its usage head {count}"))
        top, turn_id = seen.get(owner, (0, ""))
        if count is not None and top > count:
            problems.append((owner, turn_id, f"the turn saw {top} turns created, the owner's usage head {count}"))
        elif count is None and top > (made or 0):  # no counter in the usage head: the owner head's decides
            problems.append((owner, turn_id, f"the turn saw {top} turns created, the owner's owner head {made or 0}"))
    return problems


def check_counted(tally: Tally, counted: int | None, owner: str, turn_id: str) -> None:
    """Refuse (IntegrityError) a usage head that counts fewer turns than the turn's
    head saw (``Tally.o``): it was put back from an older copy, with the owner head."""
    if counted is not None and tally.o > counted:
        raise rolled_back(owner, f"turn {turn_id!r} was written after its usage head counted the owner's turns")


def rolled_back(owner: str, why: str) -> IntegrityError:
    return IntegrityError(
        f"owner {owner!r}'s heads were put back from an older copy ({why}): a turn created since may have been"
        " removed (tampering)"
    )


def owner_removed(owner: str) -> IntegrityError:
    return IntegrityError(
        f"owner {owner!r} has a key but no owner head: its turns and their heads were removed (tampering)"
    )
