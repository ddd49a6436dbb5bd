"""A turn's inventory authenticated by its head, a read checked against it
(the verified inventory kept while the read's freshness token holds:
``reading``), and the turns this process found tampered."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ...core.lru import LRUCache
from ...crypto.primitives import CounterSeal
from ...errors import IntegrityError, StoreBusyError
from ...storage.base import Backend, Conn, Rows
from .owner import OwnerHeads, owner_removed
from .reading import ITEMS_SQL, OWNER_HEAD, InventoryReads, without_token
from .tally import KINDS, MOD, Head, Tally, entry_item, record_item, term

__all__ = ["CONSISTENT_TRIES", "Inventories", "turn_items"]

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
