"""Sealed turn heads: what each turn holds, so that a row cannot vanish unseen.

Every entry and every turn record is authenticated on its own; what a single
row cannot say is that it is *missing*. A head per (owner, turn) holds a
constant-size **tally** of what the turn holds: for each kind (``e`` entries,
``c`` checkpoints, ``m`` compaction marks) a count and a keyed multiset digest,
and the highest step ever recorded. An owner head (turn id ``""``) lists the
owner's turns, so a whole turn (rows and head) cannot vanish either.

**The digest** of a kind is the sum, mod 2**256, of one HMAC-SHA256 per row
over the row's clear columns that matter (owner, turn, kind, id, step or
sequence number, expiry, stored bytes, actor, channel), under a key derived
from the master key (``Keystore.counter_seal``, the anchor key; HKDF label
``anchor``). A sum can be added to and subtracted from: a put adds its row, a
delete or gc subtracts, an extension swaps the old row for the new one, each
in O(1), so a write of a turn costs the same whatever the turn's length
(issue 14). The HMAC is keyed because the rows' clear columns are the
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
  (``reseal_owner``). It reads and rewrites one small row.
* Every read of a turn fetches the turn's head together with the turn's
  **inventory** (the clear columns above of every row of the turn, expired
  ones not yet collected included: ``checked_sql``), recomputes the tally
  from it, and refuses a difference; the inventory, so authenticated, is the
  ``Head`` the read's rows are then checked against (``check_entries``,
  ``check_entry``, ``check_records``): a row absent before its sealed expiry,
  a row not in the inventory, or a row whose step, sequence, expiry or stored
  bytes differ raises ``IntegrityError``.

Expiry stays legitimate: an entry whose *sealed* expiry has passed may be
absent (gc subtracts what it collects, in its transaction).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._backend import Backend, Conn, Params, Rows
from .crypto import CounterSeal, Wrapper, head_aad
from .errors import IntegrityError, StoreBusyError
from .keystore import NEWEST_VERSION_SQL, Keystore
from .policy import Policy
from .principal import Principal

__all__ = [
    "OWNER_HEAD",
    "RECORD_KINDS",
    "Head",
    "HeadEdit",
    "Heads",
    "Tally",
    "entry_item",
    "record_item",
    "same_entry",
]

OWNER_HEAD = ""
# Head sections of the turn records, by table.
RECORD_KINDS = {"checkpoints": "c", "compaction_marks": "m"}
KINDS = {"e": "entries", "c": "checkpoints", "m": "compaction_marks"}
HEAD_FORMAT = 2
_NO_TURNS = json.dumps({"t": []}).encode()
_MOD = 1 << 256
# Reads of a turn tried again on a consistent (head, rows) pair before a mismatch is believed.
_CONSISTENT_TRIES = 8
# Digest terms kept, so that reading a turn again recomputes only what changed.
_TERM_CACHE = 1 << 14
T = TypeVar("T")
# A turn's head and its owner head (writers); ``turn`` is the placeholder of the turn's id.
_HEAD_SQL = (
    "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
    " WHERE owner_user_id = ? AND turn_id IN ({turn}, ?) ORDER BY turn_id"
)
# The same with the turn's inventory (readers): one statement, so one snapshot
# and one round trip; expired rows not yet collected are part of the tally.
_INVENTORY_SQL = (
    "SELECT 'h' AS k, owner_user_id, turn_id, key_version, sealed, NULL AS id, NULL AS n,"
    " NULL AS expires_at, NULL AS stored_bytes, NULL AS actor, NULL AS channel FROM turn_heads"
    " WHERE owner_user_id = ? AND turn_id IN ({turn}, ?)"
    " UNION ALL SELECT 'e', owner_user_id, turn_id, NULL, NULL, id, step_num, expires_at, stored_bytes, actor,"
    " channel FROM entries WHERE owner_user_id = ? AND turn_id = {turn}"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, NULL, NULL, id, seq, expires_at, NULL, actor, channel"
    " FROM checkpoints WHERE owner_user_id = ? AND turn_id = {turn}"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, NULL, NULL, id, seq, expires_at, NULL, actor, channel"
    " FROM compaction_marks WHERE owner_user_id = ? AND turn_id = {turn}"
    " UNION ALL SELECT 'k', owner_user_id, '', MAX(version), NULL, NULL, NULL, NULL, NULL, NULL, NULL"
    " FROM owner_keys WHERE owner_user_id = ? GROUP BY owner_user_id"
    " ORDER BY k, turn_id, id"
)
# The turn of one entry (``entry_select_sql``); the heads read are the owner's
# whoever the row's owner is, as when the caller reads the turn's head itself.
_ENTRY_TURN_SQL = "(SELECT turn_id FROM entries WHERE id = ?)"
# What gc collects at a cutoff, by turn (``prune``), and the clear items of one turn (``items``).
_ITEMS_SQL = (
    "SELECT 'e' AS k, owner_user_id, turn_id, id, step_num AS n, expires_at, stored_bytes, actor, channel"
    " FROM entries WHERE {where}"
    " UNION ALL SELECT 'c', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM checkpoints"
    " WHERE {where}"
    " UNION ALL SELECT 'm', owner_user_id, turn_id, id, seq, expires_at, NULL, actor, channel FROM compaction_marks"
    " WHERE {where}"
)


@dataclass
class Head:
    """What a turn holds, as its authenticated inventory: ``e`` entries ``{id:
    [step, expires_at, stored_bytes, actor, channel]}``; ``c``/``m`` records
    ``{id: [seq, expires_at, actor, channel]}``."""

    e: dict[str, list[Any]] = field(default_factory=dict)
    c: dict[str, list[Any]] = field(default_factory=dict)
    m: dict[str, list[Any]] = field(default_factory=dict)

    def section(self, kind: str) -> dict[str, list[Any]]:
        return {"e": self.e, "c": self.c, "m": self.m}[kind]


@dataclass
class Tally:
    """The sealed body of a turn head: per kind a count and a digest, the
    highest step ever recorded, and the newest entry (``[id, step, expires_at,
    actor, channel]`` of the highest (step, id); None when the turn holds no
    entry, or when the newest was deleted or collected and the next one is not
    known yet). Constant size, whatever the turn holds."""

    n: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    d: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    last: int = 0
    newest: list[Any] | None = None

    def dumps(self) -> bytes:
        body = {
            "f": HEAD_FORMAT,
            "n": self.n,
            "d": {k: format(v, "064x") for k, v in self.d.items()},
            "l": self.last,
            "w": self.newest,
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes) -> Tally:
        try:
            body = json.loads(data)
            if body["f"] != HEAD_FORMAT:
                raise ValueError("format")
            n = {kind: _count(body["n"][kind]) for kind in KINDS}
            d = {kind: int(body["d"][kind], 16) for kind in KINDS}
            newest = body["w"]
            if newest is not None and (not isinstance(newest, list) or len(newest) != 5):
                raise ValueError("newest")
            return cls(n, d, _count(body["l"]), newest)
        except (ValueError, KeyError, TypeError):
            raise IntegrityError(
                "a turn head is malformed or from an older format (a head of before its conversion put back)"
            ) from None


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("count")
    return value


class HeadEdit:
    """One write's change to a turn's tally: rows added, removed, replaced."""

    def __init__(self, tally: Tally, term: Callable[[str, str, tuple[Any, ...]], int]) -> None:
        self.tally = tally
        self._term = term

    def add(self, kind: str, item_id: str, item: list[Any]) -> None:
        """A row ``item`` (``entry_item``/``record_item``) joins the turn."""
        tally = self.tally
        if kind == "e":
            # The newest stays known while entries come in; after the newest left,
            # an entry above every step ever recorded is the newest again.
            newest = tally.newest
            if (
                tally.n["e"] == 0
                or (newest is not None and (int(item[0]), item_id) > (int(newest[1]), newest[0]))
                or (newest is None and int(item[0]) > tally.last)
            ):
                tally.newest = [item_id, item[0], item[1], item[3], item[4]]
            tally.last = max(tally.last, int(item[0]))
        tally.n[kind] += 1
        tally.d[kind] = (tally.d[kind] + self._term(kind, item_id, tuple(item))) % _MOD

    def add_all(self, kind: str, items: Iterable[tuple[str, list[Any]]]) -> None:
        for item_id, item in items:
            self.add(kind, item_id, item)

    def remove(self, kind: str, item_id: str, item: list[Any]) -> None:
        """A row leaves the turn (delete, gc), as its clear columns were."""
        self.tally.n[kind] -= 1
        self.tally.d[kind] = (self.tally.d[kind] - self._term(kind, item_id, tuple(item))) % _MOD
        if kind == "e" and self.tally.newest is not None and self.tally.newest[0] == item_id:
            self.tally.newest = None  # not known until an entry above every step comes in

    def replace(self, kind: str, item_id: str, old: list[Any], new: list[Any]) -> None:
        """A row's clear columns change (an extension): the newest stays the newest."""
        newest = self.tally.newest
        self.remove(kind, item_id, old)
        self.add(kind, item_id, new)
        if kind == "e" and newest is not None and newest[0] == item_id:
            self.tally.newest = [item_id, new[0], new[1], new[3], new[4]]


class Heads:
    """The sealed heads of one store. Safe to share between threads."""

    def __init__(self, db: Backend, keys: Keystore, policy: Policy) -> None:
        self._db = db
        self._keys = keys
        self._policy = policy
        self._term = functools.lru_cache(maxsize=_TERM_CACHE)(functools.partial(_term, keys.counter_seal))
        keys.on_first_key = self.first_owner_head

    # -- reading ---------------------------------------------------------------------------

    def _open(self, row: dict[str, Any], owner: str, turn_id: str) -> bytes:
        version = row["key_version"]
        if not isinstance(version, int) or isinstance(version, bool) or row["turn_id"] != turn_id:
            raise IntegrityError("a turn head's clear fields are malformed")
        if row["owner_user_id"] != owner:
            raise IntegrityError("a turn head belongs to another owner")
        return self._keys.owner_wrapper(owner, version).open(row["sealed"], head_aad(owner, turn_id, version))

    def _tally(self, row: dict[str, Any], owner: str, turn_id: str) -> Tally:
        return Tally.loads(self._open(row, owner, turn_id))

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
        query from ``checked_sql`` or ``entry_checked_sql``); without it the
        first try fetches, then loads the head.

        The head and inventory are read after the rows: a writer that commits
        between the two reads makes them disagree, so a failed check is tried
        again on a consistent pair (head and inventory equal before and after
        the fetch) before it is believed. The common path costs one query, one
        AES-GCM open and one HMAC per row of the turn not read before.

        Raises:
            IntegrityError: the check fails on a consistent pair.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        if first is None:
            fetched = fetch()
            head_rows = self._rows(owner, turn_id)
        else:
            fetched, head_rows = first
        try:
            check(self._from_rows(head_rows, owner, turn_id), fetched)
            return fetched
        except IntegrityError:
            pass
        for _ in range(_CONSISTENT_TRIES):
            before = self._rows(owner, turn_id)
            fetched = fetch()
            if self._rows(owner, turn_id) == before:
                check(self._from_rows(before, owner, turn_id), fetched)
                return fetched
        raise StoreBusyError(f"turn {turn_id!r} kept changing while it was read; try again")

    @staticmethod
    def select_sql(owner: str, turn_id: str) -> tuple[str, Params]:
        """The query of a turn's head rows (the turn's and the owner head), as
        ``change`` reads them (for ``Conn.prefetch``)."""
        return _HEAD_SQL.format(turn="?"), (owner, turn_id, OWNER_HEAD)

    @staticmethod
    def entry_select_sql(owner: str, entry_id: str) -> tuple[str, Params]:
        """``select_sql`` for the turn of entry ``entry_id`` (read with, or before, the entry's row)."""
        return _HEAD_SQL.format(turn=_ENTRY_TURN_SQL), (owner, entry_id, OWNER_HEAD)

    @staticmethod
    def checked_sql(owner: str, turn_id: str) -> tuple[str, Params]:
        """The query of a turn's head rows and inventory, as ``checked`` reads
        them (for ``Backend.queries``, beside the read's own rows)."""
        return _INVENTORY_SQL.format(turn="?"), (owner, turn_id, OWNER_HEAD, *(owner, turn_id) * 3, owner)

    @staticmethod
    def entry_checked_sql(owner: str, entry_id: str) -> tuple[str, Params]:
        """``checked_sql`` for the turn of entry ``entry_id``."""
        return _INVENTORY_SQL.format(turn=_ENTRY_TURN_SQL), (
            owner,
            entry_id,
            OWNER_HEAD,
            *(owner, entry_id) * 3,
            owner,
        )

    @staticmethod
    def newest_sql(owner: str) -> tuple[str, Params]:
        """The owner's newest key version, as ``change`` reads it without a version (for ``Conn.prefetch``)."""
        return f"SELECT {NEWEST_VERSION_SQL} AS v", (owner,)

    def _rows(self, owner: str, turn_id: str) -> list[dict[str, Any]]:
        return self._db.query(*self.checked_sql(owner, turn_id), owner=owner)

    def _from_rows(self, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Head:
        """The turn's inventory, authenticated by its head (rows of ``checked_sql``)."""
        by_turn = {row["turn_id"]: row for row in rows if row["k"] == "h"}
        if turn_id in by_turn:
            tally = self._tally(by_turn[turn_id], owner, turn_id)
        elif OWNER_HEAD in by_turn:
            if turn_id in self._turns(by_turn[OWNER_HEAD], owner):
                raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
            tally = Tally()
        elif any(row["k"] == "k" for row in rows):
            raise _owner_removed(owner)
        else:
            tally = Tally()
        head = Head()
        self._same_tally(tally, self._recount(head, rows, owner, turn_id), turn_id)
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
        found = Tally({kind: len(sections[kind]) for kind in KINDS}, {kind: sums[kind] % _MOD for kind in KINDS})
        if head.e:
            top = max(head.e.items(), key=lambda pair: (int(pair[1][0]), pair[0]))
            found.last = int(top[1][0])
            found.newest = [top[0], top[1][0], top[1][1], top[1][3], top[1][4]]
        return found

    @staticmethod
    def _same_tally(sealed: Tally, found: Tally, turn_id: str) -> None:
        for kind, table in KINDS.items():
            if found.n[kind] != sealed.n[kind]:
                raise IntegrityError(
                    f"turn {turn_id!r} holds {found.n[kind]} {table}, its head {sealed.n[kind]}:"
                    " rows were removed or added (tampering)"
                )
            if found.d[kind] != sealed.d[kind]:
                raise IntegrityError(
                    f"turn {turn_id!r}'s {table} differ from its head (an id, step, expiry, stored bytes or scope"
                    " was altered, or a row replaced): tampering or a rolled-back row"
                )
        if found.last > sealed.last or (sealed.newest is not None and sealed.newest != found.newest):
            raise IntegrityError(f"turn {turn_id!r}'s newest step is not the one its head recorded: tampering")

    def _terms(self, owner: str, turn_id: str) -> Callable[[str, str, tuple[Any, ...]], int]:
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

    def _turns(self, row: dict[str, Any], owner: str) -> set[str]:
        try:
            return set(json.loads(self._open(row, owner, OWNER_HEAD))["t"])
        except (ValueError, KeyError, TypeError):
            raise IntegrityError("an owner head is malformed") from None

    def all_heads(self) -> dict[str, dict[str, Tally | set[str] | IntegrityError]]:
        """Every head of the store, opened: ``{owner: {turn: Tally}}``, the owner head
        under ``""`` as its set of turns; a head that fails to open is its error (``verify``)."""
        found: dict[str, dict[str, Tally | set[str] | IntegrityError]] = {}
        rows = self._db.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads", admin=True)
        for row in rows:
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            opened: Tally | set[str] | IntegrityError
            try:
                opened = self._turns(row, owner) if turn_id == OWNER_HEAD else self._tally(row, owner, turn_id)
            except IntegrityError as exc:
                opened = exc
            found.setdefault(owner, {})[turn_id] = opened
        return found

    def tally_of(self, owner: str, turn_id: str) -> HeadEdit:
        """An empty tally to add authenticated rows to (``verify``), compared with ``same_tally``."""
        return HeadEdit(Tally(), self._terms(owner, turn_id))

    def same_tally(self, sealed: Tally, found: Tally, turn_id: str) -> None:
        """Raise IntegrityError unless ``found`` (the rows) equals ``sealed`` (the head)."""
        self._same_tally(sealed, found, turn_id)

    def _in_scope(self, principal: Principal, actor: str, channel: str) -> bool:
        values = {"actor": actor, "channel": channel, "owner_user_id": principal.owner_user_id}
        return all(values[column] == value for column, value in self._policy.scope_columns(principal))

    def check_entries(
        self, principal: Principal, turn_id: str, rows: Iterable[dict[str, Any]], now: float, *, complete: bool = True
    ) -> None:
        """Check a turn's listed entries (clear rows, already authenticated) against its head.

        With ``complete``, every entry the head lists in the principal's scope
        and still live by its sealed expiry must be among ``rows``.

        Raises:
            IntegrityError: a missing, unlisted or altered entry.
        """
        self.check_entries_in(self.load(principal.owner_user_id, turn_id), principal, turn_id, rows, now, complete)

    def check_entries_in(
        self,
        head: Head,
        principal: Principal,
        turn_id: str,
        rows: Iterable[dict[str, Any]],
        now: float,
        complete: bool = True,
    ) -> None:
        """``check_entries`` against a head already read."""
        seen = set()
        for row in rows:
            _same_entry(head, row)
            seen.add(row["id"])
        if complete:
            for entry_id, (step, expires_at, _, actor, channel) in head.e.items():
                if expires_at > now and entry_id not in seen and self._in_scope(principal, actor, channel):
                    raise IntegrityError(
                        f"turn {turn_id!r} lost step {step} (entry {entry_id}) before its expiry: tampering"
                    )

    def check_newest_first(
        self, head: Head, principal: Principal, turn_id: str, seen: list[dict[str, Any]], now: float, complete: bool
    ) -> None:
        """Check the first rows of a newest-first scan of the turn (``tools``,
        ``last_step``): they must be the head's live entries in the principal's
        scope, highest (step, id) first, and all of them with ``complete``.

        Raises:
            IntegrityError: a newest step is missing, altered or not the head's.
        """
        expected = sorted(
            (
                (item[0], entry_id)
                for entry_id, item in head.e.items()
                if item[1] > now and self._in_scope(principal, item[3], item[4])
            ),
            reverse=True,
        )
        got = [(row["step_num"], row["id"]) for row in seen]
        if got != expected[: len(got)] or (complete and len(got) != len(expected)):
            raise IntegrityError(f"turn {turn_id!r}'s newest steps are not the ones its head lists: tampering")

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

    def check_entry(self, row: dict[str, Any]) -> None:
        """Check one authenticated entry row against its turn's head.

        Raises:
            IntegrityError: the head does not list the entry, or lists it otherwise.
        """
        _same_entry(self.load(row["owner_user_id"], row["turn_id"]), row)

    def check_expired_in(self, head: Head, row: dict[str, Any], now: float) -> None:
        """``check_expired`` against a head already read."""
        sealed = head.e.get(row["id"])
        if sealed is not None and sealed[1] > now:
            raise IntegrityError(f"entry {row['id']} expires later than its clear expiry says: tampering")

    def check_expired(self, row: dict[str, Any], now: float) -> None:
        """Refuse an entry whose clear expiry has passed while its turn's head says it still lives.

        Raises:
            IntegrityError: the clear expiry was moved earlier.
        """
        sealed = self.load(row["owner_user_id"], row["turn_id"]).e.get(row["id"])
        if sealed is not None and sealed[1] > now:
            raise IntegrityError(f"entry {row['id']} expires later than its clear expiry says: tampering")

    def check_records(
        self, principal: Principal, table: str, turn_id: str, rows: list[dict[str, Any]], now: float, latest: bool
    ) -> None:
        """Check a turn's records (all live ones, or the newest with ``latest``) against its head.

        Raises:
            IntegrityError: a missing, unlisted or altered record, or an older one served as the newest.
        """
        self.check_records_in(self.load(principal.owner_user_id, turn_id), principal, table, turn_id, rows, now, latest)

    def check_records_in(
        self,
        head: Head,
        principal: Principal,
        table: str,
        turn_id: str,
        rows: list[dict[str, Any]],
        now: float,
        latest: bool,
    ) -> None:
        """``check_records`` against a head already read."""
        section = head.section(RECORD_KINDS[table])
        for row in rows:
            sealed = section.get(row["id"])
            if sealed is None or sealed[0] != row["seq"] or sealed[1] != row["expires_at"]:
                raise IntegrityError(
                    f"a {table[:-1].replace('_', ' ')} of turn {turn_id!r} is not the one its head lists"
                )
        live = {
            key: value
            for key, value in section.items()
            if value[1] > now and self._in_scope(principal, value[2], value[3])
        }
        if latest:
            newest = max(live.items(), key=lambda item: item[1][0], default=None)
            if (newest is None) != (not rows) or (newest is not None and rows[0]["id"] != newest[0]):
                raise IntegrityError(f"turn {turn_id!r} serves an older {table[:-1].replace('_', ' ')} than its newest")
        elif set(live) - {row["id"] for row in rows}:
            raise IntegrityError(f"turn {turn_id!r} lost a {table[:-1].replace('_', ' ')} before its expiry")

    # -- writing: the one place ------------------------------------------------------------

    def change(
        self,
        conn: Conn,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        version: int | None = None,
        *,
        entry_id: str | None = None,
    ) -> None:
        """Apply ``edit`` to the turn's tally and seal it again, inside the
        caller's write transaction, under the owner's newest key version
        (``version`` when the caller's transaction already checked it is the
        newest); a turn new to the owner joins the owner head in the same
        transaction. Reads and writes one small row, whatever the turn holds.

        The head's rows are read with ``select_sql`` (``entry_select_sql`` with
        ``entry_id``, the turn's entry), and the newest version with
        ``newest_sql``: a caller that announced them (``Conn.prefetch``) at the
        start of its transaction pays no round trip for them; the upserts are
        deferred (``Conn.defer``: they go with COMMIT on PostgreSQL).

        Raises:
            IntegrityError: the stored head fails authentication.
        """
        rows = conn.query(
            *(self.select_sql(owner, turn_id) if entry_id is None else self.entry_select_sql(owner, entry_id))
        )
        by_turn = {row["turn_id"]: row for row in rows}
        turns: set[str] | None = None
        if turn_id in by_turn:
            tally = self._tally(by_turn[turn_id], owner, turn_id)
        else:
            turns = self._turns(by_turn[OWNER_HEAD], owner) if OWNER_HEAD in by_turn else set()
            if turn_id in turns:
                raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
            tally = Tally()
        before = tally.dumps()
        edit(HeadEdit(tally, self._terms(owner, turn_id)))
        after = tally.dumps()
        if after == before:
            return
        if OWNER_HEAD not in by_turn:
            # Every owner with a key has an owner head (``first_owner_head``), and a
            # write that changes a turn has a key: none means the owner's heads were removed.
            raise _owner_removed(owner)
        if version is None:
            version = self._newest(conn, owner)
        if turns is not None:
            self._write(conn, owner, OWNER_HEAD, json.dumps({"t": sorted(turns | {turn_id})}).encode(), version)
        self._write(conn, owner, turn_id, after, version)

    def _newest(self, conn: Conn, owner: str) -> int | None:
        found = conn.query(*self.newest_sql(owner))[0]["v"]
        return None if found is None else int(found)

    def _write(self, conn: Conn, owner: str, turn_id: str, body: bytes, version: int | None = None) -> None:
        if version is None:
            version = self._newest(conn, owner)
        if version is None:
            raise IntegrityError(f"owner {owner!r} has no key to seal its turn head with")
        sealed = self._keys.owner_wrapper(owner, version).seal(body, head_aad(owner, turn_id, version))
        conn.defer(
            "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (owner_user_id, turn_id) DO UPDATE SET key_version = excluded.key_version,"
            " sealed = excluded.sealed",
            (owner, turn_id, version, sealed),
        )
        self._keys.count_wraps_later(owner, version)

    @staticmethod
    def items(conn: Conn, owner: str, turn_id: str) -> dict[str, dict[str, list[Any]]]:
        """The clear items of a turn's rows, by kind (``{"e": {id: item}, ...}``), inside
        the caller's transaction: what an extension replaces (``extend_head``)."""
        where = "owner_user_id = ? AND turn_id = ?"
        found: dict[str, dict[str, list[Any]]] = {kind: {} for kind in KINDS}
        for row in conn.query(_ITEMS_SQL.format(where=where), (owner, turn_id) * 3):
            found[row["k"]][row["id"]] = entry_item(row) if row["k"] == "e" else record_item(row)
        return found

    def prune(self, conn: Conn, cutoff: float) -> int:
        """Subtract what gc collects at ``cutoff`` from the heads of the turns it
        collects from (inside gc's transaction, before its deletes: the same
        rows). Returns the heads changed."""
        by_turn: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in conn.query(_ITEMS_SQL.format(where="expires_at <= ?"), (cutoff,) * 3):
            by_turn.setdefault((row["owner_user_id"], row["turn_id"]), []).append(row)
        for (owner, turn_id), rows in by_turn.items():
            self.change(conn, owner, turn_id, functools.partial(_remove_rows, rows=rows))
        return len(by_turn)

    def reseal_owner(self, conn: Conn, owner: str) -> int:
        """Seal every head of the owner again under its newest key version (an
        owner-key rotation, before the old versions retire). Returns how many.
        The tallies' key is the store's, so they carry over unchanged."""
        rows = conn.query(
            "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = ?", (owner,)
        )
        for row in rows:
            self._write(conn, owner, row["turn_id"], self._open(row, owner, row["turn_id"]))
        return len(rows)

    def first_owner_head(self, conn: Conn, owner: str, version: int, wrapper: Wrapper) -> None:
        """The empty owner head of an owner's first key, in the key's transaction
        (``Keystore.on_first_key``): an owner whose every turn and head were
        removed while its key stayed is then told from one that never wrote."""
        sealed = wrapper.seal(_NO_TURNS, head_aad(owner, OWNER_HEAD, version))
        conn.defer(
            "INSERT INTO turn_heads(owner_user_id, turn_id, key_version, sealed) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (owner_user_id, turn_id) DO NOTHING",
            (owner, OWNER_HEAD, version, sealed),
        )
        self._keys.count_wraps_later(owner, version)

    def owners_without_heads(self) -> list[str]:
        """Owners with a key but no owner head (``verify``): their heads were removed."""
        rows = self._db.query(
            "SELECT DISTINCT owner_user_id FROM owner_keys WHERE owner_user_id NOT IN"
            " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) ORDER BY owner_user_id",
            (OWNER_HEAD,),
            admin=True,
        )
        return [str(row["owner_user_id"]) for row in rows]

    def _owner_heads_for_keys(self, conn: Conn) -> None:
        """Give every owner with a key and no owner head an empty one (building or
        converting a store's heads, which sets the invariant ``change`` relies on)."""
        for row in conn.query(
            "SELECT owner_user_id, MAX(version) AS v FROM owner_keys WHERE owner_user_id NOT IN"
            " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) GROUP BY owner_user_id",
            (OWNER_HEAD,),
        ):
            self._write(conn, row["owner_user_id"], OWNER_HEAD, _NO_TURNS, int(row["v"]))

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> int:
        """Delete every head of the owner (forgetting it), inside the caller's transaction."""
        return conn.execute("DELETE FROM turn_heads WHERE owner_user_id = ?", (owner,))

    # -- building and converting: at open ---------------------------------------------------

    def _token(self) -> str:
        """``store_meta.turn_heads`` once the heads are built in this format: a tag
        under the store's anchor key, so the flag cannot be reset to make an
        open rebuild the heads from an edited file (issue 14)."""
        return f"{HEAD_FORMAT}:{self._keys.counter_seal.tag('turn-heads', HEAD_FORMAT)}"

    def build_if_needed(self, now: float, writes: int = 0) -> int:
        """Bring the store's heads to this format; a no-op (one query) once done.

        ``store_meta.turn_heads`` says what to do: the sealed token (done);
        ``pending`` (migration 7: a store from before heads) builds every
        turn's tally from what the store holds then, refused when the store
        has heads or its authenticated write counter (``writes``, the anchor's)
        shows a heads-aware version wrote it; ``convert`` (migration 8) or
        ``built`` turn each head of format 1 (authenticated: it lists each row)
        into a tally. Returns the turns built or converted.

        Raises:
            IntegrityError: the flag is neither of these, or says ``pending`` on a
                store that had heads.
        """
        token = self._token()
        rows = self._db.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
        if rows and rows[0]["value"] == token:
            return 0
        with self._db.transaction(admin=True) as conn:
            again = conn.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
            state = again[0]["value"] if again else "pending"
            if state == token:
                return 0
            if state == "pending":
                if writes > 0 or conn.query("SELECT 1 FROM turn_heads LIMIT 1"):
                    raise IntegrityError(
                        "store_meta.turn_heads was reset to 'pending' on a store that has turn heads: the file"
                        " was edited to make the heads rebuilt from it; refused (SECURITY.md, 'turn heads')"
                    )
                self._owner_heads_for_keys(conn)
                done = self._build(conn)
            elif state in ("built", "convert"):
                done = self._convert(conn, now)
                self._owner_heads_for_keys(conn)
            else:
                raise IntegrityError("store_meta.turn_heads does not authenticate: the file was edited")
            conn.execute(
                "INSERT INTO store_meta(key, value) VALUES ('turn_heads', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (token,),
            )
        return done

    def _build(self, conn: Conn) -> int:
        """Every turn's tally from the rows as they are (a store from before heads)."""
        by_turn: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in conn.query(_ITEMS_SQL.format(where="1 = 1")):
            by_turn.setdefault((row["owner_user_id"], row["turn_id"]), []).append(row)
        built = 0
        for (owner, turn_id), rows in sorted(by_turn.items()):
            if self._keys.newest_in(conn, owner) is None:
                continue
            self.change(conn, owner, turn_id, functools.partial(_add_rows, rows=rows))
            built += 1
        return built

    def _convert(self, conn: Conn, now: float) -> int:
        """Each format-1 head (a listing of the turn's rows) as a tally of what it
        lists: a listed row already gone is kept out only when its sealed
        expiry has passed (gc'd), so tampering done before stays visible."""
        converted = 0
        for row in conn.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            if turn_id == OWNER_HEAD:
                continue
            body = json.loads(self._open(row, owner, turn_id))
            if body.get("f") == HEAD_FORMAT:
                continue
            present = self.items(conn, owner, turn_id)
            edit = HeadEdit(Tally(), self._terms(owner, turn_id))
            for kind in KINDS:
                for item_id, item in dict(body.get(kind, {})).items():
                    if item_id in present[kind] or item[1] > now:
                        edit.add(kind, item_id, item)
            self._write(conn, owner, turn_id, edit.tally.dumps(), int(row["key_version"]))
            converted += 1
        return converted


def _owner_removed(owner: str) -> IntegrityError:
    return IntegrityError(
        f"owner {owner!r} has a key but no owner head: its turns and their heads were removed (tampering)"
    )


def _term(seal: CounterSeal, owner: str, turn_id: str, kind: str, item_id: str, item: tuple[Any, ...]) -> int:
    """One row's term of its turn's digest: HMAC-SHA256 under the store's anchor
    key of (owner, turn, kind, id, clear item), as an integer."""
    canonical = json.dumps([owner, turn_id, item_id, *_canonical(kind, item)], separators=(",", ":"))
    return int(seal.tag(f"turn-head/{kind}/{canonical}", HEAD_FORMAT), 16)


def _canonical(kind: str, item: tuple[Any, ...]) -> list[Any]:
    """The item with its numbers in one form (SQLite and PostgreSQL may hand back an int or a float)."""
    numbers, scope = (item[:3], item[3:]) if kind == "e" else (item[:2], item[2:])
    out: list[Any] = []
    for position, value in enumerate(numbers):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise IntegrityError("a clear column of a turn's row is not a number: tampering")
        out.append(float(value) if position == 1 else int(value))
    if not all(isinstance(value, str) for value in scope):
        raise IntegrityError("a clear scope column of a turn's row is not text: tampering")
    return out + list(scope)


def _add_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.add(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))


def _remove_rows(edit: HeadEdit, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        edit.remove(row["k"], row["id"], entry_item(row) if row["k"] == "e" else record_item(row))


def same_entry(head: Head, row: dict[str, Any]) -> None:
    """Raise IntegrityError unless ``head`` lists the entry ``row`` as it is."""
    _same_entry(head, row)


def _same_entry(head: Head, row: dict[str, Any]) -> None:
    sealed = head.e.get(row["id"])
    if sealed is None:
        raise IntegrityError(f"entry {row['id']} is not in the head of turn {row['turn_id']!r}: tampering")
    step, expires_at, stored_bytes = sealed[0], sealed[1], sealed[2]
    if (step, expires_at, stored_bytes) != (row["step_num"], row["expires_at"], row["stored_bytes"]):
        raise IntegrityError(
            f"entry {row['id']} of turn {row['turn_id']!r} differs from its head"
            " (step, expiry or stored bytes): tampering or a rolled-back row"
        )


def extend_head(
    edit: HeadEdit,
    before: dict[str, dict[str, list[Any]]],
    target: float,
    entry_ids: Iterable[str],
    record_ids: dict[str, list[str]],
) -> None:
    """Give the extended entries and records (the ids whose rows were updated)
    their new expiry in the tally: ``before`` holds their items as they were
    (``Heads.items``, read in the same transaction before the update)."""
    changed = [("e", entry_id) for entry_id in entry_ids]
    changed += [(RECORD_KINDS[table], record_id) for table, ids in record_ids.items() for record_id in ids]
    for kind, item_id in changed:
        old = before[kind].get(item_id)
        if old is not None:
            new = list(old)
            new[1] = target
            edit.replace(kind, item_id, old, new)


def entry_item(row: dict[str, Any]) -> list[Any]:
    """The clear item of an entry row: step, expiry, stored bytes, actor, channel."""
    return [row.get("step_num", row.get("n")), row["expires_at"], row["stored_bytes"], row["actor"], row["channel"]]


def record_item(row: dict[str, Any]) -> list[Any]:
    """The clear item of a turn record row: sequence number, expiry, actor, channel."""
    return [row.get("seq", row.get("n")), row["expires_at"], row["actor"], row["channel"]]
