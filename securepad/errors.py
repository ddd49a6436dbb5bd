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

    Retryable, like ``StoreBusyError``: nothing was written (a transaction
    that lost its connection is rolled back by the server), except where the
    message says a write may have been applied: a connection lost during
    COMMIT, or a put sent in one message (PostgreSQL) whose connection was
    lost and whose outcome nothing could tell (the message names the entry
    that may be stored: get it to know). The store is used again as soon as
    the server answers.

    ``maybe_stored`` holds the ids of the entries such a message names (empty
    for every other error): get them before writing the same again.
    """

    maybe_stored: tuple[str, ...] = ()

    def __init__(self, message: str, *, maybe_stored: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.maybe_stored = maybe_stored


class StorageFullError(SecurepadError):
    """The disk (or the database's size limit) is full: the write was rolled back.

    The store is as it was before the call; free space (or run ``gc``) and retry.
    """


class StoreCorruptError(SecurepadError):
    """The store's file is damaged or is not a securepad store at all.

    Raised where SQLite detects the damage (at open, or on the page a read
    touches). Tampering that keeps the file well-formed is ``IntegrityError``.
    """
