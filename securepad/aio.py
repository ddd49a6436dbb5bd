"""asyncio front of the store: ``AsyncScratchpad`` and ``AsyncTurn``.

Every call runs the synchronous store in a worker thread, so the event loop
never waits on SQLite, a lock or AES-GCM. The store keeps one SQLite
connection per thread: the workers read in parallel, and writes queue on
SQLite's write lock as they would from threads. ``AsyncScratchpad`` owns a
bounded pool of workers (``max_workers``, so at most that many connections);
``AsyncTurn.wrap`` puts a synchronous ``Turn`` behind asyncio's default pool.

A call whose task is cancelled while it runs still finishes in its worker
(a put is stored, or not, whole); only its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from ._steps import record_next
from .core import read_modes
from .errors import InvalidArgumentError, SecurepadError
from .keys.keyring import Keyring
from .keys.keystore import Progress
from .policy import Policy
from .principal import Principal
from .store import Entry, Scratchpad
from .turn import Turn

__all__ = ["AsyncScratchpad", "AsyncTurn"]

P = ParamSpec("P")
T = TypeVar("T")

# As many workers as asyncio's default pool would have: enough to keep reads
# parallel, few enough that the connections (one per worker) stay bounded.
DEFAULT_MAX_WORKERS = min(32, (os.cpu_count() or 1) + 4)


class _Runner:
    """Runs a synchronous call in a worker thread (with the caller's context variables)."""

    def __init__(self, executor: ThreadPoolExecutor | None) -> None:
        self._executor = executor
        self.closed = False

    async def __call__(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self.closed:
            raise SecurepadError("the store is closed")
        call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)


class AsyncScratchpad:
    """The store for asyncio code. Open one with ``await AsyncScratchpad.open(...)``
    and use it as an async context manager; ``AsyncScratchpad(pad)`` wraps a
    ``Scratchpad`` already open (closing the ``AsyncScratchpad`` closes it).

    Each method takes the arguments of the ``Scratchpad`` method of the same
    name and raises what it raises; after ``close``, every call raises
    ``SecurepadError``.
    """

    def __init__(self, pad: Scratchpad, *, max_workers: int | None = None) -> None:
        if not isinstance(pad, Scratchpad):
            raise InvalidArgumentError("pad must be a securepad.Scratchpad")
        workers = DEFAULT_MAX_WORKERS if max_workers is None else max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidArgumentError(f"max_workers must be a positive integer, not {max_workers!r}")
        self._pad = pad
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="securepad")
        self._run = _Runner(self._executor)

    @classmethod
    async def open(
        cls,
        db_path: str | os.PathLike[str] | Any,
        *,
        keyring: Keyring,
        policy: str | os.PathLike[str] | Policy | None = None,
        clock: Callable[[], float] = time.time,
        admin: str | Any | None = None,
        schema: str = "securepad",
        anchor: str | os.PathLike[str] | bool | None = None,
        adopt_anchor: bool = False,
        call_timeout_s: float | None = None,
        max_workers: int | None = None,
    ) -> AsyncScratchpad:
        """Open (creating if needed) the store at ``db_path`` (a SQLite file, or a
        PostgreSQL DSN or pool with ``admin`` and ``schema``), off the event loop.
        ``anchor`` and ``adopt_anchor``: the snapshot-rollback anchor, and
        ``call_timeout_s``, the PostgreSQL call deadline, as for ``Scratchpad.open``.

        Raises:
            WrongKeyError, PolicyError, SecurepadError: as for ``Scratchpad.open``.
            InvalidArgumentError: ``max_workers`` is not a positive integer, or
                PostgreSQL options given for a SQLite file.
        """
        pad = await asyncio.to_thread(
            Scratchpad.open,
            db_path,
            keyring=keyring,
            policy=policy,
            clock=clock,
            admin=admin,
            schema=schema,
            anchor=anchor,
            adopt_anchor=adopt_anchor,
            call_timeout_s=call_timeout_s,
        )
        try:
            return cls(pad, max_workers=max_workers)
        except BaseException:
            pad.close()
            raise

    @property
    def sync(self) -> Scratchpad:
        """The synchronous store underneath (for code that runs in its own threads)."""
        return self._pad

    @property
    def policy(self) -> Policy:
        """The store's policy."""
        return self._pad.policy

    @property
    def keyring(self) -> Keyring:
        """The keyring whose master key opens the store."""
        return self._pad.keyring

    @property
    def schema_upgrade(self) -> dict[str, int] | None:
        """``Scratchpad.schema_upgrade``: the schema versions this open upgraded the store from and to."""
        return self._pad.schema_upgrade

    @property
    def upgrade_notice(self) -> str | None:
        """``Scratchpad.upgrade_notice``: the one-line notice of an upgrade, or None."""
        return self._pad.upgrade_notice

    @property
    def store_id(self) -> str:
        """The store's random id (it binds every wrapped owner key to this store)."""
        return self._pad.store_id

    @property
    def path(self) -> Path:
        """The database file of a SQLite store.

        Raises:
            SecurepadError: the store is on PostgreSQL (see ``location``).
        """
        return self._pad.path

    @property
    def location(self) -> str:
        """Where the store lives: its file, or its PostgreSQL server, database and schema."""
        return self._pad.location

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._pad.backend

    async def close(self) -> None:
        """Wait for the calls in progress, then close every connection. Calling it again does nothing."""
        if self._run.closed:
            return
        self._run.closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._pad.close()

    async def __aenter__(self) -> AsyncScratchpad:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the store's calls, each in a worker ----------------------------------------------

    async def put(
        self,
        principal: Principal,
        turn_id: str,
        step_num: int,
        executor_name: str,
        observation: Any,
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
    ) -> dict[str, Any]:
        """``Scratchpad.put``: store an observation, encrypted; returns its synthetic view.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Scratchpad.put``.
        """
        return await self._run(
            self._pad.put, principal, turn_id, step_num, executor_name, observation, ttl_seconds, now=now
        )

    async def put_many(
        self,
        principal: Principal,
        turn_id: str,
        items: Sequence[tuple[int, str, Any]],
        ttl_seconds: int | None = None,
        *,
        now: float | None = None,
    ) -> list[dict[str, Any]]:
        """``Scratchpad.put_many``: several observations in one transaction; returns their views.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Scratchpad.put_many``.
        """
        return await self._run(self._pad.put_many, principal, turn_id, items, ttl_seconds, now=now)

    async def get(
        self, principal: Principal, scratchpad_id: str, *, now: float | None = None, turn_id: str | None = None
    ) -> Entry:
        """``Scratchpad.get``: the whole entry.

        Raises:
            NotFoundError, ExpiredError, IntegrityError: as for ``Scratchpad.get``.
        """
        return await self._run(self._pad.get, principal, scratchpad_id, now=now, turn_id=turn_id)

    async def read(
        self,
        principal: Principal,
        scratchpad_id: str,
        mode: str = "head",
        n: int = read_modes.DEFAULT_N,
        start: int = 0,
        end: int | None = None,
        *,
        pattern: str | None = None,
        max_matches: int = read_modes.DEFAULT_MAX_MATCHES,
        context: int = 0,
        now: float | None = None,
        turn_id: str | None = None,
    ) -> dict[str, Any]:
        """``Scratchpad.read``: part of an entry, never more than the policy's read cap.

        Raises:
            NotFoundError, ExpiredError, IntegrityError, InvalidArgumentError: as for ``Scratchpad.read``.
        """
        return await self._run(
            self._pad.read,
            principal,
            scratchpad_id,
            mode,
            n,
            start,
            end,
            pattern=pattern,
            max_matches=max_matches,
            context=context,
            now=now,
            turn_id=turn_id,
        )

    async def list_for_turn(
        self, principal: Principal, turn_id: str, *, now: float | None = None
    ) -> list[dict[str, Any]]:
        """``Scratchpad.list_for_turn``: the live entries of a turn the principal may see.

        Raises:
            InvalidArgumentError, IntegrityError: as for ``Scratchpad.list_for_turn``.
        """
        return await self._run(self._pad.list_for_turn, principal, turn_id, now=now)

    async def delete(self, principal: Principal, scratchpad_id: str, *, now: float | None = None) -> None:
        """``Scratchpad.delete``: delete one entry of the caller's.

        Raises:
            NotFoundError, StoreBusyError: as for ``Scratchpad.delete``.
        """
        await self._run(self._pad.delete, principal, scratchpad_id, now=now)

    async def extend_turn(
        self, principal: Principal, turn_id: str, ttl_seconds: int | None = None, *, now: float | None = None
    ) -> int:
        """``Scratchpad.extend_turn``: let a turn live ``ttl_seconds`` from now.

        Raises:
            InvalidArgumentError, IntegrityError, StoreBusyError: as for ``Scratchpad.extend_turn``.
        """
        return await self._run(self._pad.extend_turn, principal, turn_id, ttl_seconds, now=now)

    async def gc(self, now: float | None = None, *, wait: bool = True) -> int:
        """``Scratchpad.gc``: delete expired entries; returns how many.

        Raises:
            StoreBusyError: the write lock was not obtained in time.
        """
        return await self._run(self._pad.gc, now, wait=wait)

    async def scrub(self) -> bool:
        """``Scratchpad.scrub``: rewrite the store file so that nothing deleted remains in it.

        Raises:
            StoreBusyError: the write lock was not obtained in time.
        """
        return await self._run(self._pad.scrub)

    async def verify(self, *, now: float | None = None) -> dict[str, Any]:
        """``Scratchpad.verify``: the whole-store check of heads, entries and records.

        Raises:
            InvalidArgumentError: a bad ``now``.
        """
        return await self._run(self._pad.verify, now=now)

    async def backup(self, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """``Scratchpad.backup``: a consistent copy of the live store in the new file ``dest``.

        Raises:
            InvalidArgumentError, StorageFullError, SecurepadError: as for ``Scratchpad.backup``.
        """
        return await self._run(self._pad.backup, dest)

    @classmethod
    async def restore(
        cls,
        db_path: str | os.PathLike[str],
        src: str | os.PathLike[str],
        *,
        keyring: Keyring,
        policy: str | os.PathLike[str] | Policy | None = None,
        anchor: str | os.PathLike[str] | bool | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """``Scratchpad.restore``, off the event loop.

        Raises:
            InvalidArgumentError, WrongKeyError, IntegrityError, StoreCorruptError:
                as for ``Scratchpad.restore``.
        """
        return await asyncio.to_thread(
            Scratchpad.restore, db_path, src, keyring=keyring, policy=policy, anchor=anchor, now=now
        )

    async def stats(self, principal: Principal | None = None, *, now: float | None = None) -> dict[str, Any]:
        """``Scratchpad.stats``: counts and sizes, for one principal's scope or the whole store.

        Raises:
            InvalidArgumentError: a bad principal.
        """
        return await self._run(self._pad.stats, principal, now=now)

    async def rotate_master_key(self, new_keyring: Keyring, *, progress: Progress | None = None) -> dict[str, Any]:
        """``Scratchpad.rotate_master_key``: re-wrap every owner key under ``new_keyring``'s master key.

        ``progress`` is called in the worker thread.

        Raises:
            InvalidArgumentError, WrongKeyError, StoreBusyError: as for ``Scratchpad.rotate_master_key``.
        """
        return await self._run(self._pad.rotate_master_key, new_keyring, progress=progress)

    async def rotate_owner_key(self, owner_user_id: str, *, progress: Progress | None = None) -> dict[str, Any]:
        """``Scratchpad.rotate_owner_key``: a new key version for an owner, the old ones retired.

        ``progress`` is called in the worker thread.

        Raises:
            NotFoundError, StoreBusyError: as for ``Scratchpad.rotate_owner_key``.
        """
        return await self._run(self._pad.rotate_owner_key, owner_user_id, progress=progress)

    async def forget_owner(self, owner_user_id: str) -> dict[str, Any]:
        """``Scratchpad.forget_owner``: crypto-shred an owner's keys and entries.

        Raises:
            StoreBusyError: the write lock was not obtained in time.
        """
        return await self._run(self._pad.forget_owner, owner_user_id)

    async def drop_turn(self, owner_user_id: str, turn_id: str) -> dict[str, Any]:
        """``Scratchpad.drop_turn``: delete an owner's turn whole, whatever its check says.

        Raises:
            InvalidArgumentError: an identifier is malformed.
            IntegrityError: the owner's owner head or usage head fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        return await self._run(self._pad.drop_turn, owner_user_id, turn_id)

    async def turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> AsyncTurn:
        """``Scratchpad.turn`` (which collects expired entries first): the runtime
        surface for one turn of one principal, with async methods.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        turn = await self._run(self._pad.turn, principal, turn_id, now=now)
        return AsyncTurn(turn, self._run)


class AsyncTurn:
    """``Turn`` with async methods, each run in a worker thread; get one with
    ``await pad.turn(principal, turn_id)`` on an ``AsyncScratchpad``, or
    ``AsyncTurn.wrap(turn)`` for a synchronous ``Turn``.

    Each method takes the arguments of the ``Turn`` method of the same name and
    raises what it raises.
    """

    __slots__ = ("_run", "_turn")

    def __init__(self, turn: Turn, run: _Runner | None = None) -> None:
        if not isinstance(turn, Turn):
            raise InvalidArgumentError("turn must be a securepad.Turn")
        self._turn = turn
        self._run = run if run is not None else _Runner(None)

    @classmethod
    def wrap(cls, turn: Turn | AsyncTurn) -> AsyncTurn:
        """``turn`` itself if it is an ``AsyncTurn``, else an ``AsyncTurn`` whose
        calls run in asyncio's default thread pool.

        Raises:
            InvalidArgumentError: ``turn`` is neither.
        """
        return turn if isinstance(turn, AsyncTurn) else cls(turn)

    @property
    def sync(self) -> Turn:
        """The synchronous ``Turn`` underneath."""
        return self._turn

    @property
    def principal(self) -> Principal:
        return self._turn.principal

    @property
    def turn_id(self) -> str:
        return self._turn.turn_id

    def __repr__(self) -> str:
        return f"<AsyncTurn {self.turn_id!r} of {self.principal.owner_user_id!r}>"

    async def record(
        self,
        step_num: int,
        executor_name: str,
        observation: Any,
        *,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, Any] | Any:
        """``Turn.record``: store a step's observation; returns what goes into the history.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
        """
        return await self._run(
            self._turn.record, step_num, executor_name, observation, ttl_seconds=ttl_seconds, now=now
        )

    async def record_many(
        self,
        items: Sequence[tuple[str, Any]],
        *,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> list[Any]:
        """``Turn.record_many``: several observations at the turn's next steps, in one transaction.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record_many``.
        """
        return await self._run(self._turn.record_many, items, ttl_seconds=ttl_seconds, now=now)

    async def append(
        self, executor_name: str, observation: Any, *, ttl_seconds: int | None = None, now: float | None = None
    ) -> tuple[int, Any]:
        """Record ``observation`` at the turn's next free step number (for runtimes
        that do not count steps; concurrent callers never collide). Returns
        ``(step_num, shown)``, ``shown`` being what ``record`` returns.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
        """
        return await self._run(record_next, self._turn, executor_name, observation, ttl_seconds=ttl_seconds, now=now)

    async def history(self, *, now: float | None = None) -> list[Any]:
        """``Turn.history``: what the model saw of each live step, in step order.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return await self._run(self._turn.history, now=now)

    async def steps(self, *, now: float | None = None) -> list[dict[str, Any]]:
        """``Turn.steps``: the history with each step's number, executor and id.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return await self._run(self._turn.steps, now=now)

    async def tools(self, *, strict: bool = False, now: float | None = None) -> list[dict[str, Any]]:
        """``Turn.tools``: the scratchpad_read tool once something was offloaded, else ``[]``.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return await self._run(self._turn.tools, strict=strict, now=now)

    async def call_tool(self, name: object, arguments: object, *, now: float | None = None) -> dict[str, Any]:
        """``Turn.call_tool``: answer a model's tool call; bad input never raises.

        Raises:
            IntegrityError, StoreBusyError: as for ``Turn.call_tool``.
        """
        return await self._run(self._turn.call_tool, name, arguments, now=now)

    async def resolve(self, value: Any, *, now: float | None = None) -> Any:
        """``Turn.resolve``: fill ``{{stepN.path}}`` / ``${stepN.path}`` references.

        Raises:
            InvalidArgumentError, IntegrityError: as for ``Turn.resolve``.
        """
        return await self._run(self._turn.resolve, value, now=now)

    async def resume(self, *, extend_ttl: int | None = None, now: float | None = None) -> dict[str, Any]:
        """``Turn.resume``: pick the turn up again, optionally extending its expiry.

        Raises:
            InvalidArgumentError, IntegrityError, StoreBusyError: as for ``Turn.resume``.
        """
        return await self._run(self._turn.resume, extend_ttl=extend_ttl, now=now)

    async def checkpoint(
        self,
        *,
        workspace: Mapping[str, str] | None = None,
        budget: Mapping[str, int | float] | None = None,
        facts: list[str] | tuple[str, ...] | None = None,
        unresolved: list[str] | tuple[str, ...] | None = None,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """``Turn.checkpoint``: keep the compaction record, encrypted.

        Raises:
            InvalidArgumentError, StoreBusyError: as for ``Turn.checkpoint``.
        """
        return await self._run(
            self._turn.checkpoint,
            workspace=workspace,
            budget=budget,
            facts=facts,
            unresolved=unresolved,
            ttl_seconds=ttl_seconds,
            now=now,
        )

    async def latest_checkpoint(self, *, now: float | None = None) -> dict[str, Any] | None:
        """``Turn.latest_checkpoint``: the newest live checkpoint, or None.

        Raises:
            IntegrityError: the checkpoint fails authentication.
        """
        return await self._run(self._turn.latest_checkpoint, now=now)

    async def mark_compaction(self, *, ttl_seconds: int | None = None, now: float | None = None) -> dict[str, Any]:
        """``Turn.mark_compaction``: note that the runtime compacted its context now.

        Raises:
            InvalidArgumentError, IntegrityError, StoreBusyError: as for ``Turn.mark_compaction``.
        """
        return await self._run(self._turn.mark_compaction, ttl_seconds=ttl_seconds, now=now)

    async def reread_report(self, *, now: float | None = None) -> dict[str, Any]:
        """``Turn.reread_report``: what was fetched again after the last compaction mark.

        Raises:
            IntegrityError: a stored entry or the mark fails authentication.
        """
        return await self._run(self._turn.reread_report, now=now)
