"""The sealed-entry format: header, segments, AAD, key commitment.

Modelled on Tink's AES-GCM-HKDF streaming AEAD, adapted to random access:

* each entry has a random item key; HKDF-SHA256 over it, with the entry id,
  the owner and the format version in the info, gives a content key, a
  metadata key and a 32-byte key commitment (stored, checked before use);
* content is cut into segments of at most 64 KiB (text on UTF-8 character
  boundaries) sealed with AES-256-GCM; the nonce is a random 7-byte prefix,
  the 4-byte segment number and a last-segment flag, so reordering,
  truncating or extending the segment list fails authentication;
* every segment's AAD is a hash of the entry header (id, owner, turn, kind,
  sizes, segment count), so a segment, an item key or a whole row moved to
  another entry or owner fails authentication too; the owner-key version is
  bound by the wrapped item key's AAD.

Nonces are never chosen by a caller. Wrapped keys use random 96-bit nonces
under keys that each seal few messages (see SECURITY.md for the limits).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import operator
import secrets
import struct
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import IntegrityError, InvalidArgumentError

__all__ = [
    "ENTRY_FORMAT",
    "FORMAT_VERSION",
    "HEADS_ERA",
    "KEY_BYTES",
    "WORK",
    "ContentIdentity",
    "CounterSeal",
    "EntryCipher",
    "Header",
    "KeyHandle",
    "ListingKey",
    "WorkCounter",
    "Wrapper",
    "head_aad",
    "item_key_aad",
    "key_check",
    "listing_aad",
    "open_entry",
    "open_record",
    "owner_key_aad",
    "record_key_aad",
    "reseal_record",
    "seal_entry",
    "seal_record",
]

FORMAT_VERSION = 1
# The format of the entries this version writes (``Header.format``).
ENTRY_FORMAT = 2
KEY_BYTES = 32
NONCE_PREFIX_BYTES = 7
_TAG = b"securepad/v1/"


class KeyHandle:
    """An opaque 32-byte key. Its bytes are reachable only inside this module.

    Every key of the hierarchy (master, owner, item) travels as a handle: it
    does not show in ``repr`` (so not in logs, nor in the locals a traceback
    renders) and refuses to be pickled.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise InvalidArgumentError(f"a key has {KEY_BYTES} bytes, not {len(key)}")
        self._key = bytes(key)

    @classmethod
    def random(cls) -> KeyHandle:
        """A fresh key from the OS's CSPRNG."""
        return cls(secrets.token_bytes(KEY_BYTES))

    def __repr__(self) -> str:
        return "<KeyHandle (hidden)>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("key handles cannot be pickled")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def lp(*parts: str | bytes) -> bytes:
    """Length-prefixed concatenation: unambiguous, so ("ab","c") != ("a","bc")."""
    out = bytearray()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        out += struct.pack(">I", len(data)) + data
    return bytes(out)


class WorkCounter:
    """How much key work this process did: HKDF derivations, key unwraps and
    entry-header digests. A load-independent measure of a call's cost (the
    benchmarks' cost meter and the hot-path tests read it; approximate when
    several threads count at once)."""

    __slots__ = ("derivations", "digests", "unwraps")

    def __init__(self) -> None:
        self.derivations = 0
        self.unwraps = 0
        self.digests = 0

    def snapshot(self) -> dict[str, int]:
        return {"key_derivations": self.derivations, "key_unwraps": self.unwraps, "header_digests": self.digests}


WORK = WorkCounter()


def _derive(key: KeyHandle, label: str, salt: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``key`` for one purpose, named by ``label``."""
    WORK.derivations += 1
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=_TAG + label.encode()).derive(key._key)


def key_check(master: KeyHandle, store_id: str) -> str:
    """The store's public check value of a master key (hex): tells a wrong key at open."""
    return _derive(master, "key-check", store_id.encode()).hex()


def anchor_key(master: KeyHandle, store_id: str) -> KeyHandle:
    """The key of the store's write counter and its anchor: HKDF of the master
    key at the store's first anchored open, kept wrapped under the master key
    (so a master rotation re-wraps it and the counters stay valid)."""
    return KeyHandle(_derive(master, "anchor", store_id.encode()))


def anchor_key_aad(store_id: str) -> bytes:
    """AAD of the wrapped anchor key: the store it belongs to."""
    return lp(_TAG, "anchor-key", store_id)


class CounterSeal:
    """HMAC-SHA256 tags over the store's write counter, under the anchor key.

    ``purpose`` keeps the store's copy (``"store"``) and the anchor file's
    (``"anchor"``) apart: one cannot be pasted as the other.
    """

    __slots__ = ("_key", "_names", "_store_id", "_term_prefix")

    def __init__(self, key: KeyHandle, store_id: str) -> None:
        self._key = key
        self._store_id = store_id
        self._term_prefix = lp(_TAG, "term", store_id)
        self._names: bytes | None = None  # the turn names' key, derived at its first use

    def __repr__(self) -> str:
        return "<CounterSeal (hidden)>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("key handles cannot be pickled")

    def tag(self, purpose: str, counter: int) -> str:
        """The hex tag of ``counter`` for ``purpose``."""
        message = lp(_TAG, "counter", purpose, self._store_id, str(counter))
        return hmac.new(self._key._key, message, hashlib.sha256).hexdigest()

    def check(self, purpose: str, counter: int, tag: str) -> bool:
        """Whether ``tag`` is this key's tag of ``counter`` (constant time)."""
        return hmac.compare_digest(self.tag(purpose, counter), tag)

    def term(self, message: bytes) -> int:
        """HMAC-SHA256 of ``message`` under the anchor key, as an integer: one
        row's term of a turn head's multiset digest (``head_tally.term``).

        Its own domain (``"term"`` and the store id, length-prefixed) keeps it
        apart from the counter tags; ``message`` must be self-delimiting
        (the callers pass msgpack)."""
        return int.from_bytes(hmac.digest(self._key._key, self._term_prefix + message, "sha256"), "big")

    def turn_name(self, owner_user_id: str, message: bytes) -> str:
        """The keyed name (hex) of a turn an integration derives from ids its
        caller chooses (a LangGraph thread id, an OpenAI session id: ``message``,
        self-delimiting), for one owner: HMAC-SHA256 under a key derived
        (HKDF) from the anchor key, so stable across master and owner-key
        rotations, and without the master key no guess of an id can be tested
        against the names in the file. Owner and store are in the input: the
        same id names another turn for another owner or store."""
        if self._names is None:
            self._names = _derive(self._key, "turn-names", self._store_id.encode())
        return hmac.digest(self._names, lp(_TAG, "turn-name", self._store_id, owner_user_id) + message, "sha256").hex()


# The era an owner key's wrapping carries once the store has turn heads (issue
# 14): a store holding a key wrapped with it had heads, whatever its clear
# ``store_meta.turn_heads`` says (``master.Master.mark_owner_keys``).
HEADS_ERA = "heads"


def owner_key_aad(store_id: str, owner_user_id: str, version: int, era: str = "") -> bytes:
    """AAD of a wrapped owner key: binds store, owner and key version, and the
    era (``HEADS_ERA``) when given; without it, the AAD keys were wrapped with before heads."""
    if era:
        return lp("owner-key", store_id, owner_user_id, str(version), era)
    return lp("owner-key", store_id, owner_user_id, str(version))


def item_key_aad(entry_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a wrapped item key: binds entry, owner and owner-key version."""
    return lp("item-key", entry_id, owner_user_id, str(key_version))


def record_key_aad(record_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a turn record's wrapped item key: binds record, owner and owner-key version."""
    return lp("record-key", record_id, owner_user_id, str(key_version))


def head_aad(owner_user_id: str, turn_id: str, key_version: int) -> bytes:
    """AAD of a sealed turn head (``turn_id`` empty: the owner head): binds owner, turn and key version."""
    return lp("turn-head", str(FORMAT_VERSION), owner_user_id, turn_id, str(key_version))


class Wrapper:
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
        return cls(AESGCM(_derive(master, "owner-wrap", store_id.encode())))

    @classmethod
    def of(cls, key: KeyHandle) -> Wrapper:
        """The wrapper whose key is ``key`` itself (an owner key)."""
        return cls(AESGCM(key._key))

    def __repr__(self) -> str:
        return "<Wrapper (hidden)>"

    def wrap(self, key: KeyHandle, aad: bytes) -> bytes:
        """Seal ``key``."""
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, key._key, aad)

    def wrap_new(self, aad: bytes) -> bytes:
        """Seal a fresh random key (a new owner-key version)."""
        return self.wrap(KeyHandle.random(), aad)

    def unwrap(self, blob: object, aad: bytes) -> KeyHandle:
        """Open a wrapped key.

        Raises:
            IntegrityError: the blob was altered, or belongs to another owner, entry or version.
        """
        if not isinstance(blob, bytes) or len(blob) != 12 + KEY_BYTES + 16:
            raise IntegrityError("a wrapped key has the wrong length")
        WORK.unwraps += 1
        try:
            return KeyHandle(self._aead.decrypt(blob[:12], blob[12:], aad))
        except InvalidTag:
            raise IntegrityError("a wrapped key failed authentication") from None

    def seal(self, data: bytes, aad: bytes) -> bytes:
        """Seal a small payload directly under this key (a turn head): random nonce || ciphertext || tag."""
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, data, aad)

    def open(self, blob: object, aad: bytes) -> bytes:
        """Open what ``seal`` sealed.

        Raises:
            IntegrityError: the blob was altered or belongs to another owner, turn or version.
        """
        if not isinstance(blob, bytes) or len(blob) < 28:
            raise IntegrityError("a sealed head is truncated")
        try:
            return self._aead.decrypt(blob[:12], blob[12:], aad)
        except InvalidTag:
            raise IntegrityError("a turn head failed authentication") from None

    def rewrap(self, blob: object, aad: bytes, into: Wrapper, new_aad: bytes) -> bytes:
        """Move a wrapped key from this wrapper to ``into`` (a rotation).

        Raises:
            IntegrityError: the blob fails to unwrap.
        """
        return into.wrap(self.unwrap(blob, aad), new_aad)


class ContentIdentity:
    """A keyed identity of an owner's content, for the re-read report.

    HMAC-SHA256 under a key derived from the owner's key: equal contents of
    one owner compare equal, and no one without the owner's key (another
    owner included) can test a guess against it, as a plain hash would allow.
    The owner-key version is part of the identity, so contents stored on
    both sides of an owner-key rotation do not compare equal.
    """

    __slots__ = ("_key", "_version")

    def __init__(self, owner_key: KeyHandle, store_id: str, owner_user_id: str, version: int) -> None:
        self._key = KeyHandle(_derive(owner_key, "content-identity", lp(store_id, owner_user_id)))
        self._version = version

    def __repr__(self) -> str:
        return "<ContentIdentity (hidden)>"

    def of(self, kind: str, segments: list[bytes]) -> str:
        mac = hmac.new(self._key._key, lp("content", kind, str(sum(len(s) for s in segments))), hashlib.sha256)
        for segment in segments:
            mac.update(segment)
        return f"{self._version}:{mac.hexdigest()}"


# A listing part: its format byte, the AES-GCM nonce, then ciphertext and tag.
LISTING_FORMAT = 2
_LISTING_MIN = 1 + 12 + 16
_LISTING_TAG = lp(_TAG + b"listing", str(LISTING_FORMAT))
# The clear columns a listing part is bound to, in the order its AAD has them.
_LISTING_BOUND = operator.itemgetter(
    "id",
    "owner_user_id",
    "turn_id",
    "key_version",
    "actor",
    "channel",
    "step_num",
    "executor_name",
    "content_kind",
    "size_bytes",
    "size_chars",
    "segment_count",
    "created_at",
    "expires_at",
    "commitment",
)
_msgpack = msgspec.msgpack.Encoder().encode


def listing_aad(row: dict[str, Any]) -> bytes:
    """What a listing part is bound to: the entry's id, owner, turn, key version
    and every clear column a listing shows or trusts (actor, channel, step,
    executor, kind, sizes, segment count, creation and expiry), and the item
    key's commitment.

    msgpack of the values as the row holds them: self-delimiting and typed, so
    unambiguous, and a value edited into another type (a step stored as text)
    encodes differently and fails authentication like any other edit: the
    listing needs no type check of its own. Three times cheaper than packing
    the same fields with ``struct`` (docs/decisions/0005-listing-key.md).

    Raises:
        IntegrityError: a column holds a value no column can hold.
    """
    try:
        return _LISTING_TAG + _msgpack(_LISTING_BOUND(row))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        raise IntegrityError("the entry's clear columns hold a value of the wrong type") from None


class ListingKey:
    """Seals and opens the part of an entry a listing shows (its view, history
    item and content identity), under one AES-256-GCM key per owner and
    owner-key version: HKDF of the owner key, derived once and cached by the
    keystore beside it. A listing opens only these parts, one AES-GCM call per
    entry and no per-entry key work; reads still unwrap the entry's own item key.

    The AAD (``listing_aad``) binds the part to its entry, owner, turn, key
    version and clear columns, so it cannot be moved to another entry, turn or
    owner, nor keep its place while a clear column changes.
    """

    __slots__ = ("_aead",)

    def __init__(self, owner_key: KeyHandle, store_id: str, owner_user_id: str, version: int) -> None:
        self._aead = AESGCM(_derive(owner_key, "listing", lp(store_id, owner_user_id, str(version))))

    def __repr__(self) -> str:
        return "<ListingKey (hidden)>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("key handles cannot be pickled")

    def seal(self, row: dict[str, Any], data: bytes) -> bytes:
        """The listing part of ``row`` (its clear columns as they will be stored)."""
        nonce = secrets.token_bytes(12)
        return bytes((LISTING_FORMAT,)) + nonce + self._aead.encrypt(nonce, data, listing_aad(row))

    def open(self, row: dict[str, Any]) -> bytes:
        """The plaintext of ``row["sealed_listing"]``.

        Raises:
            IntegrityError: the part is not this entry's as its clear columns say.
        """
        blob = row["sealed_listing"]
        if not isinstance(blob, bytes) or len(blob) < _LISTING_MIN or blob[0] != LISTING_FORMAT:
            raise IntegrityError("the entry's listing part is malformed")
        try:
            return self._aead.decrypt(blob[1:13], blob[13:], listing_aad(row))
        except InvalidTag:
            raise IntegrityError("the entry's listing part failed authentication") from None


@dataclass(frozen=True, slots=True)
class Header:
    """The clear fields every segment's AAD covers."""

    entry_id: str
    owner_user_id: str
    turn_id: str
    kind: str
    size_bytes: int
    size_chars: int
    segment_count: int
    key_version: int
    # The entry's format: 1, rows written before the listing part (a JSON digest
    # input, all metadata sealed under the item key); 2, a fixed binary digest
    # input and a listing part apart (``ListingKey``). Part of the digest's
    # domain, so a row of one format cannot be opened as the other.
    format: int = 1

    def digest(self) -> bytes:
        """SHA-256 of every field but ``key_version``.

        DESIGN.md put the key version in the segment AAD too; that would make
        owner-key rotation re-encrypt every segment. The version is bound
        where it matters instead: in the AAD of the wrapped item key, so a
        row relabelled with another version fails to unwrap.
        """
        WORK.digests += 1
        if self.format == ENTRY_FORMAT:
            # Length-prefixed strings and fixed-width numbers: unambiguous, and
            # about 6x cheaper than the JSON object below (bench/encoding.py).
            texts = (
                self.entry_id.encode(),
                self.owner_user_id.encode(),
                self.turn_id.encode(),
                self.kind.encode(),
            )
            try:
                fixed = _HEADER_LAYOUT.pack(*map(len, texts), self.size_bytes, self.size_chars, self.segment_count)
            except struct.error:
                raise IntegrityError("the entry's clear sizes are out of range") from None
            return hashlib.sha256(b"".join((_HEADER_TAG, fixed, *texts))).digest()
        if self.format != 1:
            raise IntegrityError(f"unknown entry format {self.format}")
        # Not dataclasses.asdict: its deep copy cost about 13 µs of every put and read.
        body = json.dumps(
            {name: getattr(self, name) for name in _DIGEST_FIELDS}, sort_keys=True, separators=(",", ":")
        ).encode()
        return hashlib.sha256(lp(_TAG + b"header", str(FORMAT_VERSION), body)).digest()


# Every field, so that a field added later is covered without a second thought
# (the format is the digest's domain instead).
_DIGEST_FIELDS = tuple(f.name for f in fields(Header) if f.name not in ("key_version", "format"))
# Format 2's digest input: the four strings' lengths, the sizes and the
# segment count (fixed width), then the strings.
_HEADER_LAYOUT = struct.Struct(">4IQQQ")
_HEADER_TAG = lp(_TAG + b"header", str(ENTRY_FORMAT))


class EntryCipher:
    """Seals and opens one entry's segments and metadata.

    Built from the entry's item key; verifies the stored key commitment before
    anything is decrypted, so a swapped item key fails early and clearly.
    """

    __slots__ = ("_aad", "_content", "_meta", "_prefix", "commitment")

    def __init__(self, item_key: KeyHandle, header: Header, nonce_prefix: object) -> None:
        if not isinstance(nonce_prefix, bytes) or len(nonce_prefix) != NONCE_PREFIX_BYTES:
            raise IntegrityError("an entry's nonce prefix has the wrong length")
        WORK.derivations += 1
        okm = HKDF(
            algorithm=hashes.SHA256(),
            length=3 * KEY_BYTES,
            salt=None,
            info=lp(_TAG + b"entry", str(FORMAT_VERSION), header.entry_id, header.owner_user_id),
        ).derive(item_key._key)
        try:
            self._content = AESGCM(okm[:32])
            self._meta = AESGCM(okm[32:64])
            self.commitment = okm[64:]
        finally:
            del okm
        self._aad = header.digest()
        self._prefix = nonce_prefix

    def __repr__(self) -> str:
        return "<EntryCipher (hidden)>"

    def verify_commitment(self, stored: object) -> None:
        """Raises IntegrityError unless ``stored`` is this item key's commitment."""
        if not isinstance(stored, bytes) or not hmac.compare_digest(stored, self.commitment):
            raise IntegrityError("the entry's key commitment does not match")

    def _nonce(self, seq: int, last: bool) -> bytes:
        return self._prefix + struct.pack(">I?", seq, last)

    def seal_segment(self, seq: int, data: bytes, last: bool) -> bytes:
        return self._content.encrypt(self._nonce(seq, last), data, self._aad)

    def open_segment(self, seq: int, blob: bytes, last: bool) -> bytes:
        """Raises IntegrityError when the segment is not this entry's ``seq``-th."""
        try:
            return self._content.decrypt(self._nonce(seq, last), blob, self._aad)
        except (InvalidTag, TypeError):
            raise IntegrityError(f"segment {seq} failed authentication") from None

    def seal_meta(self, data: bytes) -> bytes:
        nonce = secrets.token_bytes(12)
        return nonce + self._meta.encrypt(nonce, data, self._aad)

    def open_meta(self, blob: bytes) -> bytes:
        """Raises IntegrityError when the sealed metadata is not this entry's."""
        try:
            return self._meta.decrypt(blob[:12], blob[12:], self._aad)
        except (InvalidTag, TypeError, ValueError):
            raise IntegrityError("the entry's metadata failed authentication") from None


def seal_entry(
    owner: Wrapper, header: Header, meta: bytes, segments: list[bytes]
) -> tuple[dict[str, bytes], list[bytes], EntryCipher]:
    """Seal an entry under a fresh item key wrapped by ``owner`` (the owner's
    key of ``header.key_version``): the row's crypto columns, the sealed
    segments, and the entry's cipher (to seal its metadata again)."""
    item_key = KeyHandle.random()
    nonce_prefix = secrets.token_bytes(NONCE_PREFIX_BYTES)
    cipher = EntryCipher(item_key, header, nonce_prefix)
    last = len(segments) - 1
    sealed = [cipher.seal_segment(seq, data, seq == last) for seq, data in enumerate(segments)]
    columns = {
        "wrapped_key": owner.wrap(item_key, item_key_aad(header.entry_id, header.owner_user_id, header.key_version)),
        "nonce_prefix": nonce_prefix,
        "commitment": cipher.commitment,
        "sealed_meta": cipher.seal_meta(meta),
    }
    return columns, sealed, cipher


def open_entry(
    owner: Wrapper, header: Header, wrapped_key: object, nonce_prefix: object, commitment: object
) -> EntryCipher:
    """The cipher of a stored entry: its item key unwrapped, its commitment checked.

    Raises:
        IntegrityError: the wrapped key, the nonce prefix or the commitment is not this entry's.
    """
    aad = item_key_aad(header.entry_id, header.owner_user_id, header.key_version)
    cipher = EntryCipher(owner.unwrap(wrapped_key, aad), header, nonce_prefix)
    cipher.verify_commitment(commitment)
    return cipher


def _record_aad(table: str, row: dict[str, Any]) -> bytes:
    return lp(
        "turn-record",
        str(FORMAT_VERSION),
        table,
        row["id"],
        row["owner_user_id"],
        row["actor"],
        row["channel"],
        row["turn_id"],
        str(row["seq"]),
        float(row["created_at"]).hex(),
        float(row["expires_at"]).hex(),
    )


def reseal_record(item_key: KeyHandle, table: str, row: dict[str, Any], body: bytes) -> bytes:
    """A turn record's sealed payload: AES-256-GCM under its item key; the AAD
    binds table, id, owner, actor, channel, turn, sequence number and both times."""
    nonce = secrets.token_bytes(12)
    return nonce + AESGCM(item_key._key).encrypt(nonce, body, _record_aad(table, row))


def seal_record(owner: Wrapper, table: str, row: dict[str, Any], body: bytes) -> tuple[bytes, bytes]:
    """(wrapped item key, sealed payload) of a new turn record, under a fresh item key."""
    item_key = KeyHandle.random()
    wrapped = owner.wrap(item_key, record_key_aad(row["id"], row["owner_user_id"], row["key_version"]))
    return wrapped, reseal_record(item_key, table, row, body)


def open_record(owner: Wrapper, table: str, row: dict[str, Any]) -> tuple[KeyHandle, bytes]:
    """A stored turn record's item key and payload.

    Raises:
        IntegrityError: the wrapped key or the payload fails authentication.
    """
    item_key = owner.unwrap(row["wrapped_key"], record_key_aad(row["id"], row["owner_user_id"], row["key_version"]))
    blob = row["sealed"]
    if not isinstance(blob, bytes) or len(blob) < 28:
        raise IntegrityError("a turn record is truncated")
    try:
        return item_key, AESGCM(item_key._key).decrypt(blob[:12], blob[12:], _record_aad(table, row))
    except InvalidTag:
        raise IntegrityError("a turn record failed authentication") from None
