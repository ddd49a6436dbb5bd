"""The key hierarchy's primitives: ``KeyHandle`` (a key whose bytes stay in
this module), HKDF derivation, ``Wrapper`` (AES-256-GCM key wrapping),
``CounterSeal`` (HMAC tags of the write counter, turn-head terms and keyed
turn names), ``ContentIdentity`` and the AADs every wrapped key is bound to.
The sealed formats built on them are in ``crypto/formats.py``.

Nonces are never chosen by a caller. Wrapped keys use random 96-bit nonces
under keys that each seal few messages (see SECURITY.md for the limits).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
from collections.abc import Sequence
from typing import NoReturn, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hmac import HMAC
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import IntegrityError, InvalidArgumentError

__all__ = [
    "FORMAT_VERSION",
    "HEADS_ERA",
    "ITEM_KEY_TAG",
    "KEY_BYTES",
    "TAG",
    "WORK",
    "ContentIdentity",
    "CounterSeal",
    "Hidden",
    "KeyHandle",
    "RemoteAead",
    "RemoteWrapper",
    "WorkCounter",
    "Wrapper",
    "anchor_key",
    "anchor_key_aad",
    "derive",
    "head_aad",
    "item_key_aad",
    "key_check",
    "lp",
    "lp_texts",
    "owner_key_aad",
    "record_key_aad",
    "source_key_check",
]

FORMAT_VERSION = 1
KEY_BYTES = 32
TAG = b"securepad/v1/"


try:  # OpenSSL's HMAC object itself: its copy, update and digest in C, without hmac.HMAC's Python layer
    from _hashlib import hmac_new as _openssl_hmac
except ImportError:  # pragma: no cover - a Python built without OpenSSL's hashlib
    _openssl_hmac = None  # type: ignore[assignment]


def _keyed_sha256(key: bytes, message: bytes = b"") -> _Mac:
    """``hmac.new(key, message, hashlib.sha256)``, OpenSSL's own where there is one: an object to copy per message."""
    if _openssl_hmac is not None:
        return _openssl_hmac(key, message, digestmod="sha256")
    return hmac.new(key, message, hashlib.sha256)


class _Mac(Protocol):
    def copy(self) -> _Mac: ...

    def update(self, data: bytes) -> None: ...

    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


class Hidden:
    """Holds key material: no bytes in ``repr``, never pickled."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} (hidden)>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("key handles cannot be pickled")


class KeyHandle(Hidden):
    """An opaque 32-byte key whose bytes are reachable only inside this module.

    Every key of the hierarchy (master, owner, item) travels as a handle: it
    does not show in ``repr`` (so not in logs, nor in the locals a traceback
    renders), refuses to be pickled, and compares by identity, never by its bytes.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise InvalidArgumentError(f"a key has {KEY_BYTES} bytes, not {len(key)}")
        self._key = bytes(key)

    @classmethod
    def random(cls) -> KeyHandle:
        return cls(os.urandom(KEY_BYTES))

    def hkdf(self, info: bytes, length: int = KEY_BYTES, salt: bytes | None = None) -> bytes:
        """HKDF-SHA256 of this key for ``info`` (counted in ``WORK.derivations``)."""
        WORK.derivations += 1
        return HKDF(algorithm=_HKDF_HASH, length=length, salt=salt, info=info).derive(self._key)

    def aead(self) -> AESGCM:
        return AESGCM(self._key)


def lp(*parts: str | bytes) -> bytes:
    """Length-prefixed concatenation: unambiguous, so ("ab","c") != ("a","bc")."""
    # One comprehension, no list growing per part: ``lp`` runs several times in every put and read.
    return b"".join(
        [_LENGTH(len(data)) + data for part in parts for data in (part.encode() if isinstance(part, str) else part,)]
    )


_LENGTH = struct.Struct(">I").pack
# One hash algorithm object for every HKDF (stateless: a name and sizes), not one per derivation.
_HKDF_HASH = hashes.SHA256()


def lp_texts(first: str, second: str, third: str | None = None) -> bytes:
    """``lp`` of two or three texts, without its loop: the AADs and HKDF infos every put and read builds."""
    a, b = first.encode(), second.encode()
    if third is None:
        return _LENGTH(len(a)) + a + _LENGTH(len(b)) + b
    c = third.encode()
    return _LENGTH(len(a)) + a + _LENGTH(len(b)) + b + _LENGTH(len(c)) + c


class WorkCounter:
    """The key work this process did: a load-independent measure of a call's cost
    (the benchmarks' cost meter and the hot-path tests read it; approximate when
    several threads count at once)."""

    __slots__ = ("derivations", "digests", "head_opens", "unwraps")

    def __init__(self) -> None:
        self.derivations = 0
        self.unwraps = 0
        self.digests = 0
        self.head_opens = 0

    def snapshot(self) -> dict[str, int]:
        """The key work: derivations, unwraps, header digests (``head_opens`` apart)."""
        return {"key_derivations": self.derivations, "key_unwraps": self.unwraps, "header_digests": self.digests}


WORK = WorkCounter()


def derive(key: KeyHandle, label: str, salt: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``key`` for one purpose, named by ``label``."""
    return key.hkdf(TAG + label.encode(), length, salt)


def key_check(master: KeyHandle, store_id: str) -> str:
    """The store's public check value (hex) of a master key: tells a wrong key at open."""
    return derive(master, "key-check", store_id.encode()).hex()


# A source's key check is this prefix and a hash: never a key check of a key in the process.
SOURCE_CHECK_PREFIX = "source:"


def source_key_check(key_id: str, store_id: str) -> str:
    """The check value of a master key a source holds: a hash of the key's public
    identifier and the store id. It tells which key a store expects; the key
    itself is proven by opening the store's wrapped anchor key through the source."""
    return SOURCE_CHECK_PREFIX + hashlib.sha256(lp(TAG, "source-key-check", store_id, key_id)).hexdigest()


def anchor_key(master: KeyHandle, store_id: str) -> KeyHandle:
    """The key of the store's write counter and its anchor, derived at the store's
    first anchored open and kept wrapped under the master key (a master
    rotation re-wraps it, and the counters stay valid)."""
    return KeyHandle(derive(master, "anchor", store_id.encode()))


def anchor_key_aad(store_id: str) -> bytes:
    return lp(TAG, "anchor-key", store_id)


class CounterSeal(Hidden):
    """HMAC-SHA256 tags over the store's write counter, under the anchor key.

    ``purpose`` keeps the store's copy (``"store"``) and the anchor file's
    (``"anchor"``) apart: one cannot be pasted as the other.
    """

    __slots__ = ("_key", "_names", "_owner_mac", "_store_id", "_term_mac")

    def __init__(self, key: KeyHandle, store_id: str) -> None:
        self._key = key
        self._store_id = store_id
        # Keyed once, the terms' domain absorbed: each term copies it (no keying, no digest lookup per term).
        self._term_mac = _keyed_sha256(key._key, lp(TAG, "term", store_id))
        self._names: bytes | None = None  # the turn names' key, derived at its first use
        self._owner_mac: _Mac | None = None  # the owner heads' terms, keyed at their first use

    def tag(self, purpose: str, counter: int) -> str:
        message = lp(TAG, "counter", purpose, self._store_id, str(counter))
        return hmac.new(self._key._key, message, hashlib.sha256).hexdigest()

    def check(self, purpose: str, counter: int, tag: str) -> bool:
        """Whether ``tag`` is this key's tag of ``counter`` (constant time)."""
        return hmac.compare_digest(self.tag(purpose, counter), tag)

    def term(self, message: bytes) -> int:
        """HMAC-SHA256 of ``message`` as an integer: one row's term of a turn head's
        multiset digest. Its own domain keeps it apart from the counter tags;
        ``message`` must be self-delimiting (the callers pass msgpack)."""
        mac = self._term_mac.copy()
        mac.update(message)
        return int.from_bytes(mac.digest(), "big")

    def owner_term(self, owner_user_id: str, turn_id: str) -> int:
        """HMAC-SHA256 of (owner, turn) as an integer: one turn's term of its owner
        head's multiset digest (owner head format 2). Its own domain keeps it apart
        from the rows' terms and the counter tags; the owner and the turn are
        length-prefixed. Keyed by the anchor key: stable across owner-key rotations."""
        if self._owner_mac is None:
            self._owner_mac = _keyed_sha256(self._key._key, lp(TAG, "owner-turn", self._store_id))
        mac = self._owner_mac.copy()
        mac.update(lp_texts(owner_user_id, turn_id))
        return int.from_bytes(mac.digest(), "big")

    def turn_name(self, owner_user_id: str, message: bytes) -> str:
        """The keyed name (hex) of a turn an integration derives from ids its caller
        chooses (a LangGraph thread id: ``message``, self-delimiting), for one
        owner. Keyed by the anchor key, it is stable across rotations, and
        without the master key no guess of an id can be tested against the
        names in the file; the same id names another turn for another owner or store."""
        if self._names is None:
            self._names = derive(self._key, "turn-names", self._store_id.encode())
        return hmac.digest(self._names, lp(TAG, "turn-name", self._store_id, owner_user_id) + message, "sha256").hex()


# The era an owner key's wrapping carries once the store has turn heads: a
# store holding a key wrapped with it had heads, whatever its clear
# ``store_meta.turn_heads`` says (``master.Master.mark_owner_keys``).
HEADS_ERA = "heads"


def owner_key_aad(store_id: str, owner_user_id: str, version: int, era: str = "") -> bytes:
    """AAD of a wrapped owner key: binds store, owner and key version, and the era
    (``HEADS_ERA``) when given; without it, the AAD of keys wrapped before heads."""
    return lp("owner-key", store_id, owner_user_id, str(version), *([era] if era else []))


def item_key_aad(entry_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a wrapped item key: binds entry, owner and owner-key version."""
    return ITEM_KEY_TAG + lp_texts(entry_id, owner_user_id, str(key_version))


# The constant first part of ``item_key_aad`` (``lp`` of it, once; a batch joins it to each entry's id).
ITEM_KEY_TAG = lp("item-key")


def record_key_aad(record_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a turn record's wrapped item key: binds record, owner and owner-key version."""
    return lp("record-key", record_id, owner_user_id, str(key_version))


# A writer seals the same turn's head put after put: its AAD is built once (an AAD is no secret).
@functools.lru_cache(maxsize=1024, typed=True)
def head_aad(owner_user_id: str, turn_id: str, key_version: int) -> bytes:
    """AAD of a sealed turn head (``turn_id`` empty: the owner head): binds owner, turn and key version."""
    return _TURN_HEAD + lp_texts(owner_user_id, turn_id, str(key_version))


_TURN_HEAD = lp("turn-head", str(FORMAT_VERSION))


class Wrapper(Hidden):
    """AES-256-GCM key wrapping under one key: the master's owner-wrap key
    (wraps owner keys) or an owner key (wraps item keys).

    A wrapped key is random nonce || ciphertext || tag. Keys go in and come
    out as ``KeyHandle``: no raw key is ever bound to a caller's variable.
    """

    __slots__ = ("_aead",)

    def __init__(self, aead: AESGCM) -> None:
        self._aead = aead

    @classmethod
    def for_master(cls, master: KeyHandle, store_id: str) -> Wrapper:
        """The wrapper of owner keys: HKDF of the master key, bound to the store."""
        return cls(AESGCM(derive(master, "owner-wrap", store_id.encode())))

    @classmethod
    def of(cls, key: KeyHandle) -> Wrapper:
        """The wrapper under ``key`` itself (an owner key)."""
        return cls(key.aead())

    def wrap(self, key: KeyHandle, aad: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, key._key, aad)

    def unwrap(self, blob: object, aad: bytes) -> KeyHandle:
        """Raises IntegrityError: the blob was altered, or belongs to another owner, entry or version."""
        if not isinstance(blob, bytes) or len(blob) != 12 + KEY_BYTES + 16:
            raise IntegrityError("a wrapped key has the wrong length")
        WORK.unwraps += 1
        try:
            return KeyHandle(self._aead.decrypt(blob[:12], blob[12:], aad))
        except InvalidTag:
            raise IntegrityError("a wrapped key failed authentication") from None

    def seal(self, data: bytes, aad: bytes) -> bytes:
        """Seal a small payload directly under this key (a turn head): random nonce || ciphertext || tag."""
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data, aad)

    def open(self, blob: object, aad: bytes) -> bytes:
        """Open what ``seal`` sealed.
        Raises IntegrityError: the blob was altered or belongs to another owner, turn or version."""
        if not isinstance(blob, bytes) or len(blob) < 28:
            raise IntegrityError("a sealed head is truncated")
        WORK.head_opens += 1
        try:
            return self._aead.decrypt(blob[:12], blob[12:], aad)
        except InvalidTag:
            raise IntegrityError("a turn head failed authentication") from None

    def wrap_fresh(self, aad: bytes) -> tuple[bytes, KeyHandle]:
        """A fresh random key and its wrapping (a new owner-key version); the key
        comes back from its wrapping, so a wrapping that would not open is never stored."""
        wrapped = self.wrap(KeyHandle.random(), aad)
        return wrapped, self.unwrap(wrapped, aad)

    def rewrap(self, blob: object, aad: bytes, into: Wrapper, new_aad: bytes) -> bytes:
        """Move a wrapped key from this wrapper to ``into`` (a rotation).
        Raises IntegrityError: the blob fails to unwrap."""
        return into.wrap(self.unwrap(blob, aad), new_aad)


class RemoteAead(Protocol):
    """Sealing done outside the process (``keys.source.MasterKeySource``): one call each way."""

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes: ...

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes: ...


# The longest blob a source may return for a wrapped key (a KMS ciphertext blob is ~200 bytes).
_REMOTE_BLOB_MAX = 4096


class RemoteWrapper(Wrapper):
    """Owner-key wrapping by a master key held in a token or a KMS: each wrap
    and unwrap is one call to it, and the master key never enters the
    process. Only keys go through it (``seal`` and ``open`` are for owner keys)."""

    __slots__ = ("_remote",)

    def __init__(self, remote: RemoteAead) -> None:
        self._remote = remote

    def wrap(self, key: KeyHandle, aad: bytes) -> bytes:
        """Raises KeySourceError: the source cannot be used."""
        return self._remote.encrypt(key._key, aad)

    def wrap_fresh(self, aad: bytes) -> tuple[bytes, KeyHandle]:
        """A fresh random key and its wrapping: one call (the source authenticates what it opens)."""
        key = KeyHandle.random()
        return self.wrap(key, aad), key

    def unwrap(self, blob: object, aad: bytes) -> KeyHandle:
        """Raises IntegrityError (the blob was altered, or is another owner's, version's
        or key's) or KeySourceError (the source cannot be used)."""
        if not isinstance(blob, bytes) or not 0 < len(blob) <= _REMOTE_BLOB_MAX:
            raise IntegrityError("a wrapped key has the wrong length")
        WORK.unwraps += 1
        plain = self._remote.decrypt(blob, aad)
        if len(plain) != KEY_BYTES:
            raise IntegrityError("a wrapped key opened to the wrong length")
        return KeyHandle(plain)

    def seal(self, data: bytes, aad: bytes) -> NoReturn:
        raise TypeError("a master key source wraps keys only")

    def open(self, blob: object, aad: bytes) -> NoReturn:
        raise TypeError("a master key source wraps keys only")


_CONTENT = lp("content")
_CONTENT_DIGEST = lp("content-sha256")
_SHA256 = hashes.SHA256()


class ContentIdentity(Hidden):
    """A keyed identity of an owner's content, for the re-read report.

    HMAC-SHA256 under a key derived from the owner's key: equal contents of
    one owner compare equal, and no one without the owner's key (another
    owner included) can test a guess against it, as a plain hash would allow.
    The owner-key version is part of the identity, so contents stored on
    both sides of an owner-key rotation do not compare equal.
    """

    __slots__ = ("_mac", "_version")

    def __init__(self, owner_key: KeyHandle, store_id: str, owner_user_id: str, version: int) -> None:
        # Keyed once: each identity copies it (no keying per entry). cryptography's HMAC, not
        # hashlib's: the same HMAC-SHA256 over OpenSSL, as fast natively, and its SHA-256 takes
        # a sixth fewer instructions where the CPU's SHA extensions are not used.
        self._mac = HMAC(derive(owner_key, "content-identity", lp(store_id, owner_user_id)), _SHA256)
        self._version = version

    def of(self, kind: str, segments: Sequence[bytes | memoryview], size: int | None = None) -> str:
        """The identity of content cut into ``segments`` (``size``: their bytes, when known)."""
        mac = self._mac.copy()
        mac.update(_CONTENT + lp_texts(kind, str(sum(map(len, segments)) if size is None else size)))
        for segment in segments:
            mac.update(segment)
        return f"{self._version}:{mac.finalize().hex()}"

    def of_digest(self, kind: str, size: int, digest: bytes) -> str:
        """The identity of content of ``size`` bytes whose SHA-256 is ``digest`` (binary
        content, whose view takes it anyway: the content is hashed once), in a domain of its own."""
        mac = self._mac.copy()
        mac.update(_CONTENT_DIGEST + lp_texts(kind, str(size)) + digest)
        return f"{self._version}:{mac.finalize().hex()}"
