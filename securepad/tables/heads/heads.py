"""Sealed turn heads: what each turn holds, so that a row cannot vanish unseen.

Every entry and every turn record is authenticated on its own; what a single
row cannot say is that it is *missing*. A head per (owner, turn) holds a
constant-size **tally** of what the turn holds: for each kind (``e`` entries,
``c`` checkpoints, ``m`` compaction marks) a count and a keyed multiset digest,
and the highest step ever recorded. An owner head (turn id ``""``) lists the
owner's turns, so a whole turn (rows and head) cannot vanish either; a usage
head holds the owner's usage total, the quota's (``head_owner``).

**The digest** of a kind is the sum, mod 2**256, of one HMAC-SHA256 per row
over the row's clear columns that matter (owner, turn, kind, id, step or
sequence number, expiry, stored bytes, actor, channel), under a key derived
from the master key (``Keystore.counter_seal``, the anchor key; HKDF label
``anchor``). A sum can be added to and subtracted from: a put adds its row, a
delete or gc subtracts, an extension swaps the old row for the new one, each
in O(1), so a write of a turn costs the same whatever the turn's length.
The HMAC is keyed because the rows' clear columns are the
attacker's to choose: with a plain hash, one could search for other rows
summing to the same value (Wagner's generalized birthday); with a key it
cannot compute a single term. The key is the store's, not the owner's, so an
owner-key rotation leaves every digest valid; owner and turn are in each
term, so nothing can be moved between owners or turns. The tally itself is
inside the head's AES-GCM seal (owner's key, owner, turn and key version in
the AAD: ``crypto.head_aad``): an attacker does not even see the sums.

* Every write that changes a turn calls ``Heads.change`` inside its own
  transaction (the one place): put, checkpoint, mark, extend, delete, gc
  (``prune``), forgetting an owner (``delete_owner``), owner-key rotation
  (``reseal_owner``). It reads and rewrites one small row. A change that
  leaves the turn empty deletes its head and drops the turn from the owner
  head and its reservation from the usage head (``OwnerHeads.drop``): no clear turn id
  stays behind. A turn the sealed owner head lists must have a head, so a
  turn removed by someone without the key is still refused.
* Every read of a turn fetches the turn's head together with the turn's
  **inventory** (the clear columns above of every row of the turn, expired
  ones not yet collected included: ``head_reads``), recomputes the tally
  from it, and refuses a difference; the inventory, so authenticated, is the
  ``Head`` the read's rows are then checked against (``check_entries``,
  ``check_entry``, ``check_records``): a row absent before its sealed expiry,
  a row not in the inventory, or a row whose step, sequence, expiry or stored
  bytes differ raises ``IntegrityError``.
* A read keeps the inventory it verified (``head_cache``, ``head_reads``) with a **freshness
  token** of the snapshot it was read in, and sends that token with its next
  read of the turn: the head's statement computes the token again, after the
  read's rows, and leaves the inventory out when it is the same, so the rows
  are checked against the cached inventory, in time independent of the turn's
  length. The token is per turn. SQLite's is the reading connection's
  ``PRAGMA data_version`` with the turn's sealed head, then (when the data
  version moved: another connection committed, to any turn) the exact text of
  the turn's inventory rows read along the turn's index; PostgreSQL's is
  the server's snapshot, then (when that moved) the turn's sealed head with
  the server's SHA-256 of the inventory's rows. On SQLite this process's
  writes edit the cached inventory of the turn they change, as they edit its
  tally (``change``); on PostgreSQL they drop it. What each token
  trusts is in SECURITY.md ("Tampering: the turn heads").

Expiry stays legitimate: an entry whose *sealed* expiry has passed may be
absent (gc subtracts what it collects, in its transaction).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ...core.lru import LRUCache
from ...crypto.primitives import Wrapper
from ...errors import IntegrityError, StoreBusyError
from ...keys.keystore import NEWEST_VERSION_SQL, Keystore
from ...policy import Policy
from ...principal import Principal
from ...storage.base import Backend, Conn, OwnerLockNeeded, Params, Rows
from ..access import audit_log
from .cache import HeadCache, InventoryEdit, Verified
from .checks import HeadChecks
from .last_sealed import Once, once_sql
from .owner import (
    NO_TURNS,
    OWNER_HEAD,
    USAGE_HEAD,
    OwnerHeads,
    check_counted,
    owner_body,
    owner_removed,
    rolled_back,
    usage_body,
    usage_counts,
)
from .quota import Room, record_room, reserve
from .reading import ENTRY_TURN_SQL, InventoryReads, entry_turn_params, without_token
from .tally import (
    KINDS,
    MOD,
    RECORD_KINDS,
    Head,
    HeadEdit,
    Tally,
    entry_item,
    record_item,
    same_entry,
    term,
)

__all__ = [
    "ITEMS_SQL",
    "NO_TURNS",
    "OWNER_HEAD",
    "RECORD_KINDS",
    "USAGE_HEAD",
    "Head",
    "HeadEdit",
    "Heads",
    "Room",
    "Tally",
    "entry_item",
    "expired_sql",
    "record_item",
    "same_entry",
]

# Reads of a turn tried again on a consistent (head, rows) pair before a mismatch is believed.
_CONSISTENT_TRIES = 8
# Digest terms kept, so that reading a turn again recomputes only what changed.
_TERM_CACHE = 1 << 14
# Turns this process found tampered (``found_tampered``), checked again before a write into them.
_TAMPERED = 1 << 12
T = TypeVar("T")
# A turn's head, its owner head and usage head (writers); ``turn`` is the placeholder of the turn's id.
_HEAD_SQL = (
    "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
    " WHERE owner_user_id = ? AND turn_id IN ({turn}, ?, ?) ORDER BY turn_id"
)
# What gc collects at a cutoff, by turn (``prune``), and the clear items of one turn (``items``).
ITEMS_SQL = (
    "SELECT 'e' AS k, owner_user_id, turn_id, id, step_num AS n, expires_at, stored_bytes, actor, channel"
    " FROM entries WHERE {where}"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM checkpoints"
    " WHERE {where}"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM compaction_marks"
    " WHERE {where}"
)

# The turns with expired rows (a quick gc's first look), and one turn's expired rows.
_EXPIRED_TURNS_SQL = " UNION ".join(
    f"SELECT owner_user_id, turn_id FROM {table} WHERE expires_at <= ?"
    for table in ("entries", "checkpoints", "compaction_marks")
)
_TURN_EXPIRED = "owner_user_id = ? AND turn_id = ? AND expires_at <= ?"


class Heads(HeadChecks, OwnerHeads):
    """The sealed heads of one store. Safe to share between threads."""

    def __init__(self, db: Backend, keys: Keystore, policy: Policy) -> None:
        HeadChecks.__init__(self, policy)
        OwnerHeads.__init__(self, db, keys)
        self._term = functools.lru_cache(maxsize=_TERM_CACHE)(functools.partial(term, keys.counter_seal))
        self._cache = HeadCache()
        self.reads = InventoryReads(db, self._cache)
        self._tampered: LRUCache[tuple[str, str], str] = LRUCache(_TAMPERED)
        keys.on_first_key = self.first_owner_head

    def cache_limit(self, turns: int) -> None:
        """Keep at most ``turns`` verified inventories (``head_cache``); 0 turns the
        cache off, so that every read recounts its turn (the benchmark's "before")."""
        self._cache.limit(turns)

    # -- reading ---------------------------------------------------------------------------

    def checked(
        self,
        owner: str,
        turn_id: str,
        fetch: Callable[[], T],
        check: Callable[[Head, T], None],
        first: tuple[T, Rows] | None = None,
    ) -> T:
        """``fetch()`` checked by ``check(head, fetched)`` against the turn's head.

        ``first`` is a first ``(fetched, head rows)`` pair the caller read
        together (``Backend.queries``: one round trip on PostgreSQL, the head's
        query from ``read_sql`` or ``entry_read_sql``); without it the first
        try fetches, then reads the head.

        **A verified inventory is reused** (``head_cache``) while the read's
        freshness token is the one it was verified with: the rows are then
        checked against it, and no inventory is fetched or recounted. The token
        is computed in the head's statement, after the rows were read: SQLite's
        data version of this thread's connection (it moves with every commit
        of another connection) and the turn's sealed head, then the text of
        the turn's inventory rows when the data version moved (this process's
        writes edit the cached inventory, in ``change``), or PostgreSQL's
        snapshot, turn head and the server's
        SHA-256 of the inventory's rows (the last two not even computed while
        the snapshot is the one sent; ``InventoryReads.holds``). The statement
        leaves the inventory out when the token is the one the read sent (its
        cached inventory's), and sends it otherwise: one statement either way.
        A check that fails against the cached inventory reads and verifies the
        inventory as below, and keeps it.

        The head and inventory are read after the rows: a writer that commits
        between the two reads makes them disagree, so a failed check is tried
        again on a consistent pair (head and inventory equal before and after
        the fetch) before it is believed; so is a failed fetch (a rotation may
        retire the key version of the rows it read). The common path costs one query, one
        AES-GCM open and one HMAC per row of the turn not read before.

        Raises:
            IntegrityError: the check fails on a consistent pair.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        scope = self._db.read_scope()
        try:
            if first is None:
                fetched = fetch()
                head_rows = self._db.query(*self.read_sql(owner, turn_id), owner=owner)
            else:
                fetched, head_rows = first
            token, same = self.reads.token(head_rows, turn_id)
            entry = self._cache.get(scope, owner, turn_id)
            if entry is not None and token is not None and self.reads.holds(entry.token, token):
                try:
                    check(entry.head, fetched)
                    kept = self.reads.kept(entry.token, token)
                    if entry.token != kept:  # the same inventory in a newer snapshot
                        self._cache.put(scope, owner, turn_id, kept, entry.head)
                    return fetched
                except IntegrityError:
                    self._cache.drop(owner, turn_id)
                    same = True  # read the inventory itself
            if same:  # the statement left out an inventory no longer cached (another thread's change)
                head_rows = self._rows(owner, turn_id)
            head = self._from_rows(head_rows, owner, turn_id)
            check(head, fetched)
            self.reads.keep(scope, owner, turn_id, head_rows, head)
            return fetched
        except IntegrityError:
            pass  # tampering, or a writer or a rotation (a key retired) between the reads
        for _ in range(_CONSISTENT_TRIES):
            with self._one_snapshot():
                before = self._rows(owner, turn_id)
                fetched = fetch()
                after = self._rows(owner, turn_id)
            if without_token(after) == without_token(before):
                try:
                    head = self._from_rows(before, owner, turn_id)
                    check(head, fetched)
                except IntegrityError as exc:
                    self.found_tampered(owner, turn_id, str(exc))
                    raise
                self.reads.keep(scope, owner, turn_id, before, head)
                return fetched
        raise StoreBusyError(f"turn {turn_id!r} kept changing while it was read; try again")

    def _one_snapshot(self) -> AbstractContextManager[object]:
        """A read transaction on SQLite, outside a transaction (``Database.snapshot``):
        a pair read inside is consistent, whatever other connections commit;
        elsewhere nothing (the pair is compared, and read again when it differs)."""
        snapshot = getattr(self._db, "snapshot", None)
        conn = getattr(self._db, "conn", None)
        if snapshot is None or conn is None or not conn.getautocommit():
            return contextlib.nullcontext()
        opened: AbstractContextManager[object] = snapshot()
        return opened

    def read_sql(self, owner: str, turn_id: str) -> tuple[str, Params]:
        """``InventoryReads.read_sql``: what a read of the turn sends beside its rows."""
        return self.reads.read_sql(owner, turn_id)

    def entry_read_sql(self, owner: str, entry_id: str, scope: Sequence[tuple[str, str]]) -> tuple[str, Params]:
        """``read_sql`` for the turn of entry ``entry_id``, found within ``scope`` (``Policy.scope_columns``)."""
        return self.reads.entry_read_sql(owner, entry_id, scope)

    @staticmethod
    def select_sql(owner: str, turn_id: str) -> tuple[str, Params]:
        """The query of a turn's head rows (the turn's, the owner and usage heads), as
        ``change`` reads them (for ``Conn.prefetch``)."""
        return _HEAD_SQL.format(turn="?"), (owner, turn_id, OWNER_HEAD, USAGE_HEAD)

    @staticmethod
    def entry_select_sql(owner: str, entry_id: str, scope: Sequence[tuple[str, str]]) -> tuple[str, Params]:
        """``select_sql`` for the turn of entry ``entry_id`` (read with, or before, the entry's row),
        found within ``scope`` (``Policy.scope_columns``: no default, so that no caller
        forgets the channel and actor a policy names)."""
        found = entry_turn_params(entry_id, scope)
        return _HEAD_SQL.format(turn=ENTRY_TURN_SQL), (owner, *found, OWNER_HEAD, USAGE_HEAD)

    @staticmethod
    def newest_sql(owner: str) -> tuple[str, Params]:
        """The owner's newest key version, as ``change`` reads it without a version (for ``Conn.prefetch``)."""
        return f"SELECT {NEWEST_VERSION_SQL} AS v", (owner,)

    def _rows(self, owner: str, turn_id: str) -> list[dict[str, Any]]:
        """The turn's head rows, inventory and token, whatever is cached."""
        return self._db.query(*self.reads.sql("?", turn_id, owner), owner=owner)

    def _from_rows(self, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Head:
        """The turn's inventory, authenticated by its head (rows of ``InventoryReads.sql``)."""
        by_turn = {row["turn_id"]: row for row in rows if row["k"] == "h"}
        if turn_id not in by_turn and OWNER_HEAD not in by_turn and any(row["k"] == "k" for row in rows):
            raise owner_removed(owner)  # the owner has a key (a "k" row) but no heads
        tally = self._turn_tally(by_turn, owner, turn_id)
        head = Head()
        tally.check_found(self._recount(head, rows, owner, turn_id), turn_id)
        return head

    def _recount(self, head: Head, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Tally:
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

    def terms(self, owner: str, turn_id: str) -> Callable[[str, str, tuple[Any, ...]], int]:
        return functools.partial(self._term, owner, turn_id)

    def load(self, owner: str, turn_id: str) -> Head:
        """The turn's inventory (empty for a turn that never held anything), authenticated.

        One query fetches the turn's head, the owner head and the inventory;
        the owner head is opened only when the turn has no head, to tell a new
        turn from a vanished one.

        Raises:
            IntegrityError: a head fails authentication, the inventory differs
                from the head, or the turn's head is missing while the owner
                head lists the turn.
        """
        return self._from_rows(self._rows(owner, turn_id), owner, turn_id)

    def tally_of(self, owner: str, turn_id: str) -> HeadEdit:
        """An empty tally to add authenticated rows to (``verify``), compared with ``Tally.check_found``."""
        return HeadEdit(Tally(), self.terms(owner, turn_id))

    def checked_last(
        self, principal: Principal, turn_id: str, fetch: Callable[[], dict[str, Any] | None], now: float
    ) -> dict[str, Any] | None:
        """``fetch()`` (the turn's newest live row in the principal's scope, or
        None) checked against the head. When the head knows that row (its
        ``newest``, live and in scope) the head alone answers: one small row,
        whatever the turn's length; otherwise the inventory does (``checked``).

        Raises:
            IntegrityError: the row is not the turn's newest.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        owner = principal.owner_user_id
        for _ in range(_CONSISTENT_TRIES):
            row = fetch()
            rows = self._db.query(*self.select_sql(owner, turn_id), owner=owner)
            by_turn = {each["turn_id"]: each for each in rows}
            newest = self._tally(by_turn[turn_id], owner, turn_id).newest if turn_id in by_turn else None
            if newest is None or newest[2] <= now or not self._in_scope(principal, newest[3], newest[4]):
                break
            if row is not None and (row["id"], row["step_num"]) == (newest[0], newest[1]):
                return row
        return self.checked(
            owner,
            turn_id,
            fetch,
            lambda head, found: self.check_newest_first(
                head, principal, turn_id, [] if found is None else [found], now, complete=found is None
            ),
        )

    def found_tampered(self, owner: str, turn_id: str, problem: str) -> None:
        """Remember that the turn failed its check (a read on a consistent
        pair, ``verify``, gc's ``prune``) and how: every later write into it
        in this process checks it in its transaction (``change``), and is
        refused with that ``problem`` while it fails."""
        self._tampered[(owner, turn_id)] = problem

    def _check_written(self, conn: Conn, owner: str, turn_id: str, problem: str | None) -> None:
        """For a turn this process found tampered (``problem``, None for any
        other): its inventory, the write's own rows and head included, checked
        against that head inside the write's transaction (O(the turn's rows),
        only for such a turn). A turn put back as it was (a backup restored)
        is forgotten and takes writes again.

        Raises:
            IntegrityError: ``problem``: the turn still fails its check.
        """
        if problem is None:
            return
        try:
            self._from_rows(conn.query(*self.reads.sql("?", turn_id, owner)), owner, turn_id)
        except IntegrityError:
            raise IntegrityError(problem) from None
        self._tampered.pop((owner, turn_id))

    # -- writing: the one place ------------------------------------------------------------

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
        """Apply ``edit`` to the turn's tally and seal it again, inside the
        caller's write transaction, under the owner's newest key version
        (``version`` when the caller's transaction already checked it is the
        newest); a turn new to the owner joins the owner head, and the turn's
        reservation and the owner's usage head follow the entries' stored
        bytes it adds or removes (``head_owner``), in the same upsert. Reads
        and writes small rows, whatever the turn holds. Returns the turn's
        reservation left unused (``r - b``) after the change.

        A write that adds entries gives ``room`` (its quota check): when the
        turn's reservation does not cover them, the turn is granted more
        (``head_owner.grant``), reclaiming other turns' unused reservations
        when the quota has no room for it. ``turn_only``: the caller holds the
        owner's lock shared (``Backend.transaction(owner, turn=...)``), so
        nothing but the turn's head may change: a new turn, or bytes past the
        turn's reservation, raise ``OwnerLockNeeded`` instead.

        The steps: read the head rows (``_heads_of``: no round trip of its
        own; ``rows``, the head rows when the caller read them in a statement
        of its own, ``head_beside``, or ``entry_select_sql``);
        open the turn's tally (``_turn_tally``) and apply ``edit``; write
        (deferred, ``Conn.defer``: with COMMIT on PostgreSQL) the caller's
        ``insert`` alone when the tally did not change, the turn head alone
        under the shared lock, or what the owner's exclusive lock may change
        too (``_owner_bodies``); without ``version``, the newest is read with
        the SQL of ``newest_sql``, which a caller announces too. ``insert``: the
        caller's insert of the rows the edit adds, not yet sent: it goes with
        the upsert (``OwnerHeads.write_bodies``: one statement on PostgreSQL).

        A change that leaves the turn with no row (``OwnerHeads.drop``: delete, gc)
        deletes the turn's head and drops the turn from the owner head and its
        reservation from the usage head, in the same transaction (under the
        shared lock: ``OwnerLockNeeded``); it returns 0. With ``dropped``
        (gc's ``prune``, which may empty many turns of an owner), the turn and
        its reservation are added to it instead, for the caller to drop from
        the owner's heads once (``OwnerHeads.drop``).

        The turn's verified inventory cached in this process for this
        thread's connection (``head_cache``) is edited as the tally is
        (``InventoryEdit``) and kept with the head sealed here
        (``InventoryReads.written``), when the head read in this transaction
        is the one it was verified with (SQLite; a write that rolls back
        leaves a head that is not the stored one, and the next read verifies
        the turn again); elsewhere, and in other connections, it is dropped.

        A turn this process found tampered (``found_tampered``) is checked
        once the write is done, in its transaction (``_check_written``): a
        write into a turn whose check fails is refused as its reads are.

        Raises:
            IntegrityError: the stored head fails authentication, or the turn
                was found tampered and still fails its check.
            QuotaExceededError: ``room`` has none for the entries added, even
                counting the owner's live entries only.
            OwnerLockNeeded: with ``turn_only``, as above.
        """
        scope = self._db.read_scope()
        kept = self._cache.take(scope, owner, turn_id)
        tampered = self._tampered.get((owner, turn_id))
        by_turn = self._heads_of(conn, owner, turn_id, rows)
        if turn_only and turn_id not in by_turn:
            raise OwnerLockNeeded  # a new turn joins the owner head: the exclusive lock's
        tally = self._turn_tally(by_turn, owner, turn_id)
        before, reserved = tally.dumps(), tally.r
        change = InventoryEdit(tally, self.terms(owner, turn_id), self._kept_head(kept, by_turn.get(turn_id)))
        edit(change)
        tally.b = max(tally.b, 0)
        if turn_id in by_turn and not any(tally.n.values()):  # the turn left empty: it goes
            if turn_only:
                raise OwnerLockNeeded  # the owner head and the usage head change
            self.delete_head(conn, owner, turn_id)
            if dropped is not None:  # the caller drops its turns from the owner's heads at once
                dropped.setdefault(owner, {})[turn_id] = reserved
            else:
                self.drop(conn, owner, {turn_id: reserved}, by_turn, version)
            self._check_written(conn, owner, turn_id, tampered)
            return 0
        body = tally.dumps()  # what a write within the reservation seals, unchanged below (one JSON less)
        if body == before:  # nothing the head counts changed: the caller's insert alone
            if insert is not None:
                conn.defer(*insert)
            self._check_written(conn, owner, turn_id, tampered)
            if kept is not None and change.head is not None:
                self._cache.put(scope, owner, turn_id, kept.token, change.head)
            return tally.r - tally.b
        if turn_only:
            if tally.b > tally.r or change.bytes < 0:
                raise OwnerLockNeeded  # the reservation is short: the owner's usage head must change
            bodies = [(turn_id, body)]
        else:
            bodies = self._owner_bodies(conn, owner, turn_id, by_turn, tally, change.bytes, room, version)
        spare = tally.r - tally.b  # before the tally is handed on (``head_last``: a put in one message edits it)
        sealed = self.write_bodies(conn, owner, bodies, version, insert)
        self.last.attach(owner, turn_id, bodies[0][1], tally)
        self._check_written(conn, owner, turn_id, tampered)
        if kept is not None and change.head is not None:
            self._cache.put(scope, owner, turn_id, self.reads.written(kept.token, sealed[0]), change.head)
        return spare

    def _kept_head(self, kept: Verified | None, stored: dict[str, Any] | None) -> Head | None:
        """The cached inventory a write of the turn edits along with its tally:
        the one taken out of the cache when its token says the stored head
        (read in the write's transaction) is the one it was verified with, or
        sealed by this connection's last write of the turn; None otherwise (the
        turn is verified again at its next read)."""
        if kept is None or stored is None or not self.reads.keeps_writes:
            return None
        return kept.head if self.reads.sealed_of(kept.token) == bytes(stored["sealed"]) else None

    def change_once(
        self,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        sealing: tuple[int, Wrapper],
        insert: tuple[str, Params],
        condition: tuple[str, Params] | None = None,
    ) -> Once | None:
        """``change`` of a turn whose head this process sealed last, without
        reading it (``head_last``): the next head (``LastSealed.following``) and
        one statement that writes it with the caller's ``insert`` (``INSERT ...
        SELECT`` of one row, completed with ``FROM head``) only if the stored
        head is still the recorded one, the key version of ``sealing`` (the
        version and its wrapper, the caller's entry's) is the owner's newest
        and ``condition`` (SQL) holds (``once_sql``); for the caller to send in
        one message (``entry_put``) and, once it wrote, to record
        (``last.record``). None when there is no record, or the edit needs
        more than the turn's reservation (the owner's exclusive lock:
        ``change``). Raises nothing of its own: the head is sealed in memory."""
        version, wrapper = sealing
        if self._tampered.get((owner, turn_id)) is not None:
            return None  # ``change`` checks the turn with the write
        found = self.last.following(owner, turn_id, edit, self.terms(owner, turn_id), wrapper, version)
        if found is None:
            return None
        last, head, spare = found
        self._cache.drop(owner, turn_id)
        self._keys.count_wraps_later(owner, version, 1)
        sql, params = once_sql(insert, owner, turn_id, head, last, condition)
        return Once(sql, params, head, spare)

    def _heads_of(self, conn: Conn, owner: str, turn_id: str, rows: Rows | None) -> dict[str, dict[str, Any]]:
        """``change``'s head rows by turn id (the turn's, the owner head and
        the usage head): ``rows`` when the caller read them beside its own
        row, else read here with the SQL of ``select_sql``, which a caller
        announces at the start of its transaction (``Conn.prefetch``), so that
        the read costs no round trip of its own on PostgreSQL."""
        if rows is None:
            rows = conn.query(*self.select_sql(owner, turn_id))
        return {row["turn_id"]: row for row in rows}

    def _turn_tally(self, by_turn: dict[str, dict[str, Any]], owner: str, turn_id: str) -> Tally:
        """The turn's tally as its head seals it, or an empty one for a turn
        the owner never wrote; a turn the owner head lists but that has no head
        was removed, rows and head together (the owner head is opened only then).

        Raises:
            IntegrityError: a head fails authentication, or the turn lost its head.
        """
        if turn_id in by_turn:
            return self._tally(by_turn[turn_id], owner, turn_id)
        if OWNER_HEAD in by_turn and turn_id in self.owner_head(by_turn[OWNER_HEAD], owner):
            raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
        return Tally()

    def _owner_bodies(
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
        """What a change under the owner's exclusive lock seals: the turn head,
        its reservation set for the ``added`` bytes (``head_quota.reserve``:
        granted, reclaimed from other turns, or refused; ``record_room`` for a
        record), the owner head when the turn is new, and the usage head when
        the owner's total reservation moved.

        Raises:
            IntegrityError: the owner's heads were removed, or one fails authentication.
            QuotaExceededError: ``room`` has none for what the write adds.
        """
        if OWNER_HEAD not in by_turn:
            # Every owner with a key has an owner head (``first_owner_head``), and a
            # write that changes a turn has a key: none means the owner's heads were removed.
            raise owner_removed(owner)
        usage = by_turn.get(USAGE_HEAD)
        total, counted = (None, None) if usage is None else usage_counts(self.open_body(usage, owner, USAGE_HEAD))
        if counted is None and tally.o:
            # A usage head deleted, or without the counter (from before it, or seeded at the
            # heads' build), for a turn that saw the counter: the owner head's counter decides,
            # and one from before the counter counts none (it never goes back to none).
            check_counted(tally, self.owner_turns(by_turn[OWNER_HEAD], owner)[1] or 0, owner, turn_id)
        else:
            check_counted(tally, counted, owner, turn_id)

        def reclaim(total: int) -> int:
            return self.reclaim(conn, owner, total, turn_id, version)

        reserved = reserve(tally, added, total, room, reclaim)
        if room is not None and room.records_adding:
            reserved = record_room(tally, reserved, room, reclaim)
        new_turn = turn_id not in by_turn
        if new_turn:  # the owner's turn counter grows, in its owner head and usage head
            turns, created = self.owner_turns(by_turn[OWNER_HEAD], owner)
            if None not in (created, counted) and created != counted:
                raise rolled_back(owner, "its owner head and its usage head count different turns")
            counted = max(created if created is not None else len(turns), counted or 0) + 1
            bodies = [(OWNER_HEAD, owner_body(turns | {turn_id}, counted))]
        else:
            bodies = []
        if counted is not None:
            tally.o = max(tally.o, counted)
        bodies.insert(0, (turn_id, tally.dumps()))
        if reserved is not None and (reserved != total or new_turn):  # none: unknown, the quota sums
            bodies.append((USAGE_HEAD, usage_body(reserved, counted)))
        return bodies

    def drop_turn(self, conn: Conn, owner: str, turn_id: str) -> int:
        """Delete the turn's head and drop the turn from the owner head and its
        reservation from the usage head, whatever the turn's check says, inside
        the caller's transaction, which deleted the turn's rows
        (``lifecycle.drop_turn``: the explicit way out of a turn found
        tampered). A turn head that fails to open leaves the usage head the
        sum of the reservations of the other turns whose heads open (those
        that fail count nothing, so that each can be dropped in turn).
        Returns the heads deleted (0 or 1).

        Raises:
            IntegrityError: the owner head or usage head fails authentication.
        """
        self._cache.drop(owner, turn_id)  # the turn stays found tampered until the drop commits: ``turn_dropped``
        by_turn = self._heads_of(conn, owner, turn_id, None)
        reserved: int | None = None
        if turn_id in by_turn:
            try:
                reserved = self._tally(by_turn[turn_id], owner, turn_id).r
            except IntegrityError:
                reserved = None
        if OWNER_HEAD not in by_turn:  # the owner's heads were removed: its reads say so
            self.last.take(owner, turn_id)
            return conn.execute("DELETE FROM turn_heads WHERE owner_user_id = ? AND turn_id = ?", (owner, turn_id))
        self.delete_head(conn, owner, turn_id)
        if reserved is None and USAGE_HEAD in by_turn:
            rows = conn.query(
                "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
                " WHERE owner_user_id = ? AND turn_id NOT IN (?, ?, ?)",
                (owner, OWNER_HEAD, USAGE_HEAD, turn_id),
            )
            total = usage_counts(self.open_body(by_turn[USAGE_HEAD], owner, USAGE_HEAD))[0]
            others = 0
            for row in rows:  # another turn's head that fails to open counts nothing: it can be dropped too
                with contextlib.suppress(IntegrityError):
                    others += self._tally(row, owner, row["turn_id"]).r
            reserved = total - others
        self.drop(conn, owner, {turn_id: reserved or 0}, by_turn, None)
        return 1 if turn_id in by_turn else 0

    def turn_dropped(self, owner: str, turn_id: str) -> None:
        """Forget that the turn was found tampered, once its drop (``drop_turn``)
        committed: a drop refused or rolled back leaves its writes refused."""
        self._tampered.pop((owner, turn_id))

    def reclaim(self, conn: Conn, owner: str, total: int, turn_id: str, version: int | None = None) -> int:
        """Give back the unused reservation of every turn of the owner but
        ``turn_id`` (their heads rewritten with ``r = b``), inside the caller's
        write transaction under the owner's exclusive lock (a put near the
        quota); the owner's total reservation ``total`` less what was given
        back. A head that fails to open keeps its reservation (its reads and
        ``verify`` name it). One query and one upsert, O(the owner's turns)."""
        rows = conn.query(
            "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
            " WHERE owner_user_id = ? AND turn_id NOT IN (?, ?, ?)",
            (owner, OWNER_HEAD, USAGE_HEAD, turn_id),
        )
        bodies: list[tuple[str, bytes]] = []
        for row in rows:
            try:
                tally = self._tally(row, owner, row["turn_id"])
            except IntegrityError:
                continue
            if tally.r > tally.b:
                total -= tally.r - tally.b
                tally.r = tally.b
                bodies.append((row["turn_id"], tally.dumps()))
                self._cache.drop(owner, row["turn_id"])
        if bodies:
            self.write_bodies(conn, owner, bodies, version)
        return max(total, 0)

    def converted(self, conn: Conn, row: dict[str, Any]) -> bytes | None:
        """A format-2 turn head's tally (``row``, as stored) in this format, with
        ``b`` and ``r`` its authenticated inventory's bytes (``head_build``, at
        open); None when it is not of format 2, or fails authentication (it
        stays: its reads refuse it, ``verify`` names it)."""
        owner, turn_id = row["owner_user_id"], row["turn_id"]
        try:
            body = self.open_body(row, owner, turn_id)
            if json.loads(body).get("f") != 2:
                return None
            tally = Tally.loads(body, before=True)
            head = Head()
            found = self._recount(head, conn.query(*self.reads.sql("?", turn_id, owner, kept=False)), owner, turn_id)
            tally.check_found(found, turn_id)
        except (IntegrityError, ValueError, AttributeError):
            return None
        tally.b = tally.r = sum(int(item[2]) for item in head.e.values())
        return tally.dumps()

    @staticmethod
    def items(conn: Conn, owner: str, turn_id: str) -> dict[str, dict[str, list[Any]]]:
        """The clear items of a turn's rows, by kind (``{"e": {id: item}, ...}``), inside
        the caller's transaction: what an extension replaces (``extend_head``)."""
        where = "owner_user_id = ? AND turn_id = ?"
        found: dict[str, dict[str, list[Any]]] = {kind: {} for kind in KINDS}
        for row in conn.query(ITEMS_SQL.format(where=where), (owner, turn_id) * 3):
            found[row["k"]][row["id"]] = entry_item(row) if row["k"] == "e" else record_item(row)
        return found

    def prune(self, conn: Conn, cutoff: float, budget: int | None = None) -> tuple[int, list[tuple[str, str]]]:
        """Subtract what gc collects at ``cutoff`` from the heads of the turns it
        collects from (inside gc's transaction, before its deletes: the same
        rows). Returns the heads changed, and the turns gc must leave alone.

        A turn is collected from only when its inventory matches its head: the
        clear ``expires_at`` gc selects by is then the sealed one. A turn that
        fails the check (an expiry moved earlier, a relabelled or forged row,
        anything else) keeps every row and its head, so that gc never deletes
        the evidence of tampering or a row whose sealed expiry has not passed;
        its reads and ``verify`` keep refusing it, and the audit log names it.

        With ``budget``, the rows of the turns recounted stay within it: a
        turn whose head counts more rows than are left (read from its head
        alone) is left alone too, for a gc with a larger budget or none.
        """
        by_turn: dict[tuple[str, str], list[dict[str, Any]]] = {}
        if budget is None:
            for row in conn.query(ITEMS_SQL.format(where="expires_at <= ?"), (cutoff,) * 3):
                by_turn.setdefault((row["owner_user_id"], row["turn_id"]), []).append(row)
        else:  # the turns first: a turn left alone costs one row, not its expired ones
            for row in conn.query(_EXPIRED_TURNS_SQL, (cutoff,) * 3):
                by_turn[(row["owner_user_id"], row["turn_id"])] = []
        kept: list[tuple[str, str]] = []
        dropped: dict[str, dict[str, int]] = {}
        for (owner, turn_id), rows in by_turn.items():
            try:
                if budget is not None:
                    counted = (
                        sum(self._turn_tally(self._heads_of(conn, owner, turn_id, None), owner, turn_id).n.values())
                        if budget > 0
                        else 1
                    )
                    if counted > budget:
                        kept.append((owner, turn_id))
                        continue
                    budget -= counted
                    rows.extend(conn.query(ITEMS_SQL.format(where=_TURN_EXPIRED), (owner, turn_id, cutoff) * 3))
                self._from_rows(conn.query(*self.reads.sql("?", turn_id, owner, kept=False)), owner, turn_id)
            except IntegrityError as exc:
                audit_log.warning("gc left turn %r of owner %r uncollected: %s", turn_id, owner, exc)
                self.found_tampered(owner, turn_id, str(exc))
                kept.append((owner, turn_id))
                continue
            self.change(conn, owner, turn_id, functools.partial(_remove_rows, rows=rows), dropped=dropped)
        for owner, turns in dropped.items():  # once per owner, however many of its turns gc emptied
            self.drop(conn, owner, turns, self._heads_of(conn, owner, OWNER_HEAD, None), None)
        return len(by_turn) - len(kept), kept

    def reseal_owner(self, conn: Conn, owner: str) -> int:
        """Seal every head of the owner again under its newest key version (an
        owner-key rotation, before the old versions retire). Returns how many.
        The tallies' key is the store's, so they carry over unchanged."""
        rows = conn.query(
            "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = ?", (owner,)
        )
        for row in rows:
            self.write_body(conn, owner, row["turn_id"], self.open_body(row, owner, row["turn_id"]))
        return len(rows)


def expired_sql(cutoff: float, kept: list[tuple[str, str]]) -> tuple[str, Params]:
    """The condition (and its values) of what gc deletes at ``cutoff``: expired
    rows, except those of the turns ``prune`` left alone."""
    keep = " OR ".join(["(owner_user_id = ? AND turn_id = ?)"] * len(kept))
    return "expires_at <= ?" + (f" AND NOT ({keep})" if kept else ""), (cutoff, *(v for pair in kept for v in pair))


def add_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.add(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))


def _remove_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.remove(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))
