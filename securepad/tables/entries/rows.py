"""An entry's row: its clear columns and their types, ``Entry``, ``Opened``,
the shared checks, and ``EntryParts``, what the tables are built from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...core import read_modes, shaping
from ...core.timeline import Timeline
from ...crypto.formats import EntryCipher
from ...errors import IntegrityError, InvalidArgumentError
from ...keys.keystore import Keystore
from ...policy import Policy
from ...storage.base import Backend
from ..access import Access
from ..heads.heads import Heads

__all__ = [
    "COLUMNS",
    "ID_RE",
    "LISTED_COLUMNS",
    "Entry",
    "EntryParts",
    "Opened",
    "Readable",
    "check_row_types",
    "check_step_num",
    "listing_fields",
    "live",
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
# What a listing part holds; the rest of the metadata is sealed under the item key.
_LISTING_FIELDS = ("view", "content_id", "inline")


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


def listing_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The part of an entry's metadata that its listing part holds."""
    return {name: meta[name] for name in _LISTING_FIELDS if name in meta}


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
        if ttl_seconds is None:
            return self.policy.default_ttl_seconds
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise InvalidArgumentError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        if ttl_seconds > self.policy.max_ttl_seconds:
            raise InvalidArgumentError(
                f"ttl_seconds {ttl_seconds} exceeds the policy's max_ttl_seconds ({self.policy.max_ttl_seconds})"
            )
        return ttl_seconds


def check_step_num(step_num: object) -> None:
    if isinstance(step_num, bool) or not isinstance(step_num, int) or not 0 <= step_num < 2**31:
        raise InvalidArgumentError(f"step_num must be an integer from 0 to 2**31-1, not {step_num!r}")


def check_row_types(row: dict[str, Any]) -> None:
    """Raises IntegrityError when a clear column holds a value of the wrong type."""
    for column, expected in _COLUMN_TYPES.items():
        if column in row and not isinstance(row[column], expected):
            raise IntegrityError(f"the entry's clear {column} has the wrong type")


def live(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The rows that expire after ``now`` (filtered here, not in the query,
    so that a turn's lookup keeps to the turn's index).

    Raises:
        IntegrityError: a clear expiry that is not a number.
    """
    for row in rows:
        if not isinstance(row["expires_at"], (float, int)):  # a tuple: ``float | int`` is made anew each time
            raise IntegrityError("the entry's clear expires_at has the wrong type")
    return [row for row in rows if row["expires_at"] > now]
