"""The keystore: the owner keys, their caches (``LRUCache``), and writing under the current one.

Everything that chooses an owner key lives here: the cache of unwrapped owner
keys (and the keys derived from them), the wrap counts, and the one write of
a row sealed under an owner's newest key version (``Keystore.write_current``,
its steps ``CurrentWrite``). What the master key wraps is ``master.Master``'s.

The rules of a write under the current key:

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
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from ..crypto.formats import ListingKey
from ..crypto.primitives import ContentIdentity, KeyHandle, Wrapper
from ..errors import IntegrityError, StoreBusyError, StoreUnavailableError
from ..storage import meta as keys_sql
from ..storage.base import Backend, Conn, DuplicateKeyError, Params
from ..storage.meta import NEWEST_VERSION_SQL, insert_owner_key
from .keyring import Keyring
from .master import Master, Progress, store_meta

__all__ = [
    "NEWEST_VERSION_SQL",
    "WRAP_FLUSH_EVERY",
    "IfUnknown",
    "Keystore",
    "LRUCache",
    "Progress",
    "StaleOwnerKey",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
P = TypeVar("P")
D = TypeVar("D", ContentIdentity, ListingKey)
# A key derived from an owner key: (owner key, store id, owner, version) -> key.
Derive = Callable[[KeyHandle, str, str, int], D]
# Owners whose unwrapped keys stay cached (each cache; ~2.7 KB per owner in
# all). Past it the least recently used owner's keys are unwrapped again on use.
OWNER_KEY_CACHE_SIZE = 4096
# Runs of a write whose COMMIT's answer was lost and that may simply run again (``add_version``).
_COMMIT_TRIES = 3
# Reads of the owner's newest key version when a rotation retires the one read before its key (``current``).
_ROTATION_TRIES = 3


# Item-key wraps under an owner key are counted in memory and added to
# ``owner_keys.wrap_count`` by the write transaction of every this-many-th put
# of that key (and at close): no counter-row UPDATE per put. A process that
# dies undercounts by fewer than this many wraps per key, against a rotation
# advice at 2**28 (16 times below AES-GCM's 2**32 bound).
WRAP_FLUSH_EVERY = 256


class LRUCache(Generic[K, V]):
    """At most ``maxsize`` items; a ``get`` or a ``put`` makes its key the most recent.

    The store's owner-key caches use it (they kept every owner ever
    seen, ~2.7 KB each): an owner evicted here costs one unwrap (one indexed
    query and one AES-GCM open) on its next use.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        # No lock: each OrderedDict call is one step under the GIL, and nothing here
        # iterates the items while calling Python code (``discard_if`` copies the keys first).
        items = self._items
        value = items.get(key)
        if value is not None:
            try:  # noqa: SIM105 (suppress() is a context manager: more work than the get)
                items.move_to_end(key)
            except KeyError:  # another thread dropped it meanwhile: the value found stands
                pass
        return value

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._items.pop(key, None)

    def discard_if(self, doomed: Callable[[K], bool]) -> None:
        """Drop every key for which ``doomed(key)`` is true."""
        with self._lock:
            for key in list(self._items):
                if doomed(key):
                    self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


class IfUnknown(NamedTuple, Generic[P]):
    """What ``Keystore.write_current`` does with a write whose COMMIT's answer was lost
    (a tuple: every put makes one, and a frozen dataclass costs a ``__setattr__`` per field)."""

    #: Inside a transaction under the write's locks: whether the sealed rows are stored.
    landed: Callable[[Conn, P], bool]
    #: The error that names what may be stored, given the reason it could not be found out.
    error: Callable[[P, str], StoreUnavailableError]


class Current(NamedTuple):
    """An owner's newest key version, its wrapper and its sealing keys (``Keystore.current_sealing``)."""

    version: int
    wrapper: Wrapper
    identity: ContentIdentity
    listing: ListingKey


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

    def add_unless_due(self, key: tuple[str, int], adding: int, due_with: int) -> bool:
        """Add ``adding`` wraps unless the next write of ``key`` adding ``due_with`` must
        write the pending count (``due``): whether it must (then nothing is added)."""
        with self._lock:
            pending = self._pending.get(key, 0)
            if pending + due_with >= WRAP_FLUSH_EVERY:
                return True
            self._pending[key] = pending + adding
            return False

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


class Keystore:
    """The store's keys. Safe to share between threads."""

    def __init__(self, db: Backend, keyring: Keyring) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._owner_keys: LRUCache[tuple[str, int], tuple[Wrapper, KeyHandle]] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._identities: LRUCache[tuple[str, int], ContentIdentity] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._listings: LRUCache[tuple[str, int], ListingKey] = LRUCache(OWNER_KEY_CACHE_SIZE)
        # Each owner's newest key version, with its wrapper.
        self._latest: LRUCache[str, tuple[int, Wrapper]] = LRUCache(OWNER_KEY_CACHE_SIZE)
        # The same with that version's sealing keys (``current_sealing``: what a put seals with).
        self._sealing: LRUCache[str, Current] = LRUCache(OWNER_KEY_CACHE_SIZE)
        self._wraps = WrapCounts()
        # Runs in the transaction that adds an owner's first key (the owner's
        # empty owner head, ``heads.Heads``): a key never exists without it.
        self.on_first_key: Callable[[Conn, str, int, Wrapper], None] | None = None
        self._master = Master(db, keyring)
        self.store_id = self._master.store_id
        self.counter_seal = self._master.counter_seal()

    @property
    def keyring(self) -> Keyring:
        """The keyring whose master key opens the store (the new one after a rotation)."""
        return self._master.keyring

    def cache_sizes(self) -> dict[str, int]:
        """How many entries each owner-key cache holds (bounded by ``OWNER_KEY_CACHE_SIZE``)."""
        caches: dict[str, Sized] = {"owner_keys": self._owner_keys, "identities": self._identities}
        caches.update(listings=self._listings, latest=self._latest, sealing=self._sealing)
        return {name: len(cache) for name, cache in caches.items()}

    def is_cached(self, owner: str, version: int) -> bool:
        """Whether the owner's key of ``version`` is unwrapped in the cache."""
        return self._owner_keys.get((owner, version)) is not None

    def store_meta(self) -> dict[str, str]:
        return store_meta(self._db)

    @property
    def opened_meta(self) -> dict[str, str]:
        """The store's clear metadata as read when the store was opened."""
        return dict(self._master.opened_meta)

    def owner_wrapper(self, owner: str, version: int) -> Wrapper:
        """The owner's key of ``version``, unwrapped once and cached.

        Raises:
            IntegrityError: the key is missing (tampering, or a rotation retired
                it meanwhile) or its wrapping was altered.
            WrongKeyError: another process rotated the master key meanwhile.
        """
        return self._owner_key(owner, version)[0]

    def identity(self, owner: str, version: int) -> ContentIdentity:
        """Raises IntegrityError, WrongKeyError: as ``owner_wrapper``."""
        return self._derived(self._identities, ContentIdentity, owner, version)

    def listing_key(self, owner: str, version: int) -> ListingKey:
        """Raises IntegrityError, WrongKeyError: as ``owner_wrapper``."""
        return self._derived(self._listings, ListingKey, owner, version)

    def sealing(self, owner: str, version: int) -> tuple[ContentIdentity, ListingKey]:
        """``identity`` and ``listing_key`` of one version (what every put seals with), in one call.
        Raises IntegrityError, WrongKeyError: as ``owner_wrapper``."""
        key = (owner, version)
        identity, listing = self._identities.get(key), self._listings.get(key)
        if identity is None or listing is None:
            return self.identity(owner, version), self.listing_key(owner, version)
        return identity, listing

    def current_sealing(self, owner: str) -> Current:
        """``current`` with its version's ``sealing`` keys, in one lookup (a put's).
        Raises IntegrityError, WrongKeyError: as ``current`` and ``sealing``."""
        found = self._sealing.get(owner)
        if found is None:
            version, wrapper = self.current(owner)
            found = Current(version, wrapper, *self.sealing(owner, version))
            with self._lock:
                self._sealing[owner] = found
        return found

    def _derived(self, cache: LRUCache[tuple[str, int], D], make: Derive[D], owner: str, version: int) -> D:
        """A key derived from the owner's key of ``version``, once, then cached."""
        found = cache.get((owner, version))
        if found is None:
            found = make(self._owner_key(owner, version)[1], self.store_id, owner, version)
            with self._lock:
                cache[(owner, version)] = found
        return found

    def _owner_key(self, owner: str, version: int) -> tuple[Wrapper, KeyHandle]:
        cached = self._owner_keys.get((owner, version))
        if cached is not None:
            return cached
        rows = self._db.query(keys_sql.OWNER_KEY_SQL, (owner, version), owner=owner)
        if not rows:
            raise IntegrityError("the owner key of this row is missing")
        key = self._master.unwrap_owner_key(rows[0]["wrapped"], owner, version)
        pair = (Wrapper.of(key), key)
        with self._lock:
            self._owner_keys[(owner, version)] = pair
        return pair

    def current(self, owner: str) -> tuple[int, Wrapper]:
        """The owner's newest key version and its wrapper, created (in its own short
        transaction) on first use. Raises WrongKeyError: another process rotated the master key."""
        found = self._latest.get(owner)
        if found is None:
            found = self._newest(owner)
            with self._lock:
                self._latest[owner] = found
        return found

    def _newest(self, owner: str) -> tuple[int, Wrapper]:
        """``current``'s answer read from the store. A rotation may retire the
        version read as the newest before its key is read: then the newest is
        read again; a newest version whose key is missing is tampering.

        Raises:
            IntegrityError: the newest version's key is missing or altered, or
                rotations retired each version read (``_ROTATION_TRIES`` times).
            WrongKeyError: another process rotated the master key.
        """
        version = self.newest_version(owner)
        for _ in range(_ROTATION_TRIES):
            if version is None:
                version = 1
                self.add_version(owner, version)
            try:
                return version, self.owner_wrapper(owner, version)
            except IntegrityError:
                newer = self.newest_version(owner)
                if newer == version:
                    raise
                version = newer
        raise IntegrityError("rotations retired each newest owner key version before it was read")

    def newest_version(self, owner: str) -> int | None:
        rows = self._db.query(keys_sql.NEWEST_SQL, (owner,), owner=owner)
        version = rows[0]["v"]
        return None if version is None else int(version)

    def versions(self, owner: str) -> list[int]:
        """Every key version the owner has, oldest first (housekeeping: rotation)."""
        rows = self._db.query(keys_sql.VERSIONS_SQL, (owner,), owner=owner, admin=True)
        return [int(r["version"]) for r in rows]

    def add_version(self, owner: str, version: int, *, admin: bool = False) -> None:
        """Add a fresh owner key of ``version``, unless the owner has it or a
        newer one already (a racing process or rotation added it: a version a
        later rotation retired is never made again with other key material);
        ``admin`` for a rotation (housekeeping), not for an owner's first key.

        Raises:
            WrongKeyError: another process rotated the master key meanwhile.
        """
        wrapped, key = self._master.new_owner_key(owner, version)
        for tries_left in reversed(range(_COMMIT_TRIES)):
            tx: Conn | None = None
            try:
                with self._db.transaction(owner, admin=admin) as conn:
                    tx = conn
                    self._master.check_current(conn)
                    newest = self.newest_in(conn, owner)
                    if newest is not None and newest >= version:
                        return  # a racing rotation added it, or a newer one (and may have retired this version)
                    added = insert_owner_key(conn, owner, version, wrapped, time.time())
                    if added and version == 1 and self.on_first_key:
                        self.on_first_key(conn, owner, version, Wrapper.of(key))
                return
            except StoreUnavailableError:
                # Its COMMIT's answer lost: the same insert again adds the key
                # only if the first did not (``ON CONFLICT DO NOTHING``).
                if tx is None or not tx.commit_unknown or not tries_left:
                    raise

    @staticmethod
    def retire_older(conn: Conn, owner: str, version: int) -> int:
        """Delete the owner's key versions below ``version`` (inside the caller's transaction)."""
        return conn.execute(keys_sql.RETIRE_OWNER_KEYS_SQL, (owner, version))

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> int:
        """Delete every key of the owner (inside the caller's transaction): crypto-shredding."""
        return conn.execute(keys_sql.DELETE_OWNER_KEYS_SQL, (owner,))

    def count_wraps(self, conn: Conn, owner: str, version: int, count: int = 1) -> None:
        """Count random-nonce wraps under an owner key (the rotation advice in ``stats``)."""
        conn.defer(keys_sql.COUNT_WRAPS_SQL, (count, owner, version))

    def count_wraps_later(self, owner: str, version: int, count: int = 1) -> None:
        """Count wraps made inside a write transaction (a turn head's seal) with
        the pending ones: no statement now; a rollback leaves an overcount, never less."""
        self._wraps.add((owner, version), count)

    def flush_due(self, owner: str, version: int, count: int = 1) -> bool:
        """Whether a write adding ``count`` wraps must add the pending wrap
        counts to ``owner_keys`` in its transaction (``write_current`` does): a
        write without a transaction of its own (a put in one message) leaves it to one."""
        return self._wraps.due((owner, version), count)

    def count_wraps_unless_due(self, owner: str, version: int, count: int = 1, written: int | None = None) -> bool:
        """``count_wraps_later`` unless ``flush_due`` (then nothing is counted): whether it is due.
        For a write without a transaction of its own that counts its wraps before it is sent;
        ``written``: the ``count`` that ``write_current`` is given for the same write, when the
        rest of its wraps are counted inside it (a turn head's, ``count_wraps_later``), so
        that the write it leaves to ``write_current`` is one that writes the pending count."""
        return self._wraps.add_unless_due((owner, version), count, count if written is None else written)

    def pending_wraps(self) -> dict[tuple[str, int], int]:
        """Wraps this process made that ``owner_keys.wrap_count`` does not count yet."""
        return self._wraps.peek()

    def flush_wraps(self) -> None:
        """Add this process's pending wrap counts to ``owner_keys`` (at close).
        A failure (a busy or closed store) puts them back as pending."""
        pending = self._wraps.take_all()
        if not pending:
            return
        try:
            with self._db.transaction(admin=True) as conn:
                for (owner, version), count in pending.items():
                    self.count_wraps(conn, owner, version, count)
        except Exception:
            for key, count in pending.items():
                self._wraps.add(key, count)
            raise

    def forget(self, owner: str) -> None:
        """Drop the owner's cached keys (after a rotation, or when it is forgotten)."""
        with self._lock:
            self._latest.pop(owner)
            self._sealing.pop(owner)
            self._owner_keys.discard_if(lambda key: key[0] == owner)
            self._identities.discard_if(lambda key: key[0] == owner)
            self._listings.discard_if(lambda key: key[0] == owner)

    def write_current(
        self,
        owner: str,
        seal: Callable[[int, Wrapper], P],
        write: Callable[[Conn, P], T],
        *,
        attempts: int,
        busy: str,
        count: int = 1,
        prefetch: Sequence[tuple[str, Params]] = (),
        turn: str | None = None,
        unknown: IfUnknown[P] | None = None,
    ) -> T:
        """Seal (outside any transaction) under the owner's newest key, then write
        in one transaction that checks the version is still the newest, by the
        module's rules.

        ``seal(version, wrapper)`` builds the row; ``write(conn, sealed)``
        stores it and must check the version inside the transaction, before
        its insert, with ``check_newest`` (``Putter.room`` does, with
        ``NEWEST_VERSION_SQL``); at most ``attempts`` seals. ``count``: the
        wraps the rows hold. ``prefetch``: the reads ``write`` will make, sent
        with the transaction's first message. With ``turn``, the transaction
        excludes only the owner's writes of that turn and its owner-wide ones
        (``Backend.transaction``); ``write`` raises ``OwnerLockNeeded``, which
        leaves this call, when it must change more than the turn. ``unknown``:
        what to do with a COMMIT whose answer was lost.

        Raises:
            StoreBusyError: ``busy``, when every attempt lost a race.
            OwnerLockNeeded: with ``turn``, as above.
            StoreUnavailableError: with ``unknown``, a lost COMMIT whose
                outcome could not be found out (``unknown.error``).
        """
        return CurrentWrite(
            self, self._db, self._wraps, owner, seal, write, count=count, prefetch=prefetch, turn=turn, unknown=unknown
        ).run(attempts, busy)

    @staticmethod
    def check_newest(newest: object, version: int) -> None:
        """``NEWEST_VERSION_SQL``'s answer, read inside the write transaction: raise
        ``StaleOwnerKey`` unless ``version`` is the owner's newest."""
        if newest != version:
            raise StaleOwnerKey

    @staticmethod
    def newest_in(conn: Conn, owner: str) -> int | None:
        rows = conn.query(keys_sql.NEWEST_SQL, (owner,))
        return None if rows[0]["v"] is None else int(rows[0]["v"])

    def mark_owner_keys(self, conn: Conn, *, refuse_marked: bool) -> int:
        """``Master.mark_owner_keys``, and what it raises."""
        return self._master.mark_owner_keys(conn, refuse_marked=refuse_marked)

    def rotate_master(self, new_keyring: Keyring, progress: Progress | None) -> int:
        """``Master.rotate``, and what it raises."""
        return self._master.rotate(new_keyring, progress)


@dataclass
class _Lost(Generic[P, T]):
    """An attempt whose COMMIT's answer was lost: its sealed rows and what its write returned."""

    sealed: P
    result: T


class CurrentWrite(Generic[P, T]):
    """One write of ``owner``'s rows under the owner's current key (``Keystore.write_current``)."""

    def __init__(
        self,
        keys: Keystore,
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
