"""``securepad demo``: a real round trip a newcomer can read.

Two synthetic owners store and read observations; the second is refused the
first's entry; a tampered copy of the store is detected. The demo's owners
are removed afterwards; nothing else in the store is touched.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError, NotFoundError
from ..principal import Principal
from ..store import Scratchpad, sqlite_of
from .drills import flip_segment_byte

__all__ = ["DemoStep", "run_demo"]


@dataclass(frozen=True)
class DemoStep:
    """One thing the demo did and what came of it."""

    title: str
    detail: str
    ok: bool


def run_demo(pad: Scratchpad) -> Iterator[DemoStep]:
    """Run the demo against an open store, yielding each step as it completes."""
    tag = secrets.token_hex(4)
    alice = Principal(f"demo-alice-{tag}", "planner", "cli")
    bob = Principal(f"demo-bob-{tag}", "planner", "cli")
    log = "".join(f"2026-11-30T10:{i // 60:02d}:{i % 60:02d} INFO request {i} served\n" for i in range(20_000))
    log += "2026-11-30T15:33:20 ERROR disk full while writing /var/cache/blob\n"
    try:
        view = pad.put(alice, "demo-turn", 1, "read_log", {"content": log, "metadata": {"path": "/var/log/app.log"}})
        yield DemoStep(
            "alice stores an 800 KB log",
            f"id {view['scratchpad_id']}, {view['size_bytes']} bytes, the model sees a "
            f"{len(view['summary'])}-character summary",
            True,
        )
        tail = pad.read(alice, view["scratchpad_id"], mode="tail", n=70)
        yield DemoStep("alice reads the tail", repr(tail["content"].strip()), "ERROR disk full" in tail["content"])
        bob_view = pad.put(bob, "demo-turn", 1, "search", {"results": [{"title": "a"}, {"title": "b"}], "total": 2})
        bob_read = pad.read(bob, bob_view["scratchpad_id"], mode="full")
        yield DemoStep("bob stores and reads his own search result", bob_view["summary"], bob_read["ok"])
        try:
            pad.read(bob, view["scratchpad_id"], mode="full")
            yield DemoStep("bob asks for alice's id", "bob was served alice's entry", False)
        except NotFoundError as exc:
            yield DemoStep("bob asks for alice's id", f"refused: NotFoundError({str(exc)!r})", True)
        yield _tamper_step(pad, alice, view["scratchpad_id"])
    finally:
        pad.forget_owner(alice.owner_user_id)
        pad.forget_owner(bob.owner_user_id)
    yield DemoStep("cleanup", "the demo's two owners and their keys are removed", True)


def _tamper_step(pad: Scratchpad, alice: Principal, entry_id: str) -> DemoStep:
    title = "one bit flipped in a scratch copy of the file"
    with tempfile.TemporaryDirectory(prefix="securepad-demo-") as scratch:
        copy = Path(scratch) / "tampered.db"
        sqlite_of(pad).copy_to(copy)
        flip_segment_byte(copy, entry_id)
        with Scratchpad.open(copy, keyring=pad.keyring, policy=pad.policy) as tampered:
            try:
                tampered.read(alice, entry_id, mode="head", n=100)
            except IntegrityError as exc:
                return DemoStep(title, f"detected: IntegrityError({exc})", True)
    return DemoStep(title, "the damaged entry was served", False)
