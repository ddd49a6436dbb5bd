"""The sealed formats: an entry's header, segments and metadata, its listing part, and turn records.

Modelled on Tink's AES-GCM-HKDF streaming AEAD, adapted to random access:

* each entry has a random item key; HKDF-SHA256 over it, with the entry id,
  the owner and the format version in the info, gives a content key, a
  metadata key and a 32-byte key commitment (stored, checked before use);
* content is cut into segments of at most 64 KiB (text on UTF-8 character
  boundaries; a tail of at most 4 KiB joins the last) sealed with
  AES-256-GCM; the nonce is a random 7-byte prefix, the 4-byte segment
  number and a last-segment flag, so reordering,
  truncating or extending the segment list fails authentication;
* every segment's AAD is a hash of the entry header (id, owner, turn, kind,
  sizes, segment count), so a segment, an item key or a whole row moved to
  another entry or owner fails authentication too; the owner-key version is
  bound by the wrapped item key's AAD (binding it here would make an
  owner-key rotation re-encrypt every segment).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import operator
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import IntegrityError
from .primitives import (
    FORMAT_VERSION,
    ITEM_KEY_TAG,
    KEY_BYTES,
    TAG,
    WORK,
    Hidden,
    KeyHandle,
    Wrapper,
    derive,
    item_key_aad,
    lp,
    lp_texts,
    record_key_aad,
)

__all__ = [
    "ENTRY_FORMAT",
    "LISTING_FORMAT",
    "EntryCipher",
    "EntrySealer",
    "Header",
    "ListingKey",
    "listing_aad",
    "open_entry",
    "open_record",
    "reseal_record",
    "seal_record",
]

# The format of the entries this version writes (``Header.format``).
ENTRY_FORMAT = 2
NONCE_PREFIX_BYTES = 7


# A listing part: its format byte, the AES-GCM nonce, then ciphertext and tag.
LISTING_FORMAT = 2
_LISTING_MIN = 1 + 12 + 16
_LISTING_TAG = lp(TAG + b"listing", str(LISTING_FORMAT))
# The clear columns a listing part is bound to, in the order its AAD has them.
_LISTING_BOUND = operator.itemgetter(
    *("id", "owner_user_id", "turn_id", "key_version", "actor", "channel", "step_num", "executor_name"),
    *("content_kind", "size_bytes", "size_chars", "segment_count", "created_at", "expires_at", "commitment"),
)
_msgpack = msgspec.msgpack.Encoder().encode


def listing_aad(row: dict[str, Any]) -> bytes:
    """What a listing part is bound to: every clear column a listing shows or
    trusts (``_LISTING_BOUND``), as msgpack of the values as the row holds
    them: self-delimiting and typed, so a value edited into another type (a
    step stored as text) fails authentication like any other edit.

    Raises:
        IntegrityError: a column holds a value no column can hold.
    """
    try:
        return _LISTING_TAG + _msgpack(_LISTING_BOUND(row))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        raise IntegrityError("the entry's clear columns hold a value of the wrong type") from None


class ListingKey(Hidden):
    """Seals and opens the part of an entry a listing shows (its view, history
    item and content identity) under one AES-256-GCM key per owner and
    owner-key version, derived from the owner key: a listing makes one AES-GCM
    call per entry and no per-entry key work. ``listing_aad`` binds the part
    to its entry's clear columns, so it cannot be moved, nor keep its place
    while a clear column changes.
    """

    __slots__ = ("_aead",)

    def __init__(self, owner_key: KeyHandle, store_id: str, owner_user_id: str, version: int) -> None:
        self._aead = AESGCM(derive(owner_key, "listing", lp(store_id, owner_user_id, str(version))))

    def seal(self, row: dict[str, Any], data: bytes) -> bytes:
        """The listing part of ``row`` (its clear columns as they will be stored)."""
        nonce = os.urandom(12)
        return bytes((LISTING_FORMAT,)) + nonce + self._aead.encrypt(nonce, data, listing_aad(row))

    def open(self, row: dict[str, Any]) -> bytes:
        """The plaintext of ``row["sealed_listing"]``. Raises IntegrityError: not this entry's."""
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
        """SHA-256 of every field but ``key_version`` (bound by the wrapped item key's AAD)."""
        WORK.digests += 1
        if self.format == ENTRY_FORMAT:
            # Length-prefixed strings and fixed-width numbers: unambiguous, and cheaper than the JSON below.
            owner, turn = self.owner_user_id.encode(), self.turn_id.encode()
            return _digest(
                self.entry_id.encode(),
                (len(owner), len(turn)),
                owner + turn,
                self.kind.encode(),
                (self.size_bytes, self.size_chars),
                self.segment_count,
            )
        if self.format != 1:
            raise IntegrityError(f"unknown entry format {self.format}")
        # Not dataclasses.asdict: its deep copy is paid on every put and read.
        body = json.dumps(
            {name: getattr(self, name) for name in _DIGEST_FIELDS}, sort_keys=True, separators=(",", ":")
        ).encode()
        return hashlib.sha256(lp(TAG + b"header", str(FORMAT_VERSION), body)).digest()


# Every field, so that a field added later is covered without a second thought
# (the format is the digest's domain instead).
_DIGEST_FIELDS = tuple(f.name for f in fields(Header) if f.name not in ("key_version", "format"))
# Format 2's digest input: the four strings' lengths, the sizes and the
# segment count (fixed width), then the strings.
_HEADER_LAYOUT = struct.Struct(">4IQQQ")
_HEADER_TAG = lp(TAG + b"header", str(ENTRY_FORMAT))


def _digest(
    entry_id: bytes, lengths: tuple[int, int], owner_turn: bytes, kind: bytes, sizes: tuple[int, int], segments: int
) -> bytes:
    """Format 2's header digest: ``lengths`` are the owner's and the turn's, ``owner_turn``
    the two joined (``EntrySealer`` builds them once for a batch)."""
    try:
        fixed = _HEADER_LAYOUT.pack(len(entry_id), *lengths, len(kind), *sizes, segments)
    except struct.error:
        raise IntegrityError("the entry's clear sizes are out of range") from None
    return hashlib.sha256(b"".join((_HEADER_TAG, fixed, entry_id, owner_turn, kind))).digest()


_LENGTH = struct.Struct(">I").pack


# The constant first parts of an entry's HKDF info (``lp`` of them, once).
_ENTRY_INFO = lp(TAG + b"entry", str(FORMAT_VERSION))


class EntryCipher(Hidden):
    """Seals and opens one entry's segments and metadata, under keys derived from
    its item key (whose commitment ``open_entry`` checks before any decryption)."""

    __slots__ = ("_aad", "_content", "_meta", "_prefix", "commitment")

    def __init__(self, item_key: KeyHandle, info: bytes, aad: bytes, nonce_prefix: bytes) -> None:
        """The cipher of the keys derived from ``item_key`` under HKDF ``info``, binding ``aad``
        (the header's digest); ``of`` builds both from a header."""
        okm = item_key.hkdf(info, 3 * KEY_BYTES)
        try:
            self._content = AESGCM(okm[:32])
            self._meta = AESGCM(okm[32:64])
            self.commitment = okm[64:]
        finally:
            del okm
        self._aad = aad
        self._prefix = nonce_prefix

    @classmethod
    def of(cls, item_key: KeyHandle, header: Header, nonce_prefix: object) -> EntryCipher:
        """The cipher of the entry ``header`` describes.
        Raises IntegrityError: the nonce prefix has the wrong length, or a clear size is out of range."""
        if not isinstance(nonce_prefix, bytes) or len(nonce_prefix) != NONCE_PREFIX_BYTES:
            raise IntegrityError("an entry's nonce prefix has the wrong length")
        info = _ENTRY_INFO + lp_texts(header.entry_id, header.owner_user_id)
        return cls(item_key, info, header.digest(), nonce_prefix)

    def _nonce(self, seq: int, last: bool) -> bytes:
        return self._prefix + struct.pack(">I?", seq, last)

    def seal_segment(self, seq: int, data: bytes | memoryview, last: bool) -> bytes:
        return self._content.encrypt(self._nonce(seq, last), data, self._aad)

    def open_segment(self, seq: int, blob: bytes, last: bool) -> bytes:
        """Raises IntegrityError when the segment is not this entry's ``seq``-th."""
        try:
            return self._content.decrypt(self._nonce(seq, last), blob, self._aad)
        except (InvalidTag, TypeError):
            raise IntegrityError(f"segment {seq} failed authentication") from None

    def seal_meta(self, data: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._meta.encrypt(nonce, data, self._aad)

    def open_meta(self, blob: bytes) -> bytes:
        """Raises IntegrityError when the sealed metadata is not this entry's."""
        try:
            return self._meta.decrypt(blob[:12], blob[12:], self._aad)
        except (InvalidTag, TypeError, ValueError):
            raise IntegrityError("the entry's metadata failed authentication") from None


class EntrySealer(Hidden):
    """Seals the entries of one owner's turn under one owner-key version (a put's one, a
    batch's several): each under its own fresh item key, nonce prefix and header digest
    (format 2; ``open_entry`` opens it by its ``Header``), with what the entries share
    built once: the owner's and the turn's parts of the header digest's input, of the
    HKDF info and of the wrapped item key's AAD."""

    __slots__ = ("_info", "_key_aad", "_lengths", "_texts", "_wrapper")

    def __init__(self, owner: Wrapper, owner_user_id: str, turn_id: str, version: int) -> None:
        self._wrapper = owner
        owner_bytes, turn_bytes, version_bytes = owner_user_id.encode(), turn_id.encode(), str(version).encode()
        self._lengths, self._texts = (len(owner_bytes), len(turn_bytes)), owner_bytes + turn_bytes
        # lp_texts(entry id, owner) and item_key_aad(entry id, owner, version), but for the id's part.
        self._info = _LENGTH(len(owner_bytes)) + owner_bytes
        self._key_aad = self._info + _LENGTH(len(version_bytes)) + version_bytes

    def seal(
        self, entry_id: str, kind: str, sizes: tuple[int, int], meta: bytes, segments: Sequence[bytes | memoryview]
    ) -> tuple[bytes, bytes, bytes, bytes, list[bytes]]:
        """Entry ``entry_id`` (``sizes``: its bytes and characters) sealed: its wrapped item key,
        nonce prefix, key commitment, metadata ``meta`` sealed under its item key, and sealed segments."""
        wrapped, nonce_prefix, cipher, sealed_meta, sealed = self.entry(entry_id, kind, sizes, meta, segments)
        return wrapped, nonce_prefix, cipher.commitment, sealed_meta, sealed

    def entry(
        self, entry_id: str, kind: str, sizes: tuple[int, int], meta: bytes, segments: Sequence[bytes | memoryview]
    ) -> tuple[bytes, bytes, EntryCipher, bytes, list[bytes]]:
        """``seal``, with the entry's cipher (its key commitment: ``commitment``) in place of the commitment."""
        WORK.digests += 1
        id_bytes = entry_id.encode()
        aad = _digest(id_bytes, self._lengths, self._texts, kind.encode(), sizes, len(segments))
        id_part = _LENGTH(len(id_bytes)) + id_bytes
        item_key, nonce_prefix = KeyHandle.random(), os.urandom(NONCE_PREFIX_BYTES)
        cipher = EntryCipher(item_key, _ENTRY_INFO + id_part + self._info, aad, nonce_prefix)
        last = len(segments) - 1
        sealed = [cipher.seal_segment(seq, data, seq == last) for seq, data in enumerate(segments)]
        wrapped = self._wrapper.wrap(item_key, ITEM_KEY_TAG + id_part + self._key_aad)
        return wrapped, nonce_prefix, cipher, cipher.seal_meta(meta), sealed


def open_entry(
    owner: Wrapper, header: Header, wrapped_key: object, nonce_prefix: object, commitment: object
) -> EntryCipher:
    """The cipher of a stored entry: its item key unwrapped, its commitment checked.
    Raises IntegrityError: the wrapped key, the nonce prefix or the commitment is not this entry's."""
    aad = item_key_aad(header.entry_id, header.owner_user_id, header.key_version)
    cipher = EntryCipher.of(owner.unwrap(wrapped_key, aad), header, nonce_prefix)
    if not isinstance(commitment, bytes) or not hmac.compare_digest(commitment, cipher.commitment):
        raise IntegrityError("the entry's key commitment does not match")
    return cipher


def _record_aad(table: str, row: dict[str, Any]) -> bytes:
    texts = (row["id"], row["owner_user_id"], row["actor"], row["channel"], row["turn_id"], str(row["seq"]))
    times = (float(row["created_at"]).hex(), float(row["expires_at"]).hex())
    return lp("turn-record", str(FORMAT_VERSION), table, *texts, *times)


def reseal_record(item_key: KeyHandle, table: str, row: dict[str, Any], body: bytes) -> bytes:
    """A turn record's sealed payload: AES-256-GCM under its item key; the AAD
    binds table, id, owner, actor, channel, turn, sequence number and both times."""
    nonce = os.urandom(12)
    return nonce + item_key.aead().encrypt(nonce, body, _record_aad(table, row))


def seal_record(owner: Wrapper, table: str, row: dict[str, Any], body: bytes) -> tuple[bytes, bytes]:
    """(wrapped item key, sealed payload) of a new turn record, under a fresh item key."""
    item_key = KeyHandle.random()
    wrapped = owner.wrap(item_key, record_key_aad(row["id"], row["owner_user_id"], row["key_version"]))
    return wrapped, reseal_record(item_key, table, row, body)


def open_record(owner: Wrapper, table: str, row: dict[str, Any]) -> tuple[KeyHandle, bytes]:
    """A stored turn record's item key and payload.
    Raises IntegrityError: the wrapped key or the payload fails authentication."""
    item_key = owner.unwrap(row["wrapped_key"], record_key_aad(row["id"], row["owner_user_id"], row["key_version"]))
    blob = row["sealed"]
    if not isinstance(blob, bytes) or len(blob) < 28:
        raise IntegrityError("a turn record is truncated")
    try:
        return item_key, item_key.aead().decrypt(blob[:12], blob[12:], _record_aad(table, row))
    except InvalidTag:
        raise IntegrityError("a turn record failed authentication") from None
