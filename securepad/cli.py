"""The ``securepad`` command line: options in, one library call, output out.

No SQL and no cryptography here; everything goes through the public API.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from platformdirs import user_data_path
from rich.console import Console
from rich.table import Table

from . import Keyring, Principal, Scratchpad, SecurepadError
from .demo import run_demo
from .keys import default_key_file

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)


def default_db_path() -> Path:
    """``store.db`` in the user data dir (the key file lives in the config dir)."""
    return user_data_path("securepad") / "store.db"


class Context:
    """What every command needs to open the store."""

    def __init__(
        self,
        db: Path,
        key_file: Path,
        master_key_env: str | None,
        passphrase_env: str | None,
        policy: str | None,
        as_json: bool,
    ) -> None:
        self.db = db
        self.key_file = key_file
        self.master_key_env = master_key_env
        self.passphrase_env = passphrase_env
        self.policy = policy
        self.as_json = as_json

    def keyring(self) -> Keyring:
        if self.master_key_env:
            return Keyring.from_env(self.master_key_env)
        if self.passphrase_env:
            import os

            passphrase = os.environ.get(self.passphrase_env)
            if not passphrase:
                raise click.UsageError(f"environment variable {self.passphrase_env} is not set")
            return Keyring.from_passphrase(passphrase)
        return Keyring.from_key_file(self.key_file)

    def open(self) -> Scratchpad:
        return Scratchpad.open(self.db, keyring=self.keyring(), policy=self.policy)


def principal_options(func: F) -> F:
    """--owner/--actor/--channel, turned into a ``principal`` argument."""
    func = click.option(
        "--channel", envvar="SECUREPAD_CHANNEL", default="cli", show_default=True, help="Channel of the caller."
    )(func)
    func = click.option(
        "--actor", envvar="SECUREPAD_ACTOR", default="cli", show_default=True, help="Actor (agent) of the caller."
    )(func)
    func = click.option(
        "--owner", envvar="SECUREPAD_OWNER", required=True, help="Owner (tenant) on whose behalf to act."
    )(func)
    return func


def _fail(message: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    sys.exit(1)


def emit(ctx: Context, value: Any, render: Callable[[Any], None]) -> None:
    """Print ``value`` as JSON with --json, else with ``render``."""
    if ctx.as_json:
        click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))
    else:
        render(value)


class SecurepadGroup(click.Group):
    """Turns library errors into one clear line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SecurepadError as exc:
            # Name the public class: private subclasses are an implementation detail.
            public = next(c for c in type(exc).__mro__ if not c.__name__.startswith("_"))
            _fail(f"{public.__name__}: {exc}")


@click.group(cls=SecurepadGroup)
@click.option(
    "--db",
    type=click.Path(path_type=Path),
    envvar="SECUREPAD_DB",
    default=default_db_path,
    show_default="user data dir/store.db",
    help="The store's database file.",
)
@click.option(
    "--key-file",
    type=click.Path(path_type=Path),
    envvar="SECUREPAD_KEY_FILE",
    default=default_key_file,
    show_default="user config dir/key",
    help="Master key file (created 0600 if absent).",
)
@click.option("--master-key-env", metavar="VAR", help="Take the base64 master key from this environment variable.")
@click.option("--passphrase-env", metavar="VAR", help="Derive the master key (Argon2id) from the passphrase in VAR.")
@click.option("--policy", envvar="SECUREPAD_POLICY", help="Policy file (TOML); default: the shipped default.toml.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def main(
    ctx: click.Context,
    db: Path,
    key_file: Path,
    master_key_env: str | None,
    passphrase_env: str | None,
    policy: str | None,
    as_json: bool,
) -> None:
    """securepad: the hardened observation store for LLM agent runtimes."""
    ctx.obj = Context(db, key_file, master_key_env, passphrase_env, policy, as_json)


pass_context = click.make_pass_decorator(Context)


@main.command()
@pass_context
def init(ctx: Context) -> None:
    """Create the store and its master key (if absent) and check that the key opens it."""
    with ctx.open() as pad:
        info = pad.stats()
    emit(
        ctx,
        {"db": info["path"], "policy": info["policy"], "key": ctx.keyring().__repr__()},
        lambda v: console.print(f"store ready at [bold]{v['db']}[/bold] (policy {v['policy']})"),
    )


@main.command()
@principal_options
@click.option("--turn", "turn_id", required=True, help="Turn id.")
@click.option("--step", "step_num", type=int, required=True, help="Step number within the turn.")
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
@pass_context
def put(
    ctx: Context,
    owner: str,
    actor: str,
    channel: str,
    turn_id: str,
    step_num: int,
    executor_name: str,
    kind: str,
    ttl_seconds: int | None,
    source: Any,
) -> None:
    """Store an observation read from SOURCE (a file, or - for standard input)."""
    raw: bytes = source.read()
    observation: Any
    try:
        if kind == "text":
            observation = raw.decode("utf-8")
        elif kind == "json":
            observation = json.loads(raw)
        else:
            observation = raw
    except ValueError as exc:  # bad UTF-8, bad JSON, or an integer past Python's 4,300-digit limit
        raise click.BadParameter(f"input is not valid {kind}: {exc}", param_hint="SOURCE") from None
    with ctx.open() as pad:
        view = pad.put(Principal(owner, actor, channel), turn_id, step_num, executor_name, observation, ttl_seconds)
    emit(ctx, view, lambda v: console.print_json(data=v))


@main.command()
@principal_options
@click.argument("scratchpad_id")
@click.option(
    "--mode",
    type=click.Choice(["head", "tail", "range", "full", "lines", "grep"]),
    default="head",
    show_default=True,
)
@click.option("-n", "n", type=int, default=2000, show_default=True, help="Characters (bytes) for head/tail.")
@click.option(
    "--start",
    type=int,
    default=0,
    show_default=True,
    help="Start offset for range; first line (1-based) for lines/grep.",
)
@click.option("--end", type=int, default=None, help="End offset (exclusive) for range; last line for lines/grep.")
@click.option("--pattern", default=None, help="grep: RE2 regular expression.")
@click.option("--max-matches", type=int, default=50, show_default=True, help="grep: stop after this many matches.")
@click.option("--context", "context_lines", type=int, default=0, show_default=True, help="grep: lines around each.")
@pass_context
def read(
    ctx: Context,
    owner: str,
    actor: str,
    channel: str,
    scratchpad_id: str,
    mode: str,
    n: int,
    start: int,
    end: int | None,
    pattern: str | None,
    max_matches: int,
    context_lines: int,
) -> None:
    """Read part of an entry (capped by the policy's max_read_chars)."""
    with ctx.open() as pad:
        result = pad.read(
            Principal(owner, actor, channel),
            scratchpad_id,
            mode=mode,
            n=n,
            start=start,
            end=end,
            pattern=pattern,
            max_matches=max_matches,
            context=context_lines,
        )

    def render(r: dict[str, Any]) -> None:
        click.echo(r["content"])
        meta = r["metadata"]
        err_console.print(
            f"[dim]{meta['size_returned']} of {meta['size_full']} {meta['unit']}, "
            f"truncated={meta['truncated']}{', ' + meta['hint'] if 'hint' in meta else ''}[/dim]",
            highlight=False,
        )

    emit(ctx, result, render)


@main.command(name="list")
@principal_options
@click.option("--turn", "turn_id", required=True, help="Turn id.")
@pass_context
def list_(ctx: Context, owner: str, actor: str, channel: str, turn_id: str) -> None:
    """List a turn's live entries that the owner may see."""
    with ctx.open() as pad:
        rows = pad.list_for_turn(Principal(owner, actor, channel), turn_id)

    def render(entries: list[dict[str, Any]]) -> None:
        table = Table("step", "id", "executor", "kind", "bytes", "summary")
        for e in entries:
            first_line = e["summary"].splitlines()[0] if e["summary"] else ""
            table.add_row(
                str(e["step_num"]),
                e["scratchpad_id"],
                e["executor_name"],
                e["kind"],
                str(e["size_bytes"]),
                first_line[:60],
            )
        console.print(table)

    emit(ctx, [{k: v for k, v in e.items() if k != "view"} for e in rows], render)


@main.group(name="turn")
def turn_group() -> None:
    """Inspect an owner's turns."""


@turn_group.command(name="show")
@principal_options
@click.option("--turn", "turn_id", required=True, help="Turn id.")
@pass_context
def turn_show(ctx: Context, owner: str, actor: str, channel: str, turn_id: str) -> None:
    """Print a turn's history: what the model saw of each live step (beginning a turn collects expired entries)."""
    with ctx.open() as pad:
        steps = pad.turn(Principal(owner, actor, channel), turn_id).steps()

    def render(items: list[dict[str, Any]]) -> None:
        if not items:
            console.print(f"turn {turn_id!r} has no live steps for this owner", highlight=False)
        for item in items:
            where = f"offloaded as {item['scratchpad_id']}" if item["offloaded"] else "inline"
            console.print(f"[bold]step {item['step_num']}[/bold] {item['executor_name']} ({where})", highlight=False)
            console.print_json(data=item["shown"])

    emit(ctx, steps, render)


@main.command()
@principal_options
@click.option("--turn", "turn_id", envvar="SECUREPAD_TURN", required=True, help="The turn the server serves.")
@pass_context
def mcp(ctx: Context, owner: str, actor: str, channel: str, turn_id: str) -> None:
    """Serve scratchpad_read and scratchpad_list for one turn over MCP (stdio).

    The principal and turn are fixed here, never taken from the model."""
    try:
        from .mcp_server import serve
    except ImportError as exc:
        raise click.ClickException(f"securepad mcp needs the MCP SDK ({exc}): pip install 'securepad[mcp]'") from None
    principal = Principal(owner, actor, channel)
    serve(ctx.open(), principal, turn_id)


@main.command()
@pass_context
def gc(ctx: Context) -> None:
    """Delete expired entries and scrub them from the files."""
    with ctx.open() as pad:
        deleted = pad.gc()
    emit(ctx, {"deleted": deleted}, lambda v: console.print(f"deleted {v['deleted']} expired entries"))


@main.command()
@click.option("--owner", envvar="SECUREPAD_OWNER", default=None, help="Only this owner's entries.")
@click.option("--actor", envvar="SECUREPAD_ACTOR", default="cli", show_default=True)
@click.option("--channel", envvar="SECUREPAD_CHANNEL", default="cli", show_default=True)
@pass_context
def stats(ctx: Context, owner: str | None, actor: str, channel: str) -> None:
    """Counts and sizes, for the whole store or one owner."""
    with ctx.open() as pad:
        info = pad.stats(Principal(owner, actor, channel) if owner else None)

    def render(v: dict[str, Any]) -> None:
        table = Table("statistic", "value")
        for key, value in v.items():
            table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
        console.print(table)

    emit(ctx, info, render)


@main.command()
@pass_context
def demo(ctx: Context) -> None:
    """A real round trip: two owners, a refusal, a tampered copy detected."""
    steps = []
    with ctx.open() as pad:
        if not ctx.as_json:
            console.print(f"store: [bold]{pad.path}[/bold]  policy: {pad.policy.name}")
        for step in run_demo(pad):
            steps.append({"step": step.title, "result": step.detail, "ok": step.ok})
            if not ctx.as_json:
                mark = "[green]ok[/green]" if step.ok else "[red]FAILED[/red]"
                console.print(f"{mark}  {step.title}: {step.detail}", highlight=False)
    if ctx.as_json:
        click.echo(json.dumps(steps, indent=2))
    if not all(s["ok"] for s in steps):
        sys.exit(1)


@main.command()
@click.option(
    "--db", "db_path", type=click.Path(path_type=Path), default=None, help="Store to audit (as the global --db)."
)
@click.option("--policy", "policy_file", default=None, help="Policy file to audit with (as the global --policy).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report (as the global --json).")
@pass_context
def audit(ctx: Context, db_path: Path | None, policy_file: str | None, as_json: bool) -> None:
    """Run the isolation audit: synthetic tenants attack each other, tampered scratch
    copies, at-rest scan, permissions. Exit status 1 when any check fails."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from .audit import Audit, AuditReport

    ctx.db, ctx.policy, ctx.as_json = db_path or ctx.db, policy_file or ctx.policy, as_json or ctx.as_json
    with ctx.open() as pad:
        run = Audit(pad)
        bar = Progress("{task.description}", BarColumn(), MofNCompleteColumn(), console=err_console, transient=True)
        with bar:
            task = bar.add_task("auditing", total=len(run.checks))
            for result in run.run():
                bar.update(task, advance=1, description=result.name)
        report = run.report()

    def render(r: AuditReport) -> None:
        table = Table(title=f"securepad audit of {escape(r.store)}", expand=True)
        table.add_column("check", ratio=2, overflow="fold")
        table.add_column("result", no_wrap=True)
        table.add_column("tried", ratio=3, overflow="fold")
        table.add_column("what happened", ratio=5, overflow="fold")
        group = None
        for row in r.results:
            if group is not None and row.group != group:
                table.add_section()
            group = row.group
            mark = "[green]pass[/green]" if row.passed else "[bold red]FAIL[/bold red]"
            table.add_row(escape(row.name), mark, escape(row.tried), escape(row.happened))
        console.print(table)
        failed = escape(", ".join(f.name for f in r.failed))
        if failed:
            console.print(f"[bold red]{len(r.failed)} of {len(r.results)} checks FAILED[/bold red]: {failed}")
        else:
            console.print(f"[green]all {len(r.results)} checks passed[/green]")
        console.print(f"policy {escape(r.policy)}, {escape(r.key_source)}", highlight=False)

    emit(ctx, report.as_dict() if ctx.as_json else report, render)
    if not report.passed:
        sys.exit(1)


def _progress_bar(ctx: Context, label: str) -> tuple[Any, Callable[[int, int], None]]:
    """A rich progress bar on stderr (so --json output stays clean) and its callback."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=ctx.as_json,
    )
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def _show_report(ctx: Context, report: dict[str, Any], title: str) -> None:
    def render(v: dict[str, Any]) -> None:
        table = Table(title=title, show_header=False)
        for key, value in v.items():
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)

    emit(ctx, report, render)


@main.group()
def keys() -> None:
    """Rotate the master key or an owner's key."""


@keys.command(name="rotate-master")
@click.option("--new-key-file", type=click.Path(path_type=Path), help="New master key file (created 0600 if absent).")
@click.option("--new-master-key-env", metavar="VAR", help="New base64 master key from this environment variable.")
@click.option("--new-passphrase-env", metavar="VAR", help="New passphrase (Argon2id) from this environment variable.")
@pass_context
def rotate_master(
    ctx: Context, new_key_file: Path | None, new_master_key_env: str | None, new_passphrase_env: str | None
) -> None:
    """Re-wrap every owner key under a new master key (from exactly one source)."""
    chosen = [o for o in (new_key_file, new_master_key_env, new_passphrase_env) if o]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --new-key-file, --new-master-key-env, --new-passphrase-env")
    new = Context(
        ctx.db, new_key_file or ctx.key_file, new_master_key_env, new_passphrase_env, ctx.policy, ctx.as_json
    ).keyring()
    with ctx.open() as pad:
        bar, update = _progress_bar(ctx, "re-wrapping owner keys")
        with bar:
            report = pad.rotate_master_key(new, progress=update)
    _show_report(ctx, report, "master key rotated")


@keys.command(name="rotate-owner")
@click.argument("owner")
@pass_context
def rotate_owner(ctx: Context, owner: str) -> None:
    """Give OWNER a new key version, re-wrap its item keys, retire the old versions."""
    with ctx.open() as pad:
        bar, update = _progress_bar(ctx, f"re-wrapping {owner}'s item keys")
        with bar:
            report = pad.rotate_owner_key(owner, progress=update)
    _show_report(ctx, report, "owner key rotated")


@main.command(name="forget-owner")
@click.argument("owner")
@click.confirmation_option(prompt="Delete every entry and key of this owner for good?")
@pass_context
def forget_owner(ctx: Context, owner: str) -> None:
    """Crypto-shred OWNER: delete its keys and entries and scrub them from the files."""
    with ctx.open() as pad:
        report = pad.forget_owner(owner)
    _show_report(ctx, report, "owner forgotten")


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Run the benchmark suite (from a source checkout; --quick for the smoke run, --help for options)."""
    sys.exit(_bench_runner().main(list(args)))


def _bench_runner() -> Any:
    """``benchmarks.runner`` from a source checkout: the one beside this package
    (editable install) or the one in the current directory. The suite is not
    part of the wheel, and an unrelated top-level ``benchmarks`` is refused."""
    import importlib

    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "benchmarks" / "runner.py").is_file():
            sys.path.insert(0, str(root))
            package = importlib.import_module("benchmarks")
            if getattr(package, "SECUREPAD_BENCHMARKS", False):
                return importlib.import_module("benchmarks.runner")
    raise click.ClickException(
        "securepad bench runs the suite in benchmarks/ of a source checkout, which the wheel does not"
        " include: clone the repository, pip install -e '.[bench]' and run it from there"
    )
