"""pytest-xdist's ``load`` distribution, with the ``xdist_group`` tests on one
worker.

The tests of an agent framework carry its group (``tests/test_collection.py``):
importing the framework costs a worker seconds of CPU, once. Dealt out like the
other tests, each framework is imported by every worker; kept on one worker,
once. pytest-xdist's own ``loadgroup`` cannot be used: it renames the tests it
groups, which the pytest it runs under no longer allows.

Each worker writes the groups of the tests it collected (``write_groups``) to a
file the controller names; the controller (``GroupedLoadScheduling``) reads it
once every worker has collected and queues every grouped test on one worker:
the frameworks import one another (the Agents SDK imports the MCP SDK; the
keyed turn ids' tests use LangGraph and the Agents SDK). That worker is handed
its queue before the shared tests: the groups run early (a small share of the
run), and the end of the run is dealt out as ``load`` deals it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling  # type: ignore[import-untyped]

__all__ = ["GROUPS_INPUT", "GroupedLoadScheduling", "groups_file", "write_groups"]

# The key of the groups file's path in each worker's ``workerinput``.
GROUPS_INPUT = "securepad_test_groups"


def groups_file(config: pytest.Config) -> Path | None:
    """The file this worker writes its tests' groups to (None outside pytest-xdist's workers)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    path = None if workerinput is None else workerinput.get(GROUPS_INPUT)
    return None if path is None else Path(path)


def write_groups(path: Path, items: Sequence[pytest.Item]) -> None:
    """Write ``{node id: group}`` of the grouped ``items`` to ``path`` (whole, or not at all)."""
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_text(json.dumps(groups), encoding="utf-8")
    part.replace(path)


class GroupedLoadScheduling(LoadScheduling):  # type: ignore[misc]
    """``--dist load`` with the grouped tests queued on one worker (see the module)."""

    collection: list[str] | None
    maxschedchunk: int | None
    pending: list[int]
    node2pending: dict[Any, list[int]]

    def __init__(self, config: pytest.Config, log: Any, groups: Path) -> None:
        super().__init__(config, log)
        self.groups = groups
        self.queued: dict[Any, list[int]] = {}  # worker: its grouped tests not yet sent to it

    @property
    def tests_finished(self) -> bool:
        return not any(self.queued.values()) and bool(super().tests_finished)

    @property
    def has_pending(self) -> bool:
        return any(self.queued.values()) or bool(super().has_pending)

    def schedule(self) -> None:
        if self.collection is not None:
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection: list[str] = next(iter(self.node2collection.values()))
        self.collection = collection
        self.pending[:] = range(len(collection))
        if not collection:
            return
        if self.maxschedchunk is None:
            self.maxschedchunk = len(collection)
        self._queue_groups()
        # As ``load`` starts: a quarter of each worker's share, then more as it reports.
        chunk = max(2, min(len(collection) // len(self.nodes) // 4, self.maxschedchunk))
        for node in self.nodes:
            self._send_tests(node, chunk)
        for node in self.nodes:
            if not self.pending and not self.queued[node]:
                node.shutdown()

    def _queue_groups(self) -> None:
        """Move the grouped tests from the shared list to one worker's queue, in order."""
        assert self.collection is not None
        collection = self.collection
        named = json.loads(self.groups.read_text(encoding="utf-8")) if self.groups.is_file() else {}
        grouped = [index for index, nodeid in enumerate(collection) if nodeid in named]
        self.queued = {node: [] for node in self.nodes}
        self.queued[self.nodes[0]] = grouped
        chosen = set(grouped)
        self.pending[:] = [index for index in self.pending if index not in chosen]

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down or self.collection is None or self.maxschedchunk is None:
            return
        queue = self.queued.get(node, [])
        if not self.pending and not queue:
            node.shutdown()
            return
        waiting = len(self.pending) + len(queue)
        fewest = max(2, waiting // len(self.node2pending) // 4)
        most = max(2, waiting // len(self.node2pending) // 2)
        node_pending = self.node2pending[node]
        if len(node_pending) < fewest:
            if duration >= 0.1 and len(node_pending) >= 2:
                return
            self._send_tests(node, min(most - len(node_pending), max(2 - len(node_pending), self.maxschedchunk)))

    def _send_tests(self, node: Any, num: int) -> None:
        """Send ``node`` ``num`` tests: its queue's first, then the shared list's."""
        queue = self.queued.get(node, [])
        chosen = queue[:num]
        del queue[:num]
        rest = num - len(chosen)
        chosen += self.pending[:rest]
        del self.pending[:rest]
        if chosen:
            self.node2pending[node].extend(chosen)
            node.send_runtest_some(chosen)

    def remove_node(self, node: Any) -> str | None:
        """A worker gone: its queued tests go back to the shared list."""
        self.pending.extend(self.queued.pop(node, []))
        return super().remove_node(node)  # type: ignore[no-any-return]
