"""Sealed turn heads: what each turn holds, so that a row cannot vanish unseen.

A head per (owner, turn) seals a constant-size tally of the turn's rows
(``tally``); an owner head counts the owner's turns, a usage head its quota
reservations (``owner``). Every write that changes a turn calls
``Heads.change`` in its transaction; every read is checked against the turn's
inventory, authenticated by its head (``Inventories``: a read checked against it, the
verified inventory kept while the read's freshness token holds, ``reading``, and the turns
this process found tampered). Why, and what each part
trusts: SECURITY.md ("Tampering: the turn heads"). ``Heads`` holds its parts:
``owners``, ``reservations``, ``reads``, ``inventories`` and ``checks``.

``with_heads``: a write's own one-row read and its turn's head rows in one statement
(``beside_sql``: on PostgreSQL one Bind, one portal, one executor start-up rather
than two; on SQLite one statement's execution less).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ...crypto.primitives import CounterSeal, Wrapper
from ...errors import IntegrityError, StoreBusyError
from ...keys.keystore import Keystore, LRUCache
from ...policy import Policy
from ...principal import Principal
from ...storage.base import Backend, Conn, OwnerLockNeeded, Params, Rows
from ..access import audit_log
from . import reading
from .checks import HeadChecks
from .owner import NO_TURNS, Once, OwnerHeads, Sealed, once_sql, owner_removed
from .quota import Room
from .reading import (
    ITEMS_SQL,
    OWNER_HEAD,
    USAGE_HEAD,
    HeadCache,
    InventoryReads,
    Verified,
    beside_sql,
    expired_sql,
    without_token,
)
from .recount import Recount, recount
from .reservations import Reservations
from .tally import KINDS, MOD, RECORD_KINDS, Head, HeadEdit, Tally, entry_item, record_item, same_entry, term

__all__ = [
    "CONSISTENT_TRIES",
    "ITEMS_SQL",
    "NO_TURNS",
    "OWNER_HEAD",
    "RECORD_KINDS",
    "USAGE_HEAD",
    "Head",
    "HeadEdit",
    "Heads",
    "Inventories",
    "Room",
    "Tally",
    "add_rows",
    "beside_sql",
    "entry_item",
    "expired_sql",
    "read_with_heads",
    "record_item",
    "same_entry",
    "turn_items",
    "with_heads",
]

T = TypeVar("T")
# Reads of a turn tried again on a consistent (head, rows) pair before a mismatch is believed.
CONSISTENT_TRIES = 8
# Digest terms kept, so that reading a turn again recomputes only what changed.
_TERM_CACHE = 1 << 14
# Turns this process found tampered, checked again before a write into them.
_TAMPERED = 1 << 12


class Inventories:
    """Turn inventories authenticated by their heads (one per ``Heads``)."""

    def __init__(self, db: Backend, owners: OwnerHeads, reads: InventoryReads, seal: CounterSeal) -> None:
        self._db = db
        self._owners = owners
        self._reads = reads
        self._term = functools.lru_cache(maxsize=_TERM_CACHE)(functools.partial(term, seal))
        self._tampered: LRUCache[tuple[str, str], str] = LRUCache(_TAMPERED)

    def terms(self, owner: str, turn_id: str) -> Callable[[str, str, tuple[Any, ...]], int]:
        """The digest terms of the turn's rows (cached)."""
        return functools.partial(self._term, owner, turn_id)

    def rows(self, owner: str, turn_id: str, token: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
        """The turn's head rows, token and inventory (left out when ``token`` is still the one)."""
        return self._db.query(*self._reads.sql("?", turn_id, owner, token), owner=owner)

    def from_rows(self, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Head:
        """The turn's inventory authenticated by its head (rows of ``InventoryReads.sql``).

        Raises:
            IntegrityError: a head fails authentication, the inventory differs, or the turn lost its head.
        """
        by_turn = {row["turn_id"]: row for row in rows if row["k"] == "h"}
        if turn_id not in by_turn and OWNER_HEAD not in by_turn and any(row["k"] == "k" for row in rows):
            raise owner_removed(owner)  # the owner has a key (a "k" row) but no heads
        tally = self._owners.turn_tally(by_turn, owner, turn_id)
        head = Head()
        tally.check_found(self.recount(head, rows, owner, turn_id), turn_id)
        return head

    def recount(self, head: Head, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Tally:
        """The tally of the inventory rows, filling ``head`` with them (the read path's loop: kept lean)."""
        term = self._term
        sections = {"e": head.e, "c": head.c, "m": head.m}
        sums = dict.fromkeys(KINDS, 0)
        for row in rows:
            kind = row["k"]
            if kind not in sections or row["turn_id"] != turn_id:
                continue
            if kind == "e":
                item = [row["n"], row["expires_at"], row["stored_bytes"], row["actor"], row["channel"]]
            else:
                item = [row["n"], row["expires_at"], row["actor"], row["channel"]]
            sums[kind] += term(owner, turn_id, kind, row["id"], tuple(item))
            sections[kind][row["id"]] = item
        found = Tally({kind: len(sections[kind]) for kind in KINDS}, {kind: sums[kind] % MOD for kind in KINDS})
        if head.e:
            top = max(head.e.items(), key=lambda pair: (int(pair[1][0]), pair[0]))
            found.last = int(top[1][0])
            found.newest = [top[0], top[1][0], top[1][1], top[1][3], top[1][4]]
        return found

    def checked(
        self,
        owner: str,
        turn_id: str,
        fetch: Callable[[], T],
        check: Callable[[Head, T], None],
        first: tuple[T, Rows] | None = None,
    ) -> T:
        """``fetch()`` checked by ``check(head, fetched)`` against the turn's inventory
        (``first``: a ``(fetched, head rows)`` pair read together, ``read_sql``'s):
        the cached one while the read's token holds, else the inventory read and
        verified (then kept); a failure is believed only on a consistent pair.

        Raises:
            IntegrityError: the check fails on a consistent pair.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        cache, reads = self._reads.cache, self._reads
        scope = self._db.read_scope()
        try:
            if first is None:
                fetched = fetch()
                head_rows = self._db.query(*reads.read_sql(owner, turn_id), owner=owner)
            else:
                fetched, head_rows = first
            token, same = reads.token(head_rows, turn_id)
            entry = cache.get(scope, owner, turn_id)
            fresh = entry is not None and token is not None and reads.holds(entry.token, token)
            if not fresh and reads.first_part_only(head_rows):
                # SQLite's token moved: the whole statement, with the inventory.
                head_rows = self.rows(owner, turn_id, None if entry is None else entry.token)
                token, same = reads.token(head_rows, turn_id)
            if entry is not None and token is not None and reads.holds(entry.token, token):
                try:
                    check(entry.head, fetched)
                    kept = reads.kept(entry.token, token)
                    if entry.token != kept:  # the same inventory in a newer snapshot
                        cache.put(scope, owner, turn_id, kept, entry.head)
                    return fetched
                except IntegrityError:
                    cache.drop(owner, turn_id)
                    same = True  # read the inventory itself
            if same:  # the statement left out an inventory no longer cached (another thread's change)
                head_rows = self.rows(owner, turn_id)
            head = self.from_rows(head_rows, owner, turn_id)
            check(head, fetched)
            reads.keep(scope, owner, turn_id, head_rows, head)
            return fetched
        except IntegrityError:
            pass  # tampering, or a writer or a rotation (a key retired) between the reads
        return self._consistent(scope, owner, turn_id, fetch, check)

    def _consistent(
        self, scope: object, owner: str, turn_id: str, fetch: Callable[[], T], check: Callable[[Head, T], None]
    ) -> T:
        """``fetch()`` checked on a consistent pair: head and inventory the same before and after it."""
        for _ in range(CONSISTENT_TRIES):
            with self._one_snapshot():
                before = self.rows(owner, turn_id)
                fetched = fetch()
                after = self.rows(owner, turn_id)
            if without_token(after) == without_token(before):
                try:
                    head = self.from_rows(before, owner, turn_id)
                    check(head, fetched)
                except IntegrityError as exc:
                    self.found_tampered(owner, turn_id, str(exc))
                    raise
                self._reads.keep(scope, owner, turn_id, before, head)
                return fetched
        raise StoreBusyError(f"turn {turn_id!r} kept changing while it was read; try again")

    def _one_snapshot(self) -> AbstractContextManager[object]:
        """A read transaction on SQLite outside a transaction; elsewhere nothing (the pair is compared)."""
        snapshot = getattr(self._db, "snapshot", None)
        conn = getattr(self._db, "conn", None)
        if snapshot is None or conn is None or not conn.getautocommit():
            return contextlib.nullcontext()
        opened: AbstractContextManager[object] = snapshot()
        return opened

    def found_tampered(self, owner: str, turn_id: str, problem: str) -> None:
        """Remember that the turn failed its check: a later write into it is refused with ``problem`` while it fails."""
        self._tampered[(owner, turn_id)] = problem

    def tampered(self, owner: str, turn_id: str) -> str | None:
        """How the turn failed its check, when this process found it tampered."""
        return self._tampered.get((owner, turn_id))

    def forget(self, owner: str, turn_id: str) -> None:
        """Forget that the turn was found tampered."""
        self._tampered.pop((owner, turn_id))

    def check_written(self, conn: Conn, owner: str, turn_id: str, problem: str | None) -> None:
        """For a turn found tampered (``problem``), its inventory checked in the write's
        transaction; a turn put back as it was is forgotten and takes writes again.

        Raises:
            IntegrityError: ``problem``: the turn still fails its check.
        """
        if problem is None:
            return
        try:
            self.from_rows(conn.query(*self._reads.sql("?", turn_id, owner)), owner, turn_id)
        except IntegrityError:
            raise IntegrityError(problem) from None
        self.forget(owner, turn_id)


def turn_items(conn: Conn, owner: str, turn_id: str) -> dict[str, dict[str, list[Any]]]:
    """The clear items of a turn's rows by kind (``{"e": {id: item}, ...}``), in the
    caller's transaction: what an extension replaces (``extend_head``)."""
    found: dict[str, dict[str, list[Any]]] = {kind: {} for kind in KINDS}
    for row in conn.query(ITEMS_SQL.format(where="owner_user_id = ? AND turn_id = ?"), (owner, turn_id) * 3):
        found[row["k"]][row["id"]] = entry_item(row) if row["k"] == "e" else record_item(row)
    return found


def with_heads(
    dialect: str, one_row: tuple[str, Params], owner: str, turn_id: str, *, turn_only: bool = False
) -> list[tuple[str, Params]]:
    """The read of ``one_row`` with the turn's head rows, as a write announces it
    (``Conn.prefetch``) and ``read_with_heads`` answers it; ``turn_only`` (the
    owner's lock shared): on SQLite the turn's own head row alone, all such a write
    reads of the heads (it changes its turn's head only; a new turn, or one whose
    reservation is short, takes the exclusive lock and reads the three, and on SQLite
    the new turn's seed: ``InventoryReads.seeded``)."""
    sqlite = dialect == "sqlite"
    return [beside_sql(one_row, owner, turn_id, turn_only=turn_only and sqlite, seed=sqlite and not turn_only)]


def read_with_heads(conn: Conn, reads: list[tuple[str, Params]]) -> tuple[dict[str, Any], Rows]:
    """``with_heads``'s answer inside the write: the one row, and the head rows (for ``Heads.change``)."""
    rows = conn.query(*reads[0])
    return rows[0], [row for row in rows if row["turn_id"] is not None]


class Heads:
    """The sealed heads of one store, composed of its parts. Safe to share between threads."""

    # Statements a caller announces (``Conn.prefetch``) or sends beside its own.
    select_sql = staticmethod(reading.select_sql)
    entry_select_sql = staticmethod(reading.entry_select_sql)
    newest_sql = staticmethod(reading.newest_sql)
    items = staticmethod(turn_items)

    def __init__(self, db: Backend, keys: Keystore, policy: Policy) -> None:
        self._db = db
        self._keys = keys
        self._cache = HeadCache()
        self.owners = OwnerHeads(db, keys)
        self.reservations = Reservations(self.owners, self._cache)
        self.reads = InventoryReads(db, self._cache)
        self.inventories = Inventories(db, self.owners, self.reads, keys.counter_seal)
        self.checks = HeadChecks(policy)
        self.last = self.owners.last
        # What the tests and ``verify`` reach of the owner heads.
        self.open_body, self.write_body = self.owners.open_body, self.owners.write_body
        self.owner_turns, self.all_heads = self.owners.owner_turns, self.owners.all_heads
        self.found_tampered = self.inventories.found_tampered
        keys.on_first_key = self.owners.first_owner_head

    def cache_limit(self, turns: int) -> None:
        """Keep at most ``turns`` verified inventories; 0 turns the cache off (every read recounts)."""
        self._cache.limit(turns)

    def read_sql(self, owner: str, turn_id: str) -> tuple[str, Params]:
        """What a read of the turn sends beside its rows (``InventoryReads.read_sql``)."""
        return self.reads.read_sql(owner, turn_id)

    def entry_read_sql(self, owner: str, entry_id: str, scope: Any) -> tuple[str, Params]:
        """``read_sql`` for the turn of entry ``entry_id``, found within ``scope``."""
        return self.reads.entry_read_sql(owner, entry_id, scope)

    def checked_last(
        self, principal: Principal, turn_id: str, fetch: Callable[[], dict[str, Any] | None], now: float
    ) -> dict[str, Any] | None:
        """``fetch()`` (the turn's newest live row in scope, or None) checked by the
        head alone when it knows that row, else by the inventory (``Inventories.checked``).

        Raises:
            IntegrityError: the row is not the turn's newest.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        owner = principal.owner_user_id
        for _ in range(CONSISTENT_TRIES):
            row = fetch()
            by_turn = {
                each["turn_id"]: each for each in self._db.query(*reading.select_sql(owner, turn_id), owner=owner)
            }
            newest = self.owners.tally(by_turn[turn_id], owner, turn_id).newest if turn_id in by_turn else None
            if newest is None or newest[2] <= now or not self.checks.in_scope(principal, newest[3], newest[4]):
                break
            if row is not None and (row["id"], row["step_num"]) == (newest[0], newest[1]):
                return row

        def check(head: Head, found: dict[str, Any] | None) -> None:
            seen = [] if found is None else [found]
            self.checks.check_newest_first(head, principal, turn_id, seen, now, complete=found is None)

        return self.inventories.checked(owner, turn_id, fetch, check)

    def tally_of(self, owner: str, turn_id: str) -> HeadEdit:
        """An empty tally to add authenticated rows to (``verify``), compared with ``Tally.check_found``."""
        return HeadEdit(Tally(), self.inventories.terms(owner, turn_id))

    def change(
        self,
        conn: Conn,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        version: int | None = None,
        *,
        room: Room | None = None,
        turn_only: bool = False,
        rows: Rows | None = None,
        insert: tuple[str, Params] | None = None,
        dropped: dict[str, dict[str, int]] | None = None,
    ) -> int:
        """Apply ``edit`` to the turn's tally and seal it in the caller's transaction with
        the owner-wide heads it moves and the caller's ``insert`` (one upsert); the
        turn's reservation left unused. ``turn_only``: the owner's lock is shared.

        Raises:
            IntegrityError: a head fails authentication, or the turn found tampered still fails.
            QuotaExceededError: ``room`` has none for the entries added.
            OwnerLockNeeded: with ``turn_only``, the owner head or usage head must change.
        """
        scope = self._db.read_scope()
        kept = self._cache.take(scope, owner, turn_id)
        tampered = self.inventories.tampered(owner, turn_id)
        by_turn = self.owners.heads_of(conn, owner, turn_id, rows)
        if turn_only and turn_id not in by_turn:
            raise OwnerLockNeeded  # a new turn joins the owner head: the exclusive lock's
        tally = self.owners.edited_tally(by_turn, owner, turn_id, conn)
        before, reserved = tally.state(), tally.r
        terms = self.inventories.terms(owner, turn_id)
        token, head = self._kept(kept, by_turn.get(turn_id), rows, turn_id)
        change = HeadEdit(tally, terms, head)
        edit(change)
        tally.b = max(tally.b, 0)
        if turn_id in by_turn and not any(tally.n.values()):  # the turn left empty: it goes
            self._emptied(conn, (owner, turn_id), by_turn, reserved, version, turn_only, dropped)
            self.inventories.check_written(conn, owner, turn_id, tampered)
            return 0
        if tally.state() == before:  # nothing the head counts changed: the caller's insert alone
            if insert is not None:
                conn.defer(*insert)
            spare = tally.r - tally.b
        else:
            if turn_only and (tally.b > tally.r or change.bytes < 0):
                raise OwnerLockNeeded  # the reservation is short: the owner's usage head must change
            if turn_only:
                bodies = [(turn_id, tally.dumps())]
            else:
                bodies = self.reservations.bodies(conn, owner, turn_id, by_turn, tally, change.bytes, room, version)
            spare = tally.r - tally.b  # before the tally is handed on (``LastSealed``: a put in one message edits it)
            sealed = self.owners.write_bodies(conn, owner, bodies, version, insert)
            self.owners.last.attach(owner, turn_id, bodies[0][1], tally)
            token = None if token is None else self.reads.written(token, sealed[0])
        self.inventories.check_written(conn, owner, turn_id, tampered)
        if token is not None and change.head is not None:
            self._cache.put(scope, owner, turn_id, token, change.head)
        return spare

    def _emptied(
        self,
        conn: Conn,
        turn: tuple[str, str],
        by_turn: dict[str, dict[str, Any]],
        reserved: int,
        version: int | None,
        turn_only: bool,
        dropped: dict[str, dict[str, int]] | None,
    ) -> None:
        """Delete an emptied turn's head and drop it from the owner's heads, or add it to ``dropped``."""
        owner, turn_id = turn
        if turn_only:
            raise OwnerLockNeeded  # the owner head and the usage head change
        self.owners.delete_head(conn, owner, turn_id)
        if dropped is not None:  # the caller drops its turns from the owner's heads at once
            dropped.setdefault(owner, {})[turn_id] = reserved
        else:
            self.owners.drop(conn, owner, {turn_id: reserved}, by_turn, version)

    def _kept(
        self, kept: Verified | None, stored: dict[str, Any] | None, rows: Rows | None, turn_id: str
    ) -> tuple[tuple[Any, ...] | None, Head | None]:
        """The token and the inventory a write edits with its tally: the cached one when the
        stored head is the one it was verified with; a new turn's, empty (``InventoryReads.seeded``)."""
        if kept is None:
            seeded = self.reads.seeded(rows, turn_id)
            return (None, None) if seeded is None else (seeded, Head())
        if stored is None or not self.reads.keeps_writes:
            return kept.token, None
        return kept.token, kept.head if self.reads.sealed_of(kept.token) == bytes(stored["sealed"]) else None

    def change_once(
        self,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        sealing: tuple[int, Wrapper],
        insert: tuple[str, Params],
        condition: tuple[str, Params] | None = None,
        step: int | None = None,
        expect: Sealed | None = None,
    ) -> Once | None:
        """``change`` without reading the head this process sealed last (``LastSealed``): one
        statement with the caller's ``insert`` that writes only if the stored head is
        still that one and ``condition`` holds; None without a record, or past the
        turn's reservation. A ``condition`` that a ``step`` is free is left out when
        the step is above every step that head counts: the turn holds no entry with it.
        The caller counts the head's wrap with its own (``Keystore.count_wraps_later``);
        ``expect``: the record it sealed from (``LastSealed.peek``), None when another took its place."""
        version, wrapper = sealing
        if self.inventories.tampered(owner, turn_id) is not None:
            return None  # ``change`` checks the turn with the write
        # The turn's verified inventory is edited with the head (SQLite), else dropped.
        if self.reads.keeps_writes:
            taken = self._cache.take(self._db.read_scope(), owner, turn_id)
        else:
            taken = None
            self._cache.drop(owner, turn_id)
        kept = None if taken is None else (self.reads.sealed_of(taken.token), taken.head)
        terms = self.inventories.terms(owner, turn_id)
        found = self.last.following(owner, turn_id, edit, terms, wrapper, version, kept, expect)
        if found is None:
            return None
        last, head, spare, recorded = found
        if step is not None and step > recorded:
            condition = None
        statement, params = once_sql(insert, owner, turn_id, head, last, condition, self._db.dialect)
        edited = None if taken is None or kept is None or kept[0] != last.sealed else (taken.token, taken.head)
        return Once(statement, params, head, spare, edited)

    def written_once(self, owner: str, turn_id: str, once: Once) -> None:
        """``once`` was written: its head is the one this process sealed last, and the
        inventory it edited (SQLite) is kept for the reads, as ``change`` keeps it."""
        self.last.record(owner, turn_id, once.head)
        if once.kept is not None:
            token, head = once.kept
            self._cache.put(self._db.read_scope(), owner, turn_id, self.reads.written(token, once.head.sealed), head)

    def drop_turn(self, conn: Conn, owner: str, turn_id: str) -> int:
        """Delete the turn's head and drop it from the owner's heads whatever its check
        says (the way out of a turn found tampered); the heads deleted (0 or 1).

        Raises:
            IntegrityError: the owner head or usage head fails authentication.
        """
        self._cache.drop(owner, turn_id)  # the turn stays found tampered until the drop commits: ``turn_dropped``
        by_turn = self.owners.heads_of(conn, owner, turn_id, None)
        if OWNER_HEAD not in by_turn:  # the owner's heads were removed: its reads say so
            self.last.take(owner, turn_id)
            return conn.execute(reading.DELETE_HEAD_SQL, (owner, turn_id))
        self.owners.delete_head(conn, owner, turn_id)
        reserved = self.reservations.of_dropped(conn, owner, turn_id, by_turn)
        self.owners.drop(conn, owner, {turn_id: reserved}, by_turn, None)
        return 1 if turn_id in by_turn else 0

    def turn_dropped(self, owner: str, turn_id: str) -> None:
        """Forget that the turn was found tampered, once its drop committed."""
        self.inventories.forget(owner, turn_id)

    def recount_turns(self, conn: Conn, owner: str) -> Recount:
        """The owner's turns counted anew from its heads present (``recount``), in the
        caller's transaction; the head rows it deletes are forgotten here.

        Raises:
            IntegrityError: the owner head is missing, or it or the usage head fails authentication.
        """
        done = recount(self.owners, conn, owner, self._keys.counter_seal.owner_term)
        for turn_id in done.deleted:
            if isinstance(turn_id, str):
                self._cache.drop(owner, turn_id)
                self.last.take(owner, turn_id)
        return done

    def prune(self, conn: Conn, cutoff: float, budget: int | None = None) -> tuple[int, list[tuple[str, str]]]:
        """Subtract what gc collects at ``cutoff`` from its turns' heads, in gc's transaction;
        the heads changed, and the turns gc leaves alone: those whose inventory fails
        its head (the evidence stays) and, with ``budget``, those past it."""
        by_turn: dict[tuple[str, str], list[dict[str, Any]]] = {}
        if budget is None:
            for row in conn.query(ITEMS_SQL.format(where="expires_at <= ?"), (cutoff,) * 3):
                by_turn.setdefault((row["owner_user_id"], row["turn_id"]), []).append(row)
        else:  # the turns first: a turn left alone costs one row, not its expired ones
            for row in conn.query(reading.EXPIRED_TURNS_SQL, (cutoff,) * 3):
                by_turn[(row["owner_user_id"], row["turn_id"])] = []
        kept: list[tuple[str, str]] = []
        dropped: dict[str, dict[str, int]] = {}
        for (owner, turn_id), rows in by_turn.items():
            try:
                if budget is not None:
                    counted = self._counted(conn, owner, turn_id) if budget > 0 else 1
                    if counted > budget:
                        kept.append((owner, turn_id))
                        continue
                    budget -= counted
                    rows.extend(conn.query(ITEMS_SQL.format(where=reading.TURN_EXPIRED), (owner, turn_id, cutoff) * 3))
                self.inventories.from_rows(conn.query(*self.reads.sql("?", turn_id, owner, kept=False)), owner, turn_id)
            except IntegrityError as exc:
                audit_log.warning("gc left turn %r of owner %r uncollected: %s", turn_id, owner, exc)
                self.found_tampered(owner, turn_id, str(exc))
                kept.append((owner, turn_id))
                continue
            self.change(conn, owner, turn_id, functools.partial(_remove_rows, rows=rows), dropped=dropped)
        for owner, turns in dropped.items():  # once per owner, however many of its turns gc emptied
            self.owners.drop(conn, owner, turns, self.owners.heads_of(conn, owner, OWNER_HEAD, None), None)
        return len(by_turn) - len(kept), kept

    def _counted(self, conn: Conn, owner: str, turn_id: str) -> int:
        """The rows the turn's head counts."""
        by_turn = self.owners.heads_of(conn, owner, turn_id, None)
        return sum(self.owners.turn_tally(by_turn, owner, turn_id, conn).n.values())

    def reseal_owner(self, conn: Conn, owner: str) -> int:
        """Seal every head of the owner again under its newest key version (a rotation); how many."""
        rows = conn.query(reading.OWNER_HEADS_SQL, (owner,))
        for row in rows:
            self.write_body(conn, owner, row["turn_id"], self.open_body(row, owner, row["turn_id"]))
        return len(rows)

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> int:
        """Delete every head of the owner (forgetting it), in the caller's transaction."""
        return conn.execute(reading.DELETE_OWNER_SQL, (owner,))


def add_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.add(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))


def _remove_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.remove(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))
