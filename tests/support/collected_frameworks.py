"""A pytest plugin (``-p tests.support.collected_frameworks``) that writes, once
collection is over, the agent frameworks' modules then imported: one name a
line, to the file ``SECUREPAD_COLLECTED_FRAMEWORKS`` names.

The frameworks cost seconds to import and every pytest-xdist worker collects
every test module: a module imports its framework only where a test uses it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The top-level packages of the frameworks the integrations adapt, and what they bring.
FRAMEWORKS = ("agents", "langgraph", "langchain_core", "mcp", "langsmith", "openai")
ADAPTERS = "securepad.integrations."


def imported_frameworks() -> list[str]:
    """The frameworks' packages and the adapters' modules now in ``sys.modules``."""
    return sorted(
        name for name in list(sys.modules) if name in FRAMEWORKS or (name.startswith(ADAPTERS) and "._" not in name)
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    Path(os.environ["SECUREPAD_COLLECTED_FRAMEWORKS"]).write_text(
        "".join(f"{name}\n" for name in imported_frameworks()), encoding="utf-8"
    )
