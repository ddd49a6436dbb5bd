"""Policy files: loading, validation, and the one authorization decision.

A policy narrows access inside an owner and sets limits. No policy can widen
access across owners: the owner condition is always part of the scope.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import InvalidArgumentError, NotFoundError, PolicyError, SecurepadError
from .principal import Principal
from .storage.files import POLICY_OVERRIDE, check_file_directories, check_trusted_file

__all__ = ["NOT_FOUND_MESSAGE", "Policy", "setting_sections"]

# One message for every "you cannot have this entry", whatever the reason.
NOT_FOUND_MESSAGE = "no such entry"

SCOPES = ("owner", "owner+channel", "owner+channel+actor")
# (section, key) -> what it may be: one of its choices, ``bool`` (true or false),
# or an integer from (minimum, maximum); every value is validated here.
_SETTINGS: dict[tuple[str, str], Any] = {
    ("access", "scope"): SCOPES,
    ("access", "allow_shared_files"): bool,
    ("limits", "offload_threshold_bytes"): (0, 1 << 30),
    ("limits", "inline_max_chars"): (1, 1 << 24),
    ("limits", "max_read_chars"): (16, 1 << 26),
    ("limits", "max_entry_bytes"): (1, 1 << 40),
    ("limits", "owner_quota_bytes"): (1, 1 << 50),
    ("limits", "default_ttl_seconds"): (1, 10 * 365 * 86400),
    ("limits", "max_ttl_seconds"): (1, 10 * 365 * 86400),
    # Nesting of a structured observation; past ~900 Python's JSON encoder overflows its stack.
    ("limits", "max_json_depth"): (1, 500),
    # How far the ``now`` of a write or gc may run ahead of this host's clock
    # (timeline.py); a ``now`` behind the clock is not bounded.
    ("limits", "max_clock_skew_seconds"): (1, 86400),
    ("audit", "log_denied"): bool,
    ("audit", "log_reads"): bool,
    ("storage", "wal_limit_bytes"): (1 << 20, 1 << 40),
    ("storage", "anchor_interval_seconds"): (1, 86400),
    ("storage", "call_timeout_seconds"): (1, 86400),
    ("storage", "incremental_vacuum"): bool,
    # SQLite's synchronous setting in WAL mode (docs/reliability.md): "normal"
    # syncs the WAL at checkpoints (a power cut can lose the last commits),
    # "full" at every commit.
    ("storage", "durability"): ("normal", "full"),
    # The snapshot-rollback anchor's sync policy (anchor.py, SECURITY.md).
    ("storage", "anchor_sync"): ("commit", "interval", "close"),
}
_SECTIONS = {section for section, _ in _SETTINGS}


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated policy. Build one with ``Policy.load(path)`` or ``Policy.default()``.

    ``scope`` decides which entries of an owner a principal may touch:
    ``owner`` (all of them), ``owner+channel`` (those stored on its channel),
    ``owner+channel+actor`` (those stored by it on its channel).
    """

    scope: str = "owner"
    offload_threshold_bytes: int = 4096
    inline_max_chars: int = 1500
    max_read_chars: int = 16000
    max_entry_bytes: int = 100 * 1024 * 1024
    owner_quota_bytes: int = 1024 * 1024 * 1024
    default_ttl_seconds: int = 3600
    max_ttl_seconds: int = 86400
    max_json_depth: int = 100
    max_clock_skew_seconds: int = 300
    log_denied: bool = True
    log_reads: bool = False
    # Adopt store files and directories others may read or write (a deliberate shared setup).
    allow_shared_files: bool = False
    # SQLite stores only (docs/reliability.md): the write-ahead log's bound and
    # whether gc gives freed pages back to the file system.
    wal_limit_bytes: int = 256 * 1024 * 1024
    incremental_vacuum: bool = False
    # Both backends: when a commit reaches the disk ("normal": SQLite at the
    # next checkpoint, PostgreSQL synchronous_commit = off; "full": before it returns).
    durability: str = "normal"
    # When the snapshot-rollback anchor follows the store's write counter:
    # after every commit, at most every anchor_interval_seconds, or at open
    # and close only (SECURITY.md, "Snapshot rollback", for each one's window).
    anchor_sync: str = "interval"
    anchor_interval_seconds: int = 1
    # PostgreSQL stores only: a whole call's deadline (its connection is cut
    # past it; lock, statement and pool waits are cut to fit under it).
    call_timeout_seconds: int = 60
    name: str = "default"

    @classmethod
    def load(cls, path: str | Path, *, allow_shared: bool = False) -> Policy:
        """Load and validate a policy: a shipped policy's name (``"strict"``; see
        ``Policy.shipped()``) or the path of a TOML policy file.

        A ``str`` with no path separator that does not end in ``.toml`` is a
        shipped policy's name, and only that: a file of that name in the
        current directory is never read in its place. A file is named by a
        path: one with a separator (``./strict``, ``conf/strict``), one ending
        in ``.toml``, or a ``pathlib.Path``.

        A policy file decides who may read what, so it gets the key file's
        owner checks: it must belong to the current user (or to root) and no
        one else may write it, nor plant files in its directory. Others may
        read it: a policy holds no secret. ``allow_shared=True`` lifts these
        checks for a deliberate shared setup.

        Raises:
            PolicyError: no shipped policy has that name; the file cannot be
                read or parsed, others could write or replace it, has an
                unknown section or key, a value of the wrong type or out of
                range, or contradictory limits. The message names the
                offending key.
        """
        if isinstance(path, str) and _is_name(path):
            if path not in cls.shipped():
                raise PolicyError(
                    f"no shipped policy named {path!r} (shipped: {', '.join(cls.shipped())}); a policy file"
                    f" is named by a path: ./{path}"
                )
            return cls._parse(bundled_policy_path(path), checked=False)
        return cls._parse(Path(path), checked=not allow_shared)

    @classmethod
    def _parse(cls, path: Path, *, checked: bool) -> Policy:
        import tomllib  # here: importing securepad.policy reads no file

        text = _read_policy_file(path, checked, cls.shipped())
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy file {path} is not valid TOML: {exc}") from None
        return cls.from_dict(data, name=path.stem)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, name: str = "custom") -> Policy:
        """Validate a policy given as nested dicts (the parsed TOML).

        Raises:
            PolicyError: as for ``load``.
        """
        if not data:
            raise PolicyError("policy is empty: give at least [access] scope")
        values: dict[str, Any] = {"name": name}
        for section, body in data.items():
            if section not in _SECTIONS:
                raise PolicyError(f"unknown policy section [{section}]")
            if not isinstance(body, dict):
                raise PolicyError(f"[{section}] must be a table")
            for key, value in body.items():
                values[key] = _validate(section, key, value)
        policy = cls(**values)
        if policy.default_ttl_seconds > policy.max_ttl_seconds:
            raise PolicyError("limits.default_ttl_seconds exceeds limits.max_ttl_seconds")
        if policy.max_entry_bytes > policy.owner_quota_bytes:
            raise PolicyError("limits.max_entry_bytes exceeds limits.owner_quota_bytes")
        return policy

    @staticmethod
    def shipped() -> tuple[str, ...]:
        """The names of the policies shipped with securepad, sorted."""
        return tuple(sorted(p.stem for p in _bundled_dir().glob("*.toml")))

    @classmethod
    def default(cls) -> Policy:
        """The shipped ``default.toml``.

        Raises:
            PolicyError: the installed default policy is missing or invalid.
        """
        return cls._parse(bundled_policy_path("default"), checked=False)

    def as_dict(self) -> dict[str, Any]:
        """The policy's values, for reports."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # -- the authorization decision -------------------------------------------------

    def scope_columns(self, principal: Principal) -> list[tuple[str, str]]:
        """The (column, value) pairs an entry must match for ``principal``.

        The owner is always first: this is the tenant boundary no policy can lift.
        """
        columns = [("owner_user_id", principal.owner_user_id)]
        if self.scope in ("owner+channel", "owner+channel+actor"):
            columns.append(("channel", principal.channel))
        if self.scope == "owner+channel+actor":
            columns.append(("actor", principal.actor))
        return columns

    def ttl(self, ttl_seconds: int | None) -> int:
        """The default TTL, or ``ttl_seconds`` checked against ``max_ttl_seconds``.

        Raises:
            InvalidArgumentError: not a positive integer, or above ``max_ttl_seconds``.
        """
        if ttl_seconds is None:
            return self.default_ttl_seconds
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise InvalidArgumentError(f"ttl_seconds must be a positive integer, not {ttl_seconds!r}")
        if ttl_seconds > self.max_ttl_seconds:
            raise InvalidArgumentError(
                f"ttl_seconds {ttl_seconds} exceeds the policy's max_ttl_seconds ({self.max_ttl_seconds})"
            )
        return ttl_seconds

    def scope_sql(self, principal: Principal) -> tuple[str, tuple[str, ...]]:
        """The SQL condition (for table ``entries``) and its parameters."""
        if self.scope == "owner":  # the owner alone (``scope_columns``): every put and read asks
            return _OWNER_SQL, (principal.owner_user_id,)
        columns = self.scope_columns(principal)
        sql = " AND ".join(f"{column} = ?" for column, _ in columns)
        return sql, tuple(value for _, value in columns)

    def authorize_row(self, principal: Principal, row: dict[str, Any]) -> None:
        """Check a fetched row again against the scope; the SQL already filtered it.

        Raises:
            NotFoundError: the row is outside the principal's scope.
        """
        if row.get("owner_user_id") != principal.owner_user_id:
            raise NotFoundError(NOT_FOUND_MESSAGE)
        if self.scope == "owner":  # the owner is the whole of this scope (``scope_columns``)
            return
        for column, value in self.scope_columns(principal):
            if row.get(column) != value:
                raise NotFoundError(NOT_FOUND_MESSAGE)


_OWNER_SQL = "owner_user_id = ?"


def _validate(section: str, key: str, value: Any) -> Any:
    rule = _SETTINGS.get((section, key))
    if rule is None:
        raise PolicyError(f"unknown policy key {section}.{key}")
    if rule is bool:
        if not isinstance(value, bool):
            raise PolicyError(f"{section}.{key} must be true or false, not {value!r}")
    elif isinstance(rule[0], str):
        if value not in rule:
            raise PolicyError(f"{section}.{key} must be one of {', '.join(map(repr, rule))}, not {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{section}.{key} must be an integer, not {value!r}")
    elif not rule[0] <= value <= rule[1]:
        raise PolicyError(f"{section}.{key} must be between {rule[0]} and {rule[1]}, not {value}")
    return value


def setting_sections() -> dict[str, str]:
    """Every setting a policy file may hold besides ``access.scope``: its key and its section."""
    return {key: section for section, key in _SETTINGS if key != "scope"}


def _is_name(value: str) -> bool:
    """A shipped policy's name, not a file: no separator of any platform, no ``.toml``."""
    separators = {"/", "\\", os.sep, os.altsep or "/"}
    return bool(value) and not any(sep in value for sep in separators) and not value.endswith(".toml")


def _read_policy_file(path: Path, checked: bool, shipped: tuple[str, ...]) -> str:
    """The text of a policy file, after the owner checks when ``checked``; the
    checks look at the file that was opened, not at the name again.

    Raises:
        PolicyError: unreadable, not UTF-8, or others could write or replace it.
    """
    try:
        # Non-blocking: a FIFO in the policy's place would block the open for good.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PolicyError(
            f"cannot read policy file {path}: {exc.strerror} (a shipped policy is named without a path:"
            f" {', '.join(shipped)})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device (/dev/zero) is read for ever
            raise PolicyError(f"cannot read policy file {path}: not a regular file")
        if checked:
            check_trusted_file(path, info, "policy file", POLICY_OVERRIDE)
            check_file_directories(path, "policy file", POLICY_OVERRIDE)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read()
    except PolicyError:
        raise
    except SecurepadError as exc:
        raise PolicyError(str(exc)) from None
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"policy file {path} is not UTF-8 text") from None


def _bundled_dir() -> Path:
    """Where the shipped policies are: inside an installed wheel, or a source checkout's ``policies/``."""
    installed = Path(str(resources.files("securepad"))) / "policies"
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parent.parent / "policies"


def bundled_policy_path(name: str) -> Path:
    """Path of a policy shipped with securepad (``default``, ``strict``...).

    Raises:
        PolicyError: no shipped policy has that name.
    """
    path = _bundled_dir() / f"{name}.toml"
    if not path.is_file():
        raise PolicyError(f"no shipped policy named {name!r}")
    return path
