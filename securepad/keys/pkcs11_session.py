"""The way into a PKCS#11 token: its module, the process's session, the key.

PKCS#11 logs in a process, not a session, and its sessions are not thread-safe:
each token has one session per process, shared by every source on it and used
under a lock. A lost session is opened again once, then the call fails. The
PIN is read when the session is opened and never kept.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from ..errors import (
    KeySourceError,
    KeySourceKeyError,
    KeySourceLoginError,
    KeySourceModuleError,
    KeySourceTokenError,
    KeySourceUnreachableError,
)
from .pkcs11_uri import Pkcs11Uri, quote_value
from .source import CallCounter

__all__ = ["DEFAULT_PIN_ENV", "MODULE_DIRS", "TokenLink", "binding", "one_line"]

T = TypeVar("T")

_KEY_BITS = 256
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
#: The PIN's environment variable when the URI names no ``pin-source``.
DEFAULT_PIN_ENV = "SECUREPAD_PKCS11_PIN"
# A key made here: a private token object, never readable out of the token, that only encrypts and decrypts.
_NEW_KEY = dict.fromkeys(("TOKEN", "PRIVATE", "SENSITIVE", "ENCRYPT", "DECRYPT"), True) | dict.fromkeys(
    ("EXTRACTABLE", "MODIFIABLE", "WRAP", "UNWRAP", "SIGN", "VERIFY", "DERIVE"), False
)
# What the binding raises when the session or the key's handle was lost (opened again once).
_LOST = (
    *("SessionHandleInvalid", "SessionClosed", "DeviceRemoved", "TokenNotPresent", "ObjectHandleInvalid"),
    *("KeyHandleInvalid", "UserNotLoggedIn"),
)
# The token's answers to a PIN it will not take, by the binding's exception name.
_PIN_REFUSALS = {
    **dict.fromkeys(("PinIncorrect", "PinInvalid", "PinLenRange"), "the token refused the PIN"),
    "PinLocked": "the token's PIN is locked (too many wrong PINs)",
    "PinExpired": "the token's PIN has expired",
    "UserPinNotInitialized": "the token has no user PIN yet (initialize it)",
}


def binding() -> Any:
    """The python-pkcs11 module. Raises KeySourceModuleError: it is not installed."""
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
    """One token's session in this process, used by every source on the token, one call at a time."""

    token: Any
    lock: threading.RLock
    pid: int
    session: Any = None
    # Keys found in this session, by (label, CKA_ID asked for): a store opened again does not search again.
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
# The token a URI's token attributes found, by (module path, token, serial, slot-id, manufacturer, model).
_NAMED: dict[tuple[str, ...], _Token] = {}
_SHARED_LOCK = threading.Lock()


class TokenLink:
    """The way to one key of one token; every call to the token goes through ``with_key``."""

    def __init__(self, uri: Pkcs11Uri, environ: Mapping[str, str] | None, calls: CallCounter) -> None:
        self._uri = uri
        self._environ = os.environ if environ is None else environ
        self._shown = uri.shown()
        self.calls = calls
        #: The key's label and the CKA_ID the URI asks for.
        self.place: tuple[str, bytes | None] = (uri.path["object"], uri.id)
        self._shared: _Token | None = None

    def describe(self, key: Any) -> str:
        """Token label and serial, key label and CKA_ID of ``key``, read once per process."""
        shared = self.token()
        if self.place not in shared.key_ids:
            attribute = binding().Attribute
            self.calls.add("attributes")
            token, raw_id, label = shared.token, bytes(key[attribute.ID]), key[attribute.LABEL]
            shared.key_ids[self.place] = (
                f"pkcs11:token={quote_value(token.label)};serial={quote_value(_serial_of(token))};"
                f"object={quote_value(label)};id=" + "".join(f"%{b:02x}" for b in raw_id)
            )
        return shared.key_ids[self.place]

    def fail(self, error: type[KeySourceError], what: str) -> KeySourceError:
        return error(f"PKCS#11 master key {self._shown}: {what}")

    def _module_path(self) -> str:
        query = self._uri.query
        if "module-path" in query:
            path = query["module-path"]
            if not os.path.isfile(path):
                raise self.fail(KeySourceModuleError, f"no PKCS#11 module at {path}")
            return path
        name = query["module-name"]
        for directory in MODULE_DIRS:
            for candidate in (f"lib{name}.so", f"{name}.so"):
                path = os.path.join(directory, candidate)
                if os.path.isfile(path):
                    return path
        raise self.fail(KeySourceModuleError, f"no PKCS#11 module named {name} in {', '.join(MODULE_DIRS)}")

    def _library(self) -> Any:
        pkcs11 = binding()
        path = self._module_path()
        with _LIBRARIES_LOCK:
            lib = _LIBRARIES.get(path)
            if lib is None:
                try:
                    lib = pkcs11.lib(path)
                except pkcs11.PKCS11Error as exc:
                    raise self.fail(KeySourceModuleError, f"the module cannot be loaded ({one_line(exc)})") from None
                _LIBRARIES[path] = lib
            elif self._shared is not None and self._shared.pid != os.getpid():
                lib.reinitialize()  # a forked child: the parent's sessions are not its own
        return lib

    def _pin(self) -> str:
        query = self._uri.query
        if "pin-value" in query:
            return query["pin-value"]
        source = query.get("pin-source")
        if source is None or source.startswith("env:"):
            name = DEFAULT_PIN_ENV if source is None else source[4:]
            pin = self._environ.get(name)
            if pin:
                return pin
            if source is None:
                raise self.fail(
                    KeySourceLoginError, f"no PIN: add pin-source=file:/path or pin-source=env:NAME, or set {name}"
                )
            raise self.fail(KeySourceLoginError, f"the PIN's environment variable {name} is not set")
        path = self.pin_path()
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise self.fail(KeySourceLoginError, f"cannot read the PIN file {path}: {reason}") from None
        pin = text.rstrip("\r\n")
        if not pin:
            raise self.fail(KeySourceLoginError, f"the PIN file {path} is empty")
        return pin

    def pin_path(self) -> Path:
        source = self._uri.query["pin-source"]
        if source.startswith("file:"):
            parsed = urlsplit(source)
            if parsed.netloc not in ("", "localhost"):
                raise self.fail(KeySourceLoginError, "pin-source names a file on another host")
            return Path(unquote(parsed.path))
        return Path(source)

    def token(self) -> _Token:
        if self._shared is not None and self._shared.pid == os.getpid():
            return self._shared
        # Read even when the session is open: a source whose PIN is missing fails the same way alone.
        self._pin()
        path = self._uri.path
        name = (
            self._module_path(),
            *(path.get(a, "") for a in ("token", "serial", "slot-id", "manufacturer", "model")),
        )
        known = _NAMED.get(name)
        if known is not None and known.pid == os.getpid():
            self._shared = known  # listing the slots again rescans the token's files (SoftHSM2)
            return known
        pkcs11 = binding()
        lib = self._library()
        try:
            tokens = list(
                lib.get_tokens(
                    token_label=path.get("token"),
                    token_serial=path["serial"].encode() if "serial" in path else None,
                )
            )
        except pkcs11.PKCS11Error as exc:
            raise self.fail(KeySourceUnreachableError, f"the module lists no slots ({one_line(exc)})") from None
        tokens = [t for t in tokens if _token_matches(t, path)]
        if not tokens:
            raise self.fail(KeySourceTokenError, "no token matches (token, serial or slot-id)")
        if len(tokens) > 1:
            raise self.fail(KeySourceTokenError, f"{len(tokens)} tokens match: add serial= or slot-id=")
        token = tokens[0]
        with _SHARED_LOCK:
            place = (self._module_path(), token.slot.slot_id)
            shared = _SHARED.get(place)
            if shared is None or shared.pid != os.getpid():
                shared = _SHARED[place] = _Token(token, threading.RLock(), os.getpid())
            _NAMED[name] = shared
        self._shared = shared
        return shared

    def _session(self, shared: _Token) -> Any:
        if shared.session is not None:
            return shared.session
        pkcs11 = binding()
        pin = self._pin()
        self.calls.add("session")
        try:
            try:
                session = shared.token.open(rw=True, user_pin=pin)
            except pkcs11.exceptions.UserAlreadyLoggedIn:
                # The login is the process's: another session of this process logged in already.
                session = shared.token.open(rw=True)
        except pkcs11.PKCS11Error as exc:
            refused = _PIN_REFUSALS.get(type(exc).__name__)
            if refused is not None:
                raise self.fail(KeySourceLoginError, refused) from None
            raise self.fail(KeySourceUnreachableError, f"no session ({one_line(exc)})") from None
        finally:
            del pin
        shared.session = session
        return session

    def _find(self, session: Any, *, create: bool) -> Any:
        pkcs11 = binding()
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
            raise self.fail(KeySourceUnreachableError, f"cannot search the token ({one_line(exc)})") from None
        if len(keys) > 1:
            raise self.fail(KeySourceKeyError, f"{len(keys)} keys are labelled {label!r}: add id= to the URI")
        if keys:
            key = keys[0]
            if key[pkcs11.Attribute.KEY_TYPE] != pkcs11.KeyType.AES or key[pkcs11.Attribute.VALUE_LEN] != 32:
                raise self.fail(KeySourceKeyError, f"the key labelled {label!r} is not an AES-256 key")
            if not (key[pkcs11.Attribute.ENCRYPT] and key[pkcs11.Attribute.DECRYPT]):
                raise self.fail(KeySourceKeyError, f"the key labelled {label!r} may not encrypt and decrypt")
            return key
        if not create:
            raise self.fail(KeySourceKeyError, f"the token holds no key labelled {label!r}")
        self.calls.add("create")
        try:
            return session.generate_key(
                pkcs11.KeyType.AES,
                _KEY_BITS,
                label=label,
                id=self._uri.id if self._uri.id is not None else secrets.token_bytes(16),
                store=True,
                template={getattr(pkcs11.Attribute, name): value for name, value in _NEW_KEY.items()},
            )
        except pkcs11.PKCS11Error as exc:
            raise self.fail(KeySourceKeyError, f"cannot create the key labelled {label!r} ({one_line(exc)})") from None

    def with_key(self, run: Callable[[Any], T], *, create: bool = False) -> T:
        """``run(key)`` under the lock, opening the session (again, once, when it was lost)."""
        pkcs11 = binding()
        lost = tuple(getattr(pkcs11.exceptions, name) for name in _LOST)
        shared = self.token()
        with shared.lock:
            for attempt in (1, 2):
                session = self._session(shared)
                try:
                    if self.place not in shared.keys:
                        shared.keys[self.place] = self._find(session, create=create)
                    return run(shared.keys[self.place])
                except lost as exc:
                    shared.drop()
                    if attempt == 2:
                        raise self.fail(KeySourceUnreachableError, f"the token was lost ({one_line(exc)})") from None
                except pkcs11.exceptions.DeviceError as exc:
                    shared.drop()
                    raise self.fail(KeySourceUnreachableError, f"the token failed ({one_line(exc)})") from None
        raise AssertionError("unreachable")  # pragma: no cover


def _token_matches(token: Any, path: Mapping[str, str]) -> bool:
    if "slot-id" in path and int(path["slot-id"]) != token.slot.slot_id:
        return False
    if "manufacturer" in path and path["manufacturer"] != token.manufacturer_id.strip():
        return False
    return "model" not in path or path["model"] == token.model.strip()


def _serial_of(token: Any) -> str:
    serial = token.serial
    return (serial.decode("ascii", "replace") if isinstance(serial, bytes) else str(serial)).strip()


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:160] + "..."
