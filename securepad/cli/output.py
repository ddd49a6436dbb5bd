"""What the command line prints: stored text is data, never markup, and no
terminal control sequence from the store reaches a terminal."""

from __future__ import annotations

import builtins
import functools
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.text import Text

__all__ = [
    "console",
    "err_console",
    "for_terminal",
    "plain",
    "print_json",
    "print_line",
    "print_note",
    "print_styled",
    "print_table",
    "progress",
    "to_json",
]


# rich is imported when a command first prints through it: a command that
# prints nothing, or only plain lines through click, never loads it.
@functools.cache
def console() -> Console:
    """The console on stdout (one per process)."""
    from rich.console import Console

    return Console()


@functools.cache
def err_console() -> Console:
    """The console on stderr (one per process)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


# CSI and OSC sequences (OSC 8 makes links), then any other C0/C1 control but tab and newline.
_ESCAPE_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_RAW_JSON_CONTROLS = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def for_terminal(text: str) -> str:
    """``text`` without terminal control sequences: escape sequences are dropped,
    other control characters shown as ``\\xNN``; tabs and newlines stay."""
    text = _ESCAPE_SEQUENCES.sub("", text)
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def to_json(value: Any) -> str:
    """``value`` as indented JSON; the C1 controls and DEL that ``json.dumps``
    leaves raw are written as ``\\u`` escapes (the same JSON, safe on a terminal)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return _RAW_JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def plain(value: object) -> Text:
    """A table cell or line that rich never reads as markup, stripped for the terminal."""
    from rich.text import Text

    return Text(for_terminal(str(value)))


def print_styled(*parts: str | tuple[str, str], soft_wrap: bool = True) -> None:
    """A line of ``parts`` (plain text, or text and its style) that rich never reads as markup,
    stripped for the terminal."""
    from rich.text import Text

    spans = (for_terminal(p) if isinstance(p, str) else (for_terminal(p[0]), p[1]) for p in parts)
    console().print(Text.assemble(*spans), highlight=False, soft_wrap=soft_wrap)


def print_table(columns: Iterable[str], rows: Iterable[Iterable[object]], title: str | None = None) -> None:
    """A table on stdout whose title and cells rich never reads as markup, stripped for the terminal."""
    from rich.table import Table

    table = Table(*columns, title=None if title is None else plain(title))
    for row in rows:
        table.add_row(*map(plain, row))
    console().print(table)


def print_json(value: Any) -> None:
    console().print(to_json(value), markup=False, highlight=False, soft_wrap=True)


def print_line(text: str) -> None:
    """A line of plain text (never markup), stripped for the terminal."""
    line = for_terminal(text)
    if not _wrote_plain(sys.stdout, line):
        console().print(plain(text), highlight=False, soft_wrap=True)


def write_new_file(path: Path, data: bytes) -> None:
    """Write ``data`` to the new file ``path``, mode 0600 (an entry or a key may be
    private); a file the write failed to fill is removed.

    Raises:
        FileExistsError: the file exists (it is left alone).
        OSError: it cannot be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError:
        path.unlink(missing_ok=True)
        raise


def print_note(text: str, style: str) -> None:
    """A line of plain text on stderr (so --json output stays clean), in ``style``."""
    line = for_terminal(text)
    if not _wrote_plain(sys.stderr, line):
        err_console().print(plain(text), style=style, highlight=False)


def _rich_styles(stream: TextIO) -> bool:
    """Whether rich might print more than the text itself on ``stream``: a terminal
    (or one forced by the environment), a notebook or IDLE. Elsewhere a line without
    tabs is what rich would print, and is written as is, without loading rich."""
    if any(name in os.environ for name in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return True
    if hasattr(builtins, "get_ipython") or str(getattr(sys.stdin, "__module__", "")).startswith("idlelib"):
        return True
    try:
        return stream.isatty()
    except ValueError:  # a closed stream: rich finds no terminal there either, and says why it cannot write
        return True


def _wrote_plain(stream: TextIO, line: str) -> bool:
    """Write ``line`` and a newline to ``stream`` as rich would (soft wrapped, unstyled,
    flushed), when rich would add nothing to it; False when rich must print it (a tab
    rich expands, styles it may add, or a character the stream cannot encode: rich's
    error says how to fix that)."""
    if "\t" in line or _rich_styles(stream):
        return False
    try:
        stream.write(f"{line}\n")
    except UnicodeEncodeError:
        return False
    stream.flush()
    return True


def progress(*, transient: bool, elapsed: bool = True) -> Progress:
    """A progress bar on stderr (so --json output stays clean) whose description is
    plain text: an owner id or a check's name is shown as it is, never read as markup."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

    columns: list[str | ProgressColumn] = [TextColumn("{task.description}", markup=False), BarColumn()]
    columns.append(MofNCompleteColumn())
    if elapsed:
        columns.append(TimeElapsedColumn())
    return Progress(*columns, console=err_console(), transient=transient)
