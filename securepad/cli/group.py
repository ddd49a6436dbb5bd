"""The ``securepad`` group: the global options, and each subcommand loaded from
its module when the command line names it (``securepad put`` never loads the
maintenance commands, the benchmark's or their options)."""

from __future__ import annotations

import importlib

import click

from .failures import SecurepadGroup
from .options import ENV_HELP, current_state, global_options

__all__ = ["COMMAND_MODULES", "LazyGroup", "main"]

# Each command's name, and the module and attribute of this package that define it.
COMMAND_MODULES = {
    "anchor-adopt": "maintenance:anchor_adopt",
    "audit": "maintenance:audit",
    "backup": "maintenance:backup",
    "bench": "benchmark:bench",
    "delete": "commands:delete",
    "demo": "maintenance:demo",
    "forget-owner": "maintenance:forget_owner",
    "gc": "maintenance:gc",
    "get": "commands:get",
    "init": "commands:init",
    "keys": "maintenance:keys",
    "list": "commands:list_",
    "mcp": "commands:mcp",
    "put": "commands:put",
    "read": "commands:read",
    "restore": "maintenance:restore",
    "stats": "maintenance:stats",
    "turn": "commands:turn_group",
    "verify": "maintenance:verify",
}


class LazyGroup(SecurepadGroup):
    """A group whose subcommands (``COMMAND_MODULES``) are imported when first
    resolved; listing them all (``--help``) imports every module."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            module, attribute = COMMAND_MODULES[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(f"{__package__}.{module}"), attribute))
        return self.commands.get(cmd_name)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=ENV_HELP,
)
@click.version_option(package_name="securepad", prog_name="securepad", message="%(prog)s %(version)s")
@global_options
def main() -> None:
    """securepad: the hardened observation store for LLM agent runtimes.

    The global options (--db, --key-file, --master-key-env, --passphrase-env,
    --policy, --json) go before or after the command. Only `securepad init`
    creates a store; every other command needs an existing one.
    """
    current_state()
