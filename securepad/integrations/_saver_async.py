"""The async face of a LangGraph checkpointer, derived from its sync one: each
``a*`` method runs the sync method of the same name in a worker thread, so the
two cannot drift apart (``SecurepadSaver`` implements only the sync ones)."""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import AsyncIterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

__all__ = ["ThreadedAsyncSaver"]


class ThreadedAsyncSaver(BaseCheckpointSaver[str]):
    """``BaseCheckpointSaver``'s async methods as the sync ones in a worker thread
    (the signatures are ``BaseCheckpointSaver``'s). Each raises what its sync method raises."""

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: builtins.list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item


def _in_a_thread(name: str) -> Any:
    async def method(self: BaseCheckpointSaver[str], /, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self, name), *args, **kwargs)

    method.__name__, method.__qualname__ = f"a{name}", f"ThreadedAsyncSaver.a{name}"
    method.__doc__ = f"``{name}`` in a worker thread."
    method.__signature__ = inspect.signature(getattr(BaseCheckpointSaver, f"a{name}"))  # type: ignore[attr-defined]
    return method


for _name in ("get_tuple", "put", "put_writes", "delete_thread", "delete_for_runs", "copy_thread", "prune"):
    setattr(ThreadedAsyncSaver, f"a{_name}", _in_a_thread(_name))
