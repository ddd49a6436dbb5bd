"""The master key in a PKCS#11 token (an HSM, a smart card, SoftHSM2).

The key is an AES-256 secret-key object named by its label; made here, it is
private, sensitive, non-extractable and may only encrypt and decrypt.
Sealing is AES-256-GCM in the token with the associated data as AAD: IV (12
bytes, random: one blob per owner-key version is far below the 2**32 bound)
|| ciphertext || tag. The token's key wrap is not used: it binds no
associated data. A PKCS#11 call cannot be interrupted: its deadline is the
module's own.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from typing import Any

from ..errors import IntegrityError, KeySourceKeyError
from .pkcs11_session import TokenLink, binding, one_line
from .pkcs11_uri import Pkcs11Uri
from .source import MasterKeySource, SourceCheck

__all__ = ["Pkcs11Source"]

_IV_BYTES = 12
_TAG_BITS = 128
_MAX_PLAINTEXT = 64
# What tokens answer to a failed GCM tag: SoftHSM2 says CKR_GENERAL_ERROR,
# others CKR_ENCRYPTED_DATA_INVALID (or _LEN_RANGE for a cut blob).
_REJECTED = ("GeneralError", "EncryptedDataInvalid", "EncryptedDataLenRange", "FunctionFailed")


class Pkcs11Source(MasterKeySource):
    """The master key as an AES key object in a PKCS#11 token. Build with ``from_uri``."""

    scheme = "pkcs11"

    def __init__(self, uri: Pkcs11Uri, environ: Mapping[str, str] | None) -> None:
        super().__init__(uri.shown())
        self._uri = uri
        self._link = TokenLink(uri, environ, self.calls)
        self._key_id: str | None = None

    @classmethod
    def from_uri(cls, uri: str, *, environ: Mapping[str, str] | None = None) -> Pkcs11Source:
        return cls(Pkcs11Uri.parse(uri), environ)

    def prepare(self, *, create: bool = False) -> None:
        """Open the session, log in and find the key (``create``: make it when absent).

        Raises:
            KeySourceModuleError: the binding is not installed or the module does not load.
            KeySourceTokenError: no token (or several) matches the URI.
            KeySourceLoginError: the PIN is refused, locked, absent or unreadable.
            KeySourceKeyError: no key has the label (``create`` False), several have it,
                it is no AES-256 encrypt/decrypt key, or it cannot be created.
            KeySourceUnreachableError: the token does not answer or was lost twice.
        """
        self._link.with_key(lambda key: None, create=create)

    def key_id(self) -> str:
        """``pkcs11:token=…;serial=…;object=…;id=…`` of the key found (its CKA_ID tells
        a key made again under the same label from the old one)."""
        if self._key_id is None:
            self._key_id = self._link.with_key(self._link.describe)
        return self._key_id

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """AES-256-GCM in the token: IV (12 bytes) || ciphertext || tag (16 bytes)."""
        if len(plaintext) > _MAX_PLAINTEXT:
            raise ValueError("a master key source seals keys only")
        pkcs11 = binding()
        iv = secrets.token_bytes(_IV_BYTES)
        params = pkcs11.mechanisms.GCMParams(iv, associated_data, _TAG_BITS)

        def seal(key: Any) -> bytes:
            self.calls.add("encrypt")
            try:
                return bytes(key.encrypt(plaintext, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params))
            except (pkcs11.exceptions.MechanismInvalid, pkcs11.exceptions.MechanismParamInvalid) as exc:
                raise self._link.fail(KeySourceKeyError, f"the token does not do AES-GCM ({one_line(exc)})") from None

        return iv + self._link.with_key(seal)

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Raises IntegrityError: the blob is malformed, altered, or bound to other data or another key."""
        if not isinstance(ciphertext, bytes) or len(ciphertext) < _IV_BYTES + _TAG_BITS // 8:
            raise IntegrityError("a blob sealed by the PKCS#11 master key is truncated")
        pkcs11 = binding()
        params = pkcs11.mechanisms.GCMParams(ciphertext[:_IV_BYTES], associated_data, _TAG_BITS)
        rejected = tuple(getattr(pkcs11.exceptions, name) for name in _REJECTED)

        def open_(key: Any) -> bytes:
            self.calls.add("decrypt")
            try:
                return bytes(
                    key.decrypt(ciphertext[_IV_BYTES:], mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params)
                )
            except rejected:
                raise IntegrityError("a blob sealed by the PKCS#11 master key failed authentication") from None

        return self._link.with_key(open_)

    def inspect(self) -> list[SourceCheck]:
        """The key's attributes read back, the PIN's place and the PIN file's mode."""
        names = ("EXTRACTABLE", "NEVER_EXTRACTABLE", "SENSITIVE", "ALWAYS_SENSITIVE", "TOKEN")

        def attributes(key: Any) -> list[bool]:
            self.calls.add("attributes")
            return [bool(key[getattr(binding().Attribute, name)]) for name in names]

        extractable, never, sensitive, always, on_token = self._link.with_key(attributes)
        checks = [
            SourceCheck.of(
                "key-not-extractable",
                not extractable and never,
                "the key cannot be read out of the token (CKA_EXTRACTABLE false, CKA_NEVER_EXTRACTABLE true)",
                f"CKA_EXTRACTABLE {extractable}, CKA_NEVER_EXTRACTABLE {never}:"
                " the key can be, or once could be, read out of the token",
            ),
            SourceCheck.of(
                "key-sensitive",
                sensitive and always,
                "the key's value is never shown (CKA_SENSITIVE and CKA_ALWAYS_SENSITIVE true)",
                f"CKA_SENSITIVE {sensitive}, CKA_ALWAYS_SENSITIVE {always}: the key's value is, or once was, readable",
            ),
            SourceCheck.of(
                "key-on-token",
                on_token,
                "the key is a token object",
                "the key is a session object: it ends with its session",
            ),
            SourceCheck.of(
                "pin-not-in-uri",
                "pin-value" not in self._uri.query,
                "the URI names where the PIN is, not the PIN",
                "the URI holds the PIN (pin-value): use pin-source=file:/path or pin-source=env:NAME",
            ),
        ]
        source = self._uri.query.get("pin-source", "")
        if source and not source.startswith("env:"):
            checks.append(self._pin_file_check())
        return checks

    def _pin_file_check(self) -> SourceCheck:
        path = self._link.pin_path()
        try:
            info = os.stat(path)
        except OSError as exc:
            return SourceCheck("pin-file-private", False, f"PIN file {path}: {exc.strerror}")
        mode = stat.S_IMODE(info.st_mode)
        private = not mode & 0o077 and (not hasattr(os, "geteuid") or info.st_uid == os.geteuid())
        return SourceCheck.of(
            "pin-file-private",
            private,
            f"PIN file {path} is the current user's, mode {mode:04o}",
            f"PIN file {path} (uid {info.st_uid}, mode {mode:04o}) may be read by others: chmod 600 it",
        )
