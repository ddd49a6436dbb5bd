"""The commands: each takes its options, makes one library call and prints the
result (see ``securepad.cli`` for the rules they all follow)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table
from rich.text import Text

from .. import InvalidArgumentError, Keyring, Principal, Scratchpad, SecurepadError
from ..keys import key_file_use, record_key_file_use
from ..turn import MAX_TOOL_INT, SCRATCHPAD_READ_TOOL
from .options import (
    ENV_HELP,
    SecurepadGroup,
    SecurepadSubgroup,
    State,
    command,
    current_state,
    emit,
    global_options,
    principal_options,
    required,
    turn_option,
)
from .output import console, err_console, for_terminal, plain, print_json, print_line, progress, to_json

__all__ = ["bench", "main"]


@click.group(
    cls=SecurepadGroup,
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


def _turn(turn_id: str | None) -> str:
    return required(turn_id, "--turn", "SECUREPAD_TURN")


# -- the commands ------------------------------------------------------------------------


@command(main)
def init() -> None:
    """Create the store and its master key file (if absent) and check that the key opens it.

    The only command that creates a store; on an existing store it checks the key.
    It says which key file the store uses, whether that file was made now, and
    which other stores it opens (a key file that opens several stores is never
    replaced by a rotation)."""
    state = current_state()
    pad, use, key_created = state.create()
    with pad:
        info = pad.stats()
    others = sorted(use.stores - {pad.store_id}) if use is not None else []
    result: dict[str, Any] = {"db": str(info["path"]), "policy": info["policy"], "store_id": pad.store_id}
    result["key"] = repr(pad.keyring)
    if use is not None:
        result |= {
            "key_file": str(use.path),
            "key_file_created": key_created,
            "key_file_other_stores": others,
            "key_file_record_complete": use.complete,
        }

    def render(v: dict[str, Any]) -> None:
        print_line(f"store ready at {v['db']} (policy {v['policy']})")
        if use is None:
            print_line(f"master key: {v['key']}")
            return
        if key_created:
            print_line(f"key file {use.path}: created for this store")
            return
        shared = f"also opens {len(others)} other store(s)" if others else "opens no other recorded store"
        unknown = "" if use.complete else " (it predates the record: other stores may use it too)"
        print_line(f"key file {use.path}: already existed; it {shared}{unknown}")

    emit(result, render)


def _decode(raw: bytes, kind: str) -> Any:
    try:
        if kind == "text":
            return raw.decode("utf-8")
        if kind == "json":
            return json.loads(raw)
    except ValueError as exc:  # bad UTF-8, bad JSON, or an integer past Python's 4,300-digit limit
        raise click.BadParameter(f"input is not valid {kind}: {exc}", param_hint="SOURCE") from None
    except RecursionError:  # JSON nested past the interpreter's stack
        raise click.BadParameter(f"input is not valid {kind}: nested too deeply", param_hint="SOURCE") from None
    return raw


@command(main)
@principal_options
@turn_option
@click.option("--step", "step_num", type=int, required=True, help="Step number within the turn (one live entry each).")
@click.option("--executor", "executor_name", default="cli", show_default=True, help="Tool that produced it.")
@click.option(
    "--kind",
    type=click.Choice(["text", "binary", "json"]),
    default="text",
    show_default=True,
    help="How to read the input: UTF-8 text, raw bytes, or a JSON document.",
)
@click.option("--ttl", "ttl_seconds", type=int, default=None, help="Seconds until it expires (policy default).")
@click.argument("source", type=click.File("rb"), default="-")
def put(
    principal: Principal,
    turn_id: str | None,
    step_num: int,
    executor_name: str,
    kind: str,
    ttl_seconds: int | None,
    source: Any,
) -> None:
    """Store an observation read from SOURCE (a file, or - for standard input).

    A step of a turn holds one live entry: a step already recorded is refused.
    Text and binary read from a file keep the file's name in the entry's
    metadata (``source``). Prints the new entry's id (the model's whole view
    with --json)."""
    turn = _turn(turn_id)
    observation = _decode(source.read(), kind)
    name = getattr(source, "name", "-")
    if kind != "json" and isinstance(name, str) and name not in ("-", "<stdin>"):
        observation = {"content": observation, "metadata": {"source": Path(name).name}}
    with current_state().open() as pad:
        view = pad.put(principal, turn, step_num, executor_name, observation, ttl_seconds)

    def render(v: dict[str, Any]) -> None:
        where = f"step {v['step_num']} of turn {turn}"
        print_line(f"stored {v['scratchpad_id']}: {where}, {v['kind']}, {v['size_bytes']} bytes")

    emit(view, render)


def _entry_bytes(observation: Any, kind: str) -> bytes:
    """An entry's content as stored: text as UTF-8, binary as is, json as JSON text."""
    if isinstance(observation, dict) and kind in ("text", "binary") and "content" in observation:
        observation = observation["content"]
    if isinstance(observation, bytes):
        return observation
    if isinstance(observation, str):
        return observation.encode("utf-8")
    return (json.dumps(observation, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


@command(main)
@principal_options
@click.argument("scratchpad_id")
@click.option("--turn", "turn_id", default=None, help="Only an entry of this turn.")
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the content to this new file (mode 0600; an existing file is refused) instead of stdout.",
)
def get(principal: Principal, scratchpad_id: str, turn_id: str | None, output: Path | None) -> None:
    """Write a whole entry's content, uncapped: text as stored (UTF-8), binary as
    raw bytes, json as JSON text.

    Piped or with --output the bytes are exact. On a terminal, text is shown
    without control sequences and binary is refused (give --output or pipe
    it). With --json, the entry's fields and content (binary in base64)."""
    state = current_state()
    with state.open() as pad:
        entry = pad.get(principal, scratchpad_id, turn_id=turn_id)
    data = _entry_bytes(entry.observation, entry.kind)
    fields = {k: getattr(entry, k) for k in ("scratchpad_id", "turn_id", "step_num", "executor_name", "kind")}
    fields |= {"size_bytes": len(data)}
    if output is not None:
        _write_new_file(output, data)
        emit({**fields, "output": str(output)}, lambda v: print_line(f"wrote {v['size_bytes']} bytes to {v['output']}"))
        return
    if state.as_json:
        binary = entry.kind == "binary"
        content = base64.b64encode(data).decode("ascii") if binary else data.decode("utf-8")
        click.echo(to_json({**fields, "encoding": "base64" if binary else "utf-8", "content": content}))
        return
    stdout = sys.stdout.buffer
    if not stdout.isatty():
        stdout.write(data)
        stdout.flush()
    elif entry.kind == "binary":
        raise InvalidArgumentError(
            f"entry {scratchpad_id} is binary ({len(data)} bytes): give --output FILE, or pipe it"
        )
    else:
        click.echo(for_terminal(data.decode("utf-8")), nl=not data.endswith(b"\n"))


def _write_new_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file, mode 0600 (an entry may be private).

    Raises:
        InvalidArgumentError: the file exists.
        SecurepadError: it cannot be written.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidArgumentError(f"{path} exists: get never writes over a file") from None
    except OSError as exc:
        raise SecurepadError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise SecurepadError(f"cannot write {path}: {exc.strerror or exc}") from None


@command(main)
@principal_options
@click.argument("scratchpad_id")
def delete(principal: Principal, scratchpad_id: str) -> None:
    """Delete one entry of the owner's (Scratchpad.delete): zeroed in the file, its
    step free again."""
    with current_state().open() as pad:
        pad.delete(principal, scratchpad_id)
    emit({"deleted": scratchpad_id}, lambda v: print_line(f"deleted {v['deleted']}"))


# The bounds the model's read tool (scratchpad_read, over MCP) accepts: the command line takes the same.
_READ_INT = click.IntRange(0, MAX_TOOL_INT)
_READ_PROPERTIES = SCRATCHPAD_READ_TOOL["function"]["parameters"]["properties"]
# A continuation in the library's hint (mode='lines', start=917) as this command's options.
_HINT_ARGUMENT = re.compile(r"\b(mode|start|end)=('?)([\w-]+)\2")
_HINT_CAP = re.compile(r"cut to the read cap of \d+ (characters|bytes)")


@command(main)
@principal_options
@click.argument("scratchpad_id")
@click.option(
    "--mode",
    type=click.Choice(["head", "tail", "range", "full", "lines", "grep"]),
    default="head",
    show_default=True,
    help="head/tail: the first/last -n characters (bytes for binary); range: characters --start to --end;"
    " full: the whole entry up to the read cap; lines: lines --start to --end; grep: the lines matching --pattern.",
)
@click.option("-n", "n", type=_READ_INT, default=2000, show_default=True, help="Characters (bytes) for head/tail.")
@click.option(
    "--start",
    type=_READ_INT,
    default=None,
    help="range: first character (0-based) [default: 0]; lines/grep: first line, 1-based [default: 1; 0 is read"
    " as 1, as the model's read tool does].",
)
@click.option(
    "--end", type=_READ_INT, default=None, help="range: end character (exclusive); lines/grep: last line (inclusive)."
)
@click.option("--pattern", default=None, help="grep: RE2 regular expression.")
@click.option(
    "--max-matches",
    type=click.IntRange(1, MAX_TOOL_INT),
    default=50,
    show_default=True,
    help="grep: stop after this many.",
)
@click.option(
    "--context",
    "context_lines",
    type=click.IntRange(0, _READ_PROPERTIES["context"]["maximum"]),
    default=0,
    show_default=True,
    help="grep: lines around each match.",
)
def read(
    principal: Principal,
    scratchpad_id: str,
    mode: str,
    n: int,
    start: int | None,
    end: int | None,
    pattern: str | None,
    max_matches: int,
    context_lines: int,
) -> None:
    """Read part of an entry, as the model's read tool does: capped by the policy's
    max_read_chars, counted as the JSON the model sees (a quote or a line break
    costs its escape). `securepad get` returns a whole entry."""
    with current_state().open() as pad:
        result = pad.read(
            principal,
            scratchpad_id,
            mode=mode,
            n=n,
            start=start or 0,
            end=end,
            pattern=pattern,
            max_matches=max_matches,
            context=context_lines,
        )
        cap = pad.policy.max_read_chars

    def render(r: dict[str, Any]) -> None:
        content = r["content"]
        # The stored text itself: exact when piped, without control sequences on a terminal.
        click.echo(for_terminal(content) if sys.stdout.isatty() else content)
        meta = r["metadata"]
        status = f"{meta['size_returned']} of {meta['size_full']} {meta['unit']}, truncated={meta['truncated']}"
        if "hint" in meta:
            status += ", " + _cli_hint(meta["hint"], cap)
        err_console.print(plain(status), style="dim", highlight=False, soft_wrap=True)

    emit(result, render)


def _cli_hint(hint: str, cap: int) -> str:
    """The library's hint in this command's terms: its options, and the policy's
    read cap (the hint names the share of it left to the content)."""
    hint = _HINT_CAP.sub(f"cut at the read cap (max_read_chars {cap}, counted as JSON with its escapes)", hint)
    hint = _HINT_ARGUMENT.sub(lambda m: f"--{m.group(1)} {m.group(3)}", hint)
    return hint.replace("--mode", "read --mode").replace(", --", " --")


@command(main, name="list")
@principal_options
@turn_option
def list_(principal: Principal, turn_id: str | None) -> None:
    """List a turn's live entries that the owner may see."""
    turn = _turn(turn_id)
    with current_state().open() as pad:
        rows = pad.list_for_turn(principal, turn)

    def render(entries: list[dict[str, Any]]) -> None:
        table = Table("step", "id", "executor", "kind", "bytes", "summary")
        for e in entries:
            first_line = e["summary"].splitlines()[0] if e["summary"] else ""
            table.add_row(
                plain(e["step_num"]),
                plain(e["scratchpad_id"]),
                plain(e["executor_name"]),
                plain(e["kind"]),
                plain(e["size_bytes"]),
                plain(first_line[:60]),
            )
        console.print(table)

    emit([{k: v for k, v in e.items() if k != "view"} for e in rows], render)


@main.group(name="turn", cls=SecurepadSubgroup)
@global_options
def turn_group() -> None:
    """Inspect or drop an owner's turns."""


@command(turn_group, name="show")
@principal_options
@turn_option
def turn_show(principal: Principal, turn_id: str | None) -> None:
    """Print a turn's history: what the model saw of each live step (beginning a turn collects expired entries)."""
    turn = _turn(turn_id)
    with current_state().open() as pad:
        steps = pad.turn(principal, turn).steps()

    def render(items: list[dict[str, Any]]) -> None:
        if not items:
            print_line(f"turn {turn!r} has no live steps for this owner")
        for item in items:
            where = f"offloaded as {item['scratchpad_id']}" if item["offloaded"] else "inline"
            console.print(
                Text.assemble(
                    ("step ", "bold"), (str(item["step_num"]), "bold"), " ", plain(f"{item['executor_name']} ({where})")
                ),
                highlight=False,
            )
            print_json(item["shown"])

    emit(steps, render)


@command(turn_group, name="drop")
@principal_options
@turn_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def turn_drop(principal: Principal, turn_id: str | None, yes: bool) -> None:
    """Delete every live entry of a turn that the owner may see, one Scratchpad.delete
    each (its checkpoints and compaction marks expire with their TTL, or go with
    forget-owner)."""
    turn = _turn(turn_id)
    state = current_state()
    state.require_store()
    if not yes:
        click.confirm(f"Delete every entry of turn {for_terminal(repr(turn))} of this owner?", abort=True)
    deleted = []
    with state.open() as pad:
        for entry in pad.list_for_turn(principal, turn):
            pad.delete(principal, entry["scratchpad_id"])
            deleted.append(entry["scratchpad_id"])
    emit(
        {"turn_id": turn, "deleted": deleted},
        lambda v: print_line(f"deleted {len(v['deleted'])} entries of turn {turn}"),
    )


@command(main)
@principal_options
@turn_option
def mcp(principal: Principal, turn_id: str | None) -> None:
    """Serve scratchpad_read and scratchpad_list for one turn over MCP (stdio).

    The principal and turn are fixed here, never taken from the model."""
    turn = _turn(turn_id)
    try:
        from ..mcp_server import serve
    except ImportError as exc:
        raise SecurepadError(f"securepad mcp needs the MCP SDK ({exc}): pip install '.[mcp]'") from None
    serve(current_state().open(), principal, turn)


@command(main)
def gc() -> None:
    """Delete expired entries and scrub them from the files."""
    with current_state().open() as pad:
        deleted = pad.gc()
    emit({"deleted": deleted}, lambda v: print_line(f"deleted {v['deleted']} expired entries"))


@command(main)
@click.argument("dest", type=click.Path(path_type=Path, dir_okay=False))
def backup(dest: Path) -> None:
    """Write a consistent copy of the live store to DEST, a new file (mode 0600),
    while other processes go on using the store. SQLite only: back up a
    PostgreSQL store with pg_dump (docs/how-to/backup.md). The copy is
    encrypted; back up the key file (or passphrase) separately."""
    with current_state().open() as pad:
        result = pad.backup(dest)
    emit(result, lambda v: print_line(f"backed up to {v['backup']} ({v['bytes']} bytes)"))


@command(main)
@click.argument("src", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def restore(src: Path, yes: bool) -> None:
    """Put the backup SRC in place of the store (--db), accepting it as current.

    SRC is checked first (the key opens it, verify passes) on a private copy;
    a store already at --db is kept beside it as <db>.replaced-N, then
    replaced; the snapshot-rollback anchor is adopted and the store verified
    again. Stop the processes that write to the store first. Exit status 1
    when the final verify finds a problem."""
    state = current_state()
    if not isinstance(state.db, Path):
        raise InvalidArgumentError("restore puts back a SQLite store; restore PostgreSQL with pg_restore")
    state.refuse_empty_file()
    if state.db.exists() and not yes:
        click.confirm(
            f"Replace the store at {for_terminal(str(state.db))} with {for_terminal(str(src))}"
            " (the current one is kept beside it)?",
            abort=True,
        )
    result = Scratchpad.restore(
        state.db, src, keyring=state.keyring(new_store=True), policy=state.policy, anchor=state.anchor
    )

    def render(v: dict[str, Any]) -> None:
        print_line(f"restored {v['restored']} from {v['source']}")
        if v["replaced"]:
            print_line(f"the store it replaced is kept at {v['replaced']}")
        _render_verify(v["verify"])

    emit(result, render)
    if not result["verify"]["ok"]:
        sys.exit(1)


@command(main, name="anchor-adopt")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def anchor_adopt(yes: bool) -> None:
    """Accept this copy of the store as current and reset its snapshot-rollback anchor.

    Only after a deliberate restore (a backup put back on purpose) or a moved
    anchor: it silences the check that refuses an older copy of the store."""
    state = current_state()
    state.require_store()
    if not yes:
        click.confirm(
            "Accept this copy of the store as the current one (an older copy is no longer refused)?", abort=True
        )
    with state.open(adopt_anchor=True) as pad:
        anchor = pad.stats()["anchor"]
    emit({"anchor": anchor}, lambda v: print_line(f"anchor reset: {json.dumps(v['anchor'])}"))


@command(main)
@click.option("--owner", envvar="SECUREPAD_OWNER", show_envvar=True, default=None, help="Only this owner's entries.")
@click.option("--actor", envvar="SECUREPAD_ACTOR", show_envvar=True, default="cli", show_default=True)
@click.option("--channel", envvar="SECUREPAD_CHANNEL", show_envvar=True, default="cli", show_default=True)
def stats(owner: str | None, actor: str, channel: str) -> None:
    """Counts and sizes, for the whole store or one owner (--owner or SECUREPAD_OWNER)."""
    if owner and click.get_current_context().get_parameter_source("owner") is ParameterSource.ENVIRONMENT:
        # Narrowed by the environment, not by this command line: say so.
        err_console.print(plain(f"stats of owner {owner!r} only (from SECUREPAD_OWNER)"), style="dim", highlight=False)
    with current_state().open() as pad:
        info = pad.stats(Principal(owner, actor, channel) if owner else None)

    emit(info, _render_figures)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted name, text) rows: nested figures get a row each, never raw JSON."""
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for key, inner in value.items():
            rows += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return rows or [(prefix, "none")]
    if isinstance(value, list | tuple):
        return [(prefix, "; ".join(str(v) for v in value) if value else "none")]
    if isinstance(value, float):
        return [(prefix, f"{value:.3f}")]
    return [(prefix, "none" if value is None else str(value))]


def _render_figures(v: dict[str, Any], title: str | None = None) -> None:
    """Figures as ``name  value`` lines, nested ones under dotted names."""
    rows = _flatten(v)
    width = min(max((len(name) for name, _ in rows), default=0), 32)
    if title:
        console.print(Text(for_terminal(title), "bold"), highlight=False, soft_wrap=True)
    for name, text in rows:
        print_line(f"{name:<{width}}  {text}")


def _scratch_store(state: State) -> tuple[Any, Scratchpad]:
    """A throwaway store and key in private temporary directories (for ``audit`` and
    ``demo`` before ``init``); returns the directory to clean up and the open store."""
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="securepad-scratch-")
    root = Path(scratch.name)
    (root / "data").mkdir(mode=0o700)
    (root / "keys").mkdir(mode=0o700)
    try:
        keyring = Keyring.from_key_file(root / "keys" / "key")
        return scratch, Scratchpad.open(root / "data" / "store.db", keyring=keyring, policy=state.policy)
    except BaseException:
        scratch.cleanup()
        raise


def _open_or_scratch(state: State, what: str) -> tuple[Any, Scratchpad]:
    if state.store_exists() is False:
        err_console.print(
            plain(f"no store at {state.where()} yet (`securepad init` creates it): {what} a throwaway store"),
            style="yellow",
            highlight=False,
        )
        return _scratch_store(state)
    return None, state.open()


@command(main)
def demo() -> None:
    """A real round trip: two owners, a refusal, a tampered copy detected.

    On the configured store (its demo owners removed afterwards), or on a throwaway
    store when there is none yet or the store is on PostgreSQL."""
    from ..demo import run_demo

    state = current_state()
    if isinstance(state.db, str):  # PostgreSQL: the demo damages a copy of the store's file
        state.require_store()
        err_console.print(
            plain(f"the demo's tampered copy is a file, not {state.where()}: the demo runs on a throwaway store"),
            style="yellow",
            highlight=False,
        )
        scratch, pad = _scratch_store(state)
    else:
        scratch, pad = _open_or_scratch(state, "the demo runs on")
    steps = []
    try:
        with pad:
            if not state.as_json:
                print_line(f"store: {pad.path}  policy: {pad.policy.name}")
            for step in run_demo(pad):
                steps.append({"step": step.title, "result": step.detail, "ok": step.ok})
                if not state.as_json:
                    mark = Text("ok", "green") if step.ok else Text("FAILED", "red")
                    console.print(Text.assemble(mark, "  ", plain(f"{step.title}: {step.detail}")), highlight=False)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if state.as_json:
        click.echo(to_json(steps))
    if not all(s["ok"] for s in steps):
        sys.exit(1)


@command(main)
def verify() -> None:
    """Check the whole store: every owner's sealed turn heads, every entry (all its
    segments) and turn record authenticated and compared with its head. Exit
    status 1 when anything is wrong; each problem names its owner, turn and row."""
    with current_state().open() as pad:
        report = pad.verify()
    emit(report, _render_verify)
    if not report["ok"]:
        sys.exit(1)


def _render_verify(r: dict[str, Any]) -> None:
    counts = ", ".join(
        f"{r[k]} {k.replace('_', ' ')}" for k in ("owners", "turns", "entries", "checkpoints", "compaction_marks")
    )
    if r["ok"]:
        console.print(Text("verify: no problem found", "green"), soft_wrap=True)
        _print_wrapped(f"{counts}, {r['seconds']} s", 2)
        return
    table = Table("owner", "turn", "id", "what", "problem", title=plain(f"{len(r['problems'])} problems"))
    for p in r["problems"]:
        table.add_row(
            *(plain("" if p[k] is None else p[k]) for k in ("owner_user_id", "turn_id", "id", "what", "problem"))
        )
    console.print(table)
    console.print(Text("verify FAILED", "bold red"), soft_wrap=True)
    _print_wrapped(f"{counts}, {r['seconds']} s", 2)


@command(main)
def audit() -> None:
    """Run the isolation audit: synthetic tenants attack each other, tampered scratch
    copies, at-rest scan, permissions. Exit status 1 when any check fails.

    Audits the configured store, or a throwaway store with the same policy when
    there is none yet."""
    from ..audit import Audit, AuditReport

    state = current_state()
    scratch, pad = _open_or_scratch(state, "auditing")
    try:
        with pad:
            checked = pad.verify()  # the store as found, before the audit's tenants come and go
            run = Audit(pad)
            bar = progress(transient=True, elapsed=False)
            with bar:
                task = bar.add_task("auditing", total=len(run.checks))
                for result in run.run():
                    bar.update(task, advance=1, description=for_terminal(result.name))
            report = run.report()
    finally:
        if scratch is not None:
            scratch.cleanup()

    def render(r: AuditReport) -> None:
        # A list, not a table: at 80 columns a table's narrow columns split words.
        print_line(f"securepad audit of {r.store}")
        group = None
        for row in r.results:
            if row.group != group:
                group = row.group
                console.print(Text(for_terminal(f"\n{group}"), "bold"), highlight=False, soft_wrap=True)
            mark = Text("pass", "green") if row.passed else Text("FAIL", "bold red")
            console.print(Text.assemble("  ", mark, "  ", plain(row.name)), highlight=False, soft_wrap=True)
            if not row.passed:
                _print_wrapped(f"tried: {row.tried}", 8)
            _print_wrapped(row.happened, 8)
        failed = ", ".join(f.name for f in r.failed)
        print_line("")
        if failed:
            console.print(
                Text(f"{len(r.failed)} of {len(r.results)} checks FAILED: ", "bold red") + plain(failed), soft_wrap=True
            )
        else:
            console.print(Text(f"all {len(r.results)} checks passed", "green"), soft_wrap=True)
        print_line(f"policy {r.policy}, {r.key_source}")
        _render_verify(checked)

    emit({**report.as_dict(), "verify": checked} if state.as_json else report, render)
    if not report.passed or not checked["ok"]:
        sys.exit(1)


def _print_wrapped(text: str, indent: int) -> None:
    """``text`` wrapped at spaces within 80 columns (a word longer than a line is
    left whole), each line indented."""
    import textwrap

    for line in textwrap.wrap(
        for_terminal(text), 80, initial_indent=" " * indent, subsequent_indent=" " * indent, break_long_words=False
    ):
        print_line(line)


def _progress_bar(label: str) -> tuple[Any, Callable[[int, int], None]]:
    """A progress bar on stderr and its callback; ``label`` is shown as plain text."""
    bar = progress(transient=current_state().as_json)
    task = bar.add_task(for_terminal(label), total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def _show_report(report: dict[str, Any], title: str) -> None:
    emit(report, lambda v: _render_figures(v, title))


@main.group(cls=SecurepadSubgroup)
@global_options
def keys() -> None:
    """Rotate the master key or an owner's key."""


@command(keys, name="rotate-master")
@click.option("--new-key-file", type=click.Path(path_type=Path), help="New master key file (created 0600 if absent).")
@click.option("--new-master-key-env", metavar="VAR", help="New base64 master key from this environment variable.")
@click.option("--new-passphrase-env", metavar="VAR", help="New passphrase (Argon2id) from this environment variable.")
@click.option(
    "--install",
    is_flag=True,
    help="Put the new key in place of the current key file once the rotation is committed (the old key stays"
    " until then); without --new-key-file, a new key is made for it. Refused unless the key file is recorded"
    " to open this store alone.",
)
def rotate_master(
    new_key_file: Path | None, new_master_key_env: str | None, new_passphrase_env: str | None, install: bool
) -> None:
    """Re-wrap every owner key under a new master key (from exactly one source).

    Afterwards only the new key opens the store: --install puts a new key file in
    place of the current one (only when that file opens this store alone);
    otherwise the command says what to change."""
    state = current_state()
    chosen = [o for o in (new_key_file, new_master_key_env, new_passphrase_env) if o]
    if len(chosen) > 1 or (not chosen and not install):
        raise click.UsageError("give exactly one of --new-key-file, --new-master-key-env, --new-passphrase-env")
    if install and (new_master_key_env or new_passphrase_env):
        raise click.UsageError("--install installs a key file: use it with --new-key-file or alone")
    current = state.keyring(new_store=True)  # the source only: open() checks the key
    if install and current.key_file is None:
        raise click.UsageError("--install replaces the current key file, but this store's key is not from a file")
    made: Path | None = None
    new = State()
    new.master_key_env, new.passphrase_env = new_master_key_env, new_passphrase_env
    with state.open() as pad:
        if install:
            _check_key_file_serves_only(state.key_file, pad.store_id)
            if new_key_file is None:
                made = state.key_file.with_name(state.key_file.name + ".new")
                if made.exists():
                    raise click.UsageError(
                        f"{made} exists (left by an earlier rotation?): remove it or pass it as --new-key-file"
                    )
                new_key_file = made
        new.key_file = new_key_file or state.key_file
        new_existed = new_key_file is not None and new_key_file.exists()
        try:
            new_keyring = new.keyring(new_store=True)
            bar, update = _progress_bar("re-wrapping owner keys")
            with bar:
                report = pad.rotate_master_key(new_keyring, progress=update)
        except BaseException:
            if made is not None:
                made.unlink(missing_ok=True)
            raise
        store_id = pad.store_id
    if install and new_key_file is not None:
        os.replace(new_key_file, state.key_file)
        with contextlib.suppress(SecurepadError):
            record_key_file_use(state.key_file, store_id, key_created=True)
        report["installed"] = str(state.key_file)
        report["next"] = f"nothing: the new key is in place at {state.key_file}; the old key no longer opens this store"
    elif new_key_file is not None:
        with contextlib.suppress(SecurepadError):
            record_key_file_use(new_key_file, store_id, key_created=not new_existed)
        report["next"] = (
            f"only the new key opens the store now: give --key-file {new_key_file} (or SECUREPAD_KEY_FILE)"
            " to every command on this store"
        )
        if current.key_file is not None:
            report["next"] += f"; {current.key_file} stays as it is (it may open other stores)"
    else:
        option = "--master-key-env" if new_master_key_env else "--passphrase-env"
        report["next"] = (
            f"only the new key opens the store now: give {option} {new_master_key_env or new_passphrase_env}"
            " to every command (the old key no longer opens this store)"
        )
    _show_report(report, "master key rotated")
    if not state.as_json:
        err_console.print(plain(f"next: {report['next']}"), style="bold", highlight=False)


def _check_key_file_serves_only(key_file: Path, store_id: str) -> None:
    """Refuse to replace a key file unless it is recorded to open this store alone.

    Raises:
        InvalidArgumentError: it opens other stores too, or no complete record says which.
    """
    use = key_file_use(key_file)
    if use.serves_only(store_id):
        return
    if use.complete:
        why = f"it also opens {len(use.stores - {store_id})} other store(s) (recorded in {use.record})"
    else:
        why = f"it predates its record ({use.record}), so other stores may use it"
    raise InvalidArgumentError(
        f"--install would replace key file {key_file}, but {why}: replacing it would lock them out."
        " Rotate to a key file of this store's own instead: --new-key-file PATH (a new path), then give"
        " --key-file PATH to every command on this store"
    )


@command(keys, name="rotate-owner")
@click.argument("owner")
def rotate_owner(owner: str) -> None:
    """Give OWNER a new key version, re-wrap its item keys, retire the old versions."""
    with current_state().open() as pad:
        bar, update = _progress_bar(f"re-wrapping {owner}'s item keys")
        with bar:
            report = pad.rotate_owner_key(owner, progress=update)
    _show_report(report, "owner key rotated")


@command(main, name="forget-owner")
@click.argument("owner")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def forget_owner(owner: str, yes: bool) -> None:
    """Crypto-shred OWNER: delete its keys and entries and scrub them from the files.

    Exit status 1 when the store holds nothing of OWNER (a mistyped name deletes nothing)."""
    state = current_state()
    state.require_store()
    if not yes:
        click.confirm(f"Delete every entry and key of owner {for_terminal(repr(owner))} for good?", abort=True)
    with state.open() as pad:
        report = pad.forget_owner(owner)
    found = any(v for k, v in report.items() if k not in ("owner_user_id", "wal_truncated") and isinstance(v, int))
    report["found"] = found
    _show_report(report, "owner forgotten" if found else f"owner {owner!r} not found: nothing was deleted")
    if not found:
        sys.exit(1)


@main.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Tiny sizes, every workload, about a minute (the CI smoke run).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("securepad-bench-results"),
    show_default=True,
    help="Where to write <mode>.json (and <mode>.png with matplotlib).",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the stores go [default: a temporary dir].",
)
@click.option(
    "--backends",
    default=None,
    help="Comma-separated backends [default: all]: securepad, raw-apsw, unhardened, diskcache, sqlcipher.",
)
@click.option(
    "--workloads",
    default=None,
    help="Comma-separated workloads [default: all]: put, read, concurrent, resume, gc, open, hotpath.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--no-chart", is_flag=True, help="Skip the PNG.")
@click.option("--tiny", is_flag=True, hidden=True)  # the smoke test's config
@click.option(
    "--from-json",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Print the summary of a saved run's JSON; run nothing.",
)
@click.option("--targets", "show_targets", is_flag=True, help="Also list the project's targets, each met or missed.")
@click.option("--tables", "show_tables", is_flag=True, help="Also print every workload's full table (Markdown).")
def bench(
    quick: bool,
    out: Path,
    workdir: Path | None,
    backends: str | None,
    workloads: str | None,
    no_progress: bool,
    no_chart: bool,
    tiny: bool,
    from_json: Path | None,
    show_targets: bool,
    show_tables: bool,
) -> None:
    """Benchmark securepad against raw SQLite, sqlite3, diskcache and SQLCipher on this machine.

    Prints a summary in 80 columns: securepad beside each baseline, per
    workload, and where the results are (every figure and target is in the
    JSON). Needs the bench extra (pip install '.[bench]'); writes under --out."""
    from ..bench import runner
    from ..bench.backends import BACKENDS
    from ..bench.workloads import WORKLOADS

    if from_json is not None:
        runner.print_saved(from_json, show_targets=show_targets, show_tables=show_tables)
        return
    try:
        chosen_backends = runner.parse_names("backends", backends) if backends else list(BACKENDS)
        chosen_workloads = runner.parse_names("workloads", workloads) if workloads else list(WORKLOADS)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    status = runner.main(
        out=out,
        quick=quick,
        tiny=tiny,
        workdir=workdir,
        backends=chosen_backends,
        workloads=chosen_workloads,
        progress=not no_progress,
        chart=not no_chart,
        show_targets=show_targets,
        show_tables=show_tables,
    )
    sys.exit(status)
