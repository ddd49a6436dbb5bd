"""Which stores a key file serves, recorded beside it by the command line."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import SecurepadError

__all__ = ["KeyFileUse", "key_file_use", "record_key_file_use"]

# -- which stores a key file serves ----------------------------------------------------
#
# One key file can open several stores (``securepad init`` on a second --db
# reuses the default key file). Replacing that file for one store's master
# rotation would lock the others out for good, so the stores a key file
# serves are recorded beside it, in ``<key file>.stores``: the store ids, and
# whether the record began with the key itself (then no store is missing from
# it). The record holds no secret; it only decides whether a key file may be
# replaced, and an unknown or shared one is never replaced.

_USE_SUFFIX = ".stores"


@dataclass(frozen=True)
class KeyFileUse:
    """The stores a key file is recorded to serve (its ``<key file>.stores`` record)."""

    path: Path
    stores: frozenset[str]
    complete: bool  # the record began when the key was made: it names every store the key opens

    @property
    def record(self) -> Path:
        """Where the record lives, beside the key file."""
        return self.path.with_name(self.path.name + _USE_SUFFIX)

    def serves_only(self, store_id: str) -> bool:
        """Whether the key file is known to open this store and no other."""
        return self.complete and self.stores == frozenset({store_id})


def key_file_use(path: str | os.PathLike[str]) -> KeyFileUse:
    """The stores recorded beside key file ``path``; an absent or unreadable
    record is an empty, incomplete one (nothing is known)."""
    key_path = Path(path)
    use = KeyFileUse(key_path, frozenset(), False)
    try:
        data = json.loads(use.record.read_text("utf-8"))
        stores = data["stores"]
        complete = data["complete"]
    except (OSError, ValueError, KeyError, TypeError):
        return use
    if not isinstance(stores, list) or not all(isinstance(s, str) for s in stores) or not isinstance(complete, bool):
        return use
    return KeyFileUse(key_path, frozenset(stores), complete)


def record_key_file_use(path: str | os.PathLike[str], store_id: str, *, key_created: bool = False) -> KeyFileUse:
    """Record that key file ``path`` opens store ``store_id``; ``key_created``
    when the key was made for this store just now (the record is then complete).

    Written atomically (mode 0600) only when something changes.

    Raises:
        SecurepadError: the record cannot be written.
    """
    import secrets  # here: a command that opens no store never loads it

    use = key_file_use(path)
    if key_created:
        new = KeyFileUse(use.path, frozenset({store_id}), True)
    else:
        new = KeyFileUse(use.path, use.stores | {store_id}, use.complete)
    if new == use and use.record.exists():
        return use
    body = json.dumps({"stores": sorted(new.stores), "complete": new.complete}, indent=1) + "\n"
    tmp = new.record.with_name(f".{new.record.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
        os.replace(tmp, new.record)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SecurepadError(f"cannot record the stores of key file {new.path}: {exc.strerror}") from None
    return new
