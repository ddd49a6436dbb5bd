"""Which agent frameworks a test process had imported once its collection was
over (``tests/conftest.py`` keeps the list in ``config.stash`` under
``FRAMEWORKS_AT_COLLECTION``).

The frameworks cost seconds to import and every pytest-xdist worker collects
every test module: a module imports its framework only where a test uses it.
"""

from __future__ import annotations

import sys

import pytest

# The top-level packages of the frameworks the integrations adapt, and what they bring.
FRAMEWORKS = ("agents", "langgraph", "langchain_core", "mcp", "langsmith", "openai")
ADAPTERS = "securepad.integrations."
FRAMEWORKS_AT_COLLECTION = pytest.StashKey[list[str]]()


def imported_frameworks() -> list[str]:
    """The frameworks' packages and the adapters' modules now in ``sys.modules``."""
    return sorted(
        name for name in list(sys.modules) if name in FRAMEWORKS or (name.startswith(ADAPTERS) and "._" not in name)
    )
