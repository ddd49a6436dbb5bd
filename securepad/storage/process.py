"""This process's id, kept current across ``fork``: the fork checks of per-process
state (a thread's connection, a cache) read ``process.pid``, an attribute,
rather than make a system call each.

``os.register_at_fork`` runs in every child that Python's ``os.fork`` (and
``multiprocessing``'s fork start method) makes, and in a child forked from C
that calls ``PyOS_AfterFork_Child``, as a C extension forking must: the child
sees its own id before it runs any other Python code.
"""

from __future__ import annotations

import os

pid = os.getpid()


def _after_fork_in_child() -> None:
    global pid
    pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
