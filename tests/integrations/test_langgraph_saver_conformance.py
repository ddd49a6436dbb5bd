"""LangGraph's own conformance suite for checkpointers (``langgraph-checkpoint-conformance``),
base and extended capabilities, run against ``SecurepadSaver`` on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from securepad import Principal, Scratchpad

if TYPE_CHECKING:
    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("langgraph")]


def test_the_conformance_suite_passes(pad: Scratchpad, alice: Principal) -> None:
    from langgraph.checkpoint.conformance import checkpointer_test, validate
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
    from langgraph.checkpoint.conformance.report import ProgressCallbacks

    from securepad.integrations.langgraph import SecurepadSaver

    @checkpointer_test(name="SecurepadSaver")
    async def securepad_saver() -> AsyncIterator[SecurepadSaver]:
        yield SecurepadSaver(pad, alice)

    failures: list[str] = []

    def record(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failures.append(f"{capability}/{test}:\n{error}")

    report = asyncio.run(validate(securepad_saver, progress=ProgressCallbacks(on_test_result=record)))
    assert not failures, "\n".join(failures)
    assert {name for name, result in report.results.items() if result.passed} == {c.value for c in ALL_CAPABILITIES}
    assert all(result.tests_failed == 0 and result.tests_passed > 0 for result in report.results.values())
