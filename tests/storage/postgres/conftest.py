"""The fault proxy between a store and the PostgreSQL server, and a store
whose every connection goes through it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from securepad import Keyring, Policy, Scratchpad


@pytest.fixture
def proxy(pg_database: str) -> Iterator[Any]:
    """A ``FaultyProxy`` in front of the test session's database."""
    from tests.support.faults import proxy_for

    faulty = proxy_for(pg_database)
    yield faulty
    faulty.close()


@pytest.fixture
def faulty_pad(pg_store_dsn: str, proxy: Any, keyring: Keyring) -> Iterator[Scratchpad]:
    """A store (no test has written to it) whose every connection goes through
    the proxy, with the tests' short limits."""
    from securepad.storage.postgres.database import PostgresDatabase
    from tests.support.faults import LIMITS, through

    db = PostgresDatabase(through(pg_store_dsn, proxy), schema="securepad", pool_size=4, **LIMITS)
    pad = Scratchpad(db, keyring, Policy.default(), time.time)
    yield pad
    proxy.heal()
    pad.close()
