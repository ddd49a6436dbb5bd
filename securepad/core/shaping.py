"""Observation shaping, as pure functions: what is stored, what the model sees, what comes back.

``classify`` splits an observation into its content (text or bytes) and its
other fields; ``view`` builds the synthetic view; ``rebuild`` gives the
observation back from its content and fields. No keys, no database.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ..errors import IntegrityError, InvalidArgumentError
from . import views
from .segments import SEGMENT_BYTES

__all__ = ["binary_counts", "classify", "dumps", "pack", "rebuild", "unpack", "view"]

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
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent).encode("utf-8")
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


def classify(observation: Any, max_depth: int) -> tuple[str, str, str | bytes, dict[str, Any] | None]:
    """(kind, shape, content, rest): what is stored as content and what as sealed fields.

    Raises:
        InvalidArgumentError: non-string keys, nesting deeper than ``max_depth``,
            or fields that are not JSON.
    """
    if isinstance(observation, str):
        return "text", "str", observation, None
    if isinstance(observation, bytes | bytearray | memoryview):
        return "binary", "bytes", bytes(observation), None
    if isinstance(observation, dict) and isinstance(observation.get("content"), str | bytes):
        rest = {k: v for k, v in observation.items() if k != "content"}
        _check_structure(rest, max_depth)
        dumps(rest)  # the other fields must be JSON; fail before anything is stored
        content = observation["content"]
        return ("binary" if isinstance(content, bytes) else "text"), "dict", content, rest
    _check_structure(observation, max_depth)
    # Indented JSON: the readable content, so that lines and grep mean something.
    return "json", "json", dumps(observation, indent=2).decode("utf-8"), None


def _check_structure(value: Any, max_depth: int) -> None:
    """Refuse non-string dict keys anywhere (JSON would turn 1 into "1" and the
    observation would come back different from what was put), and nesting
    deeper than ``max_depth`` (JSON's encoder would hit Python's recursion
    limit). Iterative: a deep value cannot exhaust the stack here."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > max_depth:
            raise InvalidArgumentError(
                f"the observation nests deeper than {max_depth} levels (the policy's limits.max_json_depth)"
            )
        if isinstance(item, dict):
            if any(not isinstance(k, str) for k in item):
                raise InvalidArgumentError("structured observations need string keys at every level")
            pending.extend((v, depth + 1) for v in item.values())
        else:
            pending.extend((v, depth + 1) for v in item)


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
) -> dict[str, Any]:
    """The synthetic view, without the id (added when the entry is returned),
    within ``limit`` characters as JSON (with the id)."""
    shown: dict[str, Any] = {"step_num": step_num, "size_bytes": size_bytes, "kind": kind}
    fields = rest if rest is not None else (observation if isinstance(observation, dict) else {})
    if isinstance(content, bytes):
        shown["summary"] = views.binary_summary(content)
    elif kind == "text":
        shown["summary"] = views.text_summary(content)
    else:
        info = views.structure(observation)
        shown["summary"] = views.structure_summary(info)
        shown.update(info)
        field = f".{info['list_field']}" if info["list_field"] else ""
        shown["ref_hint"] = (
            f"pass {{{{step{step_num}{field}}}}} (or a path inside it, e.g. {{{{step{step_num}{field}.0}}}})"
            " as a tool argument instead of copying the data; read it with scratchpad_read"
        )
    metadata = fields.get("metadata")
    shown["metadata"] = metadata if isinstance(metadata, dict) else {}
    # Scalars (counts, flags, messages) sit at the top level; the view's own keys win.
    return views.fit_view(shown, views.scalars(fields), limit)


def binary_counts(size: int, segment_count: int) -> list[int]:
    """The byte counts of a binary entry's segments: every one but the last is full."""
    if segment_count <= 0:
        return []
    return [SEGMENT_BYTES] * (segment_count - 1) + [size - SEGMENT_BYTES * (segment_count - 1)]
