"""Sealing heads; the owner heads (each owner's turns) and usage heads (its quota reservations).

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
from .reading import ONCE_SQL, ONCE_SQLITE_SQL, OWNER_HEAD, USAGE_HEAD
from .tally import Head, HeadEdit, Tally

__all__ = ["LastSealed", "Once", "Sealed", "once_sql"]

# Turns whose last sealed head is kept (emptied when full: a lost record costs one put a read).
_TURNS = 1024


@dataclass
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
    ) -> tuple[Sealed, Sealed, int, int] | None:
        """The turn's record taken out, the head that follows it once ``edit`` is applied,
        sealed under ``version``, the reservation left unused and the highest step the
        record counts; None without a record, or when the owner's usage head must
        change. The record stays out. ``kept``: a verified inventory and the head it
        was verified with, edited too when that head is the record."""
        last = self.take(owner, turn_id)
        if last is None:
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


@dataclass
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


# Owner heads kept opened (``OwnerHeads.owner_turns``): one per owner in use is enough.
_OWNER_HEADS_KEPT = 64


def owner_body(turns: set[str], created: int | None) -> bytes:
    """An owner head's body: the owner's turns and its turn counter (None: from before the counter)."""
    body: dict[str, Any] = {"t": sorted(turns)}
    if created is not None:
        body["c"] = created
    return json.dumps(body).encode()


NO_TURNS = owner_body(set(), 0)


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
        # The turn heads sealed here last (``LastSealed``): every turn head a transaction writes goes
        # through ``write_bodies``; a put in one message records its own. A write whose stored head
        # is the one recorded edits the recorded tally (``edited_tally``) rather than opening the head.
        self.last = LastSealed()
        # owner -> the owner head opened last (``owner_turns``): its key version and sealed
        # bytes, the owner key they opened under, and what it lists. One per owner: an owner
        # head lists every turn, and each new turn seals another, which replaces it here.
        self._owner_heads: LRUCache[str, tuple[int, bytes, Wrapper, frozenset[str], int | None]] = LRUCache(
            _OWNER_HEADS_KEPT
        )
        # (owner, body) -> what an owner head composed here lists, until ``write_bodies`` seals it.
        self._composed: dict[tuple[str, bytes], tuple[frozenset[str], int | None]] = {}

    def compose(self, owner: str, turns: frozenset[str], created: int | None) -> bytes:
        """``owner_body`` of an owner head that ``write_bodies`` is to seal, remembered with what it lists."""
        body = owner_body(set(turns), created)
        if len(self._composed) >= _OWNER_HEADS_KEPT:
            self._composed.clear()
        self._composed[(owner, body)] = (turns, created)
        return body

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

    def owner_turns(self, row: dict[str, Any], owner: str) -> tuple[set[str], int | None]:
        """The turns an owner head lists, and its turn counter (None: from before it)."""
        turns, created = self._owner_listing(row, owner)
        return set(turns), created

    def _owner_listing(self, row: dict[str, Any], owner: str) -> tuple[frozenset[str], int | None]:
        """``owner_turns``, each owner's head opened last kept with its sealed bytes: an
        owner head lists every turn of its owner, and each read of an absent turn and
        each write of a new one opens it. Bytes that opened under the owner's key
        version open to the same body again while that key is the owner's: a key
        forgotten (the owner crypto-shredded, then written again) is another key of
        the same version, under which the bytes must open anew. The clear fields and
        the key are checked at each call, as ``open_body`` checks them."""
        version, wrapper = self._sealed_under(row, owner, OWNER_HEAD)
        sealed = bytes(row["sealed"])
        found = self._owner_heads.get(owner)
        if found is not None and found[0] == version and found[1] == sealed and found[2] is wrapper:
            return found[3], found[4]
        try:
            body = json.loads(wrapper.open(sealed, head_aad(owner, OWNER_HEAD, version)))
            turns, created = body["t"], body.get("c")
            if (
                isinstance(turns, list)
                and all(isinstance(turn, str) for turn in turns)
                and (created is None or _natural(created))
            ):
                listed = frozenset(turns)
                self._owner_heads[owner] = (version, sealed, wrapper, listed, created)
                return listed, created
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise IntegrityError("an owner head is malformed")

    def tally(self, row: dict[str, Any], owner: str, turn_id: str) -> Tally:
        """A turn head's tally; raises IntegrityError when it fails authentication."""
        return Tally.loads(self.open_body(row, owner, turn_id))

    def turn_tally(self, by_turn: dict[str, dict[str, Any]], owner: str, turn_id: str) -> Tally:
        """The turn's tally, or an empty one for a turn the owner never wrote.

        Raises:
            IntegrityError: a head fails authentication, or the owner head lists the turn but it has no head.
        """
        if turn_id in by_turn:
            return self.tally(by_turn[turn_id], owner, turn_id)
        if OWNER_HEAD in by_turn and turn_id in self._owner_listing(by_turn[OWNER_HEAD], owner)[0]:
            raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
        return Tally()

    def edited_tally(self, by_turn: dict[str, dict[str, Any]], owner: str, turn_id: str) -> Tally:
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
        return self.turn_tally(by_turn, owner, turn_id)

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
            if composed is not None:  # these bytes open to that body under this key: known opened
                self._owner_heads[owner] = (version, sealed, wrapper, *composed)
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
        turns, created = self.owner_turns(by_turn[OWNER_HEAD], owner)
        bodies = [(OWNER_HEAD, self.compose(owner, frozenset(turns - set(dropped)), created))]
        usage = by_turn.get(USAGE_HEAD)
        if usage is not None:
            total, counted = usage_counts(self.open_body(usage, owner, USAGE_HEAD))
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
        head as its set of turns, the usage head as its total, a head that fails to open as its error."""
        found: dict[str, dict[str, Tally | set[str] | int | IntegrityError]] = {}
        for row in self._db.query(reading.ALL_HEADS_SQL, admin=True):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            opened: Tally | set[str] | int | IntegrityError
            try:
                if turn_id == OWNER_HEAD:
                    opened = self.owner_turns(row, owner)[0]
                elif turn_id == USAGE_HEAD:
                    opened = usage_of(self.open_body(row, owner, turn_id))
                else:
                    opened = self.tally(row, owner, turn_id)
            except IntegrityError as exc:
                opened = exc
            found.setdefault(owner, {})[turn_id] = opened
        return found

    def counter_problems(self) -> list[tuple[str, str | None, str]]:
        """(owner, turn or None, what) for each owner whose owner head and usage head count
        different turns, or whose usage head counts fewer turns than a turn head saw: put
        back from an older copy (``verify``). Heads that fail to open are ``all_heads``'."""
        created: dict[str, int | None] = {}
        counted: dict[str, int | None] = {}
        seen: dict[str, tuple[int, str]] = {}
        for row in self._db.query(reading.ALL_HEADS_SQL, admin=True):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            with contextlib.suppress(IntegrityError):
                if turn_id == OWNER_HEAD:
                    created[owner] = self.owner_turns(row, owner)[1]
                elif turn_id == USAGE_HEAD:
                    counted[owner] = usage_counts(self.open_body(row, owner, turn_id))[1]
                else:
                    seen[owner] = max(seen.get(owner, (0, "")), (self.tally(row, owner, turn_id).o, turn_id))
        problems: list[tuple[str, str | None, str]] = []
        for owner in sorted(set(created) | set(counted)):
            made, count = created.get(owner), counted.get(owner)
            if made is not None and count is not None and made != count:
                problems.append((owner, None, f"its owner head counts {made} turns created, its usage head {count}"))
            top, turn_id = seen.get(owner, (0, ""))
            if count is not None and top > count:
                problems.append((owner, turn_id, f"the turn saw {top} turns created, the owner's usage head {count}"))
            elif count is None and top > (made or 0):  # no counter in the usage head: the owner head's decides
                problems.append(
                    (owner, turn_id, f"the turn saw {top} turns created, the owner's owner head {made or 0}")
                )
        return problems

    def owners_without_heads(self) -> list[str]:
        """Owners with a key but no owner head (``verify``): their heads were removed."""
        rows = self._db.query(reading.OWNERS_WITHOUT_HEADS_SQL, (OWNER_HEAD,), admin=True)
        return [str(row["owner_user_id"]) for row in rows]


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
