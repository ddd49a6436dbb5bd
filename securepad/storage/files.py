"""Who may touch the store's files: the checks shared by the key file and the database.

Whoever can read the key file reads every entry; whoever can plant or replace
the key file or a database file, or write to their directories, chooses what
the store uses. These checks refuse such files unless the caller allows a
deliberate shared setup (SECURITY.md, "Files and permissions").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import SecurepadError, StoreCorruptError

__all__ = [
    "KEY_OVERRIDE",
    "POLICY_OVERRIDE",
    "STORE_OVERRIDE",
    "check_directory",
    "check_file_directories",
    "check_is_database",
    "check_private_file",
    "check_trusted_file",
    "create_private_file",
]


KEY_OVERRIDE = "Keyring.from_key_file(..., allow_shared=True)"
STORE_OVERRIDE = "allow_shared_files = true in the policy's [access] section"
POLICY_OVERRIDE = "Policy.load(path, allow_shared=True)"


def check_private_file(path: Path, info: os.stat_result, what: str, override: str = KEY_OVERRIDE) -> None:
    """Refuse a file of another user, or one others may read or write."""
    fix = f"; for a deliberate shared setup: {override} (SECURITY.md)"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise SecurepadError(
            f"{what} {path} belongs to uid {info.st_uid}, not to the current user ({os.geteuid()}):"
            f" whoever owns it can read or replace it; make your own (or chown it){fix}"
        )
    loose = stat.S_IMODE(info.st_mode) & 0o077
    if loose:
        raise SecurepadError(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}: others may read or write it;"
            f" run: chmod 600 {path}{fix}"
        )


def check_trusted_file(path: Path, info: os.stat_result, what: str, override: str) -> None:
    """Refuse a file that decides what the store does (a policy) when someone
    other than the current user or root owns it, or others may write it.
    Others may read it: it holds no secret."""
    fix = f"; for a deliberate shared setup: {override} (SECURITY.md)"
    if hasattr(os, "geteuid") and info.st_uid not in (os.geteuid(), 0):
        raise SecurepadError(
            f"{what} {path} belongs to uid {info.st_uid}, not to the current user ({os.geteuid()}) or root:"
            f" whoever owns it decides what it says; make your own (or chown it){fix}"
        )
    loose = stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)
    if loose:
        raise SecurepadError(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}: others may write it; run: chmod go-w {path}{fix}"
        )


def check_directory(directory: Path, what: str, override: str = KEY_OVERRIDE) -> None:
    """Refuse a directory others may write to: they could plant or replace the file."""
    try:
        info = directory.stat()
    except OSError as exc:
        raise SecurepadError(f"cannot inspect {directory}: {exc.strerror}") from None
    if stat.S_IMODE(info.st_mode) & stat.S_IWOTH:
        raise SecurepadError(
            f"the {what}'s directory {directory} has mode {stat.S_IMODE(info.st_mode):04o}: anyone may"
            f" plant or replace files in it; run: chmod o-w {directory} (or use a private directory);"
            f" for a deliberate shared setup: {override} (SECURITY.md)"
        )


def check_file_directories(path: Path, what: str, override: str) -> None:
    """``check_directory`` for the directory that names ``path`` and, when
    ``path`` is reached through a link, for the directory the file really is
    in: whoever may write either may put another file in its place."""
    named = path.absolute().parent
    check_directory(named, what, override)
    real = Path(os.path.realpath(path)).parent
    if real != named:
        check_directory(real, what, override)


def create_private_file(path: Path, allow_shared: bool = False, *, companions: bool = True) -> None:
    """Create the database, -wal and -shm files 0600 in a 0700 directory before
    SQLite does, and refuse existing ones others may read or write, or a
    directory others may write to (unless ``allow_shared``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SecurepadError(f"cannot create store {path}: {exc.strerror or exc}") from None
    if companions:  # what is at the path is named before anything about its directory
        check_is_database(path)
    if not allow_shared:
        check_directory(path.parent, "store", STORE_OVERRIDE)
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if companions else (path,):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not allow_shared:
                try:
                    info = name.stat()
                except FileNotFoundError:  # SQLite removed it meanwhile
                    continue
                check_private_file(name, info, "store file", STORE_OVERRIDE)
            continue
        except OSError as exc:
            raise SecurepadError(f"cannot create store {path}: {exc.strerror or exc}") from None
        os.close(fd)


SQLITE_HEADER = b"SQLite format 3\x00"


def check_is_database(path: Path) -> None:
    """Refuse an existing file that is not a SQLite database before SQLite
    writes a store over it (an empty file is the one this module creates).

    Raises:
        StoreCorruptError: the file is not a SQLite database.
        SecurepadError: it cannot be read, or is not a regular file.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(100)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SecurepadError(f"cannot open store {path}: {exc.strerror or exc}") from None
    if head and not head.startswith(SQLITE_HEADER):
        raise StoreCorruptError(
            f"the store {path} is damaged or is not a securepad store (not a SQLite database); nothing was"
            " changed: check the path, or give a path that does not exist to `securepad init`"
        )
    # Tables (a schema cookie, offset 40) without a user_version (offset 60,
    # set with the store's tables): another program's database.
    if len(head) == 100 and head[60:64] == bytes(4) and head[40:44] != bytes(4):
        raise StoreCorruptError(
            f"{path} is a SQLite database but not a securepad store; nothing was changed: check the path"
        )
