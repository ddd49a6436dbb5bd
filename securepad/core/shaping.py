"""Observation shaping, as pure functions: what is stored, what the model sees, what comes back.

``classify`` splits an observation into its content (text or bytes) and its
other fields; ``cut_text``/``cut_bytes`` cut the content into the segments
it is sealed in, with ``line_index``'s count of its lines; ``view`` builds the synthetic
view (text: head and tail with the exact number of characters omitted between;
binary: size and a SHA-256 prefix, never a preview; structured: the item count
and field names, never the items); ``rebuild`` gives the observation back from
its content and fields. No keys, no database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from ..errors import IntegrityError, InvalidArgumentError
from .grep import BREAK_CHARS
from .json_size import checked_structure, item_size, json_size, measured_metadata, plain_json, text_size

__all__ = [
    "SEGMENT_BYTES",
    "SEGMENT_SLACK",
    "SUMMARY_EDGE_CHARS",
    "binary_counts",
    "binary_digest",
    "binary_summary",
    "classify",
    "cut_bytes",
    "cut_text",
    "dumps",
    "fit_view",
    "line_index",
    "newlines",
    "pack",
    "rebuild",
    "scalars",
    "split_bytes",
    "structure",
    "text_summary",
    "unpack",
    "view",
]

# A segment's size (the last may take SEGMENT_SLACK more): a read opens only the segments its slice needs.
SEGMENT_BYTES = 64 * 1024


def split_bytes(data: bytes) -> list[bytes]:
    """Fixed-size segments of binary content, the last the rest (one empty segment for
    empty content): the sealed floor's cut, whose reads find a segment by its offset."""
    if not data:
        return [b""]
    return [data[i : i + SEGMENT_BYTES] for i in range(0, len(data), SEGMENT_BYTES)]


# A tail of at most this many bytes joins the segment before it: content a little over
# a segment (a 64 KiB value with its encoding's header) is one segment, kept in its row.
# Entries of any cut read back: a text entry's sealed counts give each segment's
# characters, and a binary entry's segments are full but its last, whatever its size.
SEGMENT_SLACK = SEGMENT_BYTES // 16

# A segment as it is sealed: the content's bytes, or a view of them (no copy).
Piece = bytes | memoryview


def _spans(size: int, segment: int, slack: int) -> list[tuple[int, int]]:
    """(start, end) of each segment of ``size`` bytes: every ``segment`` bytes, the last up to ``slack`` more."""
    starts = range(0, max(size - slack, 1), segment)  # a start leaves more than ``slack`` bytes after it
    return [(start, start + segment) for start in starts[:-1]] + [(starts[-1], size)]


def cut_bytes(data: bytes, segment: int = SEGMENT_BYTES, slack: int = SEGMENT_SLACK) -> list[Piece]:
    """Binary content's segments: views of ``data``, each ``segment`` bytes but
    the last (up to ``segment + slack``); one segment (``data``, empty or not) when it fits."""
    if len(data) <= segment + slack:
        return [data]
    view = memoryview(data)
    return [view[start:end] for start, end in _spans(len(data), segment, slack)]


def cut_text(
    text: str, segment: int = SEGMENT_BYTES, slack: int = SEGMENT_SLACK
) -> tuple[list[Piece], list[int], list[int], int]:
    """Text's UTF-8 segments (views of one encoding, cut on character boundaries,
    each at most ``segment`` bytes (at least 4) but the last, up to ``segment + slack``), the
    characters in each, the line breaks ending in each and the line count
    (``line_index``'s): the text encoded once, and ASCII text (most) neither
    decoded again nor copied, its breaks counted in the text itself.

    Raises:
        InvalidArgumentError: the text holds lone surrogates (not valid Unicode).
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("text content must be valid Unicode (no lone surrogates)") from None
    only_newlines = _only_newlines(text)  # ASCII, every break a "\n" (most text): counted in its bytes
    if len(data) <= segment + slack:  # one segment: the text is its own piece
        if only_newlines:
            count = newlines(data)
            return [data], [len(text)], [count], count + (text[-1:] not in ("", "\n"))
        breaks, lines = line_index([text])
        return [data], [len(text)], breaks, lines
    view = memoryview(data)
    if not text.isascii():
        pieces: list[Piece] = list(_utf8_pieces(view, segment, slack))
        decoded = [str(piece, "utf-8") for piece in pieces]
        breaks, lines = line_index(decoded)
        return pieces, list(map(len, decoded)), breaks, lines
    # One byte a character: the cuts are the same in the text and in its bytes.
    spans = _spans(len(data), segment, slack)
    pieces = [view[start:end] for start, end in spans]
    counts = [end - start for start, end in spans]
    if only_newlines:
        breaks = [newlines(data[start:end]) for start, end in spans]
        return pieces, counts, breaks, sum(breaks) + (text[-1] != "\n")
    breaks, lines = line_index([text[start:end] for start, end in spans])
    return pieces, counts, breaks, lines


# Lines longer than this on average are counted from break to break (``newlines``).
_LONG_LINE = 40
# The first bytes, whose breaks choose how ``newlines`` counts.
_SAMPLE = 256


def newlines(data: bytes) -> int:
    """``data.count(b"\n")``. Where lines average more than ``_LONG_LINE`` bytes
    (most text), CPython's ``bytes.replace`` goes from break to break with memchr,
    faster than ``count``'s byte loop; on denser breaks memchr's calls cost more
    than the loop, so the first ``_SAMPLE`` bytes choose, and a denser part further
    on stops ``replace`` at its cap, after which ``count`` runs."""
    size = len(data)
    if size <= _SAMPLE or data.count(b"\n", 0, _SAMPLE) * _LONG_LINE >= _SAMPLE:
        return data.count(b"\n")
    cap = size // _LONG_LINE + 1
    removed = size - len(data.replace(b"\n", b"", cap))
    return removed if removed < cap else data.count(b"\n")


def _utf8_pieces(view: memoryview, segment: int, slack: int) -> Iterator[memoryview]:
    """``view`` (valid UTF-8, more than ``segment + slack`` bytes) cut as ``cut_text`` does."""
    size, pos = len(view), 0
    while size - pos > segment + slack:
        end = pos + segment
        while view[end] & 0xC0 == 0x80:  # a continuation byte: the cut moves back to its character's start
            end -= 1
        yield view[pos:end]
        pos = end
    yield view[pos:]


SUMMARY_EDGE_CHARS = 500
# Top-level strings longer than this are content, not scalars worth preserving.
MAX_SCALAR_CHARS = 200
SCHEMA_SAMPLE_ITEMS = 50


def text_summary(text: str, edge: int = SUMMARY_EDGE_CHARS) -> str:
    """The first and last ``edge`` characters with the exact count omitted between."""
    if len(text) <= 2 * edge:
        return text
    omitted = len(text) - 2 * edge
    return f"{text[:edge]}[... {omitted} characters omitted ...]{text[-edge:]}"


def binary_summary(data: bytes, digest: bytes | None = None) -> str:
    """Size and a SHA-256 prefix of binary content (``digest``: its SHA-256, taken already)."""
    if digest is None:
        digest = hashlib.sha256(data).digest()
    return f"binary, {len(data)} bytes, sha256 {digest.hex()[:16]}"


def binary_digest(data: bytes) -> bytes:
    """The SHA-256 of binary content: its view's summary and its content identity both use it."""
    return hashlib.sha256(data).digest()


def structure(value: Any) -> dict[str, Any]:
    """``list_field``, ``count`` and ``schema`` of a structured observation.

    The list described is the value itself when it is a list, else its
    largest top-level list. ``schema`` names the fields of the list's items
    (or the top-level keys when there is no list).
    """
    list_field: str | None = None
    items: list[Any] | None = None
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict):
        lists = [(len(v), k) for k, v in value.items() if isinstance(v, list)]
        if lists:
            _, list_field = max(lists)
            items = value[list_field]
    if items is None:
        keys = sorted(value) if isinstance(value, dict) else []
        return {"list_field": None, "count": len(keys), "schema": keys}
    fields: set[str] = set()
    for item in items[:SCHEMA_SAMPLE_ITEMS]:
        if isinstance(item, dict):
            fields.update(str(k) for k in item)
    return {"list_field": list_field, "count": len(items), "schema": sorted(fields)}


def structure_summary(info: dict[str, Any]) -> str:
    """One line for the model from ``structure``'s result."""
    where = f" in '{info['list_field']}'" if info["list_field"] else ""
    fields = ", ".join(info["schema"]) if info["schema"] else "none"
    return f"structured: {info['count']} items{where}; fields: {fields}"


def scalars(observation: dict[str, Any]) -> dict[str, Any]:
    """Top-level scalar fields worth keeping in the view (counts, flags, messages)."""
    kept: dict[str, Any] = {}
    for key, value in observation.items():
        if key in ("content", "metadata"):
            continue
        if (
            value is None
            or isinstance(value, bool | int | float)
            or (isinstance(value, str) and len(value) <= MAX_SCALAR_CHARS)
        ):
            kept[key] = value
    return kept


# A view's own keys, as JSON strings (a scalar's key is measured).
_KEY_SIZES = {
    key: len(json.dumps(key))
    for key in (
        "step_num",
        "size_bytes",
        "kind",
        "summary",
        "metadata",
        "list_field",
        "count",
        "schema",
        "ref_hint",
        "view_cut",
    )
}
# What the store adds to a view ("ok" and the 16-hex id), as JSON.
_VIEW_FRAME = len(json.dumps({"ok": True, "scratchpad_id": "0" * 16}, ensure_ascii=False))
# Kept whatever the limit: they say what the entry is and how to read it.
_CORE = ("step_num", "size_bytes", "kind")
# Then, as long as they fit, in this order.
_OPTIONAL = ("list_field", "count", "summary", "ref_hint", "schema", "metadata")
# The longest "view_cut" there can be, reserved up front.
_CUT_RESERVE = len(', "view_cut": ') + len(json.dumps([*_OPTIONAL, "scalars"]))


def _view_size(view: dict[str, Any], metadata: int | None = None) -> int:
    """``json_size`` of a view (a dict of string keys): ``{"key": value, ...}`` with json's
    separators; ``metadata``: the ``json_size`` of its metadata, measured already."""
    if not view:
        return 2
    size = 4 * len(view)
    # One pass, the usual values (text, whole numbers) measured in line: every put measures its view.
    for key, value in view.items():
        if type(key) is not str:
            return json_size(view)
        size += _KEY_SIZES.get(key) or text_size(key)
        kind = type(value)
        if kind is int:
            size += len(int.__repr__(value))
        elif kind is str:
            size += text_size(value)
        elif metadata is not None and key == "metadata":
            size += metadata
        else:
            size += item_size(value)
    return size


def fit_view(
    view: dict[str, Any], kept_scalars: dict[str, Any], limit: int, metadata_size: int | None = None
) -> dict[str, Any]:
    """``{**kept_scalars, **view}`` if its JSON (with the id the store adds)
    fits in ``limit`` characters; else the view cut to fit: the summary
    shortened, schema names, metadata fields and scalars kept only while they
    fit, and ``view_cut`` naming what was cut (read the entry for the rest).
    Only the core (step, size, kind) can overrun a limit too small for it.
    ``metadata_size``: the ``json_size`` of ``view["metadata"]``, measured already."""
    whole = {**kept_scalars, **view}
    if _view_size(whole, metadata_size) + _VIEW_FRAME <= limit:
        return whole
    budget = limit - _VIEW_FRAME - _CUT_RESERVE
    fitted: dict[str, Any] = {key: view[key] for key in _CORE if key in view}
    cut: list[str] = []

    def room() -> int:
        return budget - json_size(fitted)

    for key in _OPTIONAL:
        if key not in view:
            continue
        value = view[key]
        cost = len(json.dumps(key)) + 4 + json_size(value)  # ', "key": value'
        if cost <= room():
            fitted[key] = value
            continue
        cut.append(key)
        if key == "summary" and isinstance(value, str):
            fitted[key] = _cut_text(value, room() - len(json.dumps(key)) - 4)
        elif key == "schema" and isinstance(value, list):
            fitted[key] = _prefix_fitting(value, room() - len(json.dumps(key)) - 4)
        elif key == "metadata" and isinstance(value, dict):
            fitted[key] = dict(_prefix_fitting(list(value.items()), room() - len(json.dumps(key)) - 4, pairs=True))
        if key in fitted and room() < 0:
            del fitted[key]
    for key, value in kept_scalars.items():
        if key in view:
            continue
        if len(json.dumps(key)) + 4 + json_size(value) <= room():
            fitted[key] = value
        elif "scalars" not in cut:
            cut.append("scalars")
    fitted["view_cut"] = cut
    return fitted


def _cut_text(text: str, room: int) -> str:
    """A prefix of ``text`` ending in "…" whose JSON (quotes included) fits in ``room`` ("" if none does)."""
    if room < 4:
        return ""
    cut = min(len(text), room)
    while cut > 0 and json_size(text[:cut] + "…") > room:
        cut = max(0, min(cut - 1, cut - (json_size(text[:cut] + "…") - room)))
    return text[:cut] + "…" if cut else ""


def _prefix_fitting(items: list[Any], room: int, *, pairs: bool = False) -> list[Any]:
    """The longest prefix of ``items`` whose JSON (a list, or a dict for pairs) fits in ``room``."""
    kept: list[Any] = []
    used = 2  # the brackets
    for item in items:
        cost = (len(json.dumps(item[0])) + 2 + json_size(item[1]) if pairs else json_size(item)) + 2
        if used + cost > room:
            break
        kept.append(item)
        used += cost
    return kept


# pack's leading byte: how the rest is encoded.
PACKED_MSGPACK = 1
PACKED_JSON = 2
_MSGPACK_BYTE = bytes((PACKED_MSGPACK,))
_JSON_BYTE = bytes((PACKED_JSON,))
_msgpack_encode = msgspec.msgpack.Encoder().encode
_msgpack_decode = msgspec.msgpack.Decoder().decode
_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


def dumps(value: Any, *, indent: int | None = None) -> bytes:
    """Compact UTF-8 JSON (or indented, for a json entry's readable content).

    Raises:
        InvalidArgumentError: the value is not JSON-serializable.
    """
    return _json_text(value, indent).encode("utf-8")


def _json_text(value: Any, indent: int | None) -> str:
    """``dumps`` as text. Raises InvalidArgumentError: not JSON-serializable."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"the observation is not JSON-serializable: {exc}") from None


def pack(value: Any) -> bytes:
    """The sealed metadata's encoding: a version byte, then msgpack (msgspec).

    Chosen by measurement (docs/decisions/0005-listing-key.md): faster to
    encode and decode than ``json``, and a little smaller. msgpack carries what JSON does (the values reaching here
    passed ``dumps``) except integers beyond 64 bits, which JSON allows:
    those few values are written as JSON (msgspec's) under the other version
    byte, so nothing storable before is refused now. Both decode to what
    ``json.loads(dumps(value))`` gives (tuples become lists).

    Raises:
        InvalidArgumentError: the value is not JSON-serializable.
    """
    try:
        return _MSGPACK_BYTE + _msgpack_encode(value)
    except OverflowError:
        pass
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidArgumentError(f"the observation is not JSON-serializable: {exc}") from None
    try:
        return _JSON_BYTE + _json_encode(value)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidArgumentError(f"the observation is not JSON-serializable: {exc}") from None


def unpack(blob: bytes) -> Any:
    """What ``pack`` encoded (the blob was authenticated: a failure here is a bug or an unknown version).

    Raises:
        IntegrityError: an unknown version byte, or a body that does not decode.
    """
    version, body = blob[:1], memoryview(blob)[1:]
    try:
        if version == _MSGPACK_BYTE:
            return _msgpack_decode(body)
        if version == _JSON_BYTE:
            return _json_decode(body)
    except msgspec.DecodeError:
        raise IntegrityError("the entry's sealed metadata does not decode") from None
    raise IntegrityError("the entry's sealed metadata has an unknown encoding")


def classify(observation: Any, max_depth: int) -> tuple[str, str, str | bytes, dict[str, Any] | None, int, int | None]:
    """(kind, shape, content, rest, the size of rest's JSON (``dumps``; 0 without rest), the
    ``json_size`` of rest's metadata when measured on the way (``json_size.measured_metadata``;
    else None)): what is stored as content and what as sealed fields.

    Raises:
        InvalidArgumentError: non-string keys, nesting deeper than ``max_depth``,
            or fields that are not JSON.
    """
    if isinstance(observation, str):
        return "text", "str", observation, None, 0, None
    if isinstance(observation, bytes | bytearray | memoryview):
        return "binary", "bytes", bytes(observation), None, 0, None
    if isinstance(observation, dict) and isinstance(observation.get("content"), str | bytes):
        rest = {k: v for k, v in observation.items() if k != "content"}
        spaces = checked_structure(rest, max_depth)
        encoded = plain_json(rest, spaces) if rest else None
        # The other fields must be JSON (json refuses what is not): fail before anything is stored.
        if encoded is not None:
            size = len(encoded) + spaces  # type: ignore[operator]
        else:
            size = len(dumps(rest)) if rest else 0
        content = observation["content"]
        kind = "binary" if isinstance(content, bytes) else "text"
        return kind, "dict", content, rest, size, measured_metadata(rest, encoded, spaces)
    checked_structure(observation, max_depth)
    # Indented JSON: the readable content, so that lines and grep mean something (text: encoded once, to seal).
    return "json", "json", _json_text(observation, 2), None, 0, None


def rebuild(shape: str, whole: str | bytes, rest: dict[str, Any] | None) -> Any:
    """The observation as it was put, from its content and its other fields."""
    if shape == "json":
        return json.loads(whole)
    if shape == "dict":
        return {**(rest or {}), "content": whole}
    return whole


def view(
    kind: str,
    step_num: int,
    size_bytes: int,
    content: str | bytes,
    rest: dict[str, Any] | None,
    observation: Any,
    limit: int,
    digest: bytes | None = None,
    *,
    hashed: bool = True,
    metadata_size: int | None = None,
) -> dict[str, Any]:
    """The synthetic view, without the id (added when it is returned), within ``limit`` characters
    as JSON (with the id); ``digest``: binary content's SHA-256, taken already; not ``hashed``:
    binary content's summary gives its size alone (no pass over its bytes); ``metadata_size``:
    ``classify``'s measure of ``rest``'s metadata, given only when nothing changed ``rest`` since."""
    shown: dict[str, Any] = {"step_num": step_num, "size_bytes": size_bytes, "kind": kind}
    if kind == "text" and rest is None and type(observation) is str:
        # Plain text, the usual observation: no fields, so no scalars and no metadata to measure.
        shown["summary"] = summary = text_summary(observation)
        shown["metadata"] = {}
        # msgspec escapes an ASCII string as json does (``text_size``'s test, in place).
        summary_size = len(_json_encode(summary)) if summary.isascii() else text_size(summary)
        size = _TEXT_VIEW_SIZE + len(int.__repr__(step_num)) + len(int.__repr__(size_bytes)) + summary_size
        return shown if type(step_num) is type(size_bytes) is int and size <= limit else fit_view(shown, {}, limit)
    fields = rest if rest is not None else (observation if isinstance(observation, dict) else {})
    if isinstance(content, bytes):
        shown["summary"] = binary_summary(content, digest) if hashed else f"binary, {size_bytes} bytes"
    elif kind == "text":
        shown["summary"] = text_summary(content)
    else:
        info = structure(observation)
        shown["summary"] = structure_summary(info)
        shown.update(info)
        field = f".{info['list_field']}" if info["list_field"] else ""
        shown["ref_hint"] = (
            f"pass {{{{step{step_num}{field}}}}} (or a path inside it, e.g. {{{{step{step_num}{field}.0}}}})"
            " as a tool argument instead of copying the data; read it with scratchpad_read"
        )
    metadata = fields.get("metadata")
    shown["metadata"] = metadata if isinstance(metadata, dict) else {}
    if rest is None:
        metadata_size = None
    elif metadata_size is not None and len(rest) == 1 and type(step_num) is type(size_bytes) is int:
        # The metadata alone beside the content, measured: no scalars, so the view is measured in line.
        size = _VIEW_KEYS_SIZE + len(int.__repr__(step_num)) + len(int.__repr__(size_bytes)) + len(kind) + 2
        if size + text_size(shown["summary"]) + metadata_size <= limit:
            return shown
    # Scalars (counts, flags, messages) sit at the top level; the view's own keys win.
    return fit_view(shown, scalars(fields), limit, metadata_size)


# A view's JSON (with the id the store adds) but for the values of its five keys (step, size,
# kind, summary, metadata): ``view``'s measures in line (``fit_view`` measures the same).
_VIEW_KEYS_SIZE = (
    _VIEW_FRAME + 4 * 5 + sum(_KEY_SIZES[key] for key in ("step_num", "size_bytes", "kind", "summary", "metadata"))
)
# A plain text view's: "text" and an empty metadata object besides.
_TEXT_VIEW_SIZE = _VIEW_KEYS_SIZE + len(json.dumps("text")) + 2


def binary_counts(size: int, segment_count: int) -> list[int]:
    """The byte counts of a binary entry's segments: every one but the last is full."""
    if segment_count <= 0:
        return []
    return [SEGMENT_BYTES] * (segment_count - 1) + [size - SEGMENT_BYTES * (segment_count - 1)]


def _only_newlines(text: str) -> bool:
    """Whether "\n" is the only one of BREAK_CHARS ``text`` may hold: ASCII (a flag of the
    string, no scan) without the other ASCII breaks (each looked for with memchr)."""
    return (
        text.isascii()
        and "\r" not in text
        and "\x0b" not in text
        and "\x0c" not in text
        and "\x1c" not in text
        and "\x1d" not in text
        and "\x1e" not in text
    )


def line_index(texts: Iterable[str]) -> tuple[list[int], int]:
    """For text cut into ``texts``: the line breaks ending in each piece, and the line count.

    A ``"\\r\\n"`` split between two pieces ends in the second one.
    """
    if type(texts) is list and len(texts) == 1 and _only_newlines(texts[0]):
        # One piece whose breaks are all "\n" (most text): its count, and a trailing line if unended.
        text = texts[0]
        count = text.count("\n")
        return [count], count + (1 if text and text[-1] != "\n" else 0)
    breaks: list[int] = []
    last_char = ""
    last_filled = -1
    for seq, text in enumerate(texts):
        if _only_newlines(text):  # every break a "\n": counted in C, no list of lines built
            breaks.append(text.count("\n"))
        else:
            # splitlines() breaks on exactly BREAK_CHARS ("\r\n" once) in one pass:
            # five times faster than counting each character (11 ms of a 1 MiB put).
            lines = len(text.splitlines())
            breaks.append(lines - 1 if text and text[-1] not in BREAK_CHARS else lines)
        if text and text[0] == "\n" and last_char == "\r":
            breaks[last_filled] -= 1
        if text:
            last_char, last_filled = text[-1], seq
    trailing = 1 if last_char and last_char not in BREAK_CHARS else 0
    return breaks, sum(breaks) + trailing
