"""Opening one entry: its row fetched through ``access.Access``, authenticated
by ``crypto.open_entry``, its content read (``Opener.open``: the one path from an id to plaintext); an entry's
row: its clear columns and their types, ``Entry``, ``Opened``, the shared checks, and
``EntryParts``, what the tables are built from."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core import read_modes, shaping
from ...core.timeline import Timeline, live
from ...crypto.formats import ENTRY_FORMAT, EntryCipher, Header, ListingKey, open_entry
from ...errors import ExpiredError, IntegrityError, InvalidArgumentError, NotFoundError
from ...keys.keystore import Keystore
from ...policy import NOT_FOUND_MESSAGE, Policy
from ...principal import Principal, check_identifier
from ...storage.base import Backend, Params, Rows
from .. import access
from ..access import ONLY_SEGMENT, Access, audit_log, check_principal
from ..heads.heads import Head, Heads, same_entry

__all__ = [
    "COLUMNS",
    "ID_RE",
    "LISTED_COLUMNS",
    "Entry",
    "EntryParts",
    "Opened",
    "Opener",
    "Readable",
    "check_row_types",
]

ID_RE = re.compile(r"[0-9a-f]{16}")
COLUMNS = (
    "id, turn_id, step_num, executor_name, content_kind, size_bytes,"
    " size_chars, segment_count, key_version, created_at, expires_at, wrapped_key, nonce_prefix,"
    " commitment, sealed_meta, stored_bytes, sealed_listing"
)
# What a listing selects: every column but those only a format-1 row needs
# (its item key and metadata: ``Opener.authenticate``), which a listing
# fetches apart, for the format-1 rows alone.
LISTED_COLUMNS = (
    "id, turn_id, step_num, executor_name, content_kind, size_bytes, size_chars,"
    " segment_count, key_version, created_at, expires_at, commitment, stored_bytes, sealed_listing"
)
# The type every clear column of an entry must have (SQLite's typing is dynamic);
# sealed_listing is None in a row written before the listing part.
_COLUMN_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("id", "owner_user_id", "actor", "channel", "turn_id", "executor_name", "content_kind"), str),
    **dict.fromkeys(("step_num", "size_bytes", "size_chars", "segment_count", "key_version", "stored_bytes"), int),
    **dict.fromkeys(("created_at", "expires_at"), (float, int)),
    **dict.fromkeys(("wrapped_key", "nonce_prefix", "commitment", "sealed_meta"), bytes),
    "sealed_listing": (bytes, type(None)),
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


@dataclass(slots=True)
class Opened:
    """An authorized, authenticated entry as a listing shows it: its clear row
    and its listing part (``view``, ``content_id``, ``inline``); content still sealed.

    Not frozen: a listing makes one per row, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` a field) costs about three times this one's; nothing
    sets a field after it is made (``row`` and ``meta`` are dicts either way)."""

    row: dict[str, Any]
    meta: dict[str, Any]

    def view(self) -> dict[str, Any]:
        return {"ok": True, "scratchpad_id": self.row["id"], **self.meta["view"]}


@dataclass(slots=True)
class Readable(Opened):
    """An entry opened with its item key: full ``meta``, and ``content`` that reads its segments."""

    content: read_modes.SegmentedContent
    cipher: EntryCipher

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


@dataclass(frozen=True)
class EntryParts:
    """What the tables are built from (never a ``Scratchpad``)."""

    db: Backend
    keys: Keystore
    access: Access
    policy: Policy
    timeline: Timeline
    heads: Heads

    def ttl(self, ttl_seconds: int | None) -> int:
        """The policy's default, or ``ttl_seconds`` checked against its maximum.

        Raises:
            InvalidArgumentError: not a positive integer, or above ``max_ttl_seconds``.
        """
        return self.policy.ttl(ttl_seconds)


def check_row_types(row: dict[str, Any]) -> None:
    """Raises IntegrityError when a clear column holds a value of the wrong type."""
    for column, expected in _COLUMN_TYPES.items():
        if column in row and not isinstance(row[column], expected):
            raise IntegrityError(f"the entry's clear {column} has the wrong type")


# Clear columns that the sealed metadata repeats; a mismatch means tampering.
_SEALED_COLUMNS = ("actor", "channel", "step_num", "executor_name", "created_at", "expires_at")
# A one-segment entry (most) comes with its segment, selected with the authorized row itself.
_OPEN_COLUMNS = f"{COLUMNS}, CASE WHEN segment_count = 1 THEN {ONLY_SEGMENT} END AS only_segment"
# A turn's rows newest first ((step, id) follows the turn's index: ``Opener.newest``).
_NEWEST_FIRST = "ORDER BY step_num DESC, id DESC"


class Opener:
    """Opens the entries of one store: ``open``, ``newest``, ``get``, ``read``, ``verify_row``."""

    def __init__(self, parts: EntryParts) -> None:
        self._db, self._keys, self._access = parts.db, parts.keys, parts.access
        self.policy, self.heads = parts.policy, parts.heads
        self.timeline = parts.timeline

    def open(
        self, principal: Principal, scratchpad_id: object, now: float | None, turn_id: str | None = None
    ) -> Readable:
        """The one path from an id to an entry's plaintext (of one turn, if ``turn_id`` is given).

        Raises:
            NotFoundError: absent, malformed, another owner's, or outside the scope.
            ExpiredError: the caller's own entry has expired.
            IntegrityError: the stored entry fails authentication.
        """
        query, rows, head_rows = self._first_fetch(principal, scratchpad_id, turn_id)
        entry_id = str(scratchpad_id)  # an id: _first_fetch checked it
        current = self.timeline.entry_time(entry_id, now)

        def fetch(got: Rows | None = None) -> tuple[dict[str, Any] | None, Readable | None]:
            if got is None:
                got = self._access.rows(principal, *query)
            if not got:
                return None, None
            row = got[0]
            check_row_types(row)
            if turn_id is not None and row["turn_id"] != turn_id:
                raise NotFoundError(NOT_FOUND_MESSAGE)
            if row["expires_at"] <= current:
                return row, None
            return row, next(self._access.open_each(principal, "entries", _OPEN_COLUMNS, [row], self.authenticate))

        def check(head: Head, fetched: tuple[dict[str, Any] | None, Readable | None]) -> None:
            row, opened = fetched
            if row is not None and opened is None:
                self.heads.checks.check_expired_in(head, row, current)
            elif opened is not None:
                same_entry(head, opened.row)

        check_row_types(rows[0])
        try:
            first: tuple[tuple[dict[str, Any] | None, Readable | None], Rows] | None = (fetch(rows), head_rows)
        except IntegrityError:  # tampering, or a rotation retired the row's key meanwhile: read again
            first = None
        row, opened = self.heads.inventories.checked(
            principal.owner_user_id, rows[0]["turn_id"], fetch, check, first=first
        )
        if row is None:  # deleted meanwhile
            raise NotFoundError(NOT_FOUND_MESSAGE)
        if opened is None:
            self.timeline.found_expired(entry_id, current)
            raise ExpiredError("this entry has expired")
        return opened

    def newest(self, principal: Principal, turn_id: str, now: float | None) -> Readable | None:
        """The turn's newest live entry in the principal's scope, opened (None: none).
        That row alone is fetched (the turn's index, highest (step, id) first),
        beside the turn's head rows, and checked against the turn's inventory
        (``Inventories.checked``, ``HeadChecks.check_newest``): it must be the
        head's newest live entry of the scope, as the head lists it, so a row
        planted above it, or the newest removed, rolled back or served as
        expired, is refused; the inventory itself is the one the head
        authenticates whole (a row removed or added anywhere in the turn
        changes it). What a read costs does not grow with the turn.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
            IntegrityError: the row is not the turn's newest as its head lists
                it, or fails authentication.
            StoreBusyError: writers kept changing the turn while it was read.
        """
        check_principal(principal)
        check_identifier("turn_id", turn_id)
        current = self.timeline.read_time(now)
        query: access.Query = (
            "entries",
            _OPEN_COLUMNS,
            "turn_id = ? AND expires_at > ?",
            (turn_id, current),
            _NEWEST_FIRST + " LIMIT 1",
        )

        def fetch(got: Rows | None = None) -> Rows:
            return live(got if got is not None else self._access.rows(principal, *query), current)

        def check(head: Head, whole: Rows) -> None:
            self.heads.checks.check_newest(head, principal, turn_id, whole[0] if whole else None, current)

        (got,), head_rows = self._access.rows_beside(
            principal, self.heads.read_sql(principal.owner_user_id, turn_id), query
        )
        whole = self.heads.inventories.checked(
            principal.owner_user_id, turn_id, fetch, check, first=(fetch(got), head_rows)
        )
        if not whole:
            return None
        return next(self._access.open_each(principal, "entries", _OPEN_COLUMNS, whole, self.authenticate))

    def _first_fetch(
        self, principal: Principal, scratchpad_id: object, turn_id: str | None
    ) -> tuple[access.Query, Rows, Rows]:
        """The entry's scoped query, its row and its turn's head rows (one round
        trip on PostgreSQL). The turn is the one given, or the id's within the
        scope: another owner's id reads the owner's heads alone, as an absent one.

        Raises:
            NotFoundError: no row (absent, malformed, another owner's, outside the scope).
        """
        check_principal(principal)
        if not isinstance(scratchpad_id, str) or not ID_RE.fullmatch(scratchpad_id):
            self._access.denied(principal, "malformed id")
            raise NotFoundError(NOT_FOUND_MESSAGE)
        owner = principal.owner_user_id
        where = "id = ?"
        params: Params = (scratchpad_id,)
        if turn_id is not None:
            where = "id = ? AND turn_id = ?"
            params = (scratchpad_id, check_identifier("turn_id", turn_id))
            head_sql = self.heads.read_sql(owner, turn_id)
        else:
            head_sql = self.heads.entry_read_sql(owner, scratchpad_id, self.policy.scope_columns(principal))
        query: access.Query = ("entries", _OPEN_COLUMNS, where, params, "")
        (rows,), head_rows = self._access.rows_beside(principal, head_sql, query)
        if not rows:
            self._access.denied(principal, scratchpad_id)
            raise NotFoundError(NOT_FOUND_MESSAGE)
        return query, rows, head_rows

    def authenticate(self, row: dict[str, Any]) -> Readable:
        """Unwrap the item key, check the commitment, open the metadata and the
        listing part (format 1: the clear columns compared with the metadata's copy).

        Raises:
            IntegrityError: any of them fails authentication or does not match.
        """
        check_row_types(row)
        entry_format = 1 if row["sealed_listing"] is None else ENTRY_FORMAT
        header = Header(
            row["id"],
            row["owner_user_id"],
            row["turn_id"],
            row["content_kind"],
            row["size_bytes"],
            row["size_chars"],
            row["segment_count"],
            row["key_version"],
            entry_format,
        )
        wrapper = self._keys.owner_wrapper(header.owner_user_id, header.key_version)
        cipher = open_entry(wrapper, header, row["wrapped_key"], row["nonce_prefix"], row["commitment"])
        if entry_format == 1:
            meta = json.loads(cipher.open_meta(row["sealed_meta"]))
            for column in _SEALED_COLUMNS:
                if meta[column] != row[column]:
                    raise IntegrityError(f"the entry's clear {column} does not match its sealed copy")
        else:
            meta = {**_entry_meta(cipher.open_meta(row["sealed_meta"])), **self._listing_meta(row)}
        counts = meta["counts"]
        if counts is None:  # binary: every segment but the last is full
            counts = shaping.binary_counts(header.size_bytes, header.segment_count)
        breaks = meta.get("breaks")
        if len(counts) != header.segment_count or (breaks is not None and len(breaks) != header.segment_count):
            raise IntegrityError("the entry's segment index does not match its header")
        content = read_modes.SegmentedContent(
            header.kind,
            counts,
            _fetcher(self._db, row["id"], row["owner_user_id"], cipher, header.segment_count, row.get("only_segment")),
            breaks=breaks,
            line_count=meta.get("lines"),
        )
        return Readable(row, meta, content, cipher)

    def lister(
        self, whole: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> Callable[[dict[str, Any]], Opened]:
        """What a listing shows of a row: its listing part opened under the
        owner's listing key (bound to every clear column a listing returns), or
        the whole entry for format 1 (``whole``: the row with every column, when
        the listing did not select them). The function raises IntegrityError when
        the part, or a clear column it is bound to, was altered."""
        keys: dict[tuple[Any, Any], ListingKey] = {}
        unpack = shaping.unpack

        def listed(row: dict[str, Any]) -> Opened:
            if row["sealed_listing"] is None:
                return self.authenticate(row if whole is None else whole(row))
            version = (row["owner_user_id"], row["key_version"])
            key = keys.get(version)
            if key is None:
                key = keys[version] = self._keys.listing_key(*version)
            meta = unpack(key.open(row))  # ``_listing_meta``, inline
            if not isinstance(meta, dict) or not isinstance(meta.get("view"), dict):
                raise IntegrityError("the entry's listing part has no view")
            return Opened(row, meta)

        return listed

    def _listing_meta(self, row: dict[str, Any]) -> dict[str, Any]:
        return _listing_meta(self._keys.listing_key(row["owner_user_id"], row["key_version"]), row)

    def verify_row(self, row: dict[str, Any]) -> None:
        """Authenticate an entry row and all its segments (``verify``).

        Raises:
            IntegrityError: the row or a segment fails authentication.
        """
        opened = self.authenticate(row)
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
        if mode not in read_modes.MODES:
            raise InvalidArgumentError(f"unknown read mode {mode!r}; use one of {', '.join(read_modes.MODES)}")
        opened = self.open(principal, scratchpad_id, now, turn_id)
        extra = {"scratchpad_id": opened.row["id"]}
        result = read_modes.read_fitted(opened.content, mode, cap=self.policy.max_read_chars, extra=extra, **args)
        if self.policy.log_reads:
            audit_log.info("read: owner=%r id=%s mode=%s", principal.owner_user_id, opened.row["id"], mode)
        return result


def _listing_meta(key: ListingKey, row: dict[str, Any]) -> dict[str, Any]:
    """What an entry's listing part holds (authenticated), with its view."""
    meta = shaping.unpack(key.open(row))
    if not isinstance(meta, dict) or not isinstance(meta.get("view"), dict):
        raise IntegrityError("the entry's listing part has no view")
    return meta


def _entry_meta(plain: bytes) -> dict[str, Any]:
    """The metadata a format-2 entry seals under its item key (authenticated)."""
    meta = shaping.unpack(plain)
    if not isinstance(meta, dict) or not {"shape", "rest", "counts"} <= meta.keys():
        raise IntegrityError("the entry's metadata is incomplete")
    return meta


def _fetcher(
    db: Backend, entry_id: str, owner: str, cipher: EntryCipher, count: int, only: object = None
) -> read_modes.Fetch:
    """The entry's segments, opened; ``only``: a one-segment entry's, fetched with its row."""

    def fetch(first: int, last: int) -> list[bytes]:
        if count == 1 and (first, last) == (0, 0):
            return [
                cipher.open_segment(0, only if isinstance(only, bytes) else _only_segment(db, entry_id, owner), True)
            ]
        rows = access.segments(db, entry_id, owner, first, last)
        if [row["seq"] for row in rows] != list(range(first, last + 1)):
            raise IntegrityError("the entry's segments are missing or out of order")
        if not all(isinstance(row["data"], bytes) for row in rows):
            raise IntegrityError("an entry's segment is not a blob")
        return [cipher.open_segment(row["seq"], row["data"], row["seq"] == count - 1) for row in rows]

    return fetch


def _only_segment(db: Backend, entry_id: str, owner: str) -> bytes:
    """The sealed segment of a one-segment entry the caller authenticated."""
    rows = access.only_segment(db, entry_id, owner)
    if not rows or rows[0]["data"] is None:
        raise IntegrityError("the entry's segments are missing or out of order")
    if not isinstance(rows[0]["data"], bytes):
        raise IntegrityError("an entry's segment is not a blob")
    return rows[0]["data"]
