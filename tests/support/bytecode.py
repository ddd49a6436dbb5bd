"""One bytecode cache, outside the source tree, for the Python processes the
tests start, where bytecode is not written (``PYTHONDONTWRITEBYTECODE``).

Without it each of those processes (the docs' examples, the command line, the
benchmark's children, the processes ``multiprocessing`` spawns) compiles every
module without a cached copy (the package and the tests) again: the docs'
examples alone spend a third of their CPU compiling. A cache named by
``PYTHONPYCACHEPREFIX`` is the only place such a process looks, so it starts
with the bytecode this test process already read from the installed packages'
own caches (which a spawned process, run with ``-B``, could not add itself).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["share_bytecode"]


def share_bytecode(prefix: Path) -> None:
    """Make ``prefix`` the bytecode cache of the processes this one starts, and
    copy into it the cached bytecode of the modules this one has loaded."""
    prefix.mkdir(mode=0o700, exist_ok=True)
    for module in list(sys.modules.values()):
        source, cached = getattr(module, "__file__", None), getattr(module, "__cached__", None)
        if not source or not cached or not source.endswith(".py") or not os.path.isfile(cached):
            continue
        target = prefix.joinpath(*Path(source).parent.parts[1:], Path(cached).name)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.{os.getpid()}")
        shutil.copyfile(cached, part)
        part.replace(target)  # whole, or not at all: another process may be reading it
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
