"""The master key in a PKCS#11 token (an HSM, a smart card, SoftHSM2).

The key is an AES-256 secret-key object in the token, named by its label
(RFC 7512 URI ``pkcs11:token=…;object=…?module-path=…&pin-source=…``).
When it is made here it is a token object that is private, sensitive and
not extractable, usable to encrypt and decrypt only.

Sealing is AES-256-GCM computed inside the token (``CKM_AES_GCM``) with the
associated data as GCM's AAD: a blob is the 12-byte IV, the ciphertext and
the 16-byte tag. The token's key-wrap mechanisms (``CKM_AES_KEY_WRAP_PAD``)
are not used: they bind no associated data, so the store id, owner and key
version would have to be bound by a second construction, and they wrap key
objects (an owner key would first have to become a token object: more
calls). The IV is drawn here from the OS's CSPRNG (PKCS#11 2.40 has the
caller supply it); each master key seals one blob per owner-key version,
far below the 2**32 bound of random 96-bit IVs.

Rules this module keeps:

* the PIN is read from ``pin-source`` (a file, or ``env:NAME``) when the
  session is opened and is never stored, shown or put in an error;
* every PKCS#11 failure becomes a one-line ``KeySourceError`` subclass
  naming ``shown_uri``; a decryption the token rejects is ``IntegrityError``;
* a session lost (device removed, session closed, a fork) is opened again
  once, then the call fails (``KeySourceUnreachableError``): bounded retries
  (``pkcs11_session.TokenLink``). A PKCS#11 call cannot be interrupted: its
  deadline is the module's own (a network HSM's client configuration sets it).
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
from .source import CallCounter, MasterKeySource, SourceCheck

__all__ = ["Pkcs11Source"]

_IV_BYTES = 12
_TAG_BITS = 128
_MAX_PLAINTEXT = 64


class Pkcs11Source(MasterKeySource):
    """The master key as an AES key object in a PKCS#11 token. Build with ``from_uri``."""

    scheme = "pkcs11"

    def __init__(self, uri: Pkcs11Uri, environ: Mapping[str, str] | None) -> None:
        self._uri = uri
        self._shown = uri.shown()
        self.calls = CallCounter()
        self._link = TokenLink(uri, environ, self.calls)
        self._key_id: str | None = None

    @classmethod
    def from_uri(cls, uri: str, *, environ: Mapping[str, str] | None = None) -> Pkcs11Source:
        """The source of ``uri`` (RFC 7512), parsed only.

        Raises:
            KeySourceUriError: the URI is malformed, has an unknown attribute, or
                names no key (``object``), no token or no module.
        """
        return cls(Pkcs11Uri.parse(uri), environ)

    @property
    def shown_uri(self) -> str:
        return self._shown

    @property
    def pin_in_uri(self) -> bool:
        """Whether the URI carries the PIN itself (``pin-value``), which the audit refuses."""
        return "pin-value" in self._uri.query

    # -- the interface -------------------------------------------------------------------

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
        a key made again under the same label from the old one).

        Raises:
            KeySourceError: as ``prepare``.
        """
        if self._key_id is None:
            self._key_id = self._link.with_key(self._link.describe)
        return self._key_id

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """AES-256-GCM in the token: IV (12 bytes) || ciphertext || tag (16 bytes).

        Raises:
            KeySourceError: the token cannot be used (as ``prepare``).
        """
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
        """Open an ``encrypt`` blob in the token.

        Raises:
            IntegrityError: the blob is malformed, altered, or bound to other data or another key.
            KeySourceError: the token cannot be used (as ``prepare``).
        """
        if not isinstance(ciphertext, bytes) or len(ciphertext) < _IV_BYTES + _TAG_BITS // 8:
            raise IntegrityError("a blob sealed by the PKCS#11 master key is truncated")
        pkcs11 = binding()
        params = pkcs11.mechanisms.GCMParams(ciphertext[:_IV_BYTES], associated_data, _TAG_BITS)
        # What tokens answer to a failed GCM tag: SoftHSM2 says CKR_GENERAL_ERROR,
        # others CKR_ENCRYPTED_DATA_INVALID (or _LEN_RANGE for a cut blob).
        rejected = (
            pkcs11.exceptions.GeneralError,
            pkcs11.exceptions.EncryptedDataInvalid,
            pkcs11.exceptions.EncryptedDataLenRange,
            pkcs11.exceptions.FunctionFailed,
        )

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
        """The key's attributes read back, the PIN's place and the PIN file's mode.

        Raises:
            KeySourceError: the token cannot be used (as ``prepare``).
        """
        pkcs11 = binding()
        a = pkcs11.Attribute

        def attributes(key: Any) -> dict[str, bool]:
            self.calls.add("attributes")
            names = {
                "extractable": a.EXTRACTABLE,
                "never_extractable": a.NEVER_EXTRACTABLE,
                "sensitive": a.SENSITIVE,
                "always_sensitive": a.ALWAYS_SENSITIVE,
                "token": a.TOKEN,
            }
            return {name: bool(key[attribute]) for name, attribute in names.items()}

        got = self._link.with_key(attributes)
        checks = [
            SourceCheck(
                "key-not-extractable",
                not got["extractable"] and got["never_extractable"],
                "the key cannot be read out of the token (CKA_EXTRACTABLE false, CKA_NEVER_EXTRACTABLE true)"
                if not got["extractable"] and got["never_extractable"]
                else f"CKA_EXTRACTABLE {got['extractable']}, CKA_NEVER_EXTRACTABLE {got['never_extractable']}:"
                " the key can be, or once could be, read out of the token",
            ),
            SourceCheck(
                "key-sensitive",
                got["sensitive"] and got["always_sensitive"],
                "the key's value is never shown (CKA_SENSITIVE and CKA_ALWAYS_SENSITIVE true)"
                if got["sensitive"] and got["always_sensitive"]
                else f"CKA_SENSITIVE {got['sensitive']}, CKA_ALWAYS_SENSITIVE {got['always_sensitive']}:"
                " the key's value is, or once was, readable",
            ),
            SourceCheck(
                "key-on-token",
                got["token"],
                "the key is a token object"
                if got["token"]
                else "the key is a session object: it ends with its session",
            ),
            SourceCheck(
                "pin-not-in-uri",
                not self.pin_in_uri,
                "the URI names where the PIN is, not the PIN"
                if not self.pin_in_uri
                else "the URI holds the PIN (pin-value): use pin-source=file:/path or pin-source=env:NAME",
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
        detail = (
            f"PIN file {path} is the current user's, mode {mode:04o}"
            if private
            else f"PIN file {path} (uid {info.st_uid}, mode {mode:04o}) may be read by others: chmod 600 it"
        )
        return SourceCheck("pin-file-private", private, detail)

    def close(self) -> None:
        """Forget the key's handle. The token's session stays open for the
        process's other sources (a login is the process's, not a session's)."""
        self._link.forget_key()
