"""``Place``, the face of ``Scratchpad`` for where an open store lives and its copies;
the file work of a restore: a private copy of the backup to check, and the
checked copy made the store (the replaced store kept beside it)."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ._assembly import Parts, location_of, open_backend, resolve_policy, store_exists
from .errors import IntegrityError, InvalidArgumentError, SecurepadError
from .keys.keyring import Keyring
from .policy import Policy
from .storage.sqlite import Database

__all__ = ["Place", "sqlite_of_parts"]


class Place:
    """Where an open store lives, and its copies."""

    _parts: Parts
    store_id: str
    exists = staticmethod(store_exists)
    location_of = staticmethod(location_of)

    if TYPE_CHECKING:  # ``Scratchpad.open``, which ``restore`` opens the backup and the store with
        open: ClassVar[Callable[..., Any]]

    @property
    def schema_upgrade(self) -> dict[str, int] | None:
        """``{"from": old, "to": new}`` when this open upgraded the store's schema (also logged), else None."""
        upgraded = self._parts.db.upgraded
        return None if upgraded is None else {"from": upgraded[0], "to": upgraded[1]}

    @property
    def upgrade_notice(self) -> str | None:
        """The one-line notice of ``schema_upgrade``, or None."""
        upgraded = self._parts.db.upgraded
        if upgraded is None:
            return None
        return (
            f"store {self.location} upgraded: schema {upgraded[0]} \u2192 {upgraded[1]}; a securepad older than"
            f" {_package_version()} refuses it now (docs/deployment.md: back up before upgrading)"
        )

    @property
    def path(self) -> Path:
        """The database file of a SQLite store.

        Raises:
            SecurepadError: the store is on PostgreSQL (see ``location``).
        """
        return sqlite_of_parts(self._parts).path

    @property
    def location(self) -> str:
        """Where the store lives: its file, or its PostgreSQL server, database and schema."""
        return self._parts.db.location

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._parts.db.dialect

    def backup(self, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """Write a consistent, encrypted copy of the live store to the new file ``dest``
        (mode 0600; one ``VACUUM INTO``) while others read and write. Returns
        ``backup`` (the path), ``bytes`` and ``store_id``.

        Raises:
            InvalidArgumentError: ``dest`` exists, or the store is on
                PostgreSQL (back it up with ``pg_dump``; docs/how-to/backup.md).
            StorageFullError: the disk is full (no copy is left behind).
            SecurepadError: ``dest`` cannot be written, or its directory is
                writable by others.
        """
        db = self._parts.db
        if not isinstance(db, Database):
            raise InvalidArgumentError(
                f"the store at {db.location} is on PostgreSQL: back it up with pg_dump (docs/how-to/backup.md)"
            )
        path = Path(dest)
        if os.path.lexists(path):
            raise InvalidArgumentError(f"{path} exists: a backup is never written over a file")
        try:
            db.copy_to(path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return {"backup": str(path), "bytes": path.stat().st_size, "store_id": self.store_id}

    @classmethod
    def restore(
        cls,
        db_path: str | os.PathLike[str],
        src: str | os.PathLike[str],
        *,
        keyring: Keyring,
        policy: str | os.PathLike[str] | Policy | None = None,
        anchor: str | os.PathLike[str] | bool | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Put the backup ``src`` in place of the SQLite store at ``db_path``, knowingly
        accepting it as the current copy (stop the store's writers first).

        A private copy of ``src`` is verified first (a failing backup changes
        nothing); the store, if any, is kept as ``<db_path>.replaced-N`` and replaced
        through SQLite's backup API; then the store is opened adopting its rollback
        anchor and verified again.

        Returns ``restored``, ``source``, ``replaced`` (the copy of the store
        it replaced, or None) and ``verify`` (the final check's report).

        Raises:
            InvalidArgumentError: a PostgreSQL store, a missing ``src``, or a
                ``src`` with a write-ahead log beside it (a live store, not a backup).
            WrongKeyError: ``keyring`` does not open the backup.
            IntegrityError: the backup fails verification (nothing was changed).
            StoreCorruptError: ``src`` or the store at ``db_path`` is not a
                securepad store.
        """
        target, source = _check_backup(db_path, src)
        resolved = resolve_policy(policy)
        staged = _stage_copy(source, target)
        try:
            with cls.open(staged, keyring=keyring, policy=resolved, anchor=False) as copy:
                checked = copy.verify(now=now)
            if not checked["ok"]:
                raise IntegrityError(
                    f"the backup {source} fails verification ({len(checked['problems'])} problems): nothing was"
                    " changed; run securepad verify on a copy of it to see them"
                )
            replaced = _replace_store(target, staged, resolved)
        finally:
            _remove_staged(staged)
        with cls.open(target, keyring=keyring, policy=resolved, anchor=anchor, adopt_anchor=True) as pad:
            report = pad.verify(now=now)
        return {"restored": str(target), "source": str(source), "replaced": replaced, "verify": report}


def sqlite_of_parts(parts: Parts) -> Database:
    """The SQLite database of an open store's ``parts``. Raises SecurepadError: PostgreSQL."""
    db = parts.db
    if not isinstance(db, Database):
        raise SecurepadError(f"the store at {db.location} is not a SQLite file")
    return db


def _check_backup(db_path: str | os.PathLike[str], src: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The store's path and the backup's.

    Raises:
        InvalidArgumentError: a PostgreSQL store, a missing ``src``, or a
            ``src`` with a write-ahead log beside it (a live store, not a backup).
    """
    if str(db_path).startswith(("postgresql://", "postgres://")):
        raise InvalidArgumentError("restore puts back a SQLite store; restore PostgreSQL with pg_restore")
    source = Path(src)
    if not source.is_file():
        raise InvalidArgumentError(f"no backup file at {source}")
    if Path(f"{source}-wal").exists() and Path(f"{source}-wal").stat().st_size:
        raise InvalidArgumentError(
            f"{source} has a write-ahead log beside it: it is a live store, not a backup (copy it with backup first)"
        )
    return Path(db_path), source


def _stage_copy(source: Path, target: Path) -> Path:
    """A private (0600) copy of ``source`` beside ``target``, for a restore to check.

    Raises:
        SecurepadError: the copy cannot be written.
    """
    staged = target.with_name(f".{target.name}.restore-{secrets.token_hex(6)}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out, open(source, "rb") as data:
            shutil.copyfileobj(data, out)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise SecurepadError(f"cannot copy {source} beside {target}: {exc.strerror or exc}") from None
    return staged


def _replace_store(target: Path, staged: Path, policy: Policy) -> str | None:
    """Make the checked copy ``staged`` the store at ``target`` (linked, or copied in
    through SQLite's backup API after backing the old one up). Returns that backup's path.

    Raises:
        StoreCorruptError: the file at ``target`` is not a securepad store.
        SecurepadError: a file cannot be written.
    """
    if not target.exists():
        try:
            os.link(staged, target)  # never over a file that appeared meanwhile
        except OSError as exc:
            raise SecurepadError(f"cannot create {target}: {exc.strerror or exc}") from None
        return None
    db = open_backend(target, None, "securepad", policy)
    try:
        assert isinstance(db, Database)  # a path is always a file
        n = 1
        while os.path.lexists(f"{target}.replaced-{n}"):
            n += 1
        aside = Path(f"{target}.replaced-{n}")
        db.restore_from(staged, aside)
    finally:
        db.close()
    return str(aside)


def _remove_staged(staged: Path) -> None:
    """Remove the checked copy and the files SQLite kept beside it."""
    for leftover in (staged, Path(f"{staged}-wal"), Path(f"{staged}-shm")):
        leftover.unlink(missing_ok=True)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only for an upgrade's notice

    try:
        return version("securepad")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without metadata
        return "this version"
