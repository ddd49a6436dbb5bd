"""The entries: the put pipeline, the authenticated open, the turn listings, delete, gc, stats.

Built from its parts (the database, the keystore, the authorized access path,
the policy, the clock), never from a ``Scratchpad``. Every fetch of an entry
row goes through ``access.Access``; every entry is sealed by
``crypto.seal_entry`` and opened by ``crypto.open_entry``.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import reads, shaping
from ._backend import Backend, Conn, DuplicateKeyError, Params, Rows
from ._db import Database
from ._records import Records
from .access import Access, audit_log, check_principal
from .crypto import EntryCipher, Header, Wrapper, open_entry, seal_entry, split_bytes, split_text
from .errors import ExpiredError, IntegrityError, InvalidArgumentError, NotFoundError, QuotaExceededError
from .heads import Head, Heads, entry_item, same_entry
from .keystore import NEWEST_VERSION_SQL, Keystore
from .policy import NOT_FOUND_MESSAGE, Policy
from .principal import Principal, check_identifier

__all__ = ["ROTATE_ADVICE_LOG2", "Entries", "Entry", "Opened", "check_step_num"]

# AES-GCM with random 96-bit nonces stays within NIST's bound for 2**32
# encryptions per key; we advise rotating a key long before, at 2**28.
ROTATE_ADVICE_LOG2 = 28

_ID_RE = re.compile(r"[0-9a-f]{16}")
# Clear columns that the sealed metadata repeats; a mismatch means tampering.
_SEALED_COLUMNS = ("actor", "channel", "step_num", "executor_name", "created_at", "expires_at")
# check_step_free's columns and condition (turn, step).
_STEP_QUERY = ("expires_at", "turn_id = ? AND step_num = ?")
_COLUMNS = (
    "id, turn_id, step_num, executor_name, content_kind, size_bytes,"
    " size_chars, segment_count, key_version, created_at, expires_at, wrapped_key, nonce_prefix,"
    " commitment, sealed_meta, stored_bytes"
)
# An entry to open comes with its segment when it has only one (up to
# SEGMENT_BYTES: most entries), selected with the authorized row itself: one
# query per read (one round trip on PostgreSQL) instead of two.
_OPEN_COLUMNS = (
    f"{_COLUMNS}, CASE WHEN segment_count = 1 THEN"
    " (SELECT data FROM segments WHERE segments.entry_id = entries.id AND segments.seq = 0) END AS only_segment"
)
# The type every clear column of an entry must have; SQLite's dynamic typing
# would let an edited file hand us a string where the code expects a number.
_COLUMN_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "owner_user_id": str,
    "actor": str,
    "channel": str,
    "turn_id": str,
    "step_num": int,
    "executor_name": str,
    "content_kind": str,
    "size_bytes": int,
    "size_chars": int,
    "segment_count": int,
    "key_version": int,
    "created_at": (float, int),
    "expires_at": (float, int),
    "wrapped_key": bytes,
    "nonce_prefix": bytes,
    "commitment": bytes,
    "sealed_meta": bytes,
}


@dataclass(frozen=True)
class Entry:
    """A whole stored observation, as returned by ``Scratchpad.get``."""

    scratchpad_id: str
    owner_user_id: str
    actor: str
    channel: str
    turn_id: str
    step_num: int
    executor_name: str
    kind: str
    size_bytes: int
    size_chars: int
    created_at: float
    expires_at: float
    observation: Any
    view: dict[str, Any]


@dataclass(frozen=True)
class Opened:
    """An authorized, authenticated entry whose content is still sealed."""

    row: dict[str, Any]
    meta: dict[str, Any]
    content: reads.SegmentedContent
    cipher: EntryCipher

    def view(self) -> dict[str, Any]:
        return {"ok": True, "scratchpad_id": self.row["id"], **self.meta["view"]}

    def entry(self) -> Entry:
        """The whole entry, its observation rebuilt."""
        row, meta = self.row, self.meta
        whole = self.content.slice(0, self.content.size)
        return Entry(
            scratchpad_id=row["id"],
            owner_user_id=row["owner_user_id"],
            actor=row["actor"],
            channel=row["channel"],
            turn_id=row["turn_id"],
            step_num=row["step_num"],
            executor_name=row["executor_name"],
            kind=row["content_kind"],
            size_bytes=row["size_bytes"],
            size_chars=row["size_chars"],
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            observation=shaping.rebuild(meta["shape"], whole, meta["rest"]),
            view=self.view(),
        )


class Entries:
    """The entries of one store. Safe to share between threads."""

    def __init__(self, db: Backend, keys: Keystore, access: Access, policy: Policy, clock: Callable[[], float]) -> None:
        self._db = db
        self._keys = keys
        self._access = access
        self.policy = policy
        self._clock = clock
        self.heads = Heads(db, keys, policy)

    def now(self, now: float | None) -> float:
        """The time for expiry: ``now`` (validated) or the clock's.

        Raises:
            InvalidArgumentError: ``now`` is not a finite number of seconds.
        """
        return _check_now(self._clock() if now is None else now)

    def ttl(self, ttl_seconds: int | None) -> int:
        """The policy's default, or ``ttl_seconds`` checked against its maximum.

        Raises:
            InvalidArgumentError: not a positive integer, or above ``max_ttl_seconds``.
        """
        if ttl_seconds is None:
            return self.policy.default_ttl_seconds
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise InvalidArgumentError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        if ttl_seconds > self.policy.max_ttl_seconds:
            raise InvalidArgumentError(
                f"ttl_seconds {ttl_seconds} exceeds the policy's max_ttl_seconds ({self.policy.max_ttl_seconds})"
            )
        return ttl_seconds

    # -- put -------------------------------------------------------------------------------

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
    ) -> dict[str, Any]:
        """Store an observation (see ``Scratchpad.put``), keeping (sealed) what a
        turn showed the model: ``inline`` is ``(item,)`` when the observation
        went into the history itself. With ``free_step``, the write transaction
        refuses a step that a live entry of the turn in the principal's scope already has.
        With ``next_step`` too (and no ``inline``), ``step_num`` is only a guess:
        the write transaction, which serializes the owner's writes, gives the
        entry the step after the turn's highest live one in the principal's
        scope (sealing its metadata again when the guess was not that), so
        concurrent writers never collide; the returned view has the step taken."""
        if next_step and (inline is not None or not free_step):
            raise InvalidArgumentError("next_step needs free_step and no inline item")
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        check_identifier("executor_name", executor_name)
        check_step_num(step_num)
        ttl = self.ttl(ttl_seconds)
        prepared = _Prepared.of(observation, step_num, self.policy)
        created = self.now(now)
        meta = prepared.meta(principal, step_num, executor_name, created, created + ttl, inline)
        owner = principal.owner_user_id
        identities: dict[int, str] = {}

        def seal(version: int, wrapper: Wrapper) -> tuple[dict[str, Any], list[bytes], EntryCipher]:
            if version not in identities:
                identities[version] = self._keys.identity(owner, version).of(prepared.kind, prepared.segments)
            meta["content_id"] = identities[version]
            return prepared.seal(wrapper, version, owner, turn_id, meta)

        def write(conn: Conn, sealed: tuple[dict[str, Any], list[bytes], EntryCipher]) -> str:
            row, segments, cipher = sealed
            if next_step:
                taken = self.last_step(principal, turn_id, created, conn) + 1
                check_step_num(taken)
                if taken != row["step_num"]:
                    resealed = prepared.restep(meta, cipher, taken, observation)
                    row["stored_bytes"] += len(resealed) - len(row["sealed_meta"])  # the quota counts the new one
                    row["step_num"], row["sealed_meta"] = taken, resealed
            elif free_step:
                self.check_step_free(principal, turn_id, step_num, created, conn)
            self.check_quota(conn, owner, row["key_version"], row["stored_bytes"], created, "entry")
            conn.defer(
                f"INSERT INTO entries({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
            )
            conn.executemany(
                "INSERT INTO segments(entry_id, seq, data) VALUES (?, ?, ?)",
                ((row["id"], seq, data) for seq, data in enumerate(segments)),
            )
            self.heads.change(
                conn, owner, turn_id, lambda head: head.e.__setitem__(row["id"], entry_item(row)), row["key_version"]
            )
            return str(row["id"])

        # The transaction's reads go in one round trip with its version check (PostgreSQL).
        prefetch = [_quota_sql(owner, created), Heads.select_sql(owner, turn_id)]
        if free_step and not next_step:
            prefetch.append(_step_sql(self._access, principal, turn_id, step_num))
        entry_id = self._keys.write_current(
            owner,
            seal,
            write,
            attempts=5,
            busy="could not store the entry: its id or owner key kept changing; try again",
            prefetch=prefetch,
        )
        return {"ok": True, "scratchpad_id": entry_id, **meta["view"]}

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
        """Store several observations in one transaction, all or nothing (see
        ``Scratchpad.put_many``); with ``shown``, the steps are chosen (see ``_Batch``)."""
        return _Batch(self, self._keys, self._access, principal, turn_id, shown).put(items, ttl_seconds, now)

    def check_quota(self, conn: Conn, owner: str, version: int, adding: int, now: float, what: str) -> None:
        """Inside the owner's write transaction, in one statement: refuse a write
        sealed under owner-key ``version`` when that is no longer the newest
        (``StaleOwnerKey``, which the keystore's retry takes), and refuse
        ``adding`` bytes (a new ``what``: entry or record) that do not fit in
        the owner's quota.

        Entries count what their row costs on disk (``row_cost``), and so do
        the owner's live checkpoints and compaction marks (``Records.used_sql``:
        a turn keeps few). ``owner_usage`` (kept by triggers) still counts
        expired entries that gc has not removed: when even that bound leaves
        room, the exact sum over the owner's live entries, O(entries), would
        not change the answer. The message gives the new bytes and the quota
        only: the owner's total counts entries outside the caller's scope,
        which it must not learn of.

        Raises:
            QuotaExceededError: no room.
        """
        quota = self.policy.owner_quota_bytes
        found = conn.query(*_quota_sql(owner, now))[0]
        Keystore.check_newest(found["newest"], version)
        used, stored = int(found["used"]), int(found["stored"] or 0)
        if used + stored + adding > quota:
            live = conn.query(
                "SELECT CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS used FROM entries"
                " WHERE owner_user_id = ? AND expires_at > ?",
                (owner, now),
            )
            stored = int(live[0]["used"])
        if used + stored + adding > quota:
            raise QuotaExceededError(
                f"owner quota exceeded: the {what} needs {adding} bytes on disk and owner_quota_bytes"
                f" {quota} has no room for it; delete entries or let them expire"
            )

    # -- authorize → fetch → decrypt ---------------------------------------------------------

    def open(
        self, principal: Principal, scratchpad_id: object, now: float | None, turn_id: str | None = None
    ) -> Opened:
        """The one path from an id to an entry's plaintext (of one turn, if ``turn_id`` is given).

        Raises:
            NotFoundError: absent, malformed, another owner's, or outside the scope.
            ExpiredError: the caller's own entry has expired.
            IntegrityError: the stored entry fails authentication.
        """
        check_principal(principal)
        if not isinstance(scratchpad_id, str) or not _ID_RE.fullmatch(scratchpad_id):
            self._access.denied(principal, "malformed id")
            raise NotFoundError(NOT_FOUND_MESSAGE)
        where = "id = ?"
        params: tuple[str, ...] = (scratchpad_id,)
        if turn_id is not None:
            where, params = "id = ? AND turn_id = ?", (scratchpad_id, check_identifier("turn_id", turn_id))
        # The entry's row and its turn's head rows: one round trip on PostgreSQL.
        head_sql = Heads.entry_select_sql(principal.owner_user_id, scratchpad_id)
        rows, head_rows = _rows_and_head(self._db, self._access, principal, head_sql, _OPEN_COLUMNS, where, params)
        if not rows:
            self._access.denied(principal, scratchpad_id)
            raise NotFoundError(NOT_FOUND_MESSAGE)
        current = self.now(now)

        def fetch(got: Rows | None = None) -> tuple[dict[str, Any] | None, Opened | None]:
            if got is None:
                got = self._access.rows(principal, "entries", _OPEN_COLUMNS, where, params)
            if not got:
                return None, None
            row = got[0]
            _check_row_types(row)
            if turn_id is not None and row["turn_id"] != turn_id:
                raise NotFoundError(NOT_FOUND_MESSAGE)
            if row["expires_at"] <= current:
                return row, None
            return row, next(self._access.open_each(principal, "entries", _OPEN_COLUMNS, [row], self._authenticate))

        def check(head: Head, fetched: tuple[dict[str, Any] | None, Opened | None]) -> None:
            row, opened = fetched
            if row is not None and opened is None:
                self.heads.check_expired_in(head, row, current)
            elif opened is not None:
                same_entry(head, opened.row)

        _check_row_types(rows[0])
        row, opened = self.heads.checked(
            principal.owner_user_id, rows[0]["turn_id"], fetch, check, first=(fetch(rows), head_rows)
        )
        if row is None:  # deleted meanwhile
            raise NotFoundError(NOT_FOUND_MESSAGE)
        if opened is None:
            raise ExpiredError("this entry has expired")
        return opened

    def _authenticate(self, row: dict[str, Any]) -> Opened:
        """Unwrap the item key, check the commitment, open and cross-check the metadata."""
        _check_row_types(row)
        header = Header(
            row["id"],
            row["owner_user_id"],
            row["turn_id"],
            row["content_kind"],
            row["size_bytes"],
            row["size_chars"],
            row["segment_count"],
            row["key_version"],
        )
        wrapper = self._keys.owner_wrapper(header.owner_user_id, header.key_version)
        cipher = open_entry(wrapper, header, row["wrapped_key"], row["nonce_prefix"], row["commitment"])
        meta = json.loads(cipher.open_meta(row["sealed_meta"]))
        for column in _SEALED_COLUMNS:
            if meta[column] != row[column]:
                raise IntegrityError(f"the entry's clear {column} does not match its sealed copy")
        counts = meta["counts"]
        if counts is None:  # binary: every segment but the last is full
            counts = shaping.binary_counts(header.size_bytes, header.segment_count)
        breaks = meta.get("breaks")
        if len(counts) != header.segment_count or (breaks is not None and len(breaks) != header.segment_count):
            raise IntegrityError("the entry's segment index does not match its header")
        content = reads.SegmentedContent(
            header.kind,
            counts,
            _fetcher(self._db, row["id"], row["owner_user_id"], cipher, header.segment_count, row.get("only_segment")),
            breaks=breaks,
            line_count=meta.get("lines"),
        )
        return Opened(row, meta, content, cipher)

    def all_rows(self) -> Rows:
        """Every entry row of the store, by owner and turn (housekeeping: ``verify``)."""
        return self._db.query(
            f"SELECT owner_user_id, actor, channel, {_COLUMNS} FROM entries ORDER BY owner_user_id, turn_id, step_num",
            admin=True,
        )

    def usage_rows(self) -> dict[str, int]:
        """``owner_usage`` as stored: each owner's counted bytes (housekeeping: ``verify``)."""
        rows = self._db.query("SELECT owner_user_id, stored_bytes FROM owner_usage", admin=True)
        return {str(row["owner_user_id"]): int(row["stored_bytes"]) for row in rows}

    def verify_row(self, row: dict[str, Any]) -> None:
        """Authenticate an entry row and every one of its segments (``verify``).

        Raises:
            IntegrityError: the row or a segment fails authentication.
        """
        opened = self._authenticate(row)
        count = int(row["segment_count"])
        if count:
            _fetcher(self._db, row["id"], row["owner_user_id"], opened.cipher, count)(0, count - 1)

    def get(
        self, principal: Principal, scratchpad_id: str, *, now: float | None = None, turn_id: str | None = None
    ) -> Entry:
        return self.open(principal, scratchpad_id, now, turn_id).entry()

    def read(
        self,
        principal: Principal,
        scratchpad_id: str,
        mode: str = "head",
        *,
        now: float | None = None,
        turn_id: str | None = None,
        **args: Any,
    ) -> dict[str, Any]:
        """``Scratchpad.read``: part of an entry, never more than ``max_read_chars``."""
        if mode not in reads.MODES:
            raise InvalidArgumentError(f"unknown read mode {mode!r}; use one of {', '.join(reads.MODES)}")
        opened = self.open(principal, scratchpad_id, now, turn_id)
        extra = {"scratchpad_id": opened.row["id"]}
        result = reads.read_fitted(opened.content, mode, cap=self.policy.max_read_chars, extra=extra, **args)
        if self.policy.log_reads:
            audit_log.info("read: owner=%r id=%s mode=%s", principal.owner_user_id, opened.row["id"], mode)
        return result

    # -- turn listings ---------------------------------------------------------------------------

    def turn_entries(self, principal: Principal, turn_id: str, now: float | None) -> list[Opened]:
        """The live entries of a turn in the principal's scope, authenticated, in
        step order, checked against the turn's head."""
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.now(now)
        order = "ORDER BY step_num, created_at, id"

        def fetch(rows: Rows | None = None) -> list[Opened]:
            if rows is None:
                rows = self._access.rows(principal, "entries", _COLUMNS, "turn_id = ?", (turn_id,), order)
            return list(self._authenticate_rows(principal, _live(rows, current)))

        def check(head: Head, opened: list[Opened]) -> None:
            self.heads.check_entries_in(head, principal, turn_id, [each.row for each in opened], current)

        # The turn's rows and its head rows: one round trip on PostgreSQL.
        head_sql = Heads.select_sql(principal.owner_user_id, turn_id)
        rows, head_rows = _rows_and_head(
            self._db, self._access, principal, head_sql, _COLUMNS, "turn_id = ?", (turn_id,), order
        )
        return self.heads.checked(principal.owner_user_id, turn_id, fetch, check, first=(fetch(rows), head_rows))

    def turn_offloads(self, principal: Principal, turn_id: str, now: float | None) -> bool:
        """Whether a live entry of the turn in the principal's scope was offloaded
        (its sealed metadata holds no ``inline`` history item).

        Entries are fetched newest step first, in pages that double (8, 16,
        ...), and authenticated one at a time until one is offloaded: when the
        latest steps were offloaded, one small indexed query and one
        authentication answer, whatever the turn's length. The answer comes
        from authenticated metadata only.
        """
        rows = self._newest_first(principal, turn_id, _COLUMNS, now)
        return any("inline" not in opened.meta for opened in self._authenticate_rows(principal, rows))

    def _newest_first(
        self, principal: Principal, turn_id: str, columns: str, now: float | None, conn: Conn | None = None
    ) -> Iterator[dict[str, Any]]:
        """The turn's live rows in the principal's scope, highest step first, fetched
        lazily in pages that double (8, 16, ...): a caller that stops early pays
        for one small indexed query."""
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.now(now)
        offset, size = 0, 8
        while True:
            # (step_num, id) follows entries_owner_turn, so a page reads only its own rows.
            rows = self._access.rows(
                principal,
                "entries",
                columns,
                "turn_id = ?",
                (turn_id,),
                "ORDER BY step_num DESC, id DESC LIMIT ? OFFSET ?",
                (size, offset),
                conn=conn,
            )
            yield from _live(rows, current)
            if len(rows) < size:
                return
            offset, size = offset + size, size * 2

    def _authenticate_rows(self, principal: Principal, rows: Iterable[dict[str, Any]]) -> Iterator[Opened]:
        return self._access.open_each(principal, "entries", _COLUMNS, rows, self._authenticate)

    def last_step(self, principal: Principal, turn_id: str, now: float | None, conn: Conn | None = None) -> int:
        """The highest step number of the turn's live entries in the principal's
        scope, 0 for none: newest first, in doubling pages.

        Read from the clear column: it only proposes the next step to try, and
        ``Turn.record`` checks that one; nothing of it reaches the model.

        Raises:
            IntegrityError: a clear step or expiry that is not a number.
        """
        for row in self._newest_first(principal, turn_id, "step_num, expires_at", now, conn):
            _check_row_types({"step_num": row["step_num"]})
            return int(row["step_num"])
        return 0

    def check_step_free(
        self, principal: Principal, turn_id: str, step_num: int, now: float | None, conn: Conn | None = None
    ) -> None:
        """Refuse a step that a live entry of the turn in the principal's scope
        already has: one lookup on the (owner, turn, step) index. Inside the
        put's write transaction (``conn``), which serializes the owner's writes
        on both backends, no other writer can take the step between this look and the insert.

        Raises:
            InvalidArgumentError: a bad principal, turn id or step, or the step is taken.
        """
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        check_step_num(step_num)
        rows = self._access.rows(principal, "entries", *_STEP_QUERY, (turn_id, step_num), conn=conn)
        if _live(rows, self.now(now)):
            raise InvalidArgumentError(f"step {step_num} is already recorded in turn {turn_id!r}")

    # -- expiry, delete, gc, stats -----------------------------------------------------------------

    def transaction(self, owner: str) -> AbstractContextManager[Conn]:
        """A write transaction of ``owner`` (for writes that span entries and records)."""
        return self._db.transaction(owner)

    def prepare_extend(self, principal: Principal, turn_id: str, target: float, now: float) -> list[tuple[Any, ...]]:
        """Re-sealed metadata (outside any transaction) for the turn's live entries
        that expire before ``target``; ``apply_extend`` writes them."""
        updates = []
        for opened in self.turn_entries(principal, turn_id, now):
            if opened.row["expires_at"] >= target:
                continue
            sealed = opened.cipher.seal_meta(shaping.dumps({**opened.meta, "expires_at": target}))
            updates.append((target, sealed, opened.row["id"], opened.row["sealed_meta"]))
        return updates

    def delete(self, principal: Principal, scratchpad_id: str) -> None:
        """``Scratchpad.delete``."""
        check_principal(principal)
        if not isinstance(scratchpad_id, str) or not _ID_RE.fullmatch(scratchpad_id):
            raise NotFoundError(NOT_FOUND_MESSAGE)
        owner = principal.owner_user_id
        turn_sql = ("SELECT turn_id FROM entries WHERE id = ? AND owner_user_id = ?", (scratchpad_id, owner))
        with self._db.transaction(owner) as conn:
            # Read before the delete, with it (one message on PostgreSQL): the
            # entry's turn, its head rows, the owner's newest key version.
            for sql, params in (turn_sql, Heads.entry_select_sql(owner, scratchpad_id), Heads.newest_sql(owner)):
                conn.prefetch(sql, params)
            if not self._access.delete(conn, principal, "entries", scratchpad_id):
                self._access.denied(principal, scratchpad_id)
                raise NotFoundError(NOT_FOUND_MESSAGE)
            conn.defer("DELETE FROM segments WHERE entry_id = ?", (scratchpad_id,))
            turn_id = conn.query(*turn_sql)[0]["turn_id"]
            self.heads.change(
                conn, owner, turn_id, lambda head: head.e.pop(scratchpad_id, None), entry_id=scratchpad_id
            )
        # secure_delete zeroed the pages; the checkpoint takes the old ones out of the WAL too.
        self._db.checkpoint(wait=False)


def _rows_and_head(
    db: Backend,
    access: Access,
    principal: Principal,
    head: tuple[str, Params],
    columns: str,
    where: str,
    params: Params,
    tail: str = "",
) -> tuple[Rows, Rows]:
    """``Access.rows`` over entries (each row authorized again) and the head
    query ``head``, read together (``Backend.queries``: one round trip on PostgreSQL)."""
    rows, head_rows = db.queries(
        access.rows_sql(principal, "entries", columns, where, params, tail), head, owner=principal.owner_user_id
    )
    for row in rows:
        access.policy.authorize_row(principal, row)
    return rows, head_rows


def _step_sql(access: Access, principal: Principal, turn_id: str, step_num: int) -> tuple[str, Params]:
    """``check_step_free``'s query (for ``Conn.prefetch``)."""
    return access.rows_sql(principal, "entries", *_STEP_QUERY, (turn_id, step_num))


def _fetcher(
    db: Backend, entry_id: str, owner: str, cipher: EntryCipher, count: int, only: object = None
) -> reads.Fetch:
    """The entry's segments, opened; ``only`` is the one segment of a
    one-segment entry when it came with the entry row (``_OPEN_COLUMNS``)."""

    def fetch(first: int, last: int) -> list[bytes]:
        if count == 1 and (first, last) == (0, 0) and isinstance(only, bytes):
            return [cipher.open_segment(0, only, True)]
        # Only the segments asked for travel from the database; the entry row
        # they belong to was authorized and authenticated by the caller.
        rows = db.query(
            "SELECT seq, data FROM segments WHERE entry_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
            (entry_id, first, last),
            owner=owner,
        )
        if [row["seq"] for row in rows] != list(range(first, last + 1)):
            raise IntegrityError("the entry's segments are missing or out of order")
        if not all(isinstance(row["data"], bytes) for row in rows):
            raise IntegrityError("an entry's segment is not a blob")
        return [cipher.open_segment(row["seq"], row["data"], row["seq"] == count - 1) for row in rows]

    return fetch


def _quota_sql(owner: str, now: float) -> tuple[str, Params]:
    """``check_quota``'s one query: the owner's newest key version, its usage
    bound and its live records' cost."""
    records, params = Records.used_sql(owner, now)
    return (
        f"SELECT {NEWEST_VERSION_SQL} AS newest,"
        " (SELECT stored_bytes FROM owner_usage WHERE owner_user_id = ?) AS stored,"
        f" {records} AS used",
        (owner, owner, *params),
    )


def apply_extend(conn: Conn, updates: list[tuple[Any, ...]]) -> list[str]:
    """Write ``prepare_extend``'s updates (compare-and-set) inside the caller's
    transaction; the ids of the entries extended."""
    return [
        update[2]
        for update in updates
        if conn.execute("UPDATE entries SET expires_at = ?, sealed_meta = ? WHERE id = ? AND sealed_meta = ?", update)
    ]


def delete_expired(conn: Conn, cutoff: float) -> int:
    """Delete expired entries and their segments inside the caller's (gc) transaction."""
    conn.execute("DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE expires_at <= ?)", (cutoff,))
    return conn.execute("DELETE FROM entries WHERE expires_at <= ?", (cutoff,))


def delete_owner(conn: Conn, owner: str) -> dict[str, int]:
    """Delete every entry and segment of an owner inside the caller's transaction."""
    return {
        "segments": conn.execute(
            "DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = ?)", (owner,)
        ),
        "entries": conn.execute("DELETE FROM entries WHERE owner_user_id = ?", (owner,)),
    }


def stats(
    db: Backend, keys: Keystore, access: Access, principal: Principal | None, current: float, location: str
) -> dict[str, Any]:
    """``Scratchpad.stats`` at time ``current``: for one principal's scope, or (None) for the whole store."""
    policy = access.policy
    if principal is not None:
        check_principal(principal)
        totals = access.aggregate(
            principal,
            "entries",
            "COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
            " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes",
            "expires_at > ?",
            (current,),
        )
        return {"owner_user_id": principal.owner_user_id, "scope": policy.scope, **totals}
    rows = db.query(
        "SELECT COUNT(*) AS entries, CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS bytes,"
        " CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) AS stored_bytes,"
        " COUNT(DISTINCT owner_user_id) AS owners,"
        " COUNT(CASE WHEN expires_at <= ? THEN 1 END) AS expired_pending_gc FROM entries",
        (current,),
        admin=True,
    )
    # With the wraps this process counted but has not written yet (Keystore.WRAP_FLUSH_EVERY).
    pending = keys.pending_wraps()
    counted = db.query("SELECT owner_user_id, version, wrap_count FROM owner_keys", admin=True)
    usage: dict[str, Any] = {
        "owner_key_max_wraps": max(
            (int(r["wrap_count"]) + pending.get((r["owner_user_id"], r["version"]), 0) for r in counted), default=0
        )
    }
    usage["master_key_wraps"] = int(keys.store_meta().get("master_wrap_count", "0"))
    usage["advice"] = [
        f"{name} has sealed {count} keys with random nonces; rotate it"
        f" (AES-GCM limit 2**32, advised below 2**{ROTATE_ADVICE_LOG2})"
        for name, count in (
            ("an owner key", usage["owner_key_max_wraps"]),
            ("the master key", usage["master_key_wraps"]),
        )
        if count >= 2**ROTATE_ADVICE_LOG2
    ]
    result = {"path": location, "policy": policy.name, **rows[0], "key_usage": usage}
    if isinstance(db, Database):
        path = db.path
        result["file_bytes"] = {suffix or "db": _file_size(Path(f"{path}{suffix}")) for suffix in ("", "-wal", "-shm")}
        result["wal"] = db.wal_status()
    return result


# What ``Turn.record_many`` shows the model of an observation at a step:
# ``(history item,)``, or None for the view.
Shown = Callable[[Any, int], tuple[Any] | None]
# A batch sealed: its rows, each row's sealed segments, each row's metadata.
_Sealed = tuple[list[dict[str, Any]], list[list[bytes]], list[dict[str, Any]]]


class _Batch:
    """One ``put_many``: every observation checked and sealed first, then one
    write transaction that checks each step, the key version and the quota of
    the whole batch, and inserts every row (a failure stores none).

    With ``shown`` (``Turn.record_many``), items are ``(executor_name,
    observation)`` and take the steps after the turn's highest live one,
    consecutively: read before sealing (the history item may name its step)
    and checked again inside the transaction; another writer that took one
    meanwhile makes the batch seal again (``write_current``'s retry)."""

    def __init__(
        self,
        entries: Entries,
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
        checked = self._items(items)
        ttl = self.entries.ttl(ttl_seconds)
        created = self.entries.now(now)
        if not checked:
            return []
        owner = self.principal.owner_user_id
        policy = self.entries.policy
        if self.shown is None:  # shaped once: the steps are the caller's
            fixed = [_Prepared.of(obs, step, policy) for step, _, obs in checked]
        identities: dict[tuple[int, int], str] = {}
        shown_items: list[tuple[Any] | None] = []

        def seal(version: int, wrapper: Wrapper) -> _Sealed:
            steps = [step for step, _, _ in checked]
            prepared = fixed if self.shown is None else []
            shown_items.clear()
            if self.shown is not None:
                first = self.entries.last_step(self.principal, self.turn_id, created) + 1
                steps = list(range(first, first + len(checked)))
                check_step_num(steps[-1])
                prepared = [_Prepared.of(obs, step, policy) for step, (_, _, obs) in zip(steps, checked, strict=True)]
            rows: list[dict[str, Any]] = []
            segments: list[list[bytes]] = []
            metas: list[dict[str, Any]] = []
            for index, (step, (_, executor, obs), prep) in enumerate(zip(steps, checked, prepared, strict=True)):
                inline = self.shown(obs, step) if self.shown is not None else None
                shown_items.append(inline)
                meta = prep.meta(self.principal, step, executor, created, created + ttl, inline)
                if (version, index) not in identities or self.shown is not None:
                    identities[(version, index)] = self.keys.identity(owner, version).of(prep.kind, prep.segments)
                meta["content_id"] = identities[(version, index)]
                row, sealed, _ = prep.seal(wrapper, version, owner, self.turn_id, meta)
                rows.append(row)
                segments.append(sealed)
                metas.append(meta)
            return rows, segments, metas

        def write(conn: Conn, sealed: _Sealed) -> _Sealed:
            rows, segments, _ = sealed
            self._check_steps(conn, [row["step_num"] for row in rows], created)
            version = rows[0]["key_version"]
            self.entries.check_quota(conn, owner, version, sum(r["stored_bytes"] for r in rows), created, "batch")
            columns = list(rows[0])
            conn.executemany(
                f"INSERT INTO entries({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [tuple(row[c] for c in columns) for row in rows],
            )
            conn.executemany(
                "INSERT INTO segments(entry_id, seq, data) VALUES (?, ?, ?)",
                [
                    (row["id"], seq, data)
                    for row, parts in zip(rows, segments, strict=True)
                    for seq, data in enumerate(parts)
                ],
            )
            self.entries.heads.change(
                conn, owner, self.turn_id, lambda head: head.e.update((r["id"], entry_item(r)) for r in rows), version
            )
            return sealed

        rows, _, metas = self.keys.write_current(
            owner,
            seal,
            write,
            attempts=5,
            count=len(checked),
            prefetch=[Heads.select_sql(owner, self.turn_id)],
            busy="could not store the batch: its ids, steps or owner key kept changing; try again",
        )
        views = [
            {"ok": True, "scratchpad_id": row["id"], **meta["view"]} for row, meta in zip(rows, metas, strict=True)
        ]
        if self.shown is None:
            return views
        return [view if inline is None else inline[0] for view, inline in zip(views, shown_items, strict=True)]

    def _check_steps(self, conn: Conn, steps: list[int], now: float) -> None:
        """Inside the write: refuse steps a live entry of the turn in the
        principal's scope has (chosen steps: seal again, another writer took one)."""
        marks = ", ".join("?" * len(steps))
        rows = self.access.rows(
            self.principal,
            "entries",
            "step_num, expires_at",
            f"turn_id = ? AND step_num IN ({marks})",
            (self.turn_id, *steps),
            conn=conn,
        )
        taken = sorted(row["step_num"] for row in _live(rows, now))
        if taken and self.shown is not None:
            raise DuplicateKeyError
        if taken:
            raise InvalidArgumentError(f"step {taken[0]} is already recorded in turn {self.turn_id!r}")
        if self.shown is not None and self.entries.last_step(self.principal, self.turn_id, now, conn) >= steps[0]:
            raise DuplicateKeyError  # a higher step appeared: these are no longer the next ones


@dataclass
class _Prepared:
    """An observation shaped and cut into segments, before it is sealed (pure)."""

    kind: str
    shape: str
    content: str | bytes
    rest: dict[str, Any] | None
    segments: list[bytes]
    counts: list[int] | None
    size_bytes: int
    size_chars: int
    breaks: list[int] | None
    line_count: int | None
    stored_bytes: int  # what the observation stores (max_entry_bytes); the row's cost on disk is row_cost
    view: dict[str, Any]
    inline_max_chars: int  # the view's bound, kept for the next-step re-seal

    @classmethod
    def of(cls, observation: Any, step_num: int, policy: Policy) -> _Prepared:
        """Raises InvalidArgumentError (not storable) or QuotaExceededError (over ``max_entry_bytes``)."""
        max_entry_bytes = policy.max_entry_bytes
        kind, shape, content, rest = shaping.classify(observation, policy.max_json_depth)
        segments, counts, size_chars, breaks, line_count = _split(content)
        size_bytes = sum(len(s) for s in segments)
        # The limits count everything the observation stores: content and other fields.
        stored_bytes = size_bytes + (len(shaping.dumps(rest)) if rest else 0)
        if stored_bytes > max_entry_bytes:
            raise QuotaExceededError(
                f"the observation has {stored_bytes} bytes; the policy's max_entry_bytes is {max_entry_bytes}"
            )
        limit = policy.inline_max_chars
        view = shaping.view(kind, step_num, size_bytes, content, rest, observation, limit)
        return cls(
            kind,
            shape,
            content,
            rest,
            segments,
            counts,
            size_bytes,
            size_chars,
            breaks,
            line_count,
            stored_bytes,
            view,
            limit,
        )

    def meta(
        self,
        principal: Principal,
        step_num: int,
        executor_name: str,
        created: float,
        expires: float,
        inline: tuple[Any] | None,
    ) -> dict[str, Any]:
        """The sealed metadata (its clear columns are checked against it on every open)."""
        meta = {
            "actor": principal.actor,
            "channel": principal.channel,
            "step_num": step_num,
            "executor_name": executor_name,
            "created_at": created,
            "expires_at": expires,
            "shape": self.shape,
            "rest": self.rest,
            "counts": self.counts,
            "breaks": self.breaks,
            "lines": self.line_count,
            "view": self.view,
        }
        if inline is not None:
            meta["inline"] = inline[0]
        return meta

    def seal(
        self, wrapper: Wrapper, version: int, owner: str, turn_id: str, meta: dict[str, Any]
    ) -> tuple[dict[str, Any], list[bytes], EntryCipher]:
        """The entry's row, sealed segments and cipher under a fresh id and item key."""
        header = Header(
            secrets.token_hex(8),
            owner,
            turn_id,
            self.kind,
            self.size_bytes,
            self.size_chars,
            len(self.segments),
            version,
        )
        crypto_columns, sealed, cipher = seal_entry(wrapper, header, shaping.dumps(meta), self.segments)
        row = {
            "id": header.entry_id,
            "owner_user_id": owner,
            "actor": meta["actor"],
            "channel": meta["channel"],
            "turn_id": turn_id,
            "step_num": meta["step_num"],
            "executor_name": meta["executor_name"],
            "content_kind": self.kind,
            "size_bytes": self.size_bytes,
            "size_chars": self.size_chars,
            "segment_count": len(self.segments),
            "key_version": version,
            "created_at": meta["created_at"],
            "expires_at": meta["expires_at"],
            **crypto_columns,
        }
        row["stored_bytes"] = row_cost(row, sealed)
        return row, sealed, cipher

    def restep(self, meta: dict[str, Any], cipher: EntryCipher, step_num: int, observation: Any) -> bytes:
        """The entry's metadata for another step, sealed (``put(next_step=True)``):
        the view names the step (its reference hint), so it is made again."""
        meta["step_num"] = step_num
        meta["view"] = shaping.view(
            self.kind, step_num, self.size_bytes, self.content, self.rest, observation, self.inline_max_chars
        )
        return cipher.seal_meta(shaping.dumps(meta))


# What a row costs on disk besides its sealed bytes (measured: an empty entry
# grows the file by about 990 bytes, 530 of them sealed): clear columns, index
# entries, b-tree cells, the segment rows' keys. Counted against the quota, so
# that empty entries, checkpoints and marks are not free.
ENTRY_ROW_OVERHEAD = 512


def row_cost(row: dict[str, Any], sealed: list[bytes]) -> int:
    """What an entry's rows cost on disk: its sealed bytes plus a fixed overhead."""
    sealed_bytes = sum(len(s) for s in sealed)
    fields = sum(len(row[c]) for c in ("sealed_meta", "wrapped_key", "nonce_prefix", "commitment"))
    return sealed_bytes + fields + ENTRY_ROW_OVERHEAD


def _split(content: str | bytes) -> tuple[list[bytes], list[int] | None, int, list[int] | None, int | None]:
    """(segments, character counts, characters, line breaks, lines) of an entry's content."""
    if isinstance(content, bytes):
        return split_bytes(content), None, 0, None, None
    segments, pieces = split_text(content)
    counts = [len(piece) for piece in pieces]
    breaks, line_count = reads.line_index(pieces)
    return segments, counts, sum(counts), breaks, line_count


def _check_now(now: object) -> float:
    """A finite number of seconds; NaN would make every expiry comparison false
    (an expired entry served), infinity every entry expired or eternal."""
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise InvalidArgumentError(f"now must be a number of seconds, not {type(now).__name__}")
    try:
        value = float(now)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise InvalidArgumentError(f"now must be a finite number of seconds, not {value}")
    return value


def check_step_num(step_num: object) -> None:
    if isinstance(step_num, bool) or not isinstance(step_num, int) or not 0 <= step_num < 2**31:
        raise InvalidArgumentError(f"step_num must be an integer from 0 to 2**31-1, not {step_num!r}")


def _check_row_types(row: dict[str, Any]) -> None:
    """Raises IntegrityError when a clear column holds a value of the wrong type."""
    for column, expected in _COLUMN_TYPES.items():
        if column in row and not isinstance(row[column], expected):
            raise IntegrityError(f"the entry's clear {column} has the wrong type")


def _live(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The rows that expire after ``now``.

    Filtered here rather than by ``expires_at > ?`` in the query: given that
    range, SQLite (which has no statistics unless ANALYZE ran) walked
    ``entries_owner_usage`` (on PostgreSQL still there; on SQLite gone since
    schema 6), every live entry of the owner, instead of the turn's part of
    ``entries_owner_turn``, and a turn's lookups grew with all of the owner's turns.

    Raises:
        IntegrityError: a clear expiry that is not a number (such a row used
            to pass ``expires_at > ?``, as text sorts after numbers, and fail
            authentication: the outcome is the same).
    """
    for row in rows:
        _check_row_types({"expires_at": row["expires_at"]})
    return [row for row in rows if row["expires_at"] > now]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
