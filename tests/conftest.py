"""Shared fixtures: a real store (apsw + AES-GCM) in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from securepad import Keyring, Principal, Scratchpad

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")

# Fast Argon2id for tests only; production defaults stay RFC 9106's.
FAST_ARGON2 = {"time_cost": 1, "memory_cost": 64, "parallelism": 1}

ALICE = Principal("alice", "planner", "web")
BOB = Principal("bob", "planner", "web")


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return tmp_path / "config" / "key"


@pytest.fixture
def keyring(key_file: Path) -> Keyring:
    return Keyring.from_key_file(key_file)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "store.db"


@pytest.fixture
def pad(db_path: Path, keyring: Keyring) -> Iterator[Scratchpad]:
    with Scratchpad.open(db_path, keyring=keyring) as store:
        yield store


@pytest.fixture
def alice() -> Principal:
    return ALICE


@pytest.fixture
def bob() -> Principal:
    return BOB
