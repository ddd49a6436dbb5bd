"""Writing under an owner's current key: one ``Keystore.write_current`` call, as steps.

The rules one such write keeps:

* the row is sealed outside any transaction, under the owner's newest key
  version, and written in one transaction whose ``write`` checks that the
  version is still the newest (``StaleOwnerKey`` otherwise): a rotation
  meanwhile, in any process, makes the call seal again under the new one;
* a unique-key collision (``DuplicateKeyError``) seals again too;
* a COMMIT whose answer was lost is never taken for failed (``IfUnknown``):
  the next attempt, under the same locks, first asks whether its rows landed;
* the item-key wraps are counted in memory (``WrapCounts``) and written with
  every ``WRAP_FLUSH_EVERY``-th write of the key, in that write's transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..crypto.primitives import Wrapper
from ..errors import IntegrityError, StoreBusyError, StoreUnavailableError
from ..storage.base import Backend, Conn, DuplicateKeyError, Params

__all__ = ["WRAP_FLUSH_EVERY", "CurrentWrite", "IfUnknown", "StaleOwnerKey", "WrapCounts"]

T = TypeVar("T")
P = TypeVar("P")

# Item-key wraps under an owner key are counted in memory and added to
# ``owner_keys.wrap_count`` by the write transaction of every this-many-th put
# of that key (and at close): no counter-row UPDATE per put. A process that
# dies undercounts by fewer than this many wraps per key, against a rotation
# advice at 2**28 (16 times below AES-GCM's 2**32 bound).
WRAP_FLUSH_EVERY = 256


@dataclass(frozen=True)
class IfUnknown(Generic[P]):
    """What ``Keystore.write_current`` does with a write whose COMMIT's answer was lost."""

    #: Inside a transaction under the write's locks: whether the sealed rows are stored.
    landed: Callable[[Conn, P], bool]
    #: The error that names what may be stored, given the reason it could not be found out.
    error: Callable[[P, str], StoreUnavailableError]


class StaleOwnerKey(Exception):
    """The row was sealed for an owner-key version that is no longer the newest
    (raised inside ``write_current``'s transaction; it never leaves the retry)."""


class WrapCounts:
    """Wraps of committed writes not yet added to ``owner_keys.wrap_count``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], int] = {}

    def take(self, key: tuple[str, int], adding: int) -> int | None:
        """The pending count to write with the next write of ``key`` (``adding``
        wraps) when it is ``due``, else None."""
        with self._lock:
            return self._pending.pop(key, 0) if self._pending.get(key, 0) + adding >= WRAP_FLUSH_EVERY else None

    def due(self, key: tuple[str, int], adding: int) -> bool:
        """Whether the next write of ``key`` (``adding`` wraps) must write the pending count."""
        with self._lock:
            return self._pending.get(key, 0) + adding >= WRAP_FLUSH_EVERY

    def add(self, key: tuple[str, int], count: int) -> None:
        if count:
            with self._lock:
                self._pending[key] = self._pending.get(key, 0) + count

    def take_all(self) -> dict[tuple[str, int], int]:
        with self._lock:
            pending, self._pending = self._pending, {}
            return pending

    def peek(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._pending)


class OwnerKeys(Protocol):
    """What a write under the current key asks of the keystore."""

    def current(self, owner: str) -> tuple[int, Wrapper]: ...

    def newest_version(self, owner: str) -> int | None: ...

    def forget(self, owner: str) -> None: ...

    def count_wraps(self, conn: Conn, owner: str, version: int, count: int = 1) -> None: ...


@dataclass
class _Lost(Generic[P, T]):
    """An attempt whose COMMIT's answer was lost: its sealed rows and what its write returned."""

    sealed: P
    result: T


class CurrentWrite(Generic[P, T]):
    """One write of ``owner``'s rows under the owner's current key (``Keystore.write_current``)."""

    def __init__(
        self,
        keys: OwnerKeys,
        db: Backend,
        wraps: WrapCounts,
        owner: str,
        seal: Callable[[int, Wrapper], P],
        write: Callable[[Conn, P], T],
        *,
        count: int,
        prefetch: Sequence[tuple[str, Params]],
        turn: str | None,
        unknown: IfUnknown[P] | None,
    ) -> None:
        self._keys, self._db, self._wraps = keys, db, wraps
        self._owner, self._seal, self._write = owner, seal, write
        self._count, self._prefetch, self._turn, self._unknown = count, prefetch, turn, unknown
        self._version, self._wrapper = keys.current(owner)
        self._lost: _Lost[P, T] | None = None

    def run(self, attempts: int, busy: str) -> T:
        """Seal and write, at most ``attempts`` times; raises as ``Keystore.write_current``."""
        for _ in range(attempts):
            sealed = self._sealed()
            if sealed is None:
                continue
            written = self._attempt(sealed[0])
            if written is not None:
                return written[0]
        if self._lost is not None and self._unknown is not None:
            raise self._unknown.error(self._lost.sealed, "every attempt to find out lost its COMMIT's answer too")
        raise StoreBusyError(busy)

    def _sealed(self) -> tuple[P] | None:
        """The rows to write: the lost attempt's again (found stored, or written
        once), else sealed anew; None when a rotation retired the version while
        sealing (the next attempt seals under the new one)."""
        if self._lost is not None:
            return (self._lost.sealed,)
        try:
            return (self._seal(self._version, self._wrapper),)
        except IntegrityError:  # a rotation retired the version (and its derived keys) while sealing
            if self._keys.newest_version(self._owner) == self._version:
                raise
            self._renew()
            return None

    def _attempt(self, sealed: P) -> tuple[T] | None:
        """One transaction: ``(what write returned,)``, or None to try again."""
        key = (self._owner, self._version)
        flush = self._wraps.take(key, self._count)
        tx: Conn | None = None
        result: tuple[T] | None = None
        try:
            with self._db.transaction(self._owner, turn=self._turn) as conn:
                tx = conn
                result = (self._in_transaction(conn, sealed, flush),)
        except BaseException as exc:
            self._wraps.add(key, flush or 0)
            if self._unknown is not None and tx is not None and tx.commit_unknown and result is not None:
                self._lost = _Lost(sealed, result[0])
                return None
            if not self._may_retry(exc):
                raise
            return None
        if flush is None:
            self._wraps.add(key, self._count)
        return result

    def _in_transaction(self, conn: Conn, sealed: P, flush: int | None) -> T:
        for sql, params in self._prefetch:
            conn.prefetch(sql, params)
        lost = self._lost
        if lost is not None and self._unknown is not None and self._unknown.landed(conn, lost.sealed):
            return lost.result  # the lost COMMIT was applied: nothing to write
        self._lost = None  # not applied (it ended before these locks were granted)
        result = self._write(conn, sealed)
        if flush is not None:
            self._keys.count_wraps(conn, self._owner, self._version, flush + self._count)
        return result

    def _may_retry(self, exc: BaseException) -> bool:
        """Whether the next attempt may succeed after ``exc`` (a stale key, a
        taken id); a lost COMMIT whose outcome cannot be found out raises ``unknown.error``."""
        lost, unknown = self._lost, self._unknown
        if lost is not None and unknown is not None and isinstance(exc, StoreBusyError | StoreUnavailableError):
            raise unknown.error(lost.sealed, str(exc)) from None
        if isinstance(exc, DuplicateKeyError):
            return True
        if not isinstance(exc, StaleOwnerKey):
            return False
        # The owner's key was rotated (maybe by another process) since it was cached.
        self._renew()
        return True

    def _renew(self) -> None:
        self._keys.forget(self._owner)
        self._version, self._wrapper = self._keys.current(self._owner)
