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
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass, fields

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import IntegrityError, InvalidArgumentError
from .keys import KEY_BYTES, KeyHandle

__all__ = [
    "FORMAT_VERSION",
    "SEGMENT_BYTES",
    "EntryCipher",
    "Header",
    "derive",
    "item_key_aad",
    "owner_key_aad",
    "split_bytes",
    "split_text",
    "unwrap_key",
    "wrap_key",
]

FORMAT_VERSION = 1
SEGMENT_BYTES = 64 * 1024
NONCE_PREFIX_BYTES = 7
_TAG = b"securepad/v1/"


def lp(*parts: str | bytes) -> bytes:
    """Length-prefixed concatenation: unambiguous, so ("ab","c") != ("a","bc")."""
    out = bytearray()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        out += struct.pack(">I", len(data)) + data
    return bytes(out)


def derive(key: KeyHandle | bytes, label: str, salt: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``key`` for one purpose, named by ``label``."""
    raw = key._key if isinstance(key, KeyHandle) else key
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=_TAG + label.encode()).derive(raw)


def owner_key_aad(store_id: str, owner_user_id: str, version: int) -> bytes:
    """AAD of a wrapped owner key: binds store, owner and key version."""
    return lp("owner-key", store_id, owner_user_id, str(version))


def item_key_aad(entry_id: str, owner_user_id: str, key_version: int) -> bytes:
    """AAD of a wrapped item key: binds entry, owner and owner-key version."""
    return lp("item-key", entry_id, owner_user_id, str(key_version))


def wrap_key(wrapping: AESGCM, key: bytes, aad: bytes) -> bytes:
    """Seal a key under a wrapping cipher: random nonce || ciphertext || tag."""
    nonce = secrets.token_bytes(12)
    return nonce + wrapping.encrypt(nonce, key, aad)


def unwrap_key(wrapping: AESGCM, blob: bytes, aad: bytes) -> bytes:
    """Open a wrapped key.

    Raises:
        IntegrityError: the blob was altered, or belongs to another owner, entry or version.
    """
    if not isinstance(blob, bytes) or len(blob) != 12 + KEY_BYTES + 16:
        raise IntegrityError("a wrapped key has the wrong length")
    try:
        return wrapping.decrypt(blob[:12], blob[12:], aad)
    except InvalidTag:
        raise IntegrityError("a wrapped key failed authentication") from None


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

    def digest(self) -> bytes:
        """SHA-256 of every field but ``key_version``.

        DESIGN.md put the key version in the segment AAD too; that would make
        owner-key rotation re-encrypt every segment. The version is bound
        where it matters instead: in the AAD of the wrapped item key, so a
        row relabelled with another version fails to unwrap.
        """
        # Not dataclasses.asdict: its deep copy cost about 13 µs of every put and read.
        body = json.dumps(
            {name: getattr(self, name) for name in _DIGEST_FIELDS}, sort_keys=True, separators=(",", ":")
        ).encode()
        return hashlib.sha256(lp(_TAG + b"header", str(FORMAT_VERSION), body)).digest()


# Every field, so that a field added later is covered without a second thought.
_DIGEST_FIELDS = tuple(f.name for f in fields(Header) if f.name != "key_version")


class EntryCipher:
    """Seals and opens one entry's segments and metadata.

    Built from the entry's item key; verifies the stored key commitment before
    anything is decrypted, so a swapped item key fails early and clearly.
    """

    __slots__ = ("_aad", "_content", "_meta", "_prefix", "commitment")

    def __init__(self, item_key: bytes, header: Header, nonce_prefix: bytes) -> None:
        if len(nonce_prefix) != NONCE_PREFIX_BYTES:
            raise IntegrityError("an entry's nonce prefix has the wrong length")
        okm = HKDF(
            algorithm=hashes.SHA256(),
            length=3 * KEY_BYTES,
            salt=None,
            info=lp(_TAG + b"entry", str(FORMAT_VERSION), header.entry_id, header.owner_user_id),
        ).derive(item_key)
        self._content = AESGCM(okm[:32])
        self._meta = AESGCM(okm[32:64])
        self.commitment = okm[64:]
        self._aad = header.digest()
        self._prefix = nonce_prefix

    def verify_commitment(self, stored: bytes) -> None:
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


def split_text(text: str) -> tuple[list[bytes], list[str]]:
    """UTF-8 segments of at most SEGMENT_BYTES, cut on character boundaries,
    and the text of each (decoded once, for the character and line indexes).

    Raises:
        InvalidArgumentError: the text holds lone surrogates (not valid Unicode).
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("text content must be valid Unicode (no lone surrogates)") from None
    segments = list(_utf8_chunks(data))
    return segments, [chunk.decode("utf-8") for chunk in segments]


def _utf8_chunks(data: bytes) -> Iterator[bytes]:
    if not data:
        yield b""
        return
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        end = min(pos + SEGMENT_BYTES, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1
        yield bytes(view[pos:end])
        pos = end


def split_bytes(data: bytes) -> list[bytes]:
    """Fixed-size segments of binary content (one empty segment for empty content)."""
    if not data:
        return [b""]
    return [data[i : i + SEGMENT_BYTES] for i in range(0, len(data), SEGMENT_BYTES)]
