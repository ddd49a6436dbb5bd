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
  once, then the call fails (``KeySourceUnreachableError``): bounded retries.
  A PKCS#11 call cannot be interrupted: its deadline is the module's own
  (a network HSM's client configuration sets it);
* one session per source, used under a lock (PKCS#11 sessions are not
  safe to share between threads), opened again in a forked child.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, unquote_to_bytes, urlsplit

from ..errors import (
    IntegrityError,
    KeySourceError,
    KeySourceKeyError,
    KeySourceLoginError,
    KeySourceModuleError,
    KeySourceTokenError,
    KeySourceUnreachableError,
    KeySourceUriError,
)
from .source import CallCounter, MasterKeySource, SourceCheck, redact_uri

__all__ = ["Pkcs11Source", "Pkcs11Uri"]

T = TypeVar("T")

_IV_BYTES = 12
_TAG_BITS = 128
_KEY_BITS = 256
_MAX_PLAINTEXT = 64
# Path attributes (RFC 7512, section 2.3) this source reads; others are refused.
_PATH_ATTRIBUTES = frozenset({"token", "serial", "slot-id", "manufacturer", "model", "object", "id", "type"})
_QUERY_ATTRIBUTES = frozenset({"module-path", "module-name", "pin-source", "pin-value"})
# Where ``module-name=NAME`` is looked for (``libNAME.so`` or ``NAME.so``).
MODULE_DIRS = (
    "/usr/lib/x86_64-linux-gnu/pkcs11",
    "/usr/lib/aarch64-linux-gnu/pkcs11",
    "/usr/lib/pkcs11",
    "/usr/lib/softhsm",
    "/usr/local/lib/softhsm",
    "/usr/lib64/pkcs11",
    "/usr/local/lib",
)
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
#: The PIN's environment variable when the URI names no ``pin-source``.
DEFAULT_PIN_ENV = "SECUREPAD_PKCS11_PIN"


@dataclass(frozen=True)
class Pkcs11Uri:
    """A parsed RFC 7512 URI naming one secret key (values percent-decoded)."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    id: bytes | None = field(default=None)

    @classmethod
    def parse(cls, uri: str) -> Pkcs11Uri:
        """Raises KeySourceUriError: not a ``pkcs11:`` URI, a repeated, unknown or
        empty attribute, no ``object`` (the key's label), no token, no module."""
        shown = redact_uri(uri)
        if not isinstance(uri, str) or not uri[:7].lower() == "pkcs11:":
            raise KeySourceUriError(f"{shown!r} is not a pkcs11: URI")
        body = uri[7:]
        if "#" in body:
            raise KeySourceUriError(f"master key URI {shown!r}: a PKCS#11 URI has no fragment")
        path_part, _, query_part = body.partition("?")
        path, key_id = _attributes(path_part, ";", _PATH_ATTRIBUTES, shown)
        query, _ = _attributes(query_part, "&", _QUERY_ATTRIBUTES, shown)
        if "object" not in path:
            raise KeySourceUriError(f"master key URI {shown!r} names no key: add object=<the key's label>")
        if not {"token", "serial", "slot-id"} & path.keys():
            raise KeySourceUriError(f"master key URI {shown!r} names no token: add token=<the token's label>")
        if path.get("type", "secret-key") != "secret-key":
            raise KeySourceUriError(
                f"master key URI {shown!r}: the master key is a secret-key object, not {path['type']}"
            )
        if not {"module-path", "module-name"} & query.keys():
            raise KeySourceUriError(
                f"master key URI {shown!r} names no PKCS#11 module: add ?module-path=/path/to/module.so"
            )
        if "slot-id" in path and not path["slot-id"].isdigit():
            raise KeySourceUriError(f"master key URI {shown!r}: slot-id must be a decimal number")
        return cls(path, query, key_id)

    def shown(self) -> str:
        """The URI in canonical form without ``pin-value``."""
        parts = [f"{name}={_quote(value)}" for name, value in self.path.items() if name != "id"]
        if self.id is not None:
            parts.append("id=" + "".join(f"%{b:02x}" for b in self.id))
        query = [f"{name}={_quote(value)}" for name, value in self.query.items() if name != "pin-value"]
        return "pkcs11:" + ";".join(parts) + ("?" + "&".join(query) if query else "")


def _quote(value: str) -> str:
    return quote(value, safe="/:-_.~@!$'()*+,")


def _attributes(part: str, separator: str, known: frozenset[str], shown: str) -> tuple[dict[str, str], bytes | None]:
    values: dict[str, str] = {}
    key_id: bytes | None = None
    if not part:
        return values, key_id
    for item in part.split(separator):
        name, equals, raw = item.partition("=")
        name = name.lower()
        if not equals or not raw:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} has no value")
        if name not in known and not name.startswith("x-"):
            raise KeySourceUriError(f"master key URI {shown!r}: unknown attribute {name!r}")
        if name in values:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is given twice")
        if _BAD_PERCENT.search(raw):
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is badly percent-encoded")
        if name == "id":
            key_id = unquote_to_bytes(raw)
            values[name] = key_id.hex()
            continue
        try:
            values[name] = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is not UTF-8") from None
    return values, key_id


def _binding() -> Any:
    try:
        import pkcs11
    except ImportError:
        raise KeySourceModuleError(
            "the PKCS#11 binding (python-pkcs11) is not installed: pip install 'securepad[pkcs11]'"
        ) from None
    return pkcs11


_LIBRARIES: dict[str, Any] = {}
_LIBRARIES_LOCK = threading.Lock()


@dataclass
class _Token:
    """One token's session in this process (PKCS#11 logs a process in, not a
    session): every source on the token uses it, one call at a time."""

    token: Any
    lock: threading.RLock
    pid: int
    session: Any = None
    # Keys found in this session, by (label, CKA_ID asked for): a second source
    # of the same key (a store opened again) does not search the token again.
    keys: dict[tuple[str, bytes | None], Any] = field(default_factory=dict)
    key_ids: dict[tuple[str, bytes | None], str] = field(default_factory=dict)

    def drop(self) -> None:
        self.keys.clear()
        self.key_ids.clear()
        session, self.session = self.session, None
        if session is not None and self.pid == os.getpid():
            # A session the token already forgot has nothing left to close.
            with contextlib.suppress(Exception):
                session.close()


_SHARED: dict[tuple[str, int], _Token] = {}
_SHARED_LOCK = threading.Lock()


class Pkcs11Source(MasterKeySource):
    """The master key as an AES key object in a PKCS#11 token. Build with ``from_uri``."""

    scheme = "pkcs11"

    def __init__(self, uri: Pkcs11Uri, environ: Mapping[str, str] | None) -> None:
        self._uri = uri
        self._environ = environ
        self._shown = uri.shown()
        self.calls = CallCounter()
        self._shared: _Token | None = None
        self._key: Any = None
        self._key_session: Any = None
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

    # -- the session ---------------------------------------------------------------------

    def _fail(self, error: type[KeySourceError], what: str) -> KeySourceError:
        return error(f"PKCS#11 master key {self._shown}: {what}")

    def _module_path(self) -> str:
        query = self._uri.query
        if "module-path" in query:
            path = query["module-path"]
            if not os.path.isfile(path):
                raise self._fail(KeySourceModuleError, f"no PKCS#11 module at {path}")
            return path
        name = query["module-name"]
        for directory in MODULE_DIRS:
            for candidate in (f"lib{name}.so", f"{name}.so"):
                path = os.path.join(directory, candidate)
                if os.path.isfile(path):
                    return path
        raise self._fail(KeySourceModuleError, f"no PKCS#11 module named {name} in {', '.join(MODULE_DIRS)}")

    def _library(self) -> Any:
        pkcs11 = _binding()
        path = self._module_path()
        with _LIBRARIES_LOCK:
            lib = _LIBRARIES.get(path)
            if lib is None:
                try:
                    lib = pkcs11.lib(path)
                except pkcs11.PKCS11Error as exc:
                    raise self._fail(KeySourceModuleError, f"the module cannot be loaded ({_one_line(exc)})") from None
                _LIBRARIES[path] = lib
            elif self._shared is not None and self._shared.pid != os.getpid():
                lib.reinitialize()  # a forked child: the parent's sessions are not its own
        return lib

    def _pin(self) -> str:
        query = self._uri.query
        environ = os.environ if self._environ is None else self._environ
        if "pin-value" in query:
            return query["pin-value"]
        source = query.get("pin-source")
        if source is None:
            pin = environ.get(DEFAULT_PIN_ENV)
            if not pin:
                raise self._fail(
                    KeySourceLoginError,
                    f"no PIN: add pin-source=file:/path or pin-source=env:NAME, or set {DEFAULT_PIN_ENV}",
                )
            return pin
        if source.startswith("env:"):
            name = source[4:]
            pin = environ.get(name)
            if not pin:
                raise self._fail(KeySourceLoginError, f"the PIN's environment variable {name} is not set")
            return pin
        path = self._pin_path()
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise self._fail(KeySourceLoginError, f"cannot read the PIN file {path}: {reason}") from None
        pin = text.rstrip("\r\n")
        if not pin:
            raise self._fail(KeySourceLoginError, f"the PIN file {path} is empty")
        return pin

    def _pin_path(self) -> Path:
        source = self._uri.query["pin-source"]
        if source.startswith("file:"):
            parsed = urlsplit(source)
            if parsed.netloc not in ("", "localhost"):
                raise self._fail(KeySourceLoginError, "pin-source names a file on another host")
            return Path(unquote(parsed.path))
        return Path(source)

    def _token(self) -> _Token:
        """The token the URI names, shared by every source of this process on it."""
        if self._shared is not None and self._shared.pid == os.getpid():
            return self._shared
        # The PIN is read once per source even when the token's session is
        # open already: a source whose PIN is missing fails the same way alone.
        self._pin()
        pkcs11 = _binding()
        lib = self._library()
        path = self._uri.path
        try:
            tokens = list(
                lib.get_tokens(
                    token_label=path.get("token"),
                    token_serial=path["serial"].encode() if "serial" in path else None,
                )
            )
        except pkcs11.PKCS11Error as exc:
            raise self._fail(KeySourceUnreachableError, f"the module lists no slots ({_one_line(exc)})") from None
        tokens = [t for t in tokens if _token_matches(t, path)]
        if not tokens:
            raise self._fail(KeySourceTokenError, "no token matches (token, serial or slot-id)")
        if len(tokens) > 1:
            raise self._fail(KeySourceTokenError, f"{len(tokens)} tokens match: add serial= or slot-id=")
        token = tokens[0]
        with _SHARED_LOCK:
            place = (self._module_path(), token.slot.slot_id)
            shared = _SHARED.get(place)
            if shared is None or shared.pid != os.getpid():
                shared = _SHARED[place] = _Token(token, threading.RLock(), os.getpid())
        self._shared = shared
        return shared

    def _session(self, shared: _Token) -> Any:
        """The token's logged-in session, opened when there is none. Under ``shared.lock``."""
        if shared.session is not None:
            return shared.session
        pkcs11 = _binding()
        pin = self._pin()
        self.calls.add("session")
        try:
            try:
                session = shared.token.open(rw=True, user_pin=pin)
            except pkcs11.exceptions.UserAlreadyLoggedIn:
                # The login is the process's, not the session's: another session
                # of this process (another library's, say) logged in already.
                session = shared.token.open(rw=True)
        except (pkcs11.exceptions.PinIncorrect, pkcs11.exceptions.PinInvalid, pkcs11.exceptions.PinLenRange):
            raise self._fail(KeySourceLoginError, "the token refused the PIN") from None
        except pkcs11.exceptions.PinLocked:
            raise self._fail(KeySourceLoginError, "the token's PIN is locked (too many wrong PINs)") from None
        except pkcs11.exceptions.PinExpired:
            raise self._fail(KeySourceLoginError, "the token's PIN has expired") from None
        except pkcs11.exceptions.UserPinNotInitialized:
            raise self._fail(KeySourceLoginError, "the token has no user PIN yet (initialize it)") from None
        except pkcs11.PKCS11Error as exc:
            raise self._fail(KeySourceUnreachableError, f"no session ({_one_line(exc)})") from None
        finally:
            del pin
        shared.session = session
        return session

    def _find(self, session: Any, *, create: bool) -> Any:
        pkcs11 = _binding()
        label = self._uri.path["object"]
        self.calls.add("find")
        try:
            keys = list(
                session.get_objects(
                    {
                        pkcs11.Attribute.CLASS: pkcs11.ObjectClass.SECRET_KEY,
                        pkcs11.Attribute.LABEL: label,
                        **({pkcs11.Attribute.ID: self._uri.id} if self._uri.id is not None else {}),
                    }
                )
            )
        except pkcs11.PKCS11Error as exc:
            raise self._fail(KeySourceUnreachableError, f"cannot search the token ({_one_line(exc)})") from None
        if len(keys) > 1:
            raise self._fail(KeySourceKeyError, f"{len(keys)} keys are labelled {label!r}: add id= to the URI")
        if keys:
            key = keys[0]
            if key[pkcs11.Attribute.KEY_TYPE] != pkcs11.KeyType.AES or key[pkcs11.Attribute.VALUE_LEN] != 32:
                raise self._fail(KeySourceKeyError, f"the key labelled {label!r} is not an AES-256 key")
            if not (key[pkcs11.Attribute.ENCRYPT] and key[pkcs11.Attribute.DECRYPT]):
                raise self._fail(KeySourceKeyError, f"the key labelled {label!r} may not encrypt and decrypt")
            return key
        if not create:
            raise self._fail(KeySourceKeyError, f"the token holds no key labelled {label!r}")
        self.calls.add("create")
        try:
            return session.generate_key(
                pkcs11.KeyType.AES,
                _KEY_BITS,
                label=label,
                id=self._uri.id if self._uri.id is not None else secrets.token_bytes(16),
                store=True,
                template={
                    pkcs11.Attribute.TOKEN: True,
                    pkcs11.Attribute.PRIVATE: True,
                    pkcs11.Attribute.SENSITIVE: True,
                    pkcs11.Attribute.EXTRACTABLE: False,
                    pkcs11.Attribute.MODIFIABLE: False,
                    pkcs11.Attribute.ENCRYPT: True,
                    pkcs11.Attribute.DECRYPT: True,
                    pkcs11.Attribute.WRAP: False,
                    pkcs11.Attribute.UNWRAP: False,
                    pkcs11.Attribute.SIGN: False,
                    pkcs11.Attribute.VERIFY: False,
                    pkcs11.Attribute.DERIVE: False,
                },
            )
        except pkcs11.PKCS11Error as exc:
            raise self._fail(
                KeySourceKeyError, f"cannot create the key labelled {label!r} ({_one_line(exc)})"
            ) from None

    def _with_key(self, run: Callable[[Any], T], *, create: bool = False) -> T:
        """``run(key)`` under the lock, opening the session (again, once, when it was lost)."""
        pkcs11 = _binding()
        lost = (
            pkcs11.exceptions.SessionHandleInvalid,
            pkcs11.exceptions.SessionClosed,
            pkcs11.exceptions.DeviceRemoved,
            pkcs11.exceptions.TokenNotPresent,
            pkcs11.exceptions.ObjectHandleInvalid,
            pkcs11.exceptions.KeyHandleInvalid,
            pkcs11.exceptions.UserNotLoggedIn,
        )
        shared = self._token()
        with shared.lock:
            for attempt in (1, 2):
                session = self._session(shared)
                try:
                    if self._key is None or self._key_session is not session:
                        place = (self._uri.path["object"], self._uri.id)
                        if place not in shared.keys:
                            shared.keys[place] = self._find(session, create=create)
                        self._key, self._key_session = shared.keys[place], session
                    return run(self._key)
                except lost as exc:
                    shared.drop()
                    if attempt == 2:
                        raise self._fail(KeySourceUnreachableError, f"the token was lost ({_one_line(exc)})") from None
                except pkcs11.exceptions.DeviceError as exc:
                    shared.drop()
                    raise self._fail(KeySourceUnreachableError, f"the token failed ({_one_line(exc)})") from None
        raise AssertionError("unreachable")  # pragma: no cover

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
        self._with_key(lambda key: None, create=create)

    def key_id(self) -> str:
        """``pkcs11:token=…;serial=…;object=…;id=…`` of the key found (its CKA_ID tells
        a key made again under the same label from the old one).

        Raises:
            KeySourceError: as ``prepare``.
        """
        if self._key_id is None:
            pkcs11 = _binding()

            def describe(key: Any) -> str:
                shared, place = self._token(), (self._uri.path["object"], self._uri.id)
                if place not in shared.key_ids:
                    self.calls.add("attributes")
                    token, raw_id, label = shared.token, key[pkcs11.Attribute.ID], key[pkcs11.Attribute.LABEL]
                    shared.key_ids[place] = (
                        f"pkcs11:token={_quote(token.label)};serial={_quote(_serial(token))};"
                        f"object={_quote(label)};id=" + "".join(f"%{b:02x}" for b in bytes(raw_id))
                    )
                return shared.key_ids[place]

            self._key_id = self._with_key(describe)
        return self._key_id

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """AES-256-GCM in the token: IV (12 bytes) || ciphertext || tag (16 bytes).

        Raises:
            KeySourceError: the token cannot be used (as ``prepare``).
        """
        if len(plaintext) > _MAX_PLAINTEXT:
            raise ValueError("a master key source seals keys only")
        pkcs11 = _binding()
        iv = secrets.token_bytes(_IV_BYTES)
        params = pkcs11.mechanisms.GCMParams(iv, associated_data, _TAG_BITS)

        def seal(key: Any) -> bytes:
            self.calls.add("encrypt")
            try:
                return bytes(key.encrypt(plaintext, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params))
            except (pkcs11.exceptions.MechanismInvalid, pkcs11.exceptions.MechanismParamInvalid) as exc:
                raise self._fail(KeySourceKeyError, f"the token does not do AES-GCM ({_one_line(exc)})") from None

        return iv + self._with_key(seal)

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Open an ``encrypt`` blob in the token.

        Raises:
            IntegrityError: the blob is malformed, altered, or bound to other data or another key.
            KeySourceError: the token cannot be used (as ``prepare``).
        """
        if not isinstance(ciphertext, bytes) or len(ciphertext) < _IV_BYTES + _TAG_BITS // 8:
            raise IntegrityError("a blob sealed by the PKCS#11 master key is truncated")
        pkcs11 = _binding()
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

        return self._with_key(open_)

    def inspect(self) -> list[SourceCheck]:
        """The key's attributes read back, the PIN's place and the PIN file's mode.

        Raises:
            KeySourceError: the token cannot be used (as ``prepare``).
        """
        pkcs11 = _binding()
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

        got = self._with_key(attributes)
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
        path = self._pin_path()
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
        self._key = self._key_session = None


def _token_matches(token: Any, path: Mapping[str, str]) -> bool:
    if "slot-id" in path and int(path["slot-id"]) != token.slot.slot_id:
        return False
    if "manufacturer" in path and path["manufacturer"] != token.manufacturer_id.strip():
        return False
    return "model" not in path or path["model"] == token.model.strip()


def _serial(token: Any) -> str:
    serial = token.serial
    return (serial.decode("ascii", "replace") if isinstance(serial, bytes) else str(serial)).strip()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:160] + "..."
