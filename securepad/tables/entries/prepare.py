"""An observation made ready to store: shaped and cut into segments
(``Prepared.of``, pure), sealed under a fresh id and item key (``seal``);
what its rows cost against the quota (``row_cost``)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from ...core import shaping
from ...core.shaping import Piece, cut_bytes, cut_text
from ...crypto.formats import NONCE_PREFIX_BYTES, EntryCipher, EntrySealer, ListingKey
from ...crypto.primitives import ContentIdentity, Wrapper
from ...errors import QuotaExceededError
from ...policy import Policy
from ...principal import Principal

__all__ = [
    "ENTRY_ROW_OVERHEAD",
    "Prepared",
    "check_write_bound",
    "check_write_size",
    "identifier_cost",
    "listing_fields",
    "row_cost",
    "split",
]


# What a listing part holds; the rest of the metadata is sealed under the item key.
_LISTING_FIELDS = ("view", "content_id", "inline")


def listing_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The part of an entry's metadata that its listing part holds."""
    return {name: meta[name] for name in _LISTING_FIELDS if name in meta}


def new_entry_id() -> str:
    """A fresh entry id: 8 random bytes as hex (``secrets.token_hex(8)``, without its two calls)."""
    return os.urandom(8).hex()


@dataclass(slots=True)
class Prepared:
    """An observation shaped and cut into segments, before it is sealed (pure)."""

    kind: str
    shape: str
    content: str | bytes
    rest: dict[str, Any] | None
    segments: list[Piece]  # views of the content's bytes: sealed, never stored as they are
    counts: list[int] | None
    size_bytes: int
    size_chars: int
    breaks: list[int] | None
    line_count: int | None
    stored_bytes: int  # what the observation stores (max_entry_bytes); the row's cost on disk is row_cost
    view: dict[str, Any]
    inline_max_chars: int  # the view's bound, kept for the next-step re-seal
    digest: bytes | None = None  # binary content's SHA-256: its view's and its identity's one pass
    identified: bool = True  # whether the entry gets a content identity (``of``'s ``identified``)

    @classmethod
    def of(cls, observation: Any, step_num: int, policy: Policy, identified: bool = True) -> Prepared:
        """``identified`` False: the content gets no identity (the re-read report never finds it
        again) and binary content is not hashed (its view's summary gives its size alone), a
        pass over its bytes fewer, for content only its writer reads back (a saver's values).

        Raises InvalidArgumentError (not storable) or QuotaExceededError (over ``max_entry_bytes``)."""
        max_entry_bytes = policy.max_entry_bytes
        kind, shape, content, rest, rest_bytes, measured = shaping.classify(observation, policy.max_json_depth)
        segments, counts, size_chars, breaks, line_count = split(content)
        size_bytes = sum(map(len, segments))
        # The limits count everything the observation stores: content and other fields.
        stored_bytes = size_bytes + rest_bytes
        if stored_bytes > max_entry_bytes:
            raise QuotaExceededError(
                f"the observation has {stored_bytes} bytes; the policy's max_entry_bytes is {max_entry_bytes}"
            )
        limit = policy.inline_max_chars
        digest = shaping.binary_digest(content) if identified and isinstance(content, bytes) else None
        # Back to back on classify's copy of the fields, whose measure (plain builtins only: no
        # code of the caller's runs in either) holds for the metadata the view shows.
        view = shaping.view(
            kind,
            step_num,
            size_bytes,
            content,
            rest,
            observation,
            limit,
            digest,
            hashed=identified,
            metadata_size=measured,
        )
        return cls(
            kind,
            shape,
            content,
            rest,
            segments,
            counts,
            size_bytes,
            size_chars,
            breaks,
            line_count,
            stored_bytes,
            view,
            limit,
            digest,
            identified,
        )

    def identity(self, identity: ContentIdentity) -> str:
        """The content's identity under ``identity`` (the owner's, of one key version):
        binary content's from its SHA-256 (hashed once, with its view), text's from its segments
        (only when ``identified``)."""
        if self.digest is not None:
            return identity.of_digest(self.kind, self.size_bytes, self.digest)
        return identity.of(self.kind, self.segments, self.size_bytes)

    def cost_bound(self, principal: Principal, turn_id: str, executor_name: str) -> int:
        """More than the entry's ``row_cost`` will be, before it is sealed."""
        identifiers = self.identifiers(
            principal.owner_user_id, turn_id, principal.actor, principal.channel, executor_name
        )
        return self.stored_bytes + ENTRY_ROW_OVERHEAD + _SEALING_BOUND + 32 * len(self.segments) + identifiers

    def cost_floor(self, principal: Principal, turn_id: str, executor_name: str) -> int:
        """At most the entry's ``row_cost``, before it is sealed: its sealed content (a tag a
        segment), the least its metadata, listing part (with the view's summary and the content
        identity), nonce prefix and commitment can take, its identifiers and the fixed overhead."""
        identifiers = self.identifiers(
            principal.owner_user_id, turn_id, principal.actor, principal.channel, executor_name
        )
        summary = self.view.get("summary")
        listing = _SEALED_LEAST + (_CONTENT_ID_LEAST if self.identified else 0)
        listing += len(summary) if isinstance(summary, str) else 0
        sealed = self.size_bytes + 16 * len(self.segments) + _SEALED_LEAST + listing + NONCE_PREFIX_BYTES + 32
        return sealed + identifiers + ENTRY_ROW_OVERHEAD

    def identifiers(self, owner: str, turn_id: str, actor: str, channel: str, executor_name: str) -> int:
        """``identifier_cost`` of the entry's rows: the same for every id (16 hex characters each)."""
        count = len(self.segments)
        return _identifier_cost(owner, turn_id, actor, channel, executor_name, count if count > 1 else 0)

    def meta(
        self,
        principal: Principal,
        step_num: int,
        executor_name: str,
        created: float,
        expires: float,
        inline: tuple[Any] | None,
    ) -> dict[str, Any]:
        """The entry's metadata: clear columns, what a read needs, what a listing shows."""
        meta = {
            "actor": principal.actor,
            "channel": principal.channel,
            "step_num": step_num,
            "executor_name": executor_name,
            "created_at": created,
            "expires_at": expires,
            "shape": self.shape,
            "rest": self.rest,
            "counts": self.counts,
            "breaks": self.breaks,
            "lines": self.line_count,
            "view": self.view,
        }
        if inline is not None:
            meta["inline"] = inline[0]
        return meta

    def seal(
        self, wrapper: Wrapper, listing: ListingKey, version: int, owner: str, turn_id: str, meta: dict[str, Any]
    ) -> tuple[dict[str, Any], list[bytes], EntryCipher]:
        """The entry's row, sealed segments and cipher under a fresh id and item
        key (format 2): what only a read needs is sealed under the item key, what
        a listing shows under ``listing``, the owner's listing key of ``version``,
        bound to the clear columns (which format 1 repeated inside its metadata)."""
        return self.seal_in(EntrySealer(wrapper, owner, turn_id, version), listing, version, owner, turn_id, meta)

    def seal_in(
        self, sealer: EntrySealer, listing: ListingKey, version: int, owner: str, turn_id: str, meta: dict[str, Any]
    ) -> tuple[dict[str, Any], list[bytes], EntryCipher]:
        """``seal`` by ``sealer`` (of ``owner``, ``turn_id`` and ``version``; a batch's, shared by
        its entries): the row under a fresh id and item key, its sealed segments and its cipher."""
        entry_id = new_entry_id()
        inner = _pack_inner(meta["shape"], meta["rest"], meta["counts"], meta["breaks"], meta["lines"])
        sizes = (self.size_bytes, self.size_chars)
        wrapped, nonce_prefix, cipher, sealed_meta, sealed = sealer.entry(
            entry_id, self.kind, sizes, inner, self.segments
        )
        actor, channel, executor = meta["actor"], meta["channel"], meta["executor_name"]
        row = {  # every column at once (the last two set below)
            "id": entry_id,
            "owner_user_id": owner,
            "actor": actor,
            "channel": channel,
            "turn_id": turn_id,
            "step_num": meta["step_num"],
            "executor_name": executor,
            "content_kind": self.kind,
            "size_bytes": self.size_bytes,
            "size_chars": self.size_chars,
            "segment_count": len(sealed),
            "key_version": version,
            "created_at": meta["created_at"],
            "expires_at": meta["expires_at"],
            "wrapped_key": wrapped,
            "nonce_prefix": nonce_prefix,
            "commitment": cipher.commitment,
            "sealed_meta": sealed_meta,
            # A one-segment entry's sealed segment stays in its row (no segments row).
            "only_segment": sealed[0] if len(sealed) == 1 else None,
            "sealed_listing": None,
            "stored_bytes": 0,
        }
        row["sealed_listing"] = listing.seal(row, shaping.pack(listing_fields(meta)))
        row["stored_bytes"] = row_cost(row, sealed, self.identifiers(owner, turn_id, actor, channel, executor))
        return row, sealed, cipher

    def restep(
        self, row: dict[str, Any], meta: dict[str, Any], listing: ListingKey, step_num: int, observation: Any
    ) -> None:
        """Give the sealed ``row`` another step: its view made and its listing part sealed again."""
        meta["view"] = self.view_at(meta["view"], step_num, observation)
        meta["step_num"] = row["step_num"] = step_num
        before = len(row["sealed_listing"])
        row["sealed_listing"] = listing.seal(row, shaping.pack(listing_fields(meta)))
        row["stored_bytes"] += len(row["sealed_listing"]) - before

    def view_at(self, view: dict[str, Any], step_num: int, observation: Any) -> dict[str, Any]:
        """The entry's view at ``step_num``, from ``view``, its view at another step: that view with
        the step changed when it was whole and the new step has no more digits (only a json view
        holds its step elsewhere, in its hint: every other one fits as it did, its fields as they
        were sealed); else made again from ``observation``."""
        old = view["step_num"]
        if (
            self.kind != "json"
            and "view_cut" not in view
            and type(step_num) is int
            and type(old) is int
            and len(int.__repr__(step_num)) <= len(int.__repr__(old))
        ):
            return {**view, "step_num": step_num}
        return shaping.view(
            self.kind,
            step_num,
            self.size_bytes,
            self.content,
            self.rest,
            observation,
            self.inline_max_chars,
            self.digest,
            hashed=self.identified,
        )


def _pack_inner(shape: str, rest: Any, counts: Any, breaks: Any, lines: Any) -> bytes:
    """``shaping.pack`` of what only a read needs of an entry's metadata (``seal``'s ``inner``)."""
    return shaping.pack({"shape": shape, "rest": rest, "counts": counts, "breaks": breaks, "lines": lines})


# What a row costs on disk besides its sealed bytes (measured: an empty entry
# grows the file by about 990 bytes, 530 of them sealed): clear columns, index
# entries, b-tree cells, the segment rows' keys. Counted against the quota, so
# that empty entries, checkpoints and marks are not free.
ENTRY_ROW_OVERHEAD = 512
# More than an entry's sealed fields add to its content (metadata, wrapped key,
# nonce prefix, commitment, listing part; 32 bytes a segment besides): ``cost_bound``.
_SEALING_BOUND = 2048


# The least a sealed part takes (a format or version byte, a 12-byte nonce, a 16-byte tag),
# and the least a content identity does ("<version>:" and 64 hex digits): ``cost_floor``.
_SEALED_LEAST = 1 + 12 + 16
_CONTENT_ID_LEAST = 2 + 64


def identifier_cost(
    entry_id: str, owner: str, turn_id: str, actor: str, channel: str, executor_name: str, segment_rows: int
) -> int:
    """What an entry's clear identifiers cost on disk, as UTF-8 bytes, the most
    either backend stores: each once in the row; the id, owner and turn again in
    the indexes (the owner twice more on PostgreSQL), index keys counted one and
    a half times (pages split half full); the id and owner twice in each segment row."""
    id_size, owner_size, turn_size = len(entry_id.encode()), len(owner.encode()), len(turn_id.encode())
    in_row = id_size + owner_size + turn_size + len(actor.encode()) + len(channel.encode())
    in_row += len(executor_name.encode())
    in_indexes = (id_size + 3 * owner_size + turn_size) * 3 // 2
    return in_row + in_indexes + segment_rows * 2 * (id_size + owner_size)


# The identifiers' cost is the same put after put into a turn (a bound before the seal, the row's
# cost after it): computed once per owner, turn, scope, executor and segment rows.
@functools.lru_cache(maxsize=256)
def _identifier_cost(owner: str, turn_id: str, actor: str, channel: str, executor_name: str, segment_rows: int) -> int:
    return identifier_cost("0" * 16, owner, turn_id, actor, channel, executor_name, segment_rows)


def row_cost(row: dict[str, Any], sealed: list[bytes], identifiers: int | None = None) -> int:
    """What an entry's rows cost on disk: sealed bytes, clear identifiers (``identifiers``:
    their ``identifier_cost``, known already) and a fixed overhead; kept in its
    ``stored_bytes`` (the head binds it) at the put."""
    sealed_bytes = sum(map(len, sealed))
    fields = len(row["sealed_meta"]) + len(row["wrapped_key"]) + len(row["nonce_prefix"]) + len(row["commitment"])
    fields += len(row.get("sealed_listing") or b"")
    if identifiers is None:
        identifiers = identifier_cost(
            row["id"],
            row["owner_user_id"],
            row["turn_id"],
            row["actor"],
            row["channel"],
            row["executor_name"],
            len(sealed) if len(sealed) > 1 else 0,
        )
    return sealed_bytes + fields + identifiers + ENTRY_ROW_OVERHEAD


def split(content: str | bytes) -> tuple[list[Piece], list[int] | None, int, list[int] | None, int | None]:
    """(segments, character counts, characters, line breaks, lines) of an entry's content."""
    if isinstance(content, bytes):
        return cut_bytes(content), None, 0, None, None
    segments, counts, breaks, line_count = cut_text(content)
    return segments, counts, len(content), breaks, line_count


def check_write_size(
    prepared: list[tuple[Prepared, str]], principal: Principal, turn_id: str, limit: int | None, what: str
) -> int:
    """Refuse, before anything is written, entries that could take more than
    ``limit`` bytes in one transaction (raises QuotaExceededError); the sum of
    their ``cost_bound``."""
    size = sum([p.cost_bound(principal, turn_id, executor) for p, executor in prepared])
    if limit is not None:
        check_write_bound(size, limit, what)
    return size


def check_write_bound(size: int, limit: int | None, what: str) -> None:
    """Refuse, before anything is written, a write of ``what`` that could take
    ``size`` bytes in one transaction when the backend stores at most ``limit``
    in one (``Backend.write_limit_bytes``; None: no bound).

    Raises:
        QuotaExceededError: over the limit.
    """
    if limit is not None and size > limit:
        raise QuotaExceededError(
            f"the {what} would write up to {size} bytes in one transaction; this store writes at most {limit}"
            " in one (half its write-ahead log limit, [storage] wal_limit_bytes): nothing was stored"
            + ("; split the batch" if what == "batch" else "")
        )
