"""The turn heads this process sealed last: a put in one message (``Heads.change_once``),
and a write that finds the stored head to be the one recorded (``OwnerHeads.edited_tally``).

The one-message statement writes only if the stored head is still the one sealed here
(AES-GCM seals each head under a fresh nonce, so no other write seals the same
bytes); a stale record only makes it write nothing, and the put reads the head.
A write in a transaction compares the head it read with the record: the same
bytes are the same head, so its tally is the recorded one, with no decryption
and no parsing. Bounded; a writer takes its record out, so no two threads edit one tally.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...crypto.primitives import Wrapper, head_aad
from ...storage.base import Params
from .statements import ONCE_SQL
from .tally import HeadEdit, Tally

__all__ = ["LastSealed", "Once", "Sealed", "once_sql"]

# Turns whose last sealed head is kept (emptied when full: a lost record costs one put a read).
_TURNS = 1024


@dataclass
class Sealed:
    """A turn head as this process sealed it (``tally``: ``body`` opened, when the writer had it)."""

    version: int
    sealed: bytes
    body: bytes
    tally: Tally | None = None

    def matches(self, version: object, sealed: object) -> bool:
        """Whether a stored head (its clear key version and sealed bytes) is this one."""
        return version == self.version and bytes(sealed) == self.sealed  # type: ignore[call-overload]

    def opened(self) -> Tally:
        """The tally the head holds (parsed from ``body`` when not kept)."""
        return self.tally if self.tally is not None else Tally.loads(self.body)


class LastSealed:
    """(owner, turn) -> the ``Sealed`` head this process wrote last."""

    def __init__(self) -> None:
        self._heads: dict[tuple[str, str], Sealed] = {}

    def record(self, owner: str, turn_id: str, head: Sealed) -> None:
        """``head`` is the one this process sealed last for the turn."""
        if len(self._heads) >= _TURNS:
            self._heads.clear()
        self._heads[(owner, turn_id)] = head

    def attach(self, owner: str, turn_id: str, body: bytes, tally: Tally) -> None:
        """Keep ``tally`` with the record of the head just sealed from ``body``, so the next put need not parse it."""
        head = self._heads.get((owner, turn_id))
        if head is not None and head.body is body:
            head.tally = tally

    def has(self, owner: str, turn_id: str) -> bool:
        """Whether a head of the turn is recorded (``take`` may still find none: another thread took it)."""
        return (owner, turn_id) in self._heads

    def take(self, owner: str, turn_id: str) -> Sealed | None:
        """The record, removed: the caller edits its tally, and records the next head if it writes one."""
        return self._heads.pop((owner, turn_id), None)

    def following(
        self,
        owner: str,
        turn_id: str,
        edit: Callable[[HeadEdit], object],
        term: Callable[[str, str, tuple[Any, ...]], int],
        wrapper: Wrapper,
        version: int,
    ) -> tuple[Sealed, Sealed, int] | None:
        """The turn's record taken out, the head that follows it once ``edit`` is applied,
        sealed under ``version``, and the reservation left unused; None without a
        record, or when the owner's usage head must change. The record stays out."""
        last = self.take(owner, turn_id)
        if last is None:
            return None
        tally = last.opened()
        change = HeadEdit(tally, term)
        edit(change)
        tally.b = max(tally.b, 0)
        if tally.b > tally.r or change.bytes < 0:
            return None
        body = tally.dumps()
        head = Sealed(version, wrapper.seal(body, head_aad(owner, turn_id, version)), body, tally)
        return last, head, tally.r - tally.b


@dataclass
class Once:
    """A write of one turn in one statement (``Heads.change_once``): SQL, head, reservation left."""

    sql: str
    params: Params
    head: Sealed
    spare: int


def once_sql(
    insert: tuple[str, Params],
    owner: str,
    turn_id: str,
    head: Sealed,
    expected: Sealed,
    condition: tuple[str, Params] | None = None,
) -> tuple[str, Params]:
    """``insert`` (``INSERT ... SELECT`` of one row, without ``FROM``) and ``head`` written
    when the stored head is ``expected`` and ``condition`` holds; the row count says if it wrote."""
    more, more_params = (f" AND {condition[0]}", condition[1]) if condition is not None else ("", ())
    return (
        ONCE_SQL.format(condition=more, insert=insert[0]),
        (
            head.version,
            head.sealed,
            owner,
            turn_id,
            expected.version,
            expected.sealed,
            head.version,
            owner,
            *more_params,
            *insert[1],
        ),
    )
