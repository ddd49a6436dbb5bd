"""The keyring: where the master key comes from (key file, environment variable,
Argon2id of a passphrase, or a token or KMS that keeps it: SECURITY.md has the
key hierarchy). Keys are handles: no ``repr``, no pickling."""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from ..crypto.primitives import KEY_BYTES, KeyHandle
from ..errors import InvalidArgumentError, SecurepadError, WrongKeyError
from ..storage.files import check_directory, check_private_file
from .process import make_undumpable, scrub_initial_environment
from .source import MasterKeySource, open_source

__all__ = ["KeyHandle", "Keyring"]


# RFC 9106, section 4, second recommended option (memory-constrained):
# Argon2id, t=3 passes, 64 MiB, 4 lanes, 16-byte salt, 32-byte tag.
ARGON2_DEFAULTS: dict[str, int] = {"time_cost": 3, "memory_cost": 64 * 1024, "parallelism": 4}
# What a store's record may ask for (memory in KiB): up to 4 GiB and 64 lanes.
ARGON2_BOUNDS: dict[str, tuple[int, int]] = {
    "time_cost": (1, 64),
    "memory_cost": (8, 4 * 1024 * 1024),
    "parallelism": (1, 64),
}


class Keyring:
    """The master key's source. Build one with a ``from_*`` class method; the key is
    derived when a store opens (a passphrase needs the salt the store keeps)."""

    def __init__(
        self,
        kind: str,
        detail: str,
        secret: bytes = b"",
        *,
        argon2: dict[str, int] | None = None,
        allow_shared: bool = False,
        remote: MasterKeySource | None = None,
    ) -> None:
        self._kind = kind  # "file" | "env" | "passphrase" | a source's URI scheme ("pkcs11", "aws-kms")
        self._detail = detail  # the path, variable name or URI without secrets; never the secret
        self._secret = secret  # a key file's is read (or created) when the store opens, if not yet
        self._argon2 = argon2 or {}
        self._allow_shared = allow_shared
        self._remote = remote

    def __repr__(self) -> str:
        return f"<Keyring {self._kind}: {self._detail}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("keyrings cannot be pickled")

    @property
    def kind(self) -> str:
        """``file``, ``env``, ``passphrase``, or a source's scheme (``pkcs11``, ``aws-kms``)."""
        return self._kind

    @property
    def identifier(self) -> str:
        """Which master key this is, never a secret: a source's key identifier
        (reaching the source once, if the store has not), else the kind and
        the path or variable (``file:/…/key``, ``env:VAR``, ``passphrase:argon2id``).

        Raises:
            KeySourceError: the source cannot be reached.
        """
        if self._remote is not None:
            return self._remote.key_id()
        return f"{self._kind}:{self._detail}"

    @property
    def source(self) -> MasterKeySource | None:
        """The token or KMS that holds the master key (``from_uri``); None for a key in the process."""
        return self._remote

    @property
    def allow_shared(self) -> bool:
        """Whether the key file's owner and mode checks were lifted (``from_key_file(..., allow_shared=True)``)."""
        return self._allow_shared

    @property
    def key_file(self) -> Path | None:
        """The key file's path, for a keyring built from one."""
        return Path(self._detail) if self._kind == "file" else None

    @staticmethod
    def default_key_file() -> Path:
        """``key`` in the user config dir: where ``from_key_file`` looks when given no path."""
        from platformdirs import user_config_path

        return user_config_path("securepad") / "key"

    @classmethod
    def from_key_file(cls, path: str | os.PathLike[str] | None = None, *, allow_shared: bool = False) -> Keyring:
        """Use the base64 master key in ``path`` (default: ``key`` in the user config
        dir). An absent file is created (mode 0600, in a 0700 directory) only with a
        new store or as ``rotate_master_key``'s new key.

        The file must be the current user's, unreadable and unwritable by others, in a
        directory others cannot write; ``allow_shared=True`` lifts these checks (a key
        mounted by an orchestrator, say).

        Raises:
            WrongKeyError: the file exists but does not hold a base64 32-byte key.
            SecurepadError: the file cannot be read, or its owner or mode or its
                directory's mode lets others read, plant or replace it (the
                message says how to fix it).
        """
        key_path = Path(path) if path is not None else cls.default_key_file()
        raw = _read_key_file(key_path, allow_shared)
        key = b"" if raw is None else _decode_key(raw, f"key file {key_path}")
        return cls("file", str(key_path), key, allow_shared=allow_shared)

    @classmethod
    def create_key_file(cls, path: str | os.PathLike[str], *, allow_shared: bool = False) -> Keyring:
        """Write a new random master key to ``path`` (which must not exist) and use it.

        Raises:
            SecurepadError: the file exists, cannot be created, or its directory
                is writable by others (unless ``allow_shared``).
        """
        key_path = Path(path)
        if key_path.exists():
            raise SecurepadError(f"key file {key_path} already exists; a new key is never written over a key")
        key = _decode_key(_create_key_file(key_path, allow_shared), f"key file {key_path}")
        return cls("file", str(key_path), key, allow_shared=allow_shared)

    @classmethod
    def from_uri(cls, uri: str, *, environ: Mapping[str, str] | None = None) -> Keyring:
        """Use the master key that ``uri`` names in a token or a KMS, where it stays:
        ``pkcs11:token=…;object=…?module-path=…&pin-source=…`` (RFC 7512) or
        ``aws-kms://arn:aws:kms:…``. Only the URI is read here; the source is reached
        when a store opens (a new store creates an absent PKCS#11 key). Variables come
        from ``environ`` (default ``os.environ``).

        Raises:
            KeySourceUriError: the URI is malformed or of an unknown scheme.
            KeySourceModuleError: the source's client library is not installed.
        """
        remote = open_source(uri, environ=environ)
        return cls(remote.scheme, remote.shown_uri, remote=remote)

    @classmethod
    def from_env(
        cls, var: str = "SECUREPAD_MASTER_KEY", *, keep_in_env: bool = False, keep_dumpable: bool = False
    ) -> Keyring:
        """Use the base64 32-byte master key in environment variable ``var``.

        Once read, the variable is unset (no subprocess inherits it) and on Linux
        overwritten in the block ``/proc/<pid>/environ`` shows; ``keep_in_env=True``
        leaves it. The process is made non-dumpable on Linux (no core dump, no
        same-user debugger or ``/proc`` memory read); ``keep_dumpable=True`` leaves it
        dumpable for debugging.

        Raises:
            WrongKeyError: the variable is unset or does not hold a base64 32-byte key
                (it is then left as it was).
        """
        value = os.environ.get(var)
        if not value:
            raise WrongKeyError(f"environment variable {var} is not set")
        key = _decode_key(value.encode("ascii", "replace"), f"environment variable {var}")
        if not keep_in_env:
            os.environ.pop(var, None)  # os.environ's pop also unsets it for child processes
            # After the unset, so that no thread's getenv sees a blanked value.
            scrub_initial_environment(var)
        if not keep_dumpable:
            make_undumpable()
        return cls("env", var, key)

    @classmethod
    def from_passphrase(
        cls,
        passphrase: str,
        *,
        time_cost: int = ARGON2_DEFAULTS["time_cost"],
        memory_cost: int = ARGON2_DEFAULTS["memory_cost"],
        parallelism: int = ARGON2_DEFAULTS["parallelism"],
    ) -> Keyring:
        """Stretch ``passphrase`` with Argon2id into the master key.

        The defaults are RFC 9106's second recommended parameters; an existing store
        keeps the salt and parameters it was created with.

        Raises:
            InvalidArgumentError: the passphrase is empty or a parameter is out of range.
        """
        if not isinstance(passphrase, str) or not passphrase:
            raise InvalidArgumentError("the passphrase must be a non-empty string")
        params = {"time_cost": time_cost, "memory_cost": memory_cost, "parallelism": parallelism}
        for name, (low, high) in ARGON2_BOUNDS.items():
            if not _within(params[name], low, high):
                raise InvalidArgumentError(f"Argon2id {name} must be an integer from {low} to {high}")
        if memory_cost < 8 * parallelism:
            raise InvalidArgumentError("Argon2id needs memory_cost >= 8 * parallelism")
        return cls("passphrase", "argon2id", passphrase.encode("utf-8"), argon2=params)

    def _key_file_secret(self, new: bool) -> bytes:
        if not self._secret:
            path = Path(self._detail)
            raw = _read_key_file(path, self._allow_shared)
            if raw is None:
                if not new:
                    raise WrongKeyError(
                        f"key file {path} does not exist, and this store was made with a key:"
                        " give the key file it was created with (none was created)"
                    )
                raw = _create_key_file(path, self._allow_shared)
            self._secret = _decode_key(raw, f"key file {path}")
        return self._secret


def master_key(
    keyring: Keyring, kdf: dict[str, Any] | None, *, new: bool = False
) -> tuple[KeyHandle, dict[str, Any] | None]:
    """The master key of ``keyring`` for a store whose KDF record is ``kdf``, and the
    new record to keep when a passphrase store has none; ``new`` (a new store, a
    rotation's target) creates an absent key file.

    Raises:
        WrongKeyError: the store's passphrase record is unreadable or unusable,
            or the key file is absent and the store exists.
    """
    if keyring._remote is not None:
        raise InvalidArgumentError(f"the master key of {keyring!r} stays in its source: it has no bytes here")
    if keyring._kind == "file":
        return KeyHandle(keyring._key_file_secret(new)), None
    if keyring._kind != "passphrase":
        return KeyHandle(keyring._secret), None
    # Argon2 is loaded for a passphrase only: a key file or a token never needs it.
    from argon2.exceptions import HashingError
    from argon2.low_level import Type, hash_secret_raw

    created: dict[str, Any] | None = None
    record = kdf if kdf is not None and kdf.get("alg") == "argon2id" else None
    if record is None:
        new_salt = base64.b64encode(secrets.token_bytes(16)).decode()
        record = created = {"alg": "argon2id", "salt": new_salt, **keyring._argon2}
    salt, params = _kdf_params(record)
    try:
        # The derived key goes straight into its handle: never a local of this frame.
        return KeyHandle(hash_secret_raw(keyring._secret, salt, hash_len=KEY_BYTES, type=Type.ID, **params)), created
    except HashingError as exc:
        raise WrongKeyError(f"the store's passphrase parameters are unusable: {exc}") from None


def _within(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _kdf_params(record: dict[str, Any]) -> tuple[bytes, dict[str, int]]:
    """Salt and Argon2id parameters within bounds: a tampered record must not hang the open.
    Raises WrongKeyError: unreadable or out of bounds."""
    try:
        salt = base64.b64decode(record["salt"], validate=True)
        params = {name: record[name] for name in ARGON2_BOUNDS}
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise WrongKeyError("the store's passphrase record is unreadable") from None
    if len(salt) < 16:
        raise WrongKeyError("the store's passphrase salt is shorter than 16 bytes")
    for name, (low, high) in ARGON2_BOUNDS.items():
        if not _within(params[name], low, high):
            raise WrongKeyError(f"the store's passphrase parameter {name} is out of bounds")
    return salt, params


def _decode_key(raw: bytes, where: str) -> bytes:
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise WrongKeyError(f"{where} does not hold a base64 key") from None
    if len(key) != KEY_BYTES:
        raise WrongKeyError(f"{where} holds {len(key)} bytes; a master key has {KEY_BYTES}")
    return key


def _read_key_file(path: Path, allow_shared: bool) -> bytes | None:
    """The checked key file's bytes, or None. Raises SecurepadError: unreadable, or not private."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecurepadError(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        if not allow_shared:
            check_private_file(path, os.fstat(fd), "key file")
            check_directory(path.parent, "key file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as exc:
        raise SecurepadError(f"cannot read key file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _create_key_file(path: Path, allow_shared: bool) -> bytes:
    """Write a fresh key, mode 0600, hard-linked into place from a private temporary file: a racing
    process reads the winner's whole key. Raises SecurepadError: cannot be created, or a shared directory."""
    if not allow_shared and path.parent.exists():
        check_directory(path.parent, "key file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SecurepadError(f"cannot create key file {path}: {exc.strerror}") from None
    encoded = base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n"
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as handle:
            handle.write(encoded)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_bytes()
    except OSError as exc:
        raise SecurepadError(f"cannot create key file {path}: {exc.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return encoded
