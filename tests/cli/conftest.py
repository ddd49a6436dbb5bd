"""The command line as a new user meets it: ``securepad`` through click's runner on
a fresh HOME, in a scratch working directory. The ``cli`` fixture runs a test on
both backends (``[sqlite]``: the default store under HOME; ``[postgresql]``:
``--db`` a fresh database), like the ``pad`` fixture; ``sqlite_only`` keeps it
on the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from securepad.cli import ENVIRONMENT
from tests.support.cli_runner import Cli


def _fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str | None) -> Cli:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env: dict[str, str | None] = {"HOME": str(home), "XDG_DATA_HOME": None, "XDG_CONFIG_HOME": None}
    env |= {var: None for var, _, _ in ENVIRONMENT}
    monkeypatch.setenv("HOME", str(home))  # platformdirs reads HOME when the defaults are computed
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", *(var for var, _, _ in ENVIRONMENT)):
        monkeypatch.delenv(var, raising=False)
    return Cli(home, env, store)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest) -> Cli:
    store = request.getfixturevalue("pg_dsn") if backend == "postgresql" else None
    return _fresh_home(tmp_path, monkeypatch, store)


@pytest.fixture
def pg_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> Cli:
    """``cli`` on PostgreSQL only, for what only PostgreSQL has."""
    return _fresh_home(tmp_path, monkeypatch, pg_dsn)
