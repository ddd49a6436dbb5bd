"""How the command line reports a failure: one error line, ``error: Type:
message`` (or one JSON object with ``--json``), on stderr, and its exit status."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from .. import SecurepadError
from .output import for_terminal

__all__ = ["ABORTED", "INTERRUPTED", "INTERRUPTED_STATUS", "USAGE_ERROR", "SecurepadGroup", "fail", "interrupted"]


def _error_type(exc: BaseException) -> str:
    # Name the public class: private subclasses are an implementation detail.
    return next(c for c in type(exc).__mro__ if not c.__name__.startswith("_")).__name__


def _wants_json(args: Sequence[str]) -> bool:
    """Whether ``--json`` is among the options (before a ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    return "--json" in args[:end]


# The error types the command line adds to securepad.errors' (documented in docs/reference/cli.md).
USAGE_ERROR = "UsageError"  # the command line is wrong: exit status 2
ABORTED = "Aborted"  # a confirmation was declined: nothing changed, exit status 1
INTERRUPTED = "Interrupted"  # Ctrl-C
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as shells report it


class SecurepadGroup(click.Group):
    """One error line, ``error: Type: message`` (or one JSON object with ``--json``),
    on stderr for every failure: a securepad error exits 1, a usage error 2,
    Ctrl-C 130 (with the plain line ``interrupted``)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        as_json = _wants_json(argv)
        warnings = _WarningLines()
        library_log = logging.getLogger("securepad")
        library_log.addHandler(warnings)
        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except SecurepadError as exc:
            fail(_error_type(exc), str(exc), as_json, 1)
        except click.ClickException as exc:
            fail(USAGE_ERROR, exc.format_message(), as_json, 2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except click.exceptions.Abort as exc:
            # click turns Ctrl-C into Abort: from the interrupt itself, or (at a
            # prompt) in its handling; a declined confirmation has neither.
            if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
                interrupted(as_json)
            fail(ABORTED, "not confirmed; nothing was changed", as_json, 1)
        except KeyboardInterrupt:
            interrupted(as_json)
        finally:
            library_log.removeHandler(warnings)
        sys.exit(result if isinstance(result, int) else 0)


class _WarningLines(logging.Handler):
    """The library's warnings (a store's schema upgraded, a server unreachable)
    as ``warning: message`` lines on stderr; the access log ("securepad.audit")
    is for the application's own handlers."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("securepad.audit"):
            return
        click.echo(f"warning: {for_terminal(' '.join(record.getMessage().split()))}", err=True)


def interrupted(as_json: bool) -> NoReturn:
    """Ctrl-C: the plain line ``interrupted`` (a JSON error with --json), exit status 130."""
    if as_json:
        fail(INTERRUPTED, "interrupted", True, INTERRUPTED_STATUS)
    click.echo("interrupted", err=True)
    sys.exit(INTERRUPTED_STATUS)


def fail(kind: str, message: str, as_json: bool, status: int) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"error": {"type": kind, "message": message}}, ensure_ascii=False), err=True)
    else:
        click.echo(f"error: {kind}: {for_terminal(' '.join(message.split()))}", err=True)
    sys.exit(status)
