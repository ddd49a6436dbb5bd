"""Master key sources that keep the key outside the process: a PKCS#11 token, a KMS.

What a source guarantees: ``encrypt`` and ``decrypt`` are one call each and
bind the associated data (else ``IntegrityError``); ``key_id`` names the key
and is never a secret; ``shown_uri`` carries no secret; every failure is a
one-line ``KeySourceError`` subclass. A source's module is imported only when
a URI of its scheme is used, so its client library is optional.
"""

from __future__ import annotations

import abc
import importlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import KeySourceModuleError, KeySourceUriError

__all__ = ["SCHEMES", "CallCounter", "MasterKeySource", "SourceCheck", "open_source", "redact_uri"]

#: URI scheme -> "module:Class" of the source that answers it.
SCHEMES: dict[str, str] = {
    "pkcs11": "securepad.keys.pkcs11:Pkcs11Source",
    "aws-kms": "securepad.keys.aws_kms:AwsKmsSource",
}

# What may follow a secret-bearing attribute name in a URI, up to its separator.
_SECRET_ATTRIBUTES = re.compile(r"(?i)\b(pin-value|password|secret|token-value|credentials?)=[^;&?#]*")


@dataclass(frozen=True)
class SourceCheck:
    """One audit fact about a source: a kebab-case name, whether it holds, one line (no secret)."""

    name: str
    ok: bool
    detail: str

    @classmethod
    def of(cls, name: str, ok: bool, good: str, bad: str) -> SourceCheck:
        """The check named ``name``, its detail ``good`` when it holds, else ``bad``."""
        return cls(name, ok, good if ok else bad)


class CallCounter:
    """Calls this process made into a token or KMS, by kind ("encrypt", "session", ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + count

    def total(self, *kinds: str) -> int:
        """The calls of ``kinds`` (of every kind when none is given)."""
        with self._lock:
            return sum(n for kind, n in self._counts.items() if not kinds or kind in kinds)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class MasterKeySource(abc.ABC):
    """A master key held by a token or a KMS, used through it and never read out.
    Every method but ``from_uri`` and ``shown_uri`` may raise a ``KeySourceError`` subclass."""

    scheme: ClassVar[str]

    def __init__(self, shown_uri: str) -> None:
        #: The URI without its secrets: what errors, logs, reports and ``repr`` show.
        self.shown_uri = shown_uri
        self.calls = CallCounter()

    @classmethod
    @abc.abstractmethod
    def from_uri(cls, uri: str, *, environ: Mapping[str, str] | None = None) -> MasterKeySource:
        """The source ``uri`` names, parsed only (no I/O).
        Raises KeySourceUriError: the URI is malformed or has an unknown or missing attribute."""

    @abc.abstractmethod
    def prepare(self, *, create: bool = False) -> None:
        """Connect, log in and find the key, once; ``create``: make an absent key."""

    @abc.abstractmethod
    def key_id(self) -> str:
        """The key's stable identifier (not a secret), recorded by the store."""

    @abc.abstractmethod
    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Seal ``plaintext`` (a key: at most 64 bytes) bound to ``associated_data``, in one call."""

    @abc.abstractmethod
    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Open what ``encrypt`` sealed, in one call. Raises IntegrityError: the blob was altered,
        or sealed with other associated data or under another key."""

    @abc.abstractmethod
    def inspect(self) -> list[SourceCheck]:
        """What the audit checks of this source (its key's attributes, no secret in the URI)."""

    def close(self) -> None:  # noqa: B027 - a source without a session of its own has nothing to release
        """Release what the source holds of its own (a token's session is the process's). Idempotent."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shown_uri}>"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("master key sources cannot be pickled")


def open_source(uri: str, *, environ: Mapping[str, str] | None = None) -> MasterKeySource:
    """The source ``uri`` names (parsed, not yet connected).

    Raises:
        KeySourceUriError: unknown scheme, or a malformed URI.
        KeySourceModuleError: the source's client library is not installed.
    """
    scheme = uri.split(":", 1)[0].lower() if isinstance(uri, str) and ":" in uri else ""
    if scheme not in SCHEMES:
        known = ", ".join(sorted(SCHEMES))
        raise KeySourceUriError(f"master key URI {redact_uri(uri)!r}: unknown scheme; securepad knows {known}")
    module_name, _, class_name = SCHEMES[scheme].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KeySourceModuleError(
            f"master key URI {redact_uri(uri)!r} needs a client library that is not installed ({exc.name}):"
            f" pip install 'securepad[{scheme}]'"
        ) from None
    source_class: type[MasterKeySource] = getattr(module, class_name)
    return source_class.from_uri(uri, environ=environ)


def redact_uri(uri: object) -> str:
    """``uri`` with every secret-bearing attribute's value replaced by ``***``. Never raises."""
    text = uri if isinstance(uri, str) else repr(type(uri))
    text = _SECRET_ATTRIBUTES.sub(lambda m: f"{m.group(1)}=***", text)
    return text if len(text) <= 300 else text[:300] + "..."
