"""The put pipeline: an observation sealed outside any transaction, then
written in one that checks the step, the owner key's version and the quota."""

from __future__ import annotations

import functools
from typing import Any

from ...crypto.formats import EntryCipher, ListingKey
from ...crypto.primitives import ContentIdentity, Wrapper
from ...errors import IntegrityError, InvalidArgumentError, StoreBusyError, StoreUnavailableError
from ...keys.keystore import IfUnknown, Keystore
from ...principal import STEP_LIMIT, Principal, check_identifier, check_step_num
from ...storage.base import (
    Conn,
    DuplicateKeyError,
    OnceWriter,
    OutcomeUnknown,
    OwnerLockNeeded,
    Params,
    Rows,
)
from ..access import check_principal, quota_sql, stored_sql
from ..heads.heads import HeadEdit, Room, entry_item, read_with_heads, with_heads
from ..heads.owner import Once, Sealed
from ..quota import room
from .batch import Batch, Shown, insert_segments, maybe_stored, taken
from .listings import Listings, step_look
from .open import EntryParts
from .prepare import Prepared, check_write_bound

__all__ = ["Putter", "Shown"]

# Turns whose lock hint ``Putter`` keeps (emptied when full: a lost hint costs one put the exclusive lock).
_HINTS = 4096


class Putter:
    """Stores the entries of one store: ``put``, ``put_many``."""

    def __init__(self, parts: EntryParts, listings: Listings) -> None:
        self._keys, self._access = parts.keys, parts.access
        self.dialect = parts.db.dialect
        self.policy, self.heads, self.ttl = parts.policy, parts.heads, parts.policy.ttl
        self.default_ttl = parts.policy.ttl(None)
        self.write_now, self.write_clock = parts.timeline.write_time, parts.timeline.write_clock
        self.listings = listings
        self._once = parts.db if isinstance(parts.db, OnceWriter) else None  # a put in one message
        self.write_limit = parts.db.write_limit_bytes
        # The reservation (owner, turn) had left after its last put here: a hint that picks the lock.
        self._spare: dict[tuple[str, str], int] = {}
        # Each principal's step look (``step_look``), made at its first put.
        self._looks: dict[Principal, tuple[str, Params]] = {}
        self._last_look: tuple[Principal | None, tuple[str, Params]] = (None, ("", ()))
        # (turn, executor) pairs whose identifiers passed ``check_identifier`` (a pure check of the strings).
        self._checked: set[tuple[str, str]] = set()

    def put(
        self,
        principal: Principal,
        turn_id: str,
        step_num: int,
        executor_name: str,
        observation: Any,
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
        inline: tuple[Any] | None = None,
        free_step: bool = False,
        next_step: bool = False,
        identified: bool = True,
    ) -> dict[str, Any]:
        """``Scratchpad.put``; ``inline``: ``(item,)`` the history showed. ``free_step``
        refuses a step a live entry of the turn in the scope has; ``next_step``
        (no ``inline``) takes the step after the highest inside the write;
        ``identified`` False: no content identity (``Prepared.of``)."""
        if next_step and (inline is not None or not free_step):
            raise InvalidArgumentError("next_step needs free_step and no inline item")
        if type(principal) is not Principal:  # a subclass passes ``check_principal`` too
            check_principal(principal)
        if type(turn_id) is not str or type(executor_name) is not str or (turn_id, executor_name) not in self._checked:
            check_identifier("turn_id", turn_id)
            check_identifier("executor_name", executor_name)
            if len(self._checked) >= _HINTS:
                self._checked.clear()
            self._checked.add((turn_id, executor_name))
        if type(step_num) is not int or not 0 <= step_num < STEP_LIMIT:  # ``check_step_num``'s test, first
            check_step_num(step_num)
        ttl = self.default_ttl if ttl_seconds is None else self.ttl(ttl_seconds)
        prepared = Prepared.of(observation, step_num, self.policy, identified)
        bound = prepared.cost_bound(principal, turn_id, executor_name)
        if self.write_limit is not None and bound > self.write_limit:  # ``check_write_size`` of one entry
            check_write_bound(bound, self.write_limit, "entry")
        created = self.write_clock() if now is None else self.write_now(now)
        meta = prepared.meta(principal, step_num, executor_name, created, created + ttl, inline)
        step = self._step(principal, turn_id, step_num) if free_step and not next_step else None
        one = _Put(self, self._keys, principal, turn_id, observation, prepared, meta, step, next_step)
        owner = principal.owner_user_id
        # In one message (``_Put.once``), else under the shared lock when the turn had room, or exclusive;
        # a turn this process left with less reservation than the entry takes goes to the exclusive
        # lock at once (the one message would seal a head only to find it short).
        hint = self._spare.get((owner, turn_id))
        roomy = hint is not None and hint >= bound
        short = hint is not None and not roomy and hint < prepared.cost_floor(principal, turn_id, executor_name)
        done = one.once(self._once) if self._once is not None and not short else None
        entry_id, spare = done or one.written(shared=roomy)
        self.left(owner, turn_id, spare)
        return {"ok": True, "scratchpad_id": entry_id, **meta["view"]}

    def spare(self, owner: str, turn_id: str) -> int:
        """The turn's reservation this process's last write into it left (0 unknown)."""
        return self._spare.get((owner, turn_id), 0)

    def left(self, owner: str, turn_id: str, spare: int) -> None:
        """The turn's reservation left unused by this process's last write into it (the lock's hint)."""
        if len(self._spare) >= _HINTS:
            self._spare.clear()
        self._spare[(owner, turn_id)] = spare

    def _step(self, principal: Principal, turn_id: str, step_num: int) -> tuple[str, Params]:
        """The step's look (``step_look``) for ``principal``'s put at ``step_num`` of ``turn_id``."""
        last = self._last_look  # the same principal object as the last put: no hash of its fields
        if last[0] is principal:
            look = last[1]
        else:
            found = self._looks.get(principal)
            if found is None:
                if len(self._looks) >= _HINTS:
                    self._looks.clear()
                found = self._looks[principal] = step_look(self._access, principal)
            look = found
            self._last_look = (principal, look)
        return look[0], (turn_id, step_num, *look[1])

    def put_many(
        self,
        principal: Principal,
        turn_id: str,
        items: Any,
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
        shown: Shown | None = None,
    ) -> list[dict[str, Any]]:
        """``Scratchpad.put_many``; with ``shown``, the steps are chosen (``batch.Batch``)."""
        return Batch(self, self._keys, self._access, principal, turn_id, shown).put(items, ttl_seconds, now)


def _if_unknown(owner: str, chosen: bool) -> IfUnknown[_SealedOne]:
    """A put whose COMMIT's answer was lost: its entry is looked up by id."""
    return IfUnknown(
        lambda conn, sealed: bool(conn.query(*stored_sql("entries", owner, str(sealed[0]["id"])))),
        lambda sealed, why: maybe_stored([str(sealed[0]["id"])], why, sent="the put's COMMIT", chosen=chosen),
    )


def _add_entry(row: dict[str, Any], head: HeadEdit) -> None:
    """The entry ``row`` joins its turn's tally."""
    head.add("e", row["id"], entry_item(row))


# ``_Put.once``'s condition that a given step is free.
_STEP_FREE = "NOT EXISTS (SELECT 1 FROM ({step}) AS taken WHERE expires_at > ?)"


# The statements' text is the same put after put (an entry's columns; a scope's step look): made once.
@functools.lru_cache(maxsize=16)
def _insert_select(columns: tuple[str, ...]) -> str:
    """``_Put.once``'s ``INSERT ... SELECT`` of one entry row with ``columns``."""
    return f"INSERT INTO entries({', '.join(columns)}) SELECT {', '.join('?' * len(columns))}"


@functools.lru_cache(maxsize=16)
def _insert_values(columns: tuple[str, ...]) -> str:
    """The ``INSERT ... VALUES`` of one entry row with ``columns`` (``_Put.insert``'s; ``_Put.once``'s on SQLite)."""
    return f"INSERT INTO entries({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


@functools.lru_cache(maxsize=16)
def _step_free(step: str) -> str:
    """``_STEP_FREE`` of the step's look ``step``."""
    return _STEP_FREE.format(step=step)


# One put's sealed entry: its row, its sealed segments, its cipher.
_SealedOne = tuple[dict[str, Any], list[bytes], EntryCipher]


class _Put:
    """One ``Putter.put``: sealed outside any transaction (``seal``), then
    written (``write``): ``reads``, ``check``, ``insert``. ``write_current``
    runs both again on a stale key or an id collision; ``written`` runs them
    under the exclusive lock when the shared one was not enough."""

    __slots__ = (  # every put makes one: its fields set without a dict
        "announced", "created", "identities", "kept", "keys", "landed", "listings", "meta",
        "next_step", "observation", "owner", "prepared", "principal", "putter", "shared",
        "step", "step_num", "turn_id",
    )  # fmt: skip

    def __init__(
        self,
        putter: Putter,
        keys: Keystore,
        principal: Principal,
        turn_id: str,
        observation: Any,
        prepared: Prepared,
        meta: dict[str, Any],
        step: tuple[str, Params] | None,
        next_step: bool,
    ) -> None:
        self.putter, self.keys, self.principal, self.turn_id = putter, keys, principal, turn_id
        self.owner = principal.owner_user_id
        self.observation, self.prepared, self.meta = observation, prepared, meta
        self.step_num, self.created = meta["step_num"], meta["created_at"]  # the step given (or guessed)
        self.step, self.next_step = step, next_step  # ``step``: the given step's look, or None
        self.shared = False  # this attempt holds the owner's lock shared
        self.announced: list[tuple[str, Params]] = []  # this attempt's ``reads``, sent with its BEGIN
        self.identities: dict[int, str] = {}
        self.listings: dict[int, ListingKey] = {}
        # ``once``'s entry when its statement wrote nothing: the first ``seal`` of its version reuses it.
        self.kept: tuple[int, _SealedOne] | None = None
        # ``once``'s statement when its connection failed after sending it, with its entry's id.
        self.landed: tuple[Once, str] | None = None

    def attempt(self, shared: bool) -> tuple[str, int]:
        """Seal and write under the owner's lock, ``shared`` or exclusive; the
        entry's id and the turn's reservation left unused.

        Raises:
            OwnerLockNeeded: ``shared``, and the turn's reservation did not cover the entry.
        """
        self.shared = shared
        self.announced = self.reads()  # built once: the same statements again inside ``write``
        return self.keys.write_current(
            self.owner,
            self.seal,
            self.write,
            attempts=5,
            busy="could not store the entry: its id or owner key kept changing; try again",
            prefetch=[
                *self.announced,
                *([stored_sql("entries", self.owner, self.landed[1])] if self.landed is not None else []),
            ],
            turn=self.turn_id if shared else None,
            unknown=_if_unknown(self.owner, self.next_step),
        )

    def written(self, shared: bool) -> tuple[str, int]:
        """``attempt`` under the shared lock when ``shared``, else (or then) exclusive.

        Raises:
            StoreUnavailableError: as ``attempt``, naming the entry ``once`` may have stored.
        """
        try:
            try:
                return self.attempt(shared)
            except OwnerLockNeeded:
                return self.attempt(shared=False)
        except (StoreBusyError, StoreUnavailableError) as exc:
            if self.landed is None:
                raise
            raise maybe_stored([self.landed[1]], str(exc), chosen=self.next_step) from None

    def once(self, db: OnceWriter) -> tuple[str, int] | None:
        """The put without a read (one message on PostgreSQL, one transaction on SQLite) when
        this process sealed the turn's head last: its statement writes the entry and the next head only
        if the stored head and the key version are as recorded. ``attempt``'s
        answer, or None: then ``attempt`` runs, with this entry (``kept``), or
        looking for it first (``landed``), so a put is never stored twice.
        A ``next_step`` put takes the step after the record's (``following_step``),
        sealed before the statement; the stored head being the record, no writer took it since.
        Not for entries of several segments, or a wrap-count flush.

        Raises:
            StoreBusyError: the turn's locks were not obtained in time.
            StoreUnavailableError: the server cannot be reached or refused the
                statement (nothing written); or the call was cut at its deadline
                once the message was sent, naming the entry that may be stored.
        """
        heads, owner, turn_id = self.putter.heads, self.owner, self.turn_id
        if len(self.prepared.segments) > 1:
            return None
        record = heads.last.peek(owner, turn_id)
        step = self.step_num if record is None or not self.next_step else self.following_step(record)
        if record is None or step is None:
            return None
        try:
            version, wrapper, identity, listing = self.keys.current_sealing(owner)
            # The entry's key and the head's seal, counted now whether or not the message writes (a refused
            # or skipped one leaves an overcount, never less); unless the pending counts are due, as
            # ``write_current`` decides it with ``attempt``'s count (the head's is counted inside): it writes them.
            if self.keys.count_wraps_unless_due(owner, version, 2, 1):
                return None
            sealed = self.seal(version, wrapper, (identity, listing))
        except IntegrityError:  # a rotation retired the version (its keys, or its entry's): ``attempt`` finds out
            return None
        row = sealed[0]
        if step != row["step_num"]:  # ``next_step``'s guess was not the record's next step
            self.prepared.restep(row, self.meta, self.listings[version], step, self.observation)
        columns = tuple(row)
        # SQLite runs the entry's INSERT apart from the head's UPDATE (``Database.write_once``): VALUES.
        statement = _insert_values(columns) if self.putter.dialect == "sqlite" else _insert_select(columns)
        insert = (statement, tuple(row.values()))
        free = None if self.step is None else (_step_free(self.step[0]), (*self.step[1], self.created))
        edit = functools.partial(_add_entry, row)
        expect = record if self.next_step else None  # the step holds only while the record does
        once = heads.change_once(owner, turn_id, edit, (version, wrapper), insert, free, step, expect)
        if once is None:
            self.kept = (version, sealed)
            return None
        try:
            written = db.write_once(owner, turn_id, once.sql, once.params)
        except DuplicateKeyError:
            return None  # its id was taken: ``attempt`` seals it again under another
        except OutcomeUnknown as exc:
            raise maybe_stored([str(row["id"])], str(exc), chosen=self.next_step) from None
        if written == 1:
            heads.written_once(owner, turn_id, once)
            return str(row["id"]), once.spare
        if written is None:
            self.landed = (once, str(row["id"]))
        self.kept = (version, sealed)
        return None

    def seal(
        self, version: int, wrapper: Wrapper, keys: tuple[ContentIdentity, ListingKey] | None = None
    ) -> _SealedOne:
        """The entry sealed under owner-key ``version`` (``keys``: its ``Keystore.sealing``, when
        the caller has them); ``once``'s when of ``version`` and unsent."""
        if self.kept is not None and self.kept[0] == version:
            sealed, self.kept = self.kept[1], None
            return sealed
        identity, listing = self.keys.sealing(self.owner, version) if keys is None else keys
        if self.prepared.identified:  # content put unidentified has none
            if version not in self.identities:
                self.identities[version] = self.prepared.identity(identity)
            self.meta["content_id"] = self.identities[version]
        self.listings[version] = listing  # for a re-step inside the write, too
        return self.prepared.seal(wrapper, self.listings[version], version, self.owner, self.turn_id, self.meta)

    def write(self, conn: Conn, sealed: _SealedOne) -> tuple[str, int]:
        """Inside the owner's write transaction; ``attempt``'s answer."""
        row, segments, _ = sealed
        step = self.take_next_step(conn) if self.next_step else None  # sent with the reads (PostgreSQL)
        found, head_rows = read_with_heads(conn, self.announced)
        if self.landed is not None and conn.query(*stored_sql("entries", self.owner, self.landed[1])):
            # ``once`` was applied before its connection failed: its entry is stored (with its head, in one statement).
            once, entry_id = self.landed
            if any(head["turn_id"] == self.turn_id and head["sealed"] == once.head.sealed for head in head_rows):
                self.putter.heads.last.record(self.owner, self.turn_id, once.head)
            return entry_id, once.spare
        if step is not None:
            check_step_num(step)
            if step != row["step_num"]:  # the listing part sealed again
                self.prepared.restep(row, self.meta, self.listings[row["key_version"]], step, self.observation)
        room = self.check(conn, found, row)
        return str(row["id"]), self.insert(conn, row, segments, room, head_rows)

    def reads(self) -> list[tuple[str, Params]]:
        """The write's reads, sent with BEGIN: version, quota, step and (PostgreSQL) the turn's heads."""
        quota = quota_sql(self.owner, self.created, self.step, records=not self.shared)
        return with_heads(self.putter.dialect, quota, self.owner, self.turn_id, turn_only=self.shared)

    def take_next_step(self, conn: Conn) -> int:
        """``next_step``: the step after the highest of the turn's live entries in the scope."""
        return self.putter.listings.last_step(self.principal, self.turn_id, self.created, conn) + 1

    def following_step(self, record: Sealed) -> int | None:
        """``take_next_step``'s step from the head this process sealed last, ``record``: its
        newest entry (the highest (step, id) the turn holds) when live and in the scope, so
        the highest such step; None when the record cannot tell (its newest left, expired, or is
        another scope's: a deleted top step is reused, as the rows' look gives it)."""
        newest = record.opened().newest
        if newest is None:
            return None
        _, step, expires_at, actor, channel = newest
        if type(step) is not int or not isinstance(expires_at, (int, float)):
            return None
        if expires_at <= self.putter.listings.now(self.created):  # ``live`` at the write's time
            return None
        principal = self.principal
        clear = {"owner_user_id": principal.owner_user_id, "actor": actor, "channel": channel}
        if any(clear[column] != value for column, value in self.putter.policy.scope_columns(principal)):
            return None
        try:
            check_step_num(step + 1)
        except InvalidArgumentError:
            return None  # ``take_next_step`` refuses it
        return step + 1

    def check(self, conn: Conn, found: dict[str, Any], row: dict[str, Any]) -> Room | None:
        """The step is free, the key version the newest, and (exclusive lock) the quota's room.

        Raises:
            InvalidArgumentError: the step is taken.
            QuotaExceededError: the owner's quota has no room (``room``).
        """
        if self.step is not None:
            self.putter.listings.check_step_free(
                self.principal, self.turn_id, self.step_num, self.created, conn, taken=taken(found)
            )
        if self.shared:
            Keystore.check_newest(found["newest"], row["key_version"])
            return None
        version, policy = row["key_version"], self.putter.policy
        return room(conn, policy, self.owner, version, self.created, "entry", found, unsent=row["stored_bytes"])

    def insert(self, conn: Conn, row: dict[str, Any], segments: list[bytes], room: Room | None, head_rows: Rows) -> int:
        """The entry's insert with the turn head's upsert, then its segments; the reservation left."""
        spare = self.putter.heads.change(
            conn,
            self.owner,
            self.turn_id,
            lambda head: head.add("e", row["id"], entry_item(row)),
            row["key_version"],
            room=room,
            turn_only=self.shared,
            rows=head_rows,
            insert=(_insert_values(tuple(row)), tuple(row.values())),
        )
        insert_segments(conn, [row], [segments])
        return spare
