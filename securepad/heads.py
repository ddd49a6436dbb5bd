"""Sealed turn heads: what each turn holds, so that a row cannot vanish unseen.

Every entry and every turn record is authenticated on its own; what a single
row cannot say is that it is *missing*. A head per (owner, turn) lists what
the turn holds: for each entry its id, step, sealed expiry, stored bytes and
scope (actor, channel), and for each checkpoint and compaction mark its id,
sequence number, expiry and scope. An owner head (turn id ``""``) lists the
owner's turns, so a whole turn (entries and head) cannot vanish either.

Heads are sealed directly under the owner's key (``crypto.Wrapper.seal``)
with owner, turn and key version in the AAD (``crypto.head_aad``): a head
moved to another turn or owner, or edited, fails to open.

* Every write that changes a turn calls ``Heads.change`` inside its own
  transaction (the one place): put, checkpoint, mark, extend, delete, gc
  (``prune``), forgetting an owner (``delete_owner``), owner-key rotation
  (``reseal_owner``).
* Every read of a turn fetches the turn's head (one row, one AES-GCM open)
  and checks what it returns against it (``check_entries``, ``check_entry``,
  ``check_records``): a row the head lists that is absent before its sealed
  expiry, a row it does not list, or a row whose step, sequence, expiry or
  stored bytes differ from the head's raises ``IntegrityError``.

Expiry stays legitimate: an entry whose *sealed* expiry has passed may be
absent (gc), and gc prunes the heads of the turns it collected from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._backend import Backend, Conn, Params, Rows
from .crypto import head_aad
from .errors import IntegrityError, StoreBusyError
from .keystore import NEWEST_VERSION_SQL, Keystore
from .policy import Policy
from .principal import Principal

__all__ = ["OWNER_HEAD", "RECORD_KINDS", "Head", "Heads", "entry_item", "extend_head", "record_item", "same_entry"]

OWNER_HEAD = ""
# Head sections of the turn records, by table.
RECORD_KINDS = {"checkpoints": "c", "compaction_marks": "m"}
_BUILT = "built"
# Reads of a turn tried again on a consistent (head, rows) pair before a mismatch is believed.
_CONSISTENT_TRIES = 8
T = TypeVar("T")
# A turn's head and its owner head; ``turns`` is the placeholder of the turn's id.
_HEAD_SQL = (
    "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"
    " WHERE owner_user_id = ? AND turn_id IN ({turns}, ?) ORDER BY turn_id"
)
# The turn of one entry (``entry_select_sql``); the heads read are the owner's
# whoever the row's owner is, as when the caller reads the turn's head itself.
_ENTRY_TURN_SQL = "(SELECT turn_id FROM entries WHERE id = ?)"


@dataclass
class Head:
    """The opened head of one turn: ``e`` entries ``{id: [step, expires_at,
    stored_bytes, actor, channel]}``; ``c``/``m`` records ``{id: [seq,
    expires_at, actor, channel]}``."""

    e: dict[str, list[Any]] = field(default_factory=dict)
    c: dict[str, list[Any]] = field(default_factory=dict)
    m: dict[str, list[Any]] = field(default_factory=dict)

    def section(self, kind: str) -> dict[str, list[Any]]:
        return {"e": self.e, "c": self.c, "m": self.m}[kind]

    def dumps(self) -> bytes:
        return json.dumps({"e": self.e, "c": self.c, "m": self.m}, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes) -> Head:
        try:
            body = json.loads(data)
            return cls(dict(body["e"]), dict(body["c"]), dict(body["m"]))
        except (ValueError, KeyError, TypeError):
            raise IntegrityError("a turn head is malformed") from None

    def prune(self, cutoff: float) -> bool:
        """Drop what expired (by its sealed expiry) at ``cutoff``; whether anything went."""
        changed = False
        for section in (self.e, self.c, self.m):
            for key in [key for key, value in section.items() if value[1] <= cutoff]:
                del section[key]
                changed = True
        return changed


class Heads:
    """The sealed heads of one store. Safe to share between threads."""

    def __init__(self, db: Backend, keys: Keystore, policy: Policy) -> None:
        self._db = db
        self._keys = keys
        self._policy = policy

    # -- reading ---------------------------------------------------------------------------

    def _open(self, row: dict[str, Any], owner: str, turn_id: str) -> bytes:
        version = row["key_version"]
        if not isinstance(version, int) or isinstance(version, bool) or row["turn_id"] != turn_id:
            raise IntegrityError("a turn head's clear fields are malformed")
        if row["owner_user_id"] != owner:
            raise IntegrityError("a turn head belongs to another owner")
        return self._keys.owner_wrapper(owner, version).open(row["sealed"], head_aad(owner, turn_id, version))

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
        query from ``select_sql`` or ``entry_select_sql``); without it the
        first try fetches, then loads the head.

        The head is read after the rows: a writer that commits between the two
        reads makes them disagree, so a failed check is tried again on a
        consistent pair (the head's sealed bytes equal before and after the
        fetch: every write of the turn reseals it, with a fresh nonce) before
        it is believed. The common path costs one head row and one open.

        Raises:
            IntegrityError: the check fails on a consistent pair.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        if first is None:
            fetched = fetch()
            head = self.load(owner, turn_id)
        else:
            fetched, head_rows = first
            head = self._from_rows(head_rows, owner, turn_id)
        try:
            check(head, fetched)
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
        """The query of a turn's head rows (the turn's and the owner head), for
        ``Conn.prefetch`` and ``Backend.queries``."""
        return _HEAD_SQL.format(turns="?"), (owner, turn_id, OWNER_HEAD)

    @staticmethod
    def entry_select_sql(owner: str, entry_id: str) -> tuple[str, Params]:
        """``select_sql`` for the turn of entry ``entry_id`` (read with, or before, the entry's row)."""
        return _HEAD_SQL.format(turns=_ENTRY_TURN_SQL), (owner, entry_id, OWNER_HEAD)

    @staticmethod
    def newest_sql(owner: str) -> tuple[str, Params]:
        """The owner's newest key version, as ``change`` reads it without a version (for ``Conn.prefetch``)."""
        return f"SELECT {NEWEST_VERSION_SQL} AS v", (owner,)

    def _rows(self, owner: str, turn_id: str, conn: Conn | None = None) -> list[dict[str, Any]]:
        sql, params = self.select_sql(owner, turn_id)
        return conn.query(sql, params) if conn is not None else self._db.query(sql, params, owner=owner)

    def _from_rows(self, rows: list[dict[str, Any]], owner: str, turn_id: str) -> Head:
        by_turn = {row["turn_id"]: row for row in rows}
        if turn_id in by_turn:
            return Head.loads(self._open(by_turn[turn_id], owner, turn_id))
        if OWNER_HEAD in by_turn and turn_id in self._turns(by_turn[OWNER_HEAD], owner):
            raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
        return Head()

    def load(self, owner: str, turn_id: str, conn: Conn | None = None) -> Head:
        """The turn's head (empty for a turn that never held anything), authenticated.

        One query fetches the turn's head and the owner head; the owner head
        is opened only when the turn has no head, to tell a new turn from a
        vanished one.

        Raises:
            IntegrityError: a head fails authentication, or the turn's head is
                missing while the owner head lists the turn.
        """
        return self._from_rows(self._rows(owner, turn_id, conn), owner, turn_id)

    def _turns(self, row: dict[str, Any], owner: str) -> set[str]:
        try:
            return set(json.loads(self._open(row, owner, OWNER_HEAD))["t"])
        except (ValueError, KeyError, TypeError):
            raise IntegrityError("an owner head is malformed") from None

    def all_heads(self) -> dict[str, dict[str, Head | set[str] | IntegrityError]]:
        """Every head of the store, opened: ``{owner: {turn: Head}}``, the owner head
        under ``""`` as its set of turns; a head that fails to open is its error (``verify``)."""
        found: dict[str, dict[str, Head | set[str] | IntegrityError]] = {}
        rows = self._db.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads", admin=True)
        for row in rows:
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            opened: Head | set[str] | IntegrityError
            try:
                opened = (
                    self._turns(row, owner) if turn_id == OWNER_HEAD else Head.loads(self._open(row, owner, turn_id))
                )
            except IntegrityError as exc:
                opened = exc
            found.setdefault(owner, {})[turn_id] = opened
        return found

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
        edit: Callable[[Head], object],
        version: int | None = None,
        *,
        entry_id: str | None = None,
    ) -> None:
        """Apply ``edit`` to the turn's head and seal it again, inside the caller's
        write transaction, under the owner's newest key version (``version``
        when the caller's transaction already checked it is the newest); a turn
        new to the owner joins the owner head in the same transaction.

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
            head = Head.loads(self._open(by_turn[turn_id], owner, turn_id))
        else:
            turns = self._turns(by_turn[OWNER_HEAD], owner) if OWNER_HEAD in by_turn else set()
            if turn_id in turns:
                raise IntegrityError(f"turn {turn_id!r} lost its head: the turn was removed from the store")
            head = Head()
        before = head.dumps()
        edit(head)
        after = head.dumps()
        if after == before:
            return
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

    def prune(self, conn: Conn, cutoff: float) -> int:
        """Drop what gc collects at ``cutoff`` from the heads of the turns it collects
        from (inside gc's transaction, before its deletes). Returns the heads changed."""
        turns = conn.query(
            "SELECT DISTINCT owner_user_id, turn_id FROM entries WHERE expires_at <= ?"
            " UNION SELECT DISTINCT owner_user_id, turn_id FROM checkpoints WHERE expires_at <= ?"
            " UNION SELECT DISTINCT owner_user_id, turn_id FROM compaction_marks WHERE expires_at <= ?",
            (cutoff, cutoff, cutoff),
        )
        for row in turns:
            self.change(conn, row["owner_user_id"], row["turn_id"], lambda head: head.prune(cutoff))
        return len(turns)

    def reseal_owner(self, conn: Conn, owner: str) -> int:
        """Seal every head of the owner again under its newest key version (an
        owner-key rotation, before the old versions retire). Returns how many."""
        rows = conn.query(
            "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE owner_user_id = ?", (owner,)
        )
        for row in rows:
            self._write(conn, owner, row["turn_id"], self._open(row, owner, row["turn_id"]))
        return len(rows)

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> int:
        """Delete every head of the owner (forgetting it), inside the caller's transaction."""
        return conn.execute("DELETE FROM turn_heads WHERE owner_user_id = ?", (owner,))

    # -- building the heads of a store written before them -----------------------------------

    def build_if_needed(self) -> int:
        """Build the heads of every turn of a store migrated from before heads
        (trusting what it holds then); a no-op once built. Returns the turns built."""
        rows = self._db.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
        if rows and rows[0]["value"] == _BUILT:
            return 0
        built = 0
        with self._db.transaction(admin=True) as conn:
            again = conn.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
            if again and again[0]["value"] == _BUILT:
                return 0
            for owner, turns in _existing(conn).items():
                if self._keys.newest_in(conn, owner) is None:
                    continue
                for turn_id, head in turns.items():
                    self.change(conn, owner, turn_id, functools.partial(_fill, source=head))
                    built += 1
            conn.execute(
                "INSERT INTO store_meta(key, value) VALUES ('turn_heads', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (_BUILT,),
            )
        return built


def _fill(target: Head, source: Head) -> None:
    target.e.update(source.e)
    target.c.update(source.c)
    target.m.update(source.m)


def _existing(conn: Conn) -> dict[str, dict[str, Head]]:
    """What each (owner, turn) holds now, from the clear columns (a migration only)."""
    found: dict[str, dict[str, Head]] = {}
    for row in conn.query(
        "SELECT id, owner_user_id, turn_id, step_num, expires_at, stored_bytes, actor, channel FROM entries"
    ):
        head = found.setdefault(row["owner_user_id"], {}).setdefault(row["turn_id"], Head())
        head.e[row["id"]] = [row["step_num"], row["expires_at"], row["stored_bytes"], row["actor"], row["channel"]]
    for table, kind in RECORD_KINDS.items():
        for row in conn.query(f"SELECT id, owner_user_id, turn_id, seq, expires_at, actor, channel FROM {table}"):
            head = found.setdefault(row["owner_user_id"], {}).setdefault(row["turn_id"], Head())
            head.section(kind)[row["id"]] = [row["seq"], row["expires_at"], row["actor"], row["channel"]]
    return found


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


def extend_head(head: Head, target: float, entry_ids: Iterable[str], record_ids: dict[str, list[str]]) -> None:
    """Give the extended entries and records (the ids whose rows were updated) their new expiry in the head."""
    for entry_id in entry_ids:
        if entry_id in head.e:
            head.e[entry_id][1] = target
    for table, ids in record_ids.items():
        section = head.section(RECORD_KINDS[table])
        for record_id in ids:
            if record_id in section:
                section[record_id][1] = target


def entry_item(row: dict[str, Any]) -> list[Any]:
    """The head's item of a new entry row."""
    return [row["step_num"], row["expires_at"], row["stored_bytes"], row["actor"], row["channel"]]


def record_item(row: dict[str, Any]) -> list[Any]:
    """The head's item of a new turn record row."""
    return [row["seq"], row["expires_at"], row["actor"], row["channel"]]
