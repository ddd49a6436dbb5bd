"""The anchor's file: the highest durable write counter of a store, kept outside it.

* it holds ``{"format": 1, "counter": N, "tag": ...}``, tagged under the
  store's anchor key: a damaged, forged or another store's file is ``IntegrityError``;
* it gets the key file's checks: whoever may write it could put an older
  genuine anchor back with an older copy of the store;
* it is replaced atomically (temporary file, fsync, rename, fsync of the
  directory), mode 0600, under an exclusive ``fcntl`` lock on
  ``<anchor>.lock``; a killed writer's temporary file is removed at the next open.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..crypto.primitives import CounterSeal
from ..errors import IntegrityError, SecurepadError
from .files import STORE_OVERRIDE, check_directory, check_file_directories, check_private_file

__all__ = ["FIX", "AnchorFile"]

# What tempfile.mkstemp puts after the anchor's temporary prefix (".<anchor name>.").
_TEMP_RANDOM = r"[a-z0-9_]{8}"
# How to get out of a refusal, appended to every rollback error.
FIX = (
    " If you moved the store or its anchor on purpose, give the anchor's path (anchor=... or --anchor /"
    " SECUREPAD_ANCHOR); if you knowingly restored this copy and accept it as current, open it once with"
    " adopt_anchor=True (CLI: securepad anchor-adopt) (SECURITY.md, 'Snapshot rollback')."
)


class AnchorFile:
    """The anchor file at ``path``, authenticated under ``seal``."""

    def __init__(self, path: Path, seal: CounterSeal, *, allow_shared: bool = False) -> None:
        self.path = path
        self.allow_shared = allow_shared
        self._seal = seal

    def read(self) -> int | None:
        """The anchor's counter, None when there is no anchor file.

        Raises:
            IntegrityError: the file is damaged, forged, or another store's.
            SecurepadError: the anchor cannot be read, or others may write it
                or its directory.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SecurepadError(f"cannot read the anchor {self.path}: {exc.strerror}") from None
        try:
            if not self.allow_shared:
                check_private_file(self.path, os.fstat(fd), "anchor", STORE_OVERRIDE)
                # The anchor's own directory was checked under the lock; a link may lead elsewhere.
                check_file_directories(self.path, "anchor", STORE_OVERRIDE)
            with os.fdopen(fd, "rb", closefd=False) as handle:
                text = handle.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecurepadError(f"cannot read the anchor {self.path}: {exc}") from None
        finally:
            os.close(fd)
        return self._parse(text)

    def _parse(self, text: str) -> int:
        try:
            data = json.loads(text)
            counter, tag = data["counter"], data["tag"]
            valid = isinstance(counter, int) and not isinstance(counter, bool) and counter >= 0
            valid = valid and isinstance(tag, str)
        except (ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            raise IntegrityError(f"the anchor {self.path} is damaged (not an anchor file)." + FIX)
        if not self._seal.check("anchor", counter, tag):
            raise IntegrityError(
                f"the anchor {self.path} was forged or belongs to another store (it does not authenticate"
                " under this store's key)." + FIX
            )
        return int(counter)

    def write(self, counter: int) -> None:
        """Replace the anchor atomically with ``counter`` (under ``locked``).

        Raises:
            SecurepadError: the anchor cannot be written.
        """
        body = json.dumps({"format": 1, "counter": counter, "tag": self._seal.tag("anchor", counter)})
        try:
            fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)  # _TEMP_RANDOM
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(body)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise SecurepadError(f"cannot write the anchor {self.path}: {exc.strerror}") from None

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary files of killed writers; under ``locked``, which
        every writer holds from its temporary file to the rename."""
        pattern = re.compile(rf"\.{re.escape(self.path.name)}\.{_TEMP_RANDOM}")
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return  # the anchor's own read or write names the problem
        for name in names:
            if pattern.fullmatch(name):
                with contextlib.suppress(OSError):  # left for the next open; never a new failure
                    os.unlink(self.path.parent / name)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The exclusive lock of the anchor's read-compare-write, across processes.

        Raises:
            SecurepadError: the lock cannot be opened, or others may write the anchor's directory.
        """
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self.allow_shared:
                check_directory(self.path.parent, "anchor", STORE_OVERRIDE)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SecurepadError(f"cannot open the anchor's lock {lock}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
