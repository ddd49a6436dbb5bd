"""What the audit's checks share: the run's context, the synthetic tenants,
the expectations every refusal must meet, and the at-rest file scan.

A check ``check(ctx) -> str`` returns what happened when the defence held and
raises ``CheckFailed`` when it did not (any other exception fails it too).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, NotFoundError, SecurepadError
from ..principal import Principal
from ..store import Scratchpad, sqlite_of
from . import drills

__all__ = [
    "OWNER_TABLES",
    "STORE_FILE_SUFFIXES",
    "Check",
    "CheckFailed",
    "Context",
    "Step",
    "Steps",
    "Tenants",
    "describe",
    "expect_refused",
    "holding",
    "scan_files",
]

# The files SQLite keeps for a store: the database, its WAL, the WAL index,
# and the rollback journal (present only outside WAL mode or after a crash).
STORE_FILE_SUFFIXES = ("", "-wal", "-shm", "-journal")

# The tables whose rows belong to one owner (a PostgreSQL store's schema may add others).
OWNER_TABLES = ("owner_keys", "entries", "segments", "checkpoints", "compaction_marks")

_SCAN_CHUNK = 1 << 20


class CheckFailed(Exception):
    """A defence did not hold; the message says what happened instead."""


@dataclass
class Tenants:
    """The audit's synthetic owners and what they stored. ``a`` and ``b``
    differ only in their owner id; ``a_channel`` and ``a_actor`` are ``a`` on
    another channel and as another actor (for policy scopes)."""

    tag: str
    a: Principal
    a_channel: Principal
    a_actor: Principal
    b: Principal
    turn: str
    # label -> entry id, what was put, and by whom
    ids: dict[str, str] = field(default_factory=dict)
    puts: dict[str, Any] = field(default_factory=dict)
    writers: dict[str, Principal] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    # label -> canary bytes that must never be on disk in clear
    canaries: dict[str, bytes] = field(default_factory=dict)
    expired: tuple[str, ...] = ()
    expired_cutoff: float = 0.0
    absent_message: str = ""

    @property
    def owners(self) -> tuple[str, str]:
        return self.a.owner_user_id, self.b.owner_user_id

    def live(self, owner: str | None = None) -> list[str]:
        """Labels of the live entries (of one owner, or all)."""
        return [
            label
            for label, writer in self.writers.items()
            if label not in self.expired and (owner is None or writer.owner_user_id == owner)
        ]


@dataclass
class Context:
    """One audit run: the store, the key file, the tenants (``ready`` once they
    stored their entries), a private scratch directory."""

    pad: Scratchpad
    key_file: Path | None
    scratch_parent: Path | None
    synthetic: Tenants
    ready: bool = False
    scratch_dir: Path | None = None  # while it exists
    _base_copy: Path | None = None
    _copies: int = 0

    @property
    def tenants(self) -> Tenants:
        if not self.ready:
            raise CheckFailed("not run: the audit tenants could not be set up")
        return self.synthetic

    def expect_not_found(self, what: str, call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """``call(*args, **kwargs)`` must raise exactly ``NotFoundError`` with the
        message an absent id gets (``what`` names the attempt).

        Raises:
            CheckFailed: it returned something, raised another error, a subclass
                (``ExpiredError`` tells that the entry exists), or another message.
        """
        message = self.tenants.absent_message
        try:
            result = call(*args, **kwargs)
        except NotFoundError as exc:
            if type(exc) is not NotFoundError:
                raise CheckFailed(f"{what}: {type(exc).__name__}({exc}), which tells that the entry exists") from None
            if str(exc) != message:
                raise CheckFailed(f"{what}: message {str(exc)!r} differs from an absent id's {message!r}") from None
            return
        except SecurepadError as exc:
            raise CheckFailed(f"{what}: {type(exc).__name__}({exc}) instead of NotFoundError") from None
        raise CheckFailed(f"{what}: served {describe(result)}")

    def scratch(self) -> Path:
        """A 0700 directory for scratch copies, beside the store unless told otherwise."""
        if self.scratch_dir is None:
            parent = self.scratch_parent if self.scratch_parent is not None else self.pad.path.parent
            self.scratch_dir = Path(tempfile.mkdtemp(prefix=".securepad-audit-", dir=parent))
        return self.scratch_dir

    def drill_copy(self) -> Path:
        """A fresh scratch copy of the store holding only the audit tenants."""
        if self._base_copy is None:
            base = self.scratch() / "base.db"
            sqlite_of(self.pad).copy_to(base)
            drills.keep_only_owners(base, self.tenants.owners)
            self._base_copy = base
        self._copies += 1
        copy = self.scratch() / f"drill-{self._copies}.db"
        drills.clone(self._base_copy, copy)
        return copy

    @contextmanager
    def tampered(self, *drills: Callable[[Path], None]) -> Iterator[tuple[Scratchpad, Path]]:
        """Open a scratch copy damaged by ``drills`` with the store's keyring and
        policy, and no anchor (the copy's writes must not move the store's)."""
        path = self.drill_copy()
        for drill in drills:
            drill(path)
        with Scratchpad.open(path, keyring=self.pad.keyring, policy=self.pad.policy, anchor=False) as copy:
            yield copy, path

    def remove_scratch(self) -> None:
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)
            self.scratch_dir = self._base_copy = None


Check = Callable[[Context], str]


@dataclass(frozen=True)
class Step:
    """One row of the audit's plan."""

    name: str
    group: str
    tried: str
    check: Check


class Steps(list[Step]):
    """A group's steps in the order they are declared: ``@steps(name, tried)`` adds the check it decorates."""

    def __init__(self, group: str) -> None:
        super().__init__()
        self.group = group

    def __call__(self, name: str, tried: str) -> Callable[[Check], Check]:
        def add(check: Check) -> Check:
            self.append(Step(name, self.group, tried, check))
            return check

        return add


def describe(value: object) -> str:
    """A short account of what a call returned, for a failure message."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def expect_refused(what: str, call: Callable[..., object], *args: Any, **kwargs: Any) -> str:
    """``call(*args, **kwargs)`` must end in ``IntegrityError`` or ``NotFoundError``; returns which.

    Raises:
        CheckFailed: it returned something (the damage went unnoticed) or raised another error.
    """
    try:
        result = call(*args, **kwargs)
    except IntegrityError:
        return "IntegrityError"  # named by the public class, whatever private subclass was raised
    except NotFoundError:
        return "NotFoundError"
    except SecurepadError as exc:
        raise CheckFailed(f"{what}: {type(exc).__name__}({exc})") from None
    raise CheckFailed(f"{what}: served {describe(result)}")


def store_files(db_path: Path) -> list[Path]:
    """The store's files that exist now."""
    return [p for p in (Path(f"{db_path}{suffix}") for suffix in STORE_FILE_SUFFIXES) if p.exists()]


def scan_files(files: Iterable[Path], needles: dict[str, bytes]) -> dict[str, list[str]]:
    """Which needles occur in which files: label -> names of the files holding
    it, read in chunks that overlap by the longest needle."""
    found: dict[str, list[str]] = {label: [] for label in needles}
    if not needles:
        return found
    overlap = max(len(n) for n in needles.values()) - 1
    for path in files:
        hits: set[str] = set()
        tail = b""
        try:
            with path.open("rb") as handle:
                while chunk := handle.read(_SCAN_CHUNK):
                    window = tail + chunk
                    hits.update(label for label, needle in needles.items() if needle in window)
                    tail = window[-overlap:] if overlap else b""
        except FileNotFoundError:
            continue  # the WAL can be removed while we look: then nothing is in it
        for label in sorted(hits):
            found[label].append(path.name)
    return found


def holding(found: dict[str, list[str]]) -> str:
    """``scan_files``'s finds as "label in file, file; ...", empty when nothing was found."""
    return "; ".join(f"{label} in {', '.join(where)}" for label, where in found.items() if where)
