"""The command line as a new user meets it: ``securepad`` through click's runner on
a fresh HOME, in a scratch working directory. The ``cli`` fixture runs a test on
both backends (``[sqlite]``: the default store under HOME; ``[postgresql]``:
``--db`` a fresh database), like the ``pad`` fixture; ``sqlite_only`` keeps it
on the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_runner import Cli, fresh_home


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest) -> Cli:
    store = request.getfixturevalue("pg_dsn") if backend == "postgresql" else None
    return fresh_home(tmp_path, monkeypatch, store)


@pytest.fixture
def pg_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> Cli:
    """``cli`` on PostgreSQL only, for what only PostgreSQL has."""
    return fresh_home(tmp_path, monkeypatch, pg_dsn)
