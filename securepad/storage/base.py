"""What the store needs from a database engine: the one interface above SQLite and PostgreSQL.

The store speaks portable SQL with ``?`` placeholders (``ON CONFLICT``,
``CAST(... AS BIGINT)``, no boolean sums) through these protocols; a backend
owns its dialect, its connections and its migrations.

Every call says whose rows it touches. ``owner`` scopes it to one owner
(PostgreSQL's row-level security shows that owner's rows only, and one
owner's writes are serialized); ``admin`` marks store-wide housekeeping, run
under a separate role. A call with neither sees no owner's rows on PostgreSQL.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Backend",
    "Conn",
    "DuplicateKeyError",
    "OnceWriter",
    "OutcomeUnknown",
    "OwnerLockNeeded",
    "Params",
    "Rows",
    "statements",
]

Params = tuple[Any, ...]
Rows = list[dict[str, Any]]


@functools.lru_cache(maxsize=16)
def statements(sql: str) -> tuple[tuple[str, int], ...]:
    """``sql``'s statements (``"; "`` between them), each with its parameter count: the
    store's own statements, no literal of which holds ``"; "`` or ``?`` (``OnceWriter``)."""
    return tuple((statement, statement.count("?")) for statement in sql.split("; "))


class DuplicateKeyError(Exception):
    """An insert hit a unique key (an id collided, or a racing writer took a
    sequence number): the caller seals again under a new one."""


class OutcomeUnknown(Exception):
    """A write's connection was lost once the write was sent, and there is no
    time left to find out whether the server applied it (the call's deadline)."""


class OwnerLockNeeded(Exception):
    """A write begun under the owner's shared lock (``transaction(owner, turn=...)``)
    found that it must change the owner's state (a new turn, a reservation): it
    is rolled back, and the caller runs it again under the owner's exclusive lock."""


class Conn(Protocol):
    """A connection inside one transaction."""

    #: After the transaction failed: whether its COMMIT was sent and its answer
    #: lost, so that it may or may not have been applied (a transaction that
    #: takes the same locks afterwards sees which).
    commit_unknown: bool

    def query(self, sql: str, params: Params = ()) -> Rows:
        """Rows as dicts."""

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the number of rows it changed.

        Raises:
            DuplicateKeyError: an insert or update hit a unique key.
        """

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement for each parameter tuple (PostgreSQL: with the next message)."""

    def defer(self, sql: str, params: Params = ()) -> None:
        """Run a statement whose row count is not wanted: at once (SQLite), or
        with the transaction's next message (PostgreSQL); its errors may come
        from a later call, or from COMMIT."""

    def prefetch(self, sql: str, params: Params = ()) -> None:
        """Announce a read that the transaction will ``query`` later with the
        same SQL and parameters (PostgreSQL sends it with the next message):
        the later ``query`` gets the rows as they were when announced."""


class Backend(Protocol):
    """A store's database: connections, transactions, migrations."""

    #: "sqlite" or "postgresql".
    dialect: str
    #: Where the store lives, for messages and stats (never a password).
    location: str
    #: (old, new) schema versions when this open upgraded an existing store, else None.
    upgraded: tuple[int, int] | None

    @property
    def write_limit_bytes(self) -> int | None:
        """The most one write transaction may store, in bytes (SQLite: half its
        WAL limit); None where the engine has no such bound."""

    def transaction(
        self, owner: str | None = None, *, admin: bool = False, wait: bool = True, turn: str | None = None
    ) -> AbstractContextManager[Conn]:
        """A write transaction, rolled back on any exception.

        ``wait=False`` gives up at once where the engine can tell that another
        writer holds the lock. With ``turn`` (and ``owner``), a write of that
        turn's rows and head only: it excludes the owner's writes of that turn
        and its owner-wide writes, not its writes of other turns.

        Raises:
            StoreBusyError: the lock was not obtained in time.
        """

    def query(self, sql: str, params: Params = (), *, owner: str | None = None, admin: bool = False) -> Rows:
        """Rows as dicts, outside any write transaction."""

    def queries(self, *statements: tuple[str, Params], owner: str | None = None, admin: bool = False) -> list[Rows]:
        """The rows of each ``(sql, params)`` query, in order, outside any write
        transaction (one round trip on PostgreSQL); they may see writes
        committed in between."""

    def snapshot(self) -> AbstractContextManager[object]:
        """A read snapshot for this thread: every ``query`` and ``queries`` it
        makes inside sees the store as one state, whatever commits meanwhile.
        No write inside it.

        Raises:
            StoreBusyError: no connection could be had in time.
            StoreUnavailableError: the server cannot be reached.
        """

    def read_scope(self) -> object:
        """What a cache of verified reads is bound to: SQLite's connection of
        this thread, None on PostgreSQL (a read's token is the server's)."""

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Make deleted data leave the engine's files where it can (SQLite's WAL);
        returns False when part of it had to stay for now."""

    def scrub(self) -> bool:
        """Rewrite the engine's files so that nothing deleted remains in them
        (SQLite: VACUUM, then a checkpoint); returns False as ``checkpoint`` does."""

    def scrub_after_deletes(self) -> bool:
        """After deletes (gc): ``scrub`` when they left a meaningful share of the
        files free, else ``checkpoint``; whether the files were rewritten."""

    def close(self) -> None:
        """Close every connection this object opened."""


class CommitHooks(Protocol):
    """What runs around every write transaction's COMMIT on SQLite (the anchor, ``anchor.Anchor``)."""

    #: Whether ``before_commit`` runs in every write transaction.
    every_commit: bool
    #: Else it runs in a write transaction that begins its commit at or after this
    #: ``time.monotonic()`` (infinite: never).
    advance_at: float
    #: Set after a commit whose transaction did not run ``before_commit``, and nothing else
    #: to do then: the database sets it without calling ``after_commit`` (one call less a write).
    written: bool

    @property
    def failed(self) -> Exception | None:
        """Set when the commits must be told of a failure: the database calls ``after_commit``, which raises it."""

    def before_commit(self, conn: Conn) -> None:
        """Inside the transaction, last: an exception rolls it back."""

    def after_commit(self, advanced: bool) -> None:
        """After a successful COMMIT; ``advanced``: ``before_commit`` ran in its transaction."""


@runtime_checkable
class OnceWriter(Protocol):
    """A backend that writes one turn's conditional statements without a read first: in one
    message (PostgreSQL), or in one write transaction whose outcome is always known (SQLite)."""

    def write_once(self, owner: str, turn_id: str, sql: str, params: Params) -> int | None:
        """Run ``sql`` under the locks of ``transaction(owner, turn=turn_id)``,
        in one message: the rows it changed, or None when the connection failed
        after the message was sent (a transaction that takes the same locks
        afterwards sees whether it was applied).

        Raises:
            DuplicateKeyError: the statement hit a unique key; nothing was written.
            OutcomeUnknown: the call was cut at its deadline once the message
                was sent: it may or may not have been applied (or be applied later).
            StoreBusyError: a lock was not obtained in time, or the pool had no free connection.
            StoreUnavailableError: no connection to send it on, or the server
                refused or cancelled it (nothing was written).
        """
