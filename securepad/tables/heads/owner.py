"""Sealing heads; the owner heads (each owner's turns) and usage heads (its quota reservations).

A usage head holds the owner's total reservation R, the sum of its turns'
``r`` (each turn's share of the quota, at least its entries' bytes ``b``),
all sealed under the owner's key; a write never takes R (with the live
records) above the quota, and a put within its turn's reservation takes the
owner's lock shared (``reservations`` has the rest). The owner head and the
usage head count the turns the owner created; each tally holds the count it
last saw (``Tally.o``): heads that count fewer, or disagree, were put back
from an older copy, and a write refuses (``counter_problems`` names them).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ...crypto.primitives import Wrapper, head_aad
from ...errors import IntegrityError
from ...keys.keystore import Keystore
from ...storage.base import Backend, Conn, Params, Rows
from . import statements as sql
from .last_sealed import LastSealed, Sealed
from .statements import OWNER_HEAD, USAGE_HEAD
from .tally import Tally


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
        # The turn heads sealed here last (``last_sealed``): every turn head a transaction writes goes
        # through ``write_bodies``; a put in one message records its own. A write whose stored head
        # is the one recorded edits the recorded tally (``edited_tally``) rather than opening the head.
        self.last = LastSealed()

    def open_body(self, row: dict[str, Any], owner: str, turn_id: str) -> bytes:
        """A head's body, opened; raises IntegrityError when it fails authentication."""
        version = row["key_version"]
        if not isinstance(version, int) or isinstance(version, bool) or row["turn_id"] != turn_id:
            raise IntegrityError("a turn head's clear fields are malformed")
        if row["owner_user_id"] != owner:
            raise IntegrityError("a turn head belongs to another owner")
        return self._keys.owner_wrapper(owner, version).open(row["sealed"], head_aad(owner, turn_id, version))

    def owner_turns(self, row: dict[str, Any], owner: str) -> tuple[set[str], int | None]:
        """The turns an owner head lists, and its turn counter (None: from before it)."""
        try:
            body = json.loads(self.open_body(row, owner, OWNER_HEAD))
            turns, created = body["t"], body.get("c")
            if (
                isinstance(turns, list)
                and all(isinstance(turn, str) for turn in turns)
                and (created is None or _natural(created))
            ):
                return set(turns), created
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
        if OWNER_HEAD in by_turn and turn_id in self.owner_turns(by_turn[OWNER_HEAD], owner)[0]:
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
            rows = conn.query(*sql.select_sql(owner, turn_id))
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
            found = conn.query(sql.NEWEST_SQL, (owner,))[0]["v"]
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
            if turn_id not in (OWNER_HEAD, USAGE_HEAD):
                self.last.record(owner, turn_id, Sealed(version, sealed, body))
        upsert = sql.UPSERT_SQL.format(values=", ".join(["(?, ?, ?, ?)"] * len(bodies)))
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
        conn.defer(sql.DELETE_HEAD_SQL, (owner, turn_id))
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
        bodies = [(OWNER_HEAD, owner_body(turns - set(dropped), created))]
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
        conn.defer(sql.FIRST_OWNER_HEAD_SQL, tuple(params))
        self._keys.count_wraps_later(owner, version, 2)

    def all_heads(self) -> dict[str, dict[str, Tally | set[str] | int | IntegrityError]]:
        """Every head of the store, opened (``verify``): ``{owner: {turn: Tally}}``, the owner
        head as its set of turns, the usage head as its total, a head that fails to open as its error."""
        found: dict[str, dict[str, Tally | set[str] | int | IntegrityError]] = {}
        for row in self._db.query(sql.ALL_HEADS_SQL, admin=True):
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
        for row in self._db.query(sql.ALL_HEADS_SQL, admin=True):
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
        rows = self._db.query(sql.OWNERS_WITHOUT_HEADS_SQL, (OWNER_HEAD,), admin=True)
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
