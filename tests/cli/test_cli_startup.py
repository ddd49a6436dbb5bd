"""A command loads what it uses: ``--help`` and ``--version`` list and name the
commands without the store's layers, rich or any optional integration, and a
command that finds no store says so without opening one. Checked by the
modules a fresh interpreter holds afterwards (not by timing)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from securepad.cli.group import COMMAND_MODULES

# Run as the ``securepad`` script runs, then list every module loaded.
_PROGRAM = """
import json, sys
sys.argv = ["securepad", *json.loads(sys.argv[1])]
from securepad.cli import main
try:
    main()
finally:
    sys.stdout.flush()
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

# Rendering, key derivation, grep, the optional integrations and the tools of single commands.
NEVER_AT_START = (
    "rich",
    "argon2",
    "re2",
    "langgraph",
    "agents",
    "mcp",
    "boto3",
    "psycopg",
    "securepad.audit",
    "securepad.bench",
    "securepad.integrations",
    "securepad.aio",
)
# The store's layers and what they are built on: loaded by a command that opens a store.
STORE_LAYERS = (
    "securepad.store",
    "securepad._assembly",
    "securepad.keys",
    "securepad.tables",
    "securepad.crypto",
    "securepad.policy",
    "cryptography",
    "msgspec",
    "apsw",
    "tomllib",
)


def _run(tmp_path: Path, *args: str) -> tuple[int, set[str], str]:
    """The exit status, the modules loaded and the output of ``securepad args``,
    its output piped (no variable forcing a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECUREPAD_", "FORCE_COLOR", "TTY_COMPATIBLE"))}
    env |= {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, json.dumps(args)], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, set(json.loads(done.stderr.splitlines()[-1])), done.stdout


def _modules_after(tmp_path: Path, *args: str) -> tuple[int, set[str]]:
    status, modules, _ = _run(tmp_path, *args)
    return status, modules


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("keys", "--help"), ("read", "--help")])
def test_help_and_version_load_no_store_and_no_renderer(tmp_path: Path, args: tuple[str, ...]) -> None:
    status, modules = _modules_after(tmp_path, *args)
    assert status == 0
    assert _loaded(modules, NEVER_AT_START + STORE_LAYERS) == []


def test_a_command_without_a_store_reports_it_without_opening_one(tmp_path: Path) -> None:
    status, modules = _modules_after(tmp_path, "stats")
    assert status == 1
    assert _loaded(modules, NEVER_AT_START + STORE_LAYERS) == []


def test_a_command_on_a_store_loads_only_its_own_tools(tmp_path: Path) -> None:
    assert _modules_after(tmp_path, "init")[0] == 0
    status, modules = _modules_after(tmp_path, "stats")
    assert status == 0
    assert "securepad.store" in modules
    assert _loaded(modules, ("argon2", "re2", "securepad.audit", "securepad.bench", "securepad.integrations")) == []


# What a command on entries never loads: rich when it prints plain lines, the other
# commands' modules, and the library's maintenance, audit, benchmark and integrations.
NEVER_FOR_ENTRIES = (
    "rich",
    "securepad.cli.maintenance",
    "securepad.cli.benchmark",
    "securepad.maintenance",
    "securepad.audit",
    "securepad.bench",
    "securepad.integrations",
    "securepad.aio",
)


def test_the_entry_commands_load_neither_the_renderer_nor_the_maintenance(tmp_path: Path) -> None:
    assert _modules_after(tmp_path, "init")[0] == 0
    (tmp_path / "note.txt").write_text("hello\nworld\n")
    owner = ("--owner", "alice", "--turn", "t1")
    status, modules, stored = _run(tmp_path, "put", *owner, "--step", "1", str(tmp_path / "note.txt"))
    assert status == 0 and stored.startswith("stored ")
    scratchpad_id = stored.split()[1].rstrip(":")
    for args in (
        ("put", "--json", *owner, "--step", "2", str(tmp_path / "note.txt")),
        ("read", "--owner", "alice", "--mode", "tail", "-n", "5", scratchpad_id),
        ("get", "--owner", "alice", scratchpad_id),
        ("list", "--json", *owner),
        ("delete", "--owner", "alice", scratchpad_id),
    ):
        status, modules, _ = _run(tmp_path, *args)
        assert status == 0, args
        assert "securepad.store" in modules
        assert _loaded(modules, NEVER_FOR_ENTRIES) == [], args


def test_a_table_loads_the_renderer_and_only_its_commands_module(tmp_path: Path) -> None:
    assert _modules_after(tmp_path, "init")[0] == 0
    status, modules = _modules_after(tmp_path, "list", "--owner", "alice", "--turn", "t1")
    assert status == 0 and "rich.table" in modules
    assert _loaded(modules, NEVER_FOR_ENTRIES[1:]) == []


def test_each_lazy_command_is_the_command_of_its_name() -> None:
    """``COMMAND_MODULES`` names, for each command, the module and attribute that define it."""
    for name, where in COMMAND_MODULES.items():
        module, attribute = where.split(":")
        found = getattr(importlib.import_module(f"securepad.cli.{module}"), attribute)
        assert isinstance(found, click.Command) and found.name == name, where
