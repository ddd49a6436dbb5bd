"""The securepad modules whose code runs during one warm put and one warm
tail read on SQLite (a trace of the modules entered, ``sys.setprofile``).

    python benchmarks/module_trace.py [--verbose]

Prints, for each call, how many distinct securepad modules ran code and how
many times the trace came back to a module it had already left ("climbs":
entering module B again after it called into another module and returned).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import securepad
from securepad import Keyring, Principal, Scratchpad

PACKAGE = Path(securepad.__file__).resolve().parent
ALICE = Principal("alice", "agent", "web")


def _module(filename: str) -> str | None:
    path = Path(filename)
    try:
        relative = path.resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return ".".join(("securepad", *relative.with_suffix("").parts)).removesuffix(".__init__")


def trace(call: Callable[[], Any]) -> tuple[list[str], list[str]]:
    """The modules entered by ``call`` (in the order first entered) and the sequence of module changes."""
    names: dict[str, str | None] = {}
    order: list[str] = []
    sequence: list[str] = []

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        module = names.get(filename)
        if filename not in names:
            module = names[filename] = _module(filename)
        if module is None:
            return
        if module not in order:
            order.append(module)
        if not sequence or sequence[-1] != module:
            sequence.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return order, sequence


def warm_calls(pad: Scratchpad) -> dict[str, Callable[[], Any]]:
    """The traced calls on ``pad``, warmed first: the owner key, the turn's head and
    reservation, the statement caches."""
    ids = [pad.put(ALICE, "turn", step, "tool", "line\n" * 200)["scratchpad_id"] for step in range(1, 6)]
    for entry_id in ids:
        pad.read(ALICE, entry_id, "tail")
    return {
        "put": lambda: pad.put(ALICE, "turn", 6, "tool", "line\n" * 200),
        "read(tail)": lambda: pad.read(ALICE, ids[-1], "tail"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list the modules")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        keyring = Keyring.from_key_file(Path(tmp) / "key")
        with Scratchpad.open(Path(tmp) / "store.db", keyring=keyring) as pad:
            for name, call in warm_calls(pad).items():
                order, sequence = trace(call)
                climbs = len(sequence) - len(set(sequence))
                print(f"{name}: {len(order)} modules, {climbs} returns to a module already entered")
                if args.verbose:
                    for module in order:
                        print(f"    {module}")


if __name__ == "__main__":
    main()
