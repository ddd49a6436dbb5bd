"""The file work of ``Scratchpad.restore``: a private copy of the backup to check,
and the checked copy made the store (the replaced store kept beside it)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from ._assembly import open_backend
from .errors import InvalidArgumentError, SecurepadError
from .policy import Policy
from .storage.sqlite import Database

__all__ = ["check_backup", "remove_staged", "replace_store", "stage_copy"]


def check_backup(db_path: str | os.PathLike[str], src: str | os.PathLike[str]) -> tuple[Path, Path]:
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


def stage_copy(source: Path, target: Path) -> Path:
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


def replace_store(target: Path, staged: Path, policy: Policy) -> str | None:
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


def remove_staged(staged: Path) -> None:
    """Remove the checked copy and the files SQLite kept beside it."""
    for leftover in (staged, Path(f"{staged}-wal"), Path(f"{staged}-shm")):
        leftover.unlink(missing_ok=True)
