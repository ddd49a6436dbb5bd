"""What ``SecurepadSession`` reads to answer: ``get_items(limit)`` and
``pop_item`` read whole only the items they return, however long the session
(counted, not timed: ``Scratchpad.get`` calls), on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from securepad import Principal, Scratchpad

pytestmark = pytest.mark.xdist_group("openai_agents")

LENGTH = 30


def item(n: int) -> dict[str, Any]:
    # Over inline_max_chars (the view is cut) but kept in the sealed metadata (at most 4 KiB).
    return {"role": "user", "content": f"{n}: " + "m" * 2000}


def test_items_are_read_only_when_returned(pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    session = SecurepadSession("long", pad, alice)
    asyncio.run(session.add_items([item(n) for n in range(LENGTH)]))
    asyncio.run(session.add_items([{"role": "user", "content": "big " + "b" * 10_000}]))
    opened: list[str] = []
    real = pad.get

    def get(principal: Principal, scratchpad_id: str, **kwargs: Any) -> Any:
        opened.append(scratchpad_id)
        return real(principal, scratchpad_id, **kwargs)

    monkeypatch.setattr(pad, "get", get)
    assert asyncio.run(session.get_items(limit=3)) == [
        item(LENGTH - 2),
        item(LENGTH - 1),
        {"role": "user", "content": "big " + "b" * 10_000},
    ]
    assert len(opened) == 3
    opened.clear()
    assert asyncio.run(session.pop_item()) == {"role": "user", "content": "big " + "b" * 10_000}
    assert asyncio.run(session.pop_item()) == item(LENGTH - 1)
    assert len(opened) == 2
    opened.clear()
    assert asyncio.run(session.get_items()) == [item(n) for n in range(LENGTH - 1)]
    assert len(opened) == LENGTH - 1
