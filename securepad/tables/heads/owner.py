"""Sealing heads; the owner heads (each owner's turns) and usage heads (its quota reservations).

An owner head (turn id ``""``, a row of ``turn_heads`` beside the owner's turn
heads) lists, sealed under the owner's key (``crypto.head_aad``), the owner's
turns, so that a whole turn cannot vanish. A **usage head** (turn id
``USAGE_HEAD``, which no turn can have: ``check_identifier`` refuses control
characters) holds, sealed the same way, the owner's total **reservation** R:
the sum of its turns' reservations.

**Per-turn bytes and reservations.** Each turn head's tally (``head_tally``,
format 3) carries ``b``, the sum of ``stored_bytes`` over the entries it
counts (expired ones not yet collected included), and
``r >= b``, the share of the owner's quota the turn holds. Invariants: the
sum of the ``b`` is at most R = the sum of the ``r``, and a write never takes
R (with the owner's live records, ``Records.used_sql``) above the quota. A put
whose entry fits in its turn's reservation (``b + adding <= r``) rewrites its
turn head only: it takes the owner's lock *shared* and its turn's lock
exclusive (``Backend.transaction(owner, turn=...)``), so one owner's puts into
different turns run at once on PostgreSQL (before, every put
read-modify-wrote the owner's usage total on the client under the owner's
exclusive lock, across a round trip). A put that does not fit, the first of a
turn, and every other write that changes owner-wide state take the owner's
lock exclusive; such a put **grants** its turn what it lacks plus a chunk
(``head_quota.grant``). Near the limit, a put that does not fit in R is not refused
while other turns hold unused reservation: ``Heads.reclaim`` gives it back
(rewrites those heads with ``r = b``; one more query) and the put is tried
against what the entries really hold; only then, as before, the exact sum
over the owner's live entries decides (expired entries not yet collected do
not count, so R may then pass the quota until gc, as the total could
before). A removal (delete, gc) lowers the turn's ``b``, its ``r`` and R by
the same amount. A checkpoint or mark, whose cost the quota counts from
the owner's live records beside R (not in a reservation), must fit beside
R; near the limit it reclaims the same way (its own turn's spare included).
The quota stays an upper bound that is authenticated: R and
every ``r`` and ``b`` are sealed under the owner's key, which the server never
has, and ``verify`` checks each turn's ``b`` against its entries and R against
the sum of the ``r``. A clear server-side counter would not be.

**The owner's turn counter.** The owner head (``c``) and the usage head (the
second number of its array) hold how many turns the owner created; each turn
head's tally holds the counter as it last saw it (``Tally.o``: set when the
turn is created, raised by every write of the turn under the owner's
exclusive lock, which opens the usage head). A usage head that counts fewer
turns than a turn head saw, or an owner head and usage head that disagree,
were put back from an older copy: such a write refuses (``heads``), and
``counter_problems`` names them (``verify``). So putting back an owner head
and usage head from before a turn existed, after deleting that turn, is
seen once any turn was created or written under that lock since. Heads from
before the counter count nothing until the owner's next new turn. A usage
head without the counter (deleted, from before it, or seeded at the heads'
build) leaves the check to the owner head's counter, an owner head without
one counting 0: a turn head that saw the counter shows both are older.

The usage head is a row of its own, not part of the owner head, because the
owner head grows with the owner's turns. R changes only in ``Heads.change``
(and ``reclaim``), inside the write transaction that changes the entries,
under the owner's exclusive lock (SQLite: one writer). An owner without a
usage head (removed, or a store from before it not yet seeded) has an unknown
total: the quota then sums the owner's live entries, its turns get no
reservation beyond their bytes (so every put of it takes the exclusive lock),
and ``verify`` names it.

Stores from before (SQLite migration 11, PostgreSQL 8 dropped ``owner_usage``
and set ``store_meta.owner_usage``): ``seed_usage``, in the transaction that
builds or converts the heads at open with the key (``head_build``), gives every
owner with an owner head and no usage head the sum of its turns'
reservations (equal to their bytes, the sum over its entries, right after
their conversion); on a store whose heads are of this format the clear flag
is ignored. Format-2 turn heads (no ``b``, ``r``) get ``r = b =`` their
authenticated inventory's bytes at open (``head_build``): the usage head,
which held the sum of the bytes, is then already the sum of the reservations.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ...crypto.primitives import Wrapper, head_aad
from ...errors import IntegrityError
from ...keys.keystore import NEWEST_VERSION_SQL, Keystore
from ...storage.base import Backend, Conn, OnceWriter, Params
from .last_sealed import LastSealed, Sealed
from .tally import Tally

__all__ = [
    "NO_TURNS",
    "OWNER_HEAD",
    "USAGE_HEAD",
    "OwnerHeads",
    "check_counted",
    "owner_body",
    "owner_removed",
    "rolled_back",
    "usage_body",
    "usage_counts",
    "usage_of",
]

OWNER_HEAD = ""
USAGE_HEAD = "\x01usage"
_UPSERT = (
    "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES {values}"
    " ON CONFLICT (owner_user_id, turn_id) DO UPDATE SET key_version = excluded.key_version,"
    " sealed = excluded.sealed"
)


def owner_body(turns: set[str], created: int | None) -> bytes:
    """An owner head's body: the owner's turns, and its turn counter (``c``:
    how many turns the owner created, which only grows; None: not counted
    yet, an owner head from before the counter)."""
    body: dict[str, Any] = {"t": sorted(turns)}
    if created is not None:
        body["c"] = created
    return json.dumps(body).encode()


NO_TURNS = owner_body(set(), 0)


def usage_body(total: int, created: int | None = None) -> bytes:
    """A usage head's body: the total, with the owner's turn counter as its
    owner head holds it, as a JSON array (a bare number without the counter,
    as before it); not an object, so that the heads' format-1 conversion,
    which skips what it cannot read, leaves it."""
    return (str(total) if created is None else json.dumps([total, created])).encode()


def usage_of(body: bytes) -> int:
    """A usage head's total."""
    return usage_counts(body)[0]


def usage_counts(body: bytes) -> tuple[int, int | None]:
    """A usage head's total and turn counter (None: a usage head from before it)."""
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
    """Opening and sealing heads; the owner heads (``Heads`` builds on it)."""

    def __init__(self, db: Backend, keys: Keystore) -> None:
        self._db = db
        self._keys = keys
        # The turn heads sealed here last (``head_last``): every turn head a transaction writes goes through
        # ``write_bodies``; a put in one message records its own (``entry_put``).
        self.last = LastSealed(enabled=isinstance(db, OnceWriter))

    def open_body(self, row: dict[str, Any], owner: str, turn_id: str) -> bytes:
        version = row["key_version"]
        if not isinstance(version, int) or isinstance(version, bool) or row["turn_id"] != turn_id:
            raise IntegrityError("a turn head's clear fields are malformed")
        if row["owner_user_id"] != owner:
            raise IntegrityError("a turn head belongs to another owner")
        return self._keys.owner_wrapper(owner, version).open(row["sealed"], head_aad(owner, turn_id, version))

    def owner_head(self, row: dict[str, Any], owner: str) -> set[str]:
        """The turns an owner head lists."""
        return self.owner_turns(row, owner)[0]

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

    def _tally(self, row: dict[str, Any], owner: str, turn_id: str) -> Tally:
        return Tally.loads(self.open_body(row, owner, turn_id))

    def usage(self, owner: str, version: Any, sealed: Any) -> int | None:
        """The owner's usage total from its usage head's clear ``version`` and
        ``sealed`` (read with the quota's statement): None without a usage head."""
        if sealed is None:
            return None
        row = {"owner_user_id": owner, "turn_id": USAGE_HEAD, "key_version": version, "sealed": sealed}
        return usage_of(self.open_body(row, owner, USAGE_HEAD))

    def _newest(self, conn: Conn, owner: str) -> int | None:
        found = conn.query(f"SELECT {NEWEST_VERSION_SQL} AS v", (owner,))[0]["v"]
        return None if found is None else int(found)

    def write_body(self, conn: Conn, owner: str, turn_id: str, body: bytes, version: int | None = None) -> None:
        self.write_bodies(conn, owner, [(turn_id, body)], version)

    def write_bodies(
        self,
        conn: Conn,
        owner: str,
        bodies: list[tuple[str, bytes]],
        version: int | None = None,
        insert: tuple[str, Params] | None = None,
    ) -> list[bytes]:
        """Seal and upsert heads of the owner, in one statement (a put writes its
        turn head and its owner head together). ``insert``, the caller's insert
        of the rows the heads now count, goes first: on PostgreSQL in the same
        statement, as a data-modifying ``WITH`` (one Bind, one portal and one
        executor start-up less per put; it runs to completion whatever
        the upsert reads, and its errors, such as a unique violation or a
        row-level security check, fail the statement as they failed its own),
        on SQLite before it (SQLite has no data-modifying ``WITH``). Each turn
        head sealed is recorded as this process's last of its turn (``last``:
        ``head_last``). Returns the sealed heads, in the order of ``bodies``."""
        if version is None:
            version = self._newest(conn, owner)
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
        upsert = _UPSERT.format(values=", ".join(["(?, ?, ?, ?)"] * len(bodies)))
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
        conn.defer("DELETE FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?", (owner, turn_id))
        self.last.take(owner, turn_id)

    def drop(
        self,
        conn: Conn,
        owner: str,
        dropped: dict[str, int],
        by_turn: dict[str, dict[str, Any]],
        version: int | None,
    ) -> None:
        """Turns left empty (their heads deleted: ``delete_head``) dropped from
        the owner head, and their reservations (``dropped``, each turn's before
        the change) from the usage head, in the caller's transaction, so that
        no clear trace of their ids stays. The owner head, sealed, is what
        tells this from a turn removed by someone without the key: a turn it
        lists must have a head.

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
        """The empty owner head and a zero usage head of an owner's first key, in
        the key's transaction (``Keystore.on_first_key``): an owner whose every
        turn and head were removed while its key stayed is then told from one
        that never wrote."""
        params: list[Any] = []
        for turn_id, body in ((OWNER_HEAD, NO_TURNS), (USAGE_HEAD, usage_body(0, 0))):
            params += [owner, turn_id, version, wrapper.seal(body, head_aad(owner, turn_id, version))]
        conn.defer(
            "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES (?, ?, ?, ?), (?, ?, ?, ?)"
            " ON CONFLICT (owner_user_id, turn_id) DO NOTHING",
            tuple(params),
        )
        self._keys.count_wraps_later(owner, version, 2)

    def seed_usage(self, conn: Conn) -> int:
        """Give every owner with an owner head and no usage head one holding the
        sum of its turns' reservations (equal to their bytes right after their
        conversion: ``head_build``), inside the caller's transaction: the one
        that builds or converts the store's heads at open (``store_meta.owner_usage``,
        set by the migration that dropped the ``owner_usage`` table, is then
        deleted). Only that transaction calls it: on a store whose heads are
        of this format the clear flag decides nothing, so that a deleted usage
        head stays deleted (the quota sums, ``verify`` names it). A turn head
        that fails to open counts nothing (its reads and ``verify`` name it).
        Returns the usage heads written."""
        if not conn.query("SELECT value FROM store_meta WHERE key = 'owner_usage'"):
            return 0
        rows = conn.query(
            "SELECT h.owner_user_id, h.turn_id, h.key_version, h.sealed FROM turn_heads h"
            " WHERE h.turn_id != ? AND h.owner_user_id IN (SELECT o.owner_user_id FROM turn_heads o"
            " WHERE o.turn_id = ? AND NOT EXISTS (SELECT 1 FROM turn_heads u"
            " WHERE u.owner_user_id = o.owner_user_id AND u.turn_id = ?))",
            (USAGE_HEAD, OWNER_HEAD, USAGE_HEAD),
        )
        totals: dict[str, int] = {}
        for row in rows:
            owner = row["owner_user_id"]
            totals.setdefault(owner, 0)
            if row["turn_id"] != OWNER_HEAD:
                with contextlib.suppress(IntegrityError):
                    totals[owner] += self._tally(row, owner, row["turn_id"]).r
        for owner, total in totals.items():
            self.write_body(conn, owner, USAGE_HEAD, usage_body(total))
        conn.execute("DELETE FROM store_meta WHERE key = 'owner_usage'")
        return len(totals)

    def all_heads(self) -> dict[str, dict[str, Tally | set[str] | int | IntegrityError]]:
        """Every head of the store, opened: ``{owner: {turn: Tally}}``, the owner head
        under ``OWNER_HEAD`` as its set of turns, the usage head under ``USAGE_HEAD``
        as its total; a head that fails to open is its error (``verify``)."""
        found: dict[str, dict[str, Tally | set[str] | int | IntegrityError]] = {}
        rows = self._db.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads", admin=True)
        for row in rows:
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            opened: Tally | set[str] | int | IntegrityError
            try:
                if turn_id == OWNER_HEAD:
                    opened = self.owner_head(row, owner)
                elif turn_id == USAGE_HEAD:
                    opened = usage_of(self.open_body(row, owner, turn_id))
                else:
                    opened = self._tally(row, owner, turn_id)
            except IntegrityError as exc:
                opened = exc
            found.setdefault(owner, {})[turn_id] = opened
        return found

    def counter_problems(self) -> list[tuple[str, str | None, str]]:
        """(owner, turn or None, what) for each owner whose owner head and usage
        head count different turns, or whose usage head counts fewer turns
        than a turn head saw (``Tally.o``): the owner's heads were put back
        from an older copy (``verify``). Heads that fail to open are left to
        ``all_heads``; heads from before the counter count nothing."""
        created: dict[str, int | None] = {}
        counted: dict[str, int | None] = {}
        seen: dict[str, tuple[int, str]] = {}
        rows = self._db.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads", admin=True)
        for row in rows:
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            with contextlib.suppress(IntegrityError):
                if turn_id == OWNER_HEAD:
                    created[owner] = self.owner_turns(row, owner)[1]
                elif turn_id == USAGE_HEAD:
                    counted[owner] = usage_counts(self.open_body(row, owner, turn_id))[1]
                else:
                    seen[owner] = max(seen.get(owner, (0, "")), (self._tally(row, owner, turn_id).o, turn_id))
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
        rows = self._db.query(
            "SELECT DISTINCT owner_user_id FROM owner_keys WHERE owner_user_id NOT IN"
            " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) ORDER BY owner_user_id",
            (OWNER_HEAD,),
            admin=True,
        )
        return [str(row["owner_user_id"]) for row in rows]

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> int:
        """Delete every head of the owner (forgetting it), inside the caller's transaction."""
        return conn.execute("DELETE FROM turn_heads WHERE owner_user_id = ?", (owner,))


def check_counted(tally: Tally, counted: int | None, owner: str, turn_id: str) -> None:
    """Refuse a usage head that counts fewer turns than the turn's head saw
    (``Tally.o``): it was put back from an older copy, with the owner head."""
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
