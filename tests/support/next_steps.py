"""The next-step property shared by both backends: what two stores on one store put
(at the next step, or at a step of their own) and delete, against a model of the
live entries; each next-step put must take the highest live step plus one."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from securepad import Principal, Scratchpad
from securepad._steps import put_next

__all__ = ["next_step_ops", "run_next_step_ops"]

_OWNERS = itertools.count()
Op = tuple[str, int, int, bool]


def next_step_ops(max_size: int) -> st.SearchStrategy[list[Op]]:
    """Steps of the property: (what, which store, a number: the entry deleted or the step a
    plain put skips to, whether the entry is short-lived)."""
    return st.lists(
        st.one_of(
            st.tuples(st.just("next"), st.integers(0, 1), st.integers(0, 3), st.booleans()),
            st.tuples(st.just("plain"), st.integers(0, 1), st.integers(1, 3), st.booleans()),
            st.tuples(st.just("delete"), st.integers(0, 1), st.integers(0, 99), st.just(False)),
        ),
        max_size=max_size,
    )


def run_next_step_ops(stores: tuple[Scratchpad, Scratchpad], ops: list[Op], clock: float) -> None:
    """Run ``ops`` on a fresh owner's turn and check the steps: each next-step put takes the
    highest live step plus one, the turn lists exactly the live entries, no two share a
    step, and the store verifies."""
    who = Principal(f"prop-{next(_OWNERS)}", "planner", "web")
    live: dict[str, tuple[int, float]] = {}  # entry id -> (step, expires at)
    for what, store, number, short in ops:
        clock += 1
        pad = stores[store]
        steps = [step for step, expires in live.values() if expires > clock]
        top = max(steps, default=0)
        ttl = 3 if short else 3600
        if what == "next":
            guess = top + 1 if number == 0 else number  # the saver's guess is mostly right
            view = put_next(pad, who, "t", "tool", f"next {clock}", ttl, now=clock, guess=guess)
            assert view["step_num"] == top + 1
            live[view["scratchpad_id"]] = (top + 1, clock + ttl)
        elif what == "plain":
            view = pad.put(who, "t", top + number, "tool", f"plain {clock}", ttl, now=clock)
            live[view["scratchpad_id"]] = (top + number, clock + ttl)
        elif steps:
            alive = sorted(entry for entry, (_, expires) in live.items() if expires > clock)
            pad.delete(who, alive[number % len(alive)])
            del live[alive[number % len(alive)]]
    listed = [(entry["step_num"], entry["scratchpad_id"]) for entry in stores[0].list_for_turn(who, "t", now=clock)]
    assert sorted(listed) == sorted((step, entry) for entry, (step, expires) in live.items() if expires > clock)
    assert len({step for step, _ in listed}) == len(listed)
    assert stores[1].verify(now=clock)["ok"]
