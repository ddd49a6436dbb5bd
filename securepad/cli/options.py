"""The options every command shares and the state they fill: the global options
(before or after the command), the principal and the turn, and the key
sources (``failures`` reports errors)."""

from __future__ import annotations

import functools
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from .. import NotFoundError, Principal, SecurepadError, StoreCorruptError, WrongKeyError
from .failures import ABORTED, INTERRUPTED, USAGE_ERROR, SecurepadGroup
from .key_files import KeyFileUse, record_key_file_use
from .output import to_json

if TYPE_CHECKING:
    from .. import Keyring, Scratchpad

__all__ = [
    "ABORTED",
    "ENVIRONMENT",
    "ENV_HELP",
    "INTERRUPTED",
    "USAGE_ERROR",
    "SecurepadGroup",
    "SecurepadSubgroup",
    "State",
    "command",
    "confirmed",
    "current_state",
    "emit",
    "global_options",
]

F = TypeVar("F", bound=Callable[..., Any])

# Every environment variable the command line reads: (variable, option, what it sets).
ENVIRONMENT = (
    ("SECUREPAD_DB", "--db", "the store's database file (or a postgresql:// DSN)"),
    ("SECUREPAD_ADMIN_DB", "--admin", "PostgreSQL: the admin login's DSN, for housekeeping and migrations"),
    ("SECUREPAD_CALL_TIMEOUT", "--call-timeout", "PostgreSQL: a call's deadline in seconds (policy default 60)"),
    ("SECUREPAD_KEY_FILE", "--key-file", "the master key file"),
    ("SECUREPAD_MASTER_KEY_URI", "--master-key-uri", "the master key in a token or KMS (pkcs11:..., aws-kms://...)"),
    ("SECUREPAD_POLICY", "--policy", "a shipped policy's name or a TOML policy file"),
    ("SECUREPAD_ANCHOR", "--anchor", "the snapshot-rollback anchor file"),
    ("SECUREPAD_OWNER", "--owner", "the owner (tenant) a command acts for"),
    ("SECUREPAD_ACTOR", "--actor", "the actor (agent) a command acts as"),
    ("SECUREPAD_CHANNEL", "--channel", "the channel a command acts on"),
    ("SECUREPAD_TURN", "--turn", "the turn id of list, put, turn show and mcp"),
)

_PG_SCHEMES = ("postgresql://", "postgres://")


def default_db_path() -> Path:
    """``store.db`` in the user data dir (the key file lives in the config dir)."""
    from platformdirs import user_data_path

    return user_data_path("securepad") / "store.db"


# -- the global options, before or after the subcommand ----------------------------------


class State:
    """What every command needs to open the store: the global options, the command
    line's values overriding the environment's, wherever they were given."""

    def __init__(self) -> None:
        self.db: str | Path = default_db_path()
        self.master_key_env: str | None = None
        self.passphrase_env: str | None = None
        self.master_key_uri: str | None = None
        self.policy: str | None = None
        self.anchor: Path | None = None
        self.admin: str | None = None
        self.call_timeout: float | None = None
        self.as_json = False
        # The key sources given on the command line (the environment's key file yields to them).
        self.key_options: set[str] = set()

    @functools.cached_property
    def key_file(self) -> Path:
        """The master key file: ``--key-file`` (or its variable, set over this), else the default."""
        from .. import Keyring

        return Keyring.default_key_file()

    # -- the store and its key ---------------------------------------------------------
    # A SQLite store is its file: whether it is there and where it is need no more
    # than ``pathlib`` (as in ``Scratchpad.exists`` and ``Scratchpad.location_of``),
    # so that a command that finds no store says so without loading the store.

    def store_exists(self) -> bool:
        """Whether the SQLite file exists, or the PostgreSQL store's schema.

        Raises:
            StoreUnavailableError: the PostgreSQL server cannot be reached.
        """
        if isinstance(self.db, Path):
            return self.db.exists()
        from .. import Scratchpad

        return Scratchpad.exists(self.db)

    def refuse_empty_file(self) -> None:
        """An empty file is not a store, and no store is written over it.

        Raises:
            StoreCorruptError: ``--db`` names an empty file.
        """
        if isinstance(self.db, Path) and self.db.is_file() and self.db.stat().st_size == 0:
            raise StoreCorruptError(
                f"{self.db.absolute()} is an empty file, not a securepad store; nothing was changed:"
                " check the path, or remove the file and run `securepad init`"
            )

    def where(self) -> str:
        """The store's location for a message (a DSN without its password)."""
        if isinstance(self.db, Path):
            return str(self.db.absolute())
        from .. import Scratchpad

        return Scratchpad.location_of(self.db)

    def require_store(self) -> None:
        """Refuse to go on when the store is not there: only ``init`` creates one.

        Raises:
            NotFoundError: there is no store at the path or DSN.
            StoreCorruptError: the path is an empty file, not a store.
        """
        self.refuse_empty_file()
        if self.store_exists() is False:
            raise NotFoundError(
                f"no store at {self.where()}: `securepad init` creates one there (with the same --db or"
                " SECUREPAD_DB); to use an existing store, point --db or SECUREPAD_DB at it"
            )

    def keyring(self) -> Keyring:
        """The master key's source; the store's open decides whether the key is
        its own (the library creates a key file only for a new store).

        Raises:
            click.UsageError: more than one key source, or an unset variable.
            KeySourceUriError: the master key URI is malformed.
        """
        from .. import Keyring

        given = sorted(self.key_options)
        if len(given) > 1:
            raise click.UsageError(f"{' and '.join(given)} are two key sources: give one of {', '.join(_KEY_OPTIONS)}")
        # SECUREPAD_MASTER_KEY_URI yields to a key source on the command line, as SECUREPAD_KEY_FILE does.
        if self.master_key_uri and (not given or given == ["--master-key-uri"]):
            return Keyring.from_uri(self.master_key_uri)
        if self.master_key_env:
            if not os.environ.get(self.master_key_env):
                raise click.UsageError(f"environment variable {self.master_key_env} (--master-key-env) is not set")
            return Keyring.from_env(self.master_key_env)
        if self.passphrase_env:
            passphrase = os.environ.get(self.passphrase_env)
            if not passphrase:
                raise click.UsageError(f"environment variable {self.passphrase_env} (--passphrase-env) is not set")
            return Keyring.from_passphrase(passphrase)
        return Keyring.from_key_file(self.key_file)

    def admin_dsn(self) -> str | None:
        """``--admin`` for a PostgreSQL store.

        Raises:
            click.UsageError: ``--admin`` with a SQLite store, or not a postgresql:// DSN.
        """
        if self.admin is None:
            return None
        if not isinstance(self.db, str):
            raise click.UsageError("--admin (SECUREPAD_ADMIN_DB) is for a PostgreSQL store; --db is a file")
        if not self.admin.startswith(_PG_SCHEMES):
            raise click.UsageError("--admin (SECUREPAD_ADMIN_DB) takes a postgresql:// DSN")
        return self.admin

    def _open(self, keyring: Keyring, **options: Any) -> Scratchpad:
        """``Scratchpad.open`` with the global options; the library never creates a
        key file for a store that exists, and says ``WrongKeyError``: an absent
        key file is reported as such instead."""
        from .. import Scratchpad

        try:
            return Scratchpad.open(
                self.db,
                keyring=keyring,
                policy=self.policy,
                anchor=self.anchor,
                admin=self.admin_dsn(),
                call_timeout_s=self.call_timeout,
                **options,
            )
        except WrongKeyError:
            if keyring.key_file is not None and not keyring.key_file.exists():
                raise NotFoundError(
                    f"no key file at {self.key_file.absolute()}: opening an existing store never creates a key; give"
                    " this store's key with --key-file (SECUREPAD_KEY_FILE), --master-key-env, --passphrase-env or"
                    " --master-key-uri (SECUREPAD_MASTER_KEY_URI)"
                ) from None
            raise

    def open(self, *, adopt_anchor: bool = False) -> Scratchpad:
        """Open the existing store (never creating one); its key file records that it serves it.

        The store is opened before an absent key file is reported, so that a
        path that is no store says so first."""
        self.require_store()  # before the store's layers are imported: a missing store is reported without them
        pad = self._open(self.keyring(), adopt_anchor=adopt_anchor)
        note_key_use(pad)
        return pad

    def create(self) -> tuple[Scratchpad, KeyFileUse | None, bool]:
        """Open the store, creating it (and its key file) if it is not there: ``init`` only.

        Returns the store, the stores its key file is recorded to serve (None
        for a key not from a file) and whether the key file was made now. A
        PostgreSQL store is not checked here: the library creates an absent key
        file only if the store turns out to be new."""
        self.refuse_empty_file()
        keyring = self.keyring()
        key_existed = keyring.key_file is not None and keyring.key_file.exists()
        pad = self._open(keyring)
        key_created = keyring.key_file is not None and not key_existed
        return pad, note_key_use(pad, key_created=key_created), key_created


def note_key_use(pad: Scratchpad, *, key_created: bool = False) -> KeyFileUse | None:
    """Record beside the store's key file that it opens this store (None: no key file).

    A key directory that cannot be written records nothing, and a key file
    without a complete record is never replaced (``keys rotate-master --install``)."""
    key_file = pad.keyring.key_file
    if key_file is None:
        return None
    try:
        return record_key_file_use(key_file, pad.store_id, key_created=key_created)
    except SecurepadError:
        return None


def _path(value: str) -> Path:
    return Path(value).expanduser()


def _db(value: str) -> str | Path:
    return value if value.startswith(_PG_SCHEMES) else _path(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= 86400:
        raise click.BadParameter(f"{value!r} is not a number of seconds from 0 to 86400", param_hint="--call-timeout")
    return seconds


# (option, metavar, help, how its value becomes the State attribute of the option's name: None as it is);
# the key sources are the first four; an option's variable is its ENVIRONMENT row.
_GLOBALS: tuple[tuple[str, str, str, Callable[[str], Any] | None], ...] = (
    ("--key-file", "PATH", "Master key file [default: user config dir/key].", _path),
    ("--master-key-env", "VAR", "Take the base64 master key from this variable.", None),
    ("--passphrase-env", "VAR", "Derive the master key (Argon2id) from the passphrase in this variable.", None),
    (
        "--master-key-uri",
        "URI",
        "Use the master key in a token or KMS, where it stays: pkcs11:token=...;object=...?module-path=..."
        "&pin-source=... (RFC 7512) or aws-kms://arn:aws:kms:... (a new store creates an absent PKCS#11 key).",
        None,
    ),
    ("--db", "PATH", "The store: a database file [default: user data dir/store.db] or a postgresql:// DSN.", _db),
    (
        "--admin",
        "DSN",
        "PostgreSQL: the DSN of a login in securepad_admin, for housekeeping (gc, stats, audit, rotations,"
        " forget-owner) and migrations, when the --db login may only act as the application [default: --db].",
        None,
    ),
    (
        "--call-timeout",
        "SECONDS",
        "PostgreSQL: the deadline of one call in seconds; past it the call fails with StoreUnavailableError"
        " [default: the policy's call_timeout_seconds, 60].",
        _seconds,
    ),
    (
        "--policy",
        "NAME|PATH",
        "A shipped policy's name (default, strict, channel...) or a TOML policy file's path (./mine, mine.toml)"
        " [default: default].",
        None,
    ),
    (
        "--anchor",
        "PATH",
        "The snapshot-rollback anchor file, outside the store's directory [default: beside the key file;"
        " none with --master-key-env, --passphrase-env or --master-key-uri unless given].",
        _path,
    ),
)
_KEY_OPTIONS = tuple(option for option, *_ in _GLOBALS[:4])
_ENVVARS = {option: var for var, option, _ in ENVIRONMENT}


def current_state() -> State:
    ctx = click.get_current_context()
    return ctx.find_object(State) or ctx.ensure_object(State)


def _attribute(option: str) -> str:
    return option[2:].replace("-", "_")


def _global_callback(name: str, option: str, convert: Callable[[str], Any] | None) -> Callable[..., None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        source = ctx.get_parameter_source(name)
        state = ctx.find_object(State) or ctx.ensure_object(State)
        if value is None or value is False or source not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            return
        if source is ParameterSource.ENVIRONMENT and ctx.parent is not None:
            return  # the group already took the environment's value; a subcommand takes only its own command line
        if source is ParameterSource.COMMANDLINE and option in _KEY_OPTIONS:
            state.key_options.add(option)
        if source is ParameterSource.ENVIRONMENT and option == "--key-file" and state.key_options - {"--key-file"}:
            return
        setattr(state, name, value if convert is None else convert(value))

    return callback


def global_options(func: F) -> F:
    """The global options, on the group and on every subcommand (so they go before or after it)."""
    func = click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=_global_callback("as_json", "--json", None),
        help="Print JSON (results on stdout, errors on stderr).",
    )(func)
    for option, metavar, help_text, convert in reversed(_GLOBALS):
        envvar = _ENVVARS.get(option)
        func = click.option(
            option,
            metavar=metavar,
            envvar=envvar,
            show_envvar=envvar is not None,
            expose_value=False,
            callback=_global_callback(_attribute(option), option, convert),
            help=help_text,
        )(func)
    return func


def required(value: str | None, option: str, envvar: str) -> str:
    if value is None:  # an empty value goes on to the library, which says what is wrong with it
        raise click.UsageError(f"Missing option '{option}' (or set {envvar}).")
    return value


def principal_options(func: F) -> F:
    """--owner/--actor/--channel, turned into a ``principal`` argument."""

    @functools.wraps(func)
    def wrapper(*args: Any, owner: str | None, actor: str, channel: str, **kwargs: Any) -> Any:
        principal = Principal(required(owner, "--owner", "SECUREPAD_OWNER"), actor, channel)
        return func(*args, principal=principal, **kwargs)

    decorated: Any = wrapper
    for name, default, what in (
        ("channel", "cli", "Channel of the caller."),
        ("actor", "cli", "Actor (agent) of the caller."),
        ("owner", None, "Owner (tenant) on whose behalf to act (required: the option or its variable)."),
    ):
        envvar, shown = f"SECUREPAD_{name.upper()}", default is not None
        option = click.option(
            f"--{name}", envvar=envvar, show_envvar=True, default=default, show_default=shown, help=what
        )
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


def turn_option(func: F) -> F:
    """--turn (or its variable, required), turned into a ``turn`` argument."""

    @functools.wraps(func)
    def wrapper(*args: Any, turn_id: str | None, **kwargs: Any) -> Any:
        return func(*args, turn=required(turn_id, "--turn", "SECUREPAD_TURN"), **kwargs)

    what = "Turn id (required: the option or its variable)."
    return click.option("--turn", "turn_id", envvar="SECUREPAD_TURN", show_envvar=True, help=what)(wrapper)  # type: ignore[return-value]


def confirmed(yes: bool, question: str) -> State:
    """The state, once the store is found and ``question`` answered yes (not asked
    with --yes); a no aborts: nothing changed, exit status 1."""
    state = current_state()
    state.require_store()
    if not yes:
        click.confirm(question, abort=True)
    return state


def emit(value: Any, render: Callable[[Any], None], *, ok: bool = True) -> None:
    """Print ``value`` as JSON with --json, else with ``render``; then exit with status 1 unless ``ok``."""
    if current_state().as_json:
        click.echo(to_json(value))
    else:
        render(value)
    if not ok:
        sys.exit(1)


ENV_HELP = "\b\nEnvironment variables (the command line wins over them):\n" + "\n".join(
    line
    for var, option, what in ENVIRONMENT
    for line in textwrap.wrap(f"{var} ({option}): {what}", 78, initial_indent="  ", subsequent_indent="      ")
)


_GLOBAL_NAMES = frozenset({_attribute(option) for option, *_ in _GLOBALS} | {"as_json"})


class _GlobalOptionsLast:
    """Help that lists the command's own options first and the global options
    (the same on every command) after them, under their own heading."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        shared: list[tuple[str, str]] = []
        for param in self.get_params(ctx):  # type: ignore[attr-defined]
            record = param.get_help_record(ctx)
            if record is not None:
                (shared if param.name in _GLOBAL_NAMES else own).append(record)
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        if isinstance(self, click.Group):
            self.format_commands(ctx, formatter)
        if shared:
            with formatter.section("Global options (before or after the command; see securepad --help)"):
                formatter.write_dl(shared)


class SecurepadCommand(_GlobalOptionsLast, click.Command):
    """A subcommand whose help puts the global options last."""


class SecurepadSubgroup(_GlobalOptionsLast, click.Group):
    """A group of subcommands (``keys``, ``turn``) whose help puts the global options last."""


def command(
    group: click.Group | None = None, *, principal: bool = False, turn: bool = False, yes: bool = False, **kwargs: Any
) -> Callable[[Callable[..., Any]], SecurepadCommand]:
    """A subcommand (of ``group`` when given; the top-level ones are found by
    ``group.COMMAND_MODULES``) that also takes the global options, and the
    principal's (``principal_options``), ``--turn`` and ``--yes`` when asked, in that order."""

    def decorate(func: Callable[..., Any]) -> SecurepadCommand:
        yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
        for wanted, options in ((yes, yes_option), (turn, turn_option), (principal, principal_options)):
            if wanted:
                func = options(func)
        made = click.command(cls=SecurepadCommand, **kwargs)(global_options(func))
        if group is not None:
            group.add_command(made)
        return made

    return decorate
