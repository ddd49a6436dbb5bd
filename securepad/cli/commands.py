"""The commands: each takes its options, makes one library call and prints the
result (see ``securepad.cli`` for the rules they all follow)."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from .. import SCRATCHPAD_READ_TOOL, InvalidArgumentError, Principal, SecurepadError
from .options import SecurepadSubgroup, command, confirmed, current_state, emit, global_options
from .output import for_terminal, print_json, print_line, print_note, print_styled, print_table, to_json, write_new_file

__all__ = ["delete", "get", "init", "list_", "mcp", "put", "read", "turn_group"]


# -- the commands ------------------------------------------------------------------------


@command()
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


# Deeper JSON is refused before it is parsed: the parser's recursion would
# reach the interpreter's limit, and objects finalized meanwhile fail noisily.
MAX_INPUT_DEPTH = 1000
# A string (to its closing quote, or to the end of an unterminated one: one
# pass, linear) or a bracket.
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]')


def _json_depth(raw: bytes) -> int:
    """How deep ``raw``'s arrays and objects nest (brackets inside strings aside)."""
    depth = deepest = 0
    for match in _JSON_TOKEN.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def _decode(raw: bytes, kind: str) -> Any:
    try:
        if kind == "text":
            return raw.decode("utf-8")
        if kind == "json":
            if _json_depth(raw) > MAX_INPUT_DEPTH:
                raise RecursionError
            return json.loads(raw)
    except ValueError as exc:  # bad UTF-8, bad JSON, or an integer past Python's 4,300-digit limit
        raise click.BadParameter(f"input is not valid {kind}: {exc}", param_hint="SOURCE") from None
    except RecursionError:  # JSON nested past the interpreter's stack
        raise click.BadParameter(f"input is not valid {kind}: nested too deeply", param_hint="SOURCE") from None
    return raw


@command(principal=True, turn=True)
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
def put(principal: Principal, turn: str, kind: str, source: Any, **entry: Any) -> None:
    """Store an observation read from SOURCE (a file, or - for standard input).

    A step of a turn holds one live entry: a step already recorded is refused.
    Text and binary read from a file keep the file's name in the entry's
    metadata (``source``). Prints the new entry's id (the model's whole view
    with --json)."""
    observation = _decode(source.read(), kind)
    name = getattr(source, "name", "-")
    if kind != "json" and isinstance(name, str) and name not in ("-", "<stdin>"):
        observation = {"content": observation, "metadata": {"source": Path(name).name}}
    with current_state().open() as pad:
        view = pad.put(principal, turn, observation=observation, **entry)

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


@command(principal=True)
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
        try:
            write_new_file(output, data)
        except FileExistsError:
            raise InvalidArgumentError(f"{output} exists: get never writes over a file") from None
        except OSError as exc:
            raise SecurepadError(f"cannot write {output}: {exc.strerror or exc}") from None
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


@command(principal=True)
@click.argument("scratchpad_id")
def delete(principal: Principal, scratchpad_id: str) -> None:
    """Delete one entry of the owner's (Scratchpad.delete): zeroed in the file, its
    step free again."""
    with current_state().open() as pad:
        pad.delete(principal, scratchpad_id)
    emit({"deleted": scratchpad_id}, lambda v: print_line(f"deleted {v['deleted']}"))


# The bounds the model's read tool (scratchpad_read, over MCP) accepts: the command line takes the same.
# The numbers the scratchpad_read tool takes: 32-bit, as a model may send them.
MAX_TOOL_INT = 2**31 - 1
_READ_INT = click.IntRange(0, MAX_TOOL_INT)
_READ_PROPERTIES = SCRATCHPAD_READ_TOOL["function"]["parameters"]["properties"]
# A continuation in the library's hint (mode='lines', start=917) as this command's options.
_HINT_ARGUMENT = re.compile(r"\b(mode|start|end)=('?)([\w-]+)\2")
_HINT_CAP = re.compile(r"cut to the read cap of \d+ (characters|bytes)")


@command(principal=True)
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
    type=click.IntRange(0, _READ_PROPERTIES["context"]["maximum"]),
    default=0,
    show_default=True,
    help="grep: lines around each match.",
)
def read(principal: Principal, scratchpad_id: str, start: int | None, **options: Any) -> None:
    """Read part of an entry, as the model's read tool does: capped by the policy's
    max_read_chars, counted as the JSON the model sees (a quote or a line break
    costs its escape). `securepad get` returns a whole entry."""
    with current_state().open() as pad:
        result = pad.read(principal, scratchpad_id, start=start or 0, **options)
        cap = pad.policy.max_read_chars

    def render(r: dict[str, Any]) -> None:
        content = r["content"]
        # The stored text itself: exact when piped, without control sequences on a terminal.
        click.echo(for_terminal(content) if sys.stdout.isatty() else content)
        meta = r["metadata"]
        status = f"{meta['size_returned']} of {meta['size_full']} {meta['unit']}, truncated={meta['truncated']}"
        if "hint" in meta:
            status += ", " + _cli_hint(meta["hint"], cap)
        print_note(status, "dim")

    emit(result, render)


def _cli_hint(hint: str, cap: int) -> str:
    """The library's hint in this command's terms: its options, and the policy's
    read cap (the hint names the share of it left to the content)."""
    hint = _HINT_CAP.sub(f"cut at the read cap (max_read_chars {cap}, counted as JSON with its escapes)", hint)
    hint = _HINT_ARGUMENT.sub(lambda m: f"--{m.group(1)} {m.group(3)}", hint)
    return hint.replace("--mode", "read --mode").replace(", --", " --")


@command(name="list", principal=True, turn=True)
def list_(principal: Principal, turn: str) -> None:
    """List a turn's live entries that the owner may see."""
    with current_state().open() as pad:
        rows = pad.list_for_turn(principal, turn)

    def render(entries: list[dict[str, Any]]) -> None:
        rows = []
        for e in entries:
            first_line = e["summary"].splitlines()[0][:60] if e["summary"] else ""
            rows.append((e["step_num"], e["scratchpad_id"], e["executor_name"], e["kind"], e["size_bytes"], first_line))
        print_table(("step", "id", "executor", "kind", "bytes", "summary"), rows)

    emit([{k: v for k, v in e.items() if k != "view"} for e in rows], render)


@click.group(name="turn", cls=SecurepadSubgroup)
@global_options
def turn_group() -> None:
    """Inspect, drop or recount an owner's turns."""


@command(turn_group, name="show", principal=True, turn=True)
def turn_show(principal: Principal, turn: str) -> None:
    """Print a turn's history: what the model saw of each live step (beginning a turn collects expired entries)."""
    with current_state().open() as pad:
        steps = pad.turn(principal, turn).steps()

    def render(items: list[dict[str, Any]]) -> None:
        if not items:
            print_line(f"turn {turn!r} has no live steps for this owner")
        for item in items:
            where = f"offloaded as {item['scratchpad_id']}" if item["offloaded"] else "inline"
            step = ("step ", "bold"), (str(item["step_num"]), "bold")
            print_styled(*step, " ", f"{item['executor_name']} ({where})", soft_wrap=False)
            print_json(item["shown"])

    emit(steps, render)


@command(turn_group, name="drop", principal=True, turn=True, yes=True)
def turn_drop(principal: Principal, turn: str, yes: bool) -> None:
    """Delete an owner's turn whole (Scratchpad.drop_turn): every entry of every
    actor and channel of the owner, its checkpoints and compaction marks, and its
    head, even when the turn's check fails (the way out of a turn found tampered
    that no backup restores)."""
    owner = principal.owner_user_id
    question = f"Delete turn {for_terminal(repr(turn))} of owner {for_terminal(repr(owner))} whole?"
    with confirmed(yes, question).open() as pad:
        removed = pad.drop_turn(owner, turn)
    emit(
        removed,
        lambda v: print_line(
            f"dropped turn {turn} of owner {owner}: {v['entries']} entries, {v['checkpoints']} checkpoints,"
            f" {v['compaction_marks']} compaction marks"
        ),
    )


@command(turn_group, name="recount", principal=True, yes=True)
def turn_recount(principal: Principal, yes: bool) -> None:
    """Count an owner's turns anew from the turn heads present (Scratchpad.recount_turns),
    whatever its owner head says: the way out of a turn removed whole whose id is not
    known, which refuses every new turn of the owner. The removed turn is given up;
    head rows that are not the owner's are deleted. An owner whose heads add up is left as it is."""
    owner = principal.owner_user_id
    question = (
        f"Count the turns of owner {for_terminal(repr(owner))} anew from the heads present,"
        " giving up any turn removed from the store?"
    )
    with confirmed(yes, question).open() as pad:
        report = pad.recount_turns(owner)
    emit(
        report,
        lambda v: print_line(
            f"owner {owner}: {v['turns_before']} turns counted before, {v['turns_after']} now"
            + (f"; head rows deleted: {', '.join(v['heads_deleted'])}" if v["heads_deleted"] else "")
            + ("" if v["resealed"] else " (its heads added up: nothing changed)")
        ),
    )


@command(principal=True, turn=True)
def mcp(principal: Principal, turn: str) -> None:
    """Serve scratchpad_read and scratchpad_list for one turn over MCP (stdio).

    The principal and turn are fixed here, never taken from the model."""
    try:
        from ..integrations.mcp import serve
    except ImportError as exc:
        raise SecurepadError(f"securepad mcp needs the MCP SDK ({exc}): pip install '.[mcp]'") from None
    serve(current_state().open(), principal, turn)
