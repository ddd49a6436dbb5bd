"""``securepad`` through click's runner on a fresh HOME (see conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from securepad.cli import ENVIRONMENT, main


class Cli:
    """``securepad`` on a fresh HOME; ``store`` is the store's --db (None: the default file)."""

    def __init__(self, home: Path, env: dict[str, str | None], store: str | None) -> None:
        self.home, self.env, self.store = home, env, store

    def __call__(
        self, *args: str, input: str | bytes | None = None, env: dict[str, str | None] | None = None
    ) -> Result:
        argv = ["--db", self.store, *args] if self.store else list(args)
        return CliRunner().invoke(main, argv, input=input, env={**self.env, **(env or {})}, catch_exceptions=False)

    @property
    def backend(self) -> str:
        return "postgresql" if self.store else "sqlite"

    @property
    def db(self) -> Path:
        return self.home / ".local" / "share" / "securepad" / "store.db"

    @property
    def key(self) -> Path:
        return self.home / ".config" / "securepad" / "key"


def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str | None) -> Cli:
    """``securepad`` on a fresh HOME under ``tmp_path``, run from a scratch working directory."""
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


def every_command() -> dict[str, click.Command]:
    """The top-level commands by name, each loaded from its module as the command line names it."""
    ctx = click.Context(main)
    found = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


def put(cli: Cli, step: int, text: str | bytes = "hello\n", *extra: str, turn: str = "t") -> str:
    """Put ``text`` as bob's step ``step``; its id."""
    view = as_json(cli("--json", "put", "--owner", "bob", "--turn", turn, "--step", str(step), *extra, input=text))
    return str(view["scratchpad_id"])
