"""A batch of puts (``Putter.put_many``): every item sealed first, then one
transaction for all; and what a single put shares with it (``maybe_stored``,
``taken``, ``insert_segments``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...core.timeline import live
from ...crypto.formats import EntrySealer
from ...crypto.primitives import Wrapper
from ...errors import InvalidArgumentError, StoreUnavailableError
from ...keys.keystore import IfUnknown, Keystore
from ...policy import Policy
from ...principal import Principal, check_identifier, check_step_num
from ...storage.base import Conn, DuplicateKeyError, OwnerLockNeeded, Params
from ..access import Access, check_principal, quota_sql, stored_entries
from ..heads.heads import Heads, Room, entry_item, read_with_heads, with_heads
from ..quota import room
from .listings import Listings
from .prepare import Prepared, check_write_size

__all__ = ["Batch", "Shown", "insert_segments", "maybe_stored", "taken"]


class Writer(Protocol):
    """What a batch uses of its store's ``Putter``."""

    policy: Policy
    dialect: str
    heads: Heads
    listings: Listings
    write_limit: int | None

    def ttl(self, ttl_seconds: int | None) -> int: ...

    def write_now(self, given: object | None) -> float: ...

    def spare(self, owner: str, turn_id: str) -> int: ...

    def left(self, owner: str, turn_id: str, spare: int) -> None: ...


def maybe_stored(
    entry_ids: list[str], why: str, *, sent: str = "the put's one message", chosen: bool = False
) -> StoreUnavailableError:
    """The error of a write whose ``sent`` message went before its connection
    was lost; ``chosen``: the library chose the steps (writing again would store twice)."""
    named = ", ".join(repr(entry_id) for entry_id in entry_ids)
    several = len(entry_ids) > 1
    what = f"entries {named}: get those ids" if several else f"entry {named}: get that id"
    if chosen:
        again = (
            "before writing the same again: the library takes the next steps, so a second write would store it twice"
        )
    elif several:
        again = "putting the same steps again is refused if they were stored"
    else:
        again = "putting the same step again is refused if it was stored"
    return StoreUnavailableError(
        f"{why.removesuffix('; try again')}; {sent} had been sent, so it may be stored as {what} to know ({again})",
        maybe_stored=tuple(entry_ids),
    )


def taken(found: dict[str, Any]) -> list[dict[str, Any]]:
    """The step's look from the quota's row, as a row for ``live``."""
    return [] if found["step_expires"] is None else [{"expires_at": found["step_expires"]}]


# What ``Turn.record_many`` shows of an observation at a step: ``(history item,)``, or None.
Shown = Callable[[Any, int], tuple[Any] | None]
# A batch sealed: its rows, each row's sealed segments, each row's metadata.
_Sealed = tuple[list[dict[str, Any]], list[list[bytes]], list[dict[str, Any]]]


class Batch:
    """One ``put_many``: every item sealed first, then one transaction that
    checks the steps, key version and quota and inserts all (or none). With
    ``shown``, items are ``(executor_name, observation)`` at the next steps,
    looked up before sealing and checked again inside the write."""

    def __init__(
        self,
        entries: Writer,
        keys: Keystore,
        access: Access,
        principal: Principal,
        turn_id: str,
        shown: Shown | None,
    ) -> None:
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        self.entries, self.keys, self.access = entries, keys, access
        self.principal, self.turn_id, self.shown = principal, turn_id, shown
        self.shared = False  # this attempt holds the owner's lock shared (the quota is the turn's reservation)
        self.left = 0  # the turn's reservation the write left unused
        self.announced: list[tuple[str, Params]] = []  # this attempt's reads, sent with its BEGIN

    def _items(self, items: Any) -> list[tuple[int, str, Any]]:
        """The items as (step, executor, observation), validated (steps to choose are -1)."""
        width = 2 if self.shown is not None else 3
        if isinstance(items, str | bytes | dict) or not hasattr(items, "__iter__"):
            raise InvalidArgumentError("items must be a sequence of tuples")
        checked: list[tuple[int, str, Any]] = []
        for item in items:
            if not isinstance(item, tuple | list) or len(item) != width:
                raise InvalidArgumentError(f"each item must be a tuple of {width} values, not {item!r:.80}")
            step, executor, observation = (-1, *item) if width == 2 else item
            if width == 3:
                check_step_num(step)
            check_identifier("executor_name", executor)
            checked.append((step, executor, observation))
        steps = [step for step, _, _ in checked]
        if width == 3 and len(set(steps)) != len(steps):
            raise InvalidArgumentError("a batch gives one step twice")
        return checked

    def put(self, items: Any, ttl_seconds: int | None, now: float | None) -> list[dict[str, Any]]:
        """The batch's views (with ``shown``, the history items where there are some)."""
        checked = self._items(items)
        ttl = self.entries.ttl(ttl_seconds)
        created = self.entries.write_now(now)
        if not checked:
            return []
        owner = self.principal.owner_user_id
        policy = self.entries.policy
        fixed = [Prepared.of(obs, step, policy) for step, _, obs in checked] if self.shown is None else []
        limit = self.entries.write_limit
        executors = [executor for _, executor, _ in checked]
        # Chosen steps (``shown``): checked in ``seal``, once shaped.
        bound = check_write_size(
            list(zip(fixed, executors, strict=False)), self.principal, self.turn_id, limit, "batch"
        )
        identities: dict[tuple[int, int], str] = {}
        shown_items: list[tuple[Any] | None] = []

        def seal(version: int, wrapper: Wrapper) -> _Sealed:
            shown_items.clear()
            steps, prepared = self._steps(checked, fixed, created)
            rows: list[dict[str, Any]] = []
            segments: list[list[bytes]] = []
            metas: list[dict[str, Any]] = []
            if self.shown is not None:
                check_write_size(
                    list(zip(prepared, executors, strict=True)), self.principal, self.turn_id, limit, "batch"
                )
            identity, listing = self.keys.sealing(owner, version)
            sealer = EntrySealer(wrapper, owner, self.turn_id, version)
            for index, (step, (_, executor, obs), prep) in enumerate(zip(steps, checked, prepared, strict=True)):
                inline = self.shown(obs, step) if self.shown is not None else None
                shown_items.append(inline)
                meta = prep.meta(self.principal, step, executor, created, created + ttl, inline)
                if (version, index) not in identities or self.shown is not None:
                    identities[(version, index)] = prep.identity(identity)
                meta["content_id"] = identities[(version, index)]
                row, sealed, _ = prep.seal_in(sealer, listing, version, owner, self.turn_id, meta)
                rows.append(row)
                segments.append(sealed)
                metas.append(meta)
            return rows, segments, metas

        steps = [step for step, _, _ in checked]
        # As a put: under the owner's lock shared when the turn's reservation (this process's hint)
        # covers the batch's given steps, else (or when it falls short) exclusive.
        try:
            shared = self.shown is None and self.entries.spare(owner, self.turn_id) >= bound
            rows, _, metas = self._written(seal, created, steps, shared)
        except OwnerLockNeeded:
            rows, _, metas = self._written(seal, created, steps, False)
        self.entries.left(owner, self.turn_id, self.left)
        views = [
            {"ok": True, "scratchpad_id": row["id"], **meta["view"]} for row, meta in zip(rows, metas, strict=True)
        ]
        if self.shown is None:
            return views
        return [view if inline is None else inline[0] for view, inline in zip(views, shown_items, strict=True)]

    def _written(
        self, seal: Callable[[int, Wrapper], _Sealed], created: float, steps: list[int], shared: bool
    ) -> _Sealed:
        """The sealed batch written (``Keystore.write_current``), under the owner's lock ``shared``
        or exclusive. Raises OwnerLockNeeded: ``shared``, and the turn's reservation fell short."""
        self.shared = shared
        self.announced = self._prefetch(created, steps)  # built once: the same statements again inside ``_write``
        return self.keys.write_current(
            self.principal.owner_user_id,
            seal,
            lambda conn, sealed: self._write(conn, sealed, created),
            attempts=5,
            count=len(steps),
            prefetch=self.announced,
            busy="could not store the batch: its ids, steps or owner key kept changing; try again",
            turn=self.turn_id if shared else None,
            unknown=IfUnknown(self._landed, self._maybe_stored),
        )

    def _landed(self, conn: Conn, sealed: _Sealed) -> bool:
        """Whether the batch's entries are stored (one transaction wrote all or none)."""
        return bool(stored_entries(conn, self.principal.owner_user_id, [row["id"] for row in sealed[0]]))

    def _maybe_stored(self, sealed: _Sealed, why: str) -> StoreUnavailableError:
        """The error of a batch whose COMMIT's answer was lost and could not be looked up."""
        ids = [str(row["id"]) for row in sealed[0]]
        return maybe_stored(ids, why, sent="the batch's COMMIT", chosen=self.shown is not None)

    def _steps(
        self, checked: list[tuple[int, str, Any]], fixed: list[Prepared], now: float
    ) -> tuple[list[int], list[Prepared]]:
        """The items' steps and shaped observations before each seal: the caller's
        (``fixed``), or (``shown``) the next steps, looked up and shaped again each time."""
        if self.shown is None:
            return [step for step, _, _ in checked], fixed
        first = self.entries.listings.last_step(self.principal, self.turn_id, now) + 1
        steps = list(range(first, first + len(checked)))
        check_step_num(steps[-1])
        policy = self.entries.policy
        return steps, [Prepared.of(obs, step, policy) for step, (_, _, obs) in zip(steps, checked, strict=True)]

    def _write(self, conn: Conn, sealed: _Sealed, now: float) -> _Sealed:
        """Inside the owner's write transaction: steps, version, quota, inserts, the head's change."""
        rows, segments, _ = sealed
        owner = self.principal.owner_user_id
        steps = [row["step_num"] for row in rows]
        found, head_rows = read_with_heads(conn, self.announced)
        # The given steps' latest expiry came with the quota's row: looked at row by row only when one is live.
        if self.shown is not None or live(taken(found), now):
            self._check_steps(conn, steps, now)
        version = rows[0]["key_version"]
        space: Room | None = None
        if self.shared:
            Keystore.check_newest(found["newest"], version)
        else:
            space = room(conn, self.entries.policy, owner, version, now, "batch", found)
        _insert_entries(conn, self.entries.dialect, rows)
        insert_segments(conn, rows, segments)
        self.left = self.entries.heads.change(
            conn,
            owner,
            self.turn_id,
            lambda head: head.add_all("e", ((r["id"], entry_item(r)) for r in rows)),
            version,
            room=space,
            turn_only=self.shared,
            rows=head_rows,
        )
        return sealed

    def _prefetch(self, now: float, steps: list[int]) -> list[tuple[str, Params]]:
        """The write's reads, sent with BEGIN: the quota (with the given steps' latest expiry) and the turn's heads."""
        return self._reads(now, None if self.shown is not None else steps)

    def _reads(self, now: float, steps: list[int] | None) -> list[tuple[str, Params]]:
        """The quota's row, with the latest expiry of the entries at ``steps`` when
        given, and the turn's heads (one statement on PostgreSQL: ``beside_sql``)."""
        owner = self.principal.owner_user_id
        quota = quota_sql(owner, now, None if steps is None else self._steps_sql(steps), records=not self.shared)
        return with_heads(self.entries.dialect, quota, owner, self.turn_id, turn_only=self.shared)

    def _steps_query(self, steps: list[int]) -> tuple[str, str, str, Params]:
        """``_check_steps``'s query, as ``Access.rows`` and ``rows_sql`` take it."""
        where = f"turn_id = ? AND step_num IN ({', '.join('?' * len(steps))})"
        return "entries", "step_num, expires_at", where, (self.turn_id, *steps)

    def _steps_sql(self, steps: list[int]) -> tuple[str, Params]:
        """``_check_steps``'s query (for ``Conn.prefetch``)."""
        return self.access.rows_sql(self.principal, *self._steps_query(steps))

    def _check_steps(self, conn: Conn, steps: list[int], now: float) -> None:
        """Refuse steps a live entry of the turn in the scope has (chosen ones: seal again)."""
        rows = self.access.rows(self.principal, *self._steps_query(steps), conn=conn)
        taken = sorted(row["step_num"] for row in live(rows, now))
        if taken and self.shown is not None:
            raise DuplicateKeyError
        if taken:
            raise InvalidArgumentError(f"step {taken[0]} is already recorded in turn {self.turn_id!r}")
        if (
            self.shown is not None
            and self.entries.listings.last_step(self.principal, self.turn_id, now, conn) >= steps[0]
        ):
            raise DuplicateKeyError  # a higher step appeared: these are no longer the next ones


# A batch's entry rows per INSERT on SQLite: one statement for a batch of up to this many
# (21 columns: 1,344 parameters, far below SQLite's 32,766), each size compiled once.
_ROWS_PER_INSERT = 64


def _insert_entries(conn: Conn, dialect: str, rows: list[dict[str, Any]]) -> None:
    """Insert a batch's entry rows: on SQLite in one statement (per ``_ROWS_PER_INSERT``),
    on PostgreSQL one prepared statement per row, all sent in the transaction's next message."""
    columns = list(rows[0])
    one = f"({', '.join('?' * len(columns))})"
    insert = f"INSERT INTO entries({', '.join(columns)}) VALUES "
    if dialect == "postgresql":
        conn.executemany(insert + one, [tuple(row[c] for c in columns) for row in rows])
        return
    # Every row of a batch has its columns in one order (``Prepared.seal_in``): its values as they come.
    same = all(list(row) == columns for row in rows)
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        values = [v for row in chunk for v in row.values()] if same else [row[c] for row in chunk for c in columns]
        conn.defer(insert + ", ".join([one] * len(chunk)), tuple(values))


def insert_segments(conn: Conn, rows: list[dict[str, Any]], segments: list[list[bytes]]) -> None:
    """Insert the segment rows of entries of several segments (one segment stays in its row)."""
    values = [
        (row["id"], seq, data)
        for row, parts in zip(rows, segments, strict=True)
        if len(parts) > 1
        for seq, data in enumerate(parts)
    ]
    if values:
        conn.executemany("INSERT INTO segments(entry_id, seq, data) VALUES (?, ?, ?)", values)
