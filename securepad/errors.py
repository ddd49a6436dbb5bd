"""The exception hierarchy. Every error securepad raises is a ``SecurepadError``.

The hierarchy is shallow on purpose: callers catch ``NotFoundError`` for
"you cannot have this entry", whatever the reason (absent, another owner's,
outside the policy's scope, expired for a non-owner), so that no reason leaks.
"""

from __future__ import annotations

__all__ = [
    "ExpiredError",
    "IntegrityError",
    "InvalidArgumentError",
    "KeySourceError",
    "KeySourceKeyError",
    "KeySourceLoginError",
    "KeySourceModuleError",
    "KeySourceTokenError",
    "KeySourceUnreachableError",
    "KeySourceUriError",
    "NotFoundError",
    "PolicyError",
    "QuotaExceededError",
    "SecurepadError",
    "StorageFullError",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreUnavailableError",
    "WrongKeyError",
]


class SecurepadError(Exception):
    """Base class of every error raised by securepad."""


class NotFoundError(SecurepadError):
    """The entry does not exist, is not the caller's, or is outside its scope.

    The message never says which: all of these look the same to the caller.
    """


class ExpiredError(NotFoundError):
    """The caller's own entry has expired; it is never served again."""


class InvalidArgumentError(SecurepadError, ValueError):
    """An argument is malformed: bad mode, negative size, start > end, unknown field."""


class IntegrityError(SecurepadError):
    """Authentication failed: the stored data was tampered with or corrupted."""


class WrongKeyError(SecurepadError):
    """The master key does not open this store."""


class PolicyError(SecurepadError):
    """A policy file is unreadable, has an unknown key, or has a bad value."""


class QuotaExceededError(SecurepadError):
    """A put would exceed the owner's quota or the policy's entry size limit."""


class StoreBusyError(SecurepadError):
    """The store's write lock could not be obtained in time."""


class StoreUnavailableError(SecurepadError):
    """The database server cannot be reached, or did not answer in time.

    Retryable, like ``StoreBusyError``: nothing was written, except where the
    message says a write may have been applied (a connection lost during
    COMMIT); then ``maybe_stored`` holds the ids of the entries that may be
    stored: get them before writing the same again.
    """

    def __init__(self, message: str, *, maybe_stored: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.maybe_stored = maybe_stored


class StorageFullError(SecurepadError):
    """The disk (or the database's size limit) is full: the write was rolled back; free space and retry."""


class StoreCorruptError(SecurepadError):
    """The store's file is damaged or is not a securepad store (well-formed tampering is ``IntegrityError``)."""


class KeySourceError(SecurepadError):
    """The master key's source (a PKCS#11 token, a KMS) cannot be used; the one-line message has no secret."""


class KeySourceUriError(KeySourceError, InvalidArgumentError):
    """A master key URI is malformed, of an unknown scheme, or has an unknown or missing attribute."""


class KeySourceModuleError(KeySourceError):
    """The source's client cannot be loaded: the PKCS#11 module, or the Python package the source needs."""


class KeySourceTokenError(KeySourceError):
    """No token matches the URI (PKCS#11), or the service named by the URI is unknown (KMS)."""


class KeySourceLoginError(KeySourceError):
    """The source refused this process: wrong, locked or unreadable PIN; missing or rejected credentials."""


class KeySourceKeyError(KeySourceError):
    """The key the URI names does not exist, is not a key securepad can use, or is disabled."""


class KeySourceUnreachableError(KeySourceError):
    """The source did not answer within its deadline, after its bounded retries. Retryable."""
