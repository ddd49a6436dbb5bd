"""asyncio front of the store: ``AsyncScratchpad`` and ``AsyncTurn``, derived
from ``Scratchpad`` and ``Turn`` so the two faces cannot drift.

Each public method becomes a coroutine of the same name, signature and
docstring that runs it in a worker thread (with the caller's context
variables); each public attribute a property. A call whose task is cancelled
still finishes in its worker (a put is whole or absent); only its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .errors import InvalidArgumentError, SecurepadError
from .principal import Principal
from .store import Scratchpad
from .turn import Turn, record_next

__all__ = ["AsyncScratchpad", "AsyncTurn"]

P = ParamSpec("P")
T = TypeVar("T")

# As asyncio's default pool: reads stay parallel, connections (one per worker) bounded.
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


def _derived(sync_class: type, name: str, member: Any) -> Any:
    """The async counterpart of the sync class's public ``member``."""
    if isinstance(member, classmethod | staticmethod):
        bound, skip = member.__get__(None, sync_class), int(isinstance(member, classmethod))

        async def on_class(*args: Any, **kwargs: Any) -> Any:  # a classmethod's first argument: the async class
            return await asyncio.to_thread(functools.partial(bound, *args[skip:], **kwargs))

        return type(member)(functools.update_wrapper(on_class, member.__func__))
    if callable(member):

        async def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await self._run(getattr(self._sync, name), *args, **kwargs)

        return functools.update_wrapper(method, member)

    def read(self: Any) -> Any:
        return getattr(self._sync, name)

    return property(functools.update_wrapper(read, member.fget) if isinstance(member, property) else read)  # type: ignore[arg-type]


def _derive(cls: type[T]) -> type[T]:
    """Add to ``cls`` the counterpart of every public name of ``cls._sync_class`` it does not define."""
    sync_class: type = cls._sync_class  # type: ignore[attr-defined]
    names = {name for name in dir(sync_class) if not name.startswith("_")}
    names |= set(getattr(sync_class, "__slots__", ())) | set(getattr(sync_class, "__annotations__", {}))
    for name in sorted(names - set(vars(cls))):
        if not name.startswith("_"):
            setattr(cls, name, _derived(sync_class, name, inspect.getattr_static(sync_class, name, None)))
    return cls


@_derive
class AsyncScratchpad:
    """The store for asyncio code: ``await AsyncScratchpad.open(...)``, or
    ``AsyncScratchpad(pad)`` around an open ``Scratchpad`` (closed with it). Each
    method is the ``Scratchpad`` method of the same name, run in this store's pool
    of ``max_workers``; after ``close``, every call raises ``SecurepadError``.
    """

    _sync_class = Scratchpad

    def __init__(self, pad: Scratchpad, *, max_workers: int | None = None) -> None:
        if not isinstance(pad, Scratchpad):
            raise InvalidArgumentError("pad must be a securepad.Scratchpad")
        workers = DEFAULT_MAX_WORKERS if max_workers is None else max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidArgumentError(f"max_workers must be a positive integer, not {max_workers!r}")
        self._sync = pad
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="securepad")
        self._run = _Runner(self._executor)

    @classmethod
    async def open(cls, *args: Any, max_workers: int | None = None, **kwargs: Any) -> AsyncScratchpad:
        """``Scratchpad.open`` off the event loop, with a pool of ``max_workers`` workers.

        Raises:
            WrongKeyError, PolicyError, SecurepadError: as for ``Scratchpad.open``.
            InvalidArgumentError: ``max_workers`` is not a positive integer, or as for ``Scratchpad.open``.
        """
        pad = await asyncio.to_thread(functools.partial(Scratchpad.open, *args, **kwargs))
        try:
            return cls(pad, max_workers=max_workers)
        except BaseException:
            pad.close()
            raise

    _opens = inspect.signature(Scratchpad.open)
    open.__func__.__signature__ = _opens.replace(  # type: ignore[attr-defined]
        parameters=[
            *_opens.parameters.values(),
            inspect.Parameter("max_workers", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="int | None"),
        ],
        return_annotation="AsyncScratchpad",
    )
    del _opens

    @property
    def sync(self) -> Scratchpad:
        """The synchronous store underneath (for code that runs in its own threads)."""
        return self._sync

    async def close(self) -> None:
        """Wait for the calls in progress, then close every connection. Calling it again does nothing."""
        if self._run.closed:
            return
        self._run.closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._sync.close()

    async def __aenter__(self) -> AsyncScratchpad:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def turn(self, principal: Principal, turn_id: str, *, now: float | None = None) -> AsyncTurn:
        """``Scratchpad.turn`` in a worker, as an ``AsyncTurn`` whose calls run in this store's pool.

        Raises:
            InvalidArgumentError: a bad principal or turn id.
        """
        return AsyncTurn(await self._run(self._sync.turn, principal, turn_id, now=now), self._run)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


@_derive
class AsyncTurn:
    """``Turn`` with async methods, each run in a worker thread: ``await pad.turn(...)``
    on an ``AsyncScratchpad``, or ``AsyncTurn.wrap(turn)`` for a ``Turn``."""

    _sync_class = Turn

    def __init__(self, turn: Turn, run: _Runner | None = None) -> None:
        if not isinstance(turn, Turn):
            raise InvalidArgumentError("turn must be a securepad.Turn")
        self._sync = turn
        self._run = run if run is not None else _Runner(None)

    @classmethod
    def wrap(cls, turn: Turn | AsyncTurn) -> AsyncTurn:
        """``turn`` itself if it is an ``AsyncTurn``, else one on asyncio's default pool.

        Raises:
            InvalidArgumentError: ``turn`` is neither.
        """
        return turn if isinstance(turn, AsyncTurn) else cls(turn)

    @property
    def sync(self) -> Turn:
        """The synchronous ``Turn`` underneath."""
        return self._sync

    def __repr__(self) -> str:
        return f"<AsyncTurn {self._sync.turn_id!r} of {self._sync.principal.owner_user_id!r}>"

    async def append(
        self, executor_name: str, observation: Any, *, ttl_seconds: int | None = None, now: float | None = None
    ) -> tuple[int, Any]:
        """``record_next``: record at the turn's next free step; returns ``(step_num, shown)``.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
        """
        return await self._run(record_next, self._sync, executor_name, observation, ttl_seconds=ttl_seconds, now=now)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...
