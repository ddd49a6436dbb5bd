"""The commands that look after a whole store: counts, checks and the audit,
collection, backup and restore, the anchor, key rotation and forgetting an
owner (see ``securepad.cli`` for the rules they all follow)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .. import InvalidArgumentError, Principal, SecurepadError
from .key_files import key_file_use, record_key_file_use
from .options import SecurepadSubgroup, State, command, confirmed, current_state, emit, global_options
from .output import for_terminal, print_line, print_note, print_styled, print_table, progress, write_new_file

if TYPE_CHECKING:
    from .. import Keyring, Scratchpad

__all__: list[str] = []


@command()
def gc() -> None:
    """Delete expired entries and scrub them from the files."""
    with current_state().open() as pad:
        deleted = pad.gc()
    emit({"deleted": deleted}, lambda v: print_line(f"deleted {v['deleted']} expired entries"))


@command()
@click.argument("dest", type=click.Path(path_type=Path, dir_okay=False))
def backup(dest: Path) -> None:
    """Write a consistent copy of the live store to DEST, a new file (mode 0600),
    while other processes go on using the store. SQLite only: back up a
    PostgreSQL store with pg_dump (docs/how-to/backup.md). The copy is
    encrypted; back up the key file (or passphrase) separately."""
    with current_state().open() as pad:
        result = pad.backup(dest)
    emit(result, lambda v: print_line(f"backed up to {v['backup']} ({v['bytes']} bytes)"))


@command(yes=True)
@click.argument("src", type=click.Path(path_type=Path, dir_okay=False))
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
    from .. import Scratchpad

    result = Scratchpad.restore(state.db, src, keyring=state.keyring(), policy=state.policy, anchor=state.anchor)

    def render(v: dict[str, Any]) -> None:
        print_line(f"restored {v['restored']} from {v['source']}")
        if v["replaced"]:
            print_line(f"the store it replaced is kept at {v['replaced']}")
        _render_verify(v["verify"])

    emit(result, render, ok=result["verify"]["ok"])


@command(name="anchor-adopt", yes=True)
def anchor_adopt(yes: bool) -> None:
    """Accept this copy of the store as current and reset its snapshot-rollback anchor.

    Only after a deliberate restore (a backup put back on purpose) or a moved
    anchor: it silences the check that refuses an older copy of the store."""
    question = "Accept this copy of the store as the current one (an older copy is no longer refused)?"
    with confirmed(yes, question).open(adopt_anchor=True) as pad:
        anchor = pad.stats()["anchor"]
    emit({"anchor": anchor}, lambda v: print_line(f"anchor reset: {json.dumps(v['anchor'])}"))


@command()
@click.option("--owner", envvar="SECUREPAD_OWNER", show_envvar=True, default=None, help="Only this owner's entries.")
@click.option("--actor", envvar="SECUREPAD_ACTOR", show_envvar=True, default="cli", show_default=True)
@click.option("--channel", envvar="SECUREPAD_CHANNEL", show_envvar=True, default="cli", show_default=True)
def stats(owner: str | None, actor: str, channel: str) -> None:
    """Counts and sizes, for the whole store or one owner (--owner or SECUREPAD_OWNER)."""
    if owner and click.get_current_context().get_parameter_source("owner") is ParameterSource.ENVIRONMENT:
        # Narrowed by the environment, not by this command line: say so.
        print_note(f"stats of owner {owner!r} only (from SECUREPAD_OWNER)", "dim")
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
        print_styled((title, "bold"))
    for name, text in rows:
        print_line(f"{name:<{width}}  {text}")


def _no_store_yet(state: State, what: str) -> str | None:
    if state.store_exists() is False:
        return f"no store at {state.where()} yet (`securepad init` creates it): {what} a throwaway store"
    return None


@contextlib.contextmanager
def _store_or_throwaway(state: State, why: str | None) -> Iterator[Scratchpad]:
    """The configured store or, when ``why`` says why not (on stderr), a throwaway
    store and key in private temporary directories, removed afterwards."""
    if why is None:
        with state.open() as pad:
            yield pad
        return
    import tempfile

    from .. import Keyring, Scratchpad

    print_note(why, "yellow")
    with tempfile.TemporaryDirectory(prefix="securepad-scratch-") as scratch:
        root = Path(scratch)
        (root / "data").mkdir(mode=0o700)
        (root / "keys").mkdir(mode=0o700)
        keyring = Keyring.from_key_file(root / "keys" / "key")
        with Scratchpad.open(root / "data" / "store.db", keyring=keyring, policy=state.policy) as pad:
            yield pad


@command()
def demo() -> None:
    """A real round trip: two owners, a refusal, a tampered copy detected.

    On the configured store (its demo owners removed afterwards), or on a throwaway
    store when there is none yet or the store is on PostgreSQL."""
    from ..audit.demo import run_demo

    state = current_state()
    why: str | None
    if isinstance(state.db, str):  # PostgreSQL: the demo damages a copy of the store's file
        state.require_store()
        why = f"the demo's tampered copy is a file, not {state.where()}: the demo runs on a throwaway store"
    else:
        why = _no_store_yet(state, "the demo runs on")
    steps = []
    with _store_or_throwaway(state, why) as pad:
        if not state.as_json:
            print_line(f"store: {pad.path}  policy: {pad.policy.name}")
        for step in run_demo(pad):
            steps.append({"step": step.title, "result": step.detail, "ok": step.ok})
            if not state.as_json:
                mark = ("ok", "green") if step.ok else ("FAILED", "red")
                print_styled(mark, "  ", f"{step.title}: {step.detail}", soft_wrap=False)
    emit(steps, lambda _: None, ok=all(s["ok"] for s in steps))  # shown step by step as it ran


@command()
def verify() -> None:
    """Check the whole store: every owner's sealed turn heads, every entry (all its
    segments) and turn record authenticated and compared with its head. Exit
    status 1 when anything is wrong; each problem names its owner, turn and row."""
    with current_state().open() as pad:
        report = pad.verify()
    emit(report, _render_verify, ok=report["ok"])


def _render_verify(r: dict[str, Any]) -> None:
    counts = ", ".join(
        f"{r[k]} {k.replace('_', ' ')}" for k in ("owners", "turns", "entries", "checkpoints", "compaction_marks")
    )
    if r["ok"]:
        print_styled(("verify: no problem found", "green"))
    else:
        columns = ("owner_user_id", "turn_id", "id", "what", "problem")
        rows = (("" if p[k] is None else p[k] for k in columns) for p in r["problems"])
        print_table(("owner", "turn", "id", "what", "problem"), rows, f"{len(r['problems'])} problems")
        print_styled(("verify FAILED", "bold red"))
    _print_wrapped(f"{counts}, {r['seconds']} s", 2)


@command()
def audit() -> None:
    """Run the isolation audit: synthetic tenants attack each other, tampered scratch
    copies, at-rest scan, permissions. Exit status 1 when any check fails.

    Audits the configured store, or a throwaway store with the same policy when
    there is none yet."""
    from ..audit import Audit, AuditReport

    state = current_state()
    with _store_or_throwaway(state, _no_store_yet(state, "auditing")) as pad:
        checked = pad.verify()  # the store as found, before the audit's tenants come and go
        run = Audit(pad)
        with progress(transient=True, elapsed=False) as bar:
            task = bar.add_task("auditing", total=len(run.checks))
            for result in run.run():
                bar.update(task, advance=1, description=for_terminal(result.name))
        report = run.report()

    def render(r: AuditReport) -> None:
        # A list, not a table: at 80 columns a table's narrow columns split words.
        print_line(f"securepad audit of {r.store}")
        group = None
        for row in r.results:
            if row.group != group:
                group = row.group
                print_styled((f"\n{group}", "bold"))
            print_styled("  ", ("pass", "green") if row.passed else ("FAIL", "bold red"), "  ", row.name)
            if not row.passed:
                _print_wrapped(f"tried: {row.tried}", 8)
            _print_wrapped(row.happened, 8)
        failed = ", ".join(f.name for f in r.failed)
        print_line("")
        if failed:
            print_styled((f"{len(r.failed)} of {len(r.results)} checks FAILED: ", "bold red"), failed)
        else:
            print_styled((f"all {len(r.results)} checks passed", "green"))
        print_line(f"policy {r.policy}, {r.key_source}")
        _render_verify(checked)

    shown = {**report.as_dict(), "verify": checked} if state.as_json else report
    emit(shown, render, ok=report.passed and checked["ok"])


def _print_wrapped(text: str, indent: int) -> None:
    """``text`` wrapped at spaces within 80 columns (a word longer than a line is
    left whole), each line indented."""
    import textwrap

    for line in textwrap.wrap(
        for_terminal(text), 80, initial_indent=" " * indent, subsequent_indent=" " * indent, break_long_words=False
    ):
        print_line(line)


@contextlib.contextmanager
def _progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr, shown while the block runs, and its callback; ``label`` is plain text."""
    with progress(transient=current_state().as_json) as bar:
        task = bar.add_task(for_terminal(label), total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _show_report(report: dict[str, Any], title: str, *, ok: bool = True) -> None:
    emit(report, lambda v: _render_figures(v, title), ok=ok)


@click.group(cls=SecurepadSubgroup)
@global_options
def keys() -> None:
    """Rotate the master key or an owner's key."""


@command(keys, name="rotate-master")
@click.option("--new-key-file", type=click.Path(path_type=Path), help="New master key file (created 0600 if absent).")
@click.option("--new-master-key-env", metavar="VAR", help="New base64 master key from this environment variable.")
@click.option("--new-passphrase-env", metavar="VAR", help="New passphrase (Argon2id) from this environment variable.")
@click.option(
    "--new-master-key-uri",
    metavar="URI",
    help="New master key in a token or KMS (pkcs11:... or aws-kms://...); an absent PKCS#11 key is created.",
)
@click.option(
    "--install",
    is_flag=True,
    help="Put the new key in place of the current key file once the rotation is committed (the old key stays"
    " until then); without --new-key-file, a new key is made for it. Refused unless the key file is recorded"
    " to open this store alone.",
)
def rotate_master(install: bool, **sources: Any) -> None:
    """Re-wrap every owner key under a new master key (from exactly one source).

    Afterwards only the new key opens the store: --install puts a new key file in
    place of the current one (only when that file opens this store alone);
    otherwise the command says what to change."""
    state = current_state()
    new, new_key_file = _new_source(sources, install), sources["new_key_file"]
    current = state.keyring()  # the source only: open() checks the key
    if install and current.key_file is None:
        raise click.UsageError("--install replaces the current key file, but this store's key is not from a file")
    made: Path | None = None
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
        # The record beside a key file is a clear file anyone who writes the key
        # directory can forge, so the old key is never destroyed: it stays
        # beside, and a store it still opens can be given it with --key-file.
        kept = _keep_old_key(state.key_file) if install else None
        try:
            new_keyring = new.keyring()
            with _progress_bar("re-wrapping owner keys") as update:
                report = pad.rotate_master_key(new_keyring, progress=update)
        except BaseException:
            if made is not None:
                made.unlink(missing_ok=True)
            if kept is not None:
                kept.unlink(missing_ok=True)
            raise
        store_id = pad.store_id
    if new_key_file is not None:
        _place_new_key(report, state, current.key_file, new_key_file, kept, store_id, new_existed)
    else:
        report["next"] = _next_without_key_file(new, new_keyring, current.key_file)
    _show_report(report, "master key rotated")
    if not state.as_json:
        print_note(f"next: {report['next']}", "bold")


def _new_source(sources: dict[str, Any], install: bool) -> State:
    """The new master key's source (its key file is set once it is known) of the
    ``--new-*`` options: exactly one source; ``--install`` only with a key file (or none).

    Raises:
        click.UsageError: the options do not name one source.
    """
    chosen = [name for name, value in sources.items() if value]
    if len(chosen) > 1 or (not chosen and not install):
        raise click.UsageError(
            "give exactly one of --new-key-file, --new-master-key-env, --new-passphrase-env, --new-master-key-uri"
        )
    if install and chosen and chosen != ["new_key_file"]:
        raise click.UsageError("--install installs a key file: use it with --new-key-file or alone")
    new = State()
    new.master_key_env, new.passphrase_env = sources["new_master_key_env"], sources["new_passphrase_env"]
    new.master_key_uri = sources["new_master_key_uri"]
    return new


def _next_without_key_file(new: State, new_keyring: Keyring, old_key_file: Path | None) -> str:
    """What to give every command once the new master key comes from a variable, a token or a KMS."""
    option = "--master-key-env" if new.master_key_env else "--passphrase-env"
    value = new.master_key_env or new.passphrase_env
    if new_keyring.source is not None:  # the URI as shown: without a PIN
        option, value = "--master-key-uri", new_keyring.source.shown_uri
    text = (
        f"only the new key opens the store now: give {option} {value}"
        " to every command (the old key no longer opens this store)"
    )
    if new.master_key_uri and old_key_file is not None:
        text += f"; {old_key_file} still opens copies of the store made before: delete it"
        text += " once no backup needs it and no other store uses it"
    return text


def _place_new_key(
    report: dict[str, Any],
    state: State,
    current: Path | None,
    new_key_file: Path,
    kept: Path | None,
    store_id: str,
    new_existed: bool,
) -> None:
    """Install the new key file in place of the current one (``kept``: the old
    key's second name, given with --install), or record which store it opens;
    ``report["next"]`` says what comes next."""
    if kept is not None:
        os.replace(new_key_file, state.key_file)
        with contextlib.suppress(SecurepadError):
            record_key_file_use(state.key_file, store_id, key_created=True)
        report["installed"] = str(state.key_file)
        report["old_key_kept"] = str(kept)
        report["next"] = (
            f"nothing: the new key is in place at {state.key_file}; the old key no longer opens this store."
            f" It is kept at {kept}: delete it once no other store needs it"
        )
        return
    with contextlib.suppress(SecurepadError):
        record_key_file_use(new_key_file, store_id, key_created=not new_existed)
    report["next"] = (
        f"only the new key opens the store now: give --key-file {new_key_file} (or SECUREPAD_KEY_FILE)"
        " to every command on this store"
    )
    if current is not None:
        report["next"] += f"; {current} stays as it is (it may open other stores)"


def _keep_old_key(key_file: Path) -> Path:
    """A second name for the current key, ``<key file>.replaced-N`` (a hard link,
    or a 0600 copy where links are not supported), made before it is replaced.

    Raises:
        SecurepadError: it cannot be made (nothing is rotated then).
    """
    n = 1
    while os.path.lexists(f"{key_file}.replaced-{n}"):
        n += 1
    kept = Path(f"{key_file}.replaced-{n}")
    try:
        os.link(key_file, kept)
        return kept
    except FileExistsError:
        raise SecurepadError(f"cannot keep the current key at {kept}: it appeared meanwhile") from None
    except OSError:
        pass  # a file system without hard links: copy it
    try:
        write_new_file(kept, key_file.read_bytes())
    except OSError as exc:
        raise SecurepadError(f"cannot keep the current key at {kept}: {exc.strerror or exc}") from None
    return kept


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
    with current_state().open() as pad, _progress_bar(f"re-wrapping {owner}'s item keys") as update:
        report = pad.rotate_owner_key(owner, progress=update)
    _show_report(report, "owner key rotated")


@command(name="forget-owner", yes=True)
@click.argument("owner")
def forget_owner(owner: str, yes: bool) -> None:
    """Crypto-shred OWNER: delete its keys and entries and scrub them from the files.

    Exit status 1 when the store holds nothing of OWNER (a mistyped name deletes nothing)."""
    question = f"Delete every entry and key of owner {for_terminal(repr(owner))} for good?"
    with confirmed(yes, question).open() as pad:
        report = pad.forget_owner(owner)
    found = any(v for k, v in report.items() if k not in ("owner_user_id", "wal_truncated") and isinstance(v, int))
    report["found"] = found
    _show_report(report, "owner forgotten" if found else f"owner {owner!r} not found: nothing was deleted", ok=found)
