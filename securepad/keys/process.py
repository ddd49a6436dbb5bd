"""Keeping the master key from children and same-user readers (Linux only; SECURITY.md).

``/proc/<pid>/environ`` shows the initial environment block the kernel copied
at ``execve``; ``unsetenv`` leaves those bytes, so the value is overwritten in
place. A non-dumpable process writes no core dump and its ``/proc/<pid>/``
files belong to root, so no same-user process reads them or attaches a debugger.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["make_undumpable", "scrub_initial_environment"]

# <linux/prctl.h>
_PR_SET_DUMPABLE = 4
# Fields 50 and 51 of /proc/<pid>/stat (proc(5)), counted from the first field after the command.
_ENV_START_FIELD = 50 - 3
_ENV_END_FIELD = 51 - 3


def _environment_area(stat: bytes, maps: bytes) -> tuple[int, int] | None:
    """The initial environment block's [start, end) from ``/proc/self/stat``, only when
    ``/proc/self/maps`` shows it inside one writable mapping (a wrong field must not be written to)."""
    # The command (field 2) is in parentheses and may hold spaces and ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        start, end = int(fields[_ENV_START_FIELD]), int(fields[_ENV_END_FIELD])
    except (IndexError, ValueError):
        return None
    if not 0 < start < end:
        return None
    for line in maps.splitlines():
        parts = line.split()
        try:
            low, high = (int(bound, 16) for bound in parts[0].split(b"-"))
            perms = parts[1]
        except (IndexError, ValueError):
            continue
        if low <= start and end <= high:
            return (start, end) if perms.startswith(b"rw") else None
    return None


def scrub_initial_environment(name: str) -> int:
    """Overwrite with NUL bytes the value of every ``name=value`` of the initial
    environment block; return how many were found (0 where its bounds are unknown)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/stat", "rb") as stat, open("/proc/self/maps", "rb") as maps:
            area = _environment_area(stat.read(), maps.read())
    except OSError:
        return 0
    if area is None:
        return 0
    start, end = area
    block = ctypes.string_at(start, end - start)
    prefix = name.encode("utf-8", "surrogateescape") + b"="
    found = 0
    at = block.find(prefix)
    while at >= 0:
        if at == 0 or block[at - 1] == 0:  # a whole name, not the tail of a longer one
            value = at + len(prefix)
            stop = block.find(b"\0", value)
            stop = len(block) if stop < 0 else stop
            ctypes.memset(start + value, 0, stop - value)
            found += 1
        at = block.find(prefix, at + 1)
    return found


def make_undumpable() -> bool:
    """Make the process non-dumpable where the platform allows (Linux); return whether it is."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
