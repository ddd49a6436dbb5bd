"""What ``json.dumps(value, ensure_ascii=False)`` writes, measured without writing it
when the value is plain JSON, and the structure checks a put makes of a value.

A value is plain when it is built of exact ``dict`` (string keys), ``list`` and
``tuple`` around exact ``str``, ``int``, ``bool`` and ``None``: msgspec's compact
JSON of it is then json's but for the space json's separators put after each
comma and colon between items (msgspec escapes the characters json escapes, each
to as many characters; tests/core/test_shaping.py holds it for every code
point). Anything else (floats, whose shortest forms the two write differently,
subclasses, other objects) is measured by json itself, as is a value msgspec
refuses (a lone surrogate). No keys, no database.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ..errors import InvalidArgumentError

__all__ = [
    "checked_structure",
    "dumps_bytes",
    "item_size",
    "json_copy",
    "json_size",
    "measured_metadata",
    "plain_json",
    "plain_spaces",
    "text_size",
]

_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode
_LITERALS = {None: 4, True: 4, False: 5}
_CONTAINERS = (dict, list, tuple)
# The exact types of plain JSON (see the module doc), looked up by each item's ``type``.
_SCALARS = frozenset((str, int, bool, type(None)))
_PLAIN_CONTAINERS = frozenset(_CONTAINERS)
_PLAIN = _SCALARS | _PLAIN_CONTAINERS
_STR = frozenset((str,))


def json_size(value: Any) -> int:
    """``len(json.dumps(value, ensure_ascii=False))``: what the model is shown of a value, in characters."""
    return len(json.dumps(value, ensure_ascii=False))


def text_size(text: str) -> int:
    """``json_size`` of a string."""
    try:
        encoded = _ENCODE(text)
    except UnicodeEncodeError:  # a lone surrogate: json writes it as it is
        return json_size(text)
    return len(encoded) if text.isascii() else len(encoded.decode())


def item_size(value: Any) -> int:
    """``json_size`` of a view's value: strings, numbers, literals and plain containers
    measured without json's encoder."""
    kind = type(value)
    if kind is str:
        return text_size(value)
    if kind is int:
        return len(int.__repr__(value))
    if kind is bool or value is None:
        return _LITERALS[value]
    if kind is dict or kind is list or kind is tuple:
        if not value:
            return 2
        spaces = plain_spaces(value)
        if spaces is not None:
            try:
                encoded = _ENCODE(value)
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
                return json_size(value)
            return spaces + (len(encoded) if encoded.isascii() else len(encoded.decode()))
    return json_size(value)


def dumps_bytes(value: Any, spaces: int | None) -> int | None:
    """``len(shaping.dumps(value))`` (its UTF-8 bytes) from msgspec's JSON of a plain
    value whose separators add ``spaces`` (``checked_structure``'s answer); None: not
    plain, or msgspec refuses it (the caller measures with json, which raises as it does)."""
    encoded = plain_json(value, spaces)
    return None if encoded is None else len(encoded) + spaces  # type: ignore[operator]


def plain_json(value: Any, spaces: int | None) -> bytes | None:
    """msgspec's compact JSON of a plain value (``spaces``: ``checked_structure``'s answer,
    None: not plain); None: not plain, or msgspec refuses it."""
    if spaces is None:
        return None
    try:
        return _ENCODE(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None


# ``{"metadata":`` and ``}``: what a dict of that one field adds to its value's compact JSON.
_METADATA_FRAME = len(_ENCODE({"metadata": None})) - len(_ENCODE(None))


def measured_metadata(fields: dict[str, Any], encoded: bytes | None, spaces: int | None) -> int | None:
    """``json_size(fields["metadata"])`` when ``fields`` holds that one field, a plain dict, and
    ``encoded`` is their msgspec JSON (``plain_json``) whose separators add ``spaces``: the
    measure of the whole, less the field's frame and the one space after its colon, without
    walking the value again. None: not so (the view measures its metadata itself)."""
    if encoded is None or spaces is None or len(fields) != 1 or type(fields.get("metadata")) is not dict:
        return None
    chars = len(encoded) if encoded.isascii() else len(encoded.decode())
    return chars - _METADATA_FRAME + spaces - 1


def checked_structure(value: Any, max_depth: int) -> int | None:
    """Refuse non-string dict keys anywhere (JSON would turn 1 into "1" and the
    observation would come back different from what was put), and nesting
    deeper than ``max_depth`` (JSON's encoder would hit Python's recursion
    limit). Iterative: a deep value cannot exhaust the stack here. Returns the
    spaces json's separators add to a plain value's compact JSON (None: not plain).

    Raises:
        InvalidArgumentError: a non-string key, or nesting deeper than ``max_depth``.
    """
    if not isinstance(value, _CONTAINERS):
        return 0 if type(value) in _PLAIN else None
    spaces: int | None = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    pop, push = pending.pop, pending.append
    while pending:  # containers only, in the order a stack of every item would pop them
        item, depth = pop()
        if depth > max_depth:
            raise InvalidArgumentError(
                f"the observation nests deeper than {max_depth} levels (the policy's limits.max_json_depth)"
            )
        kind = type(item)
        if kind is dict:
            children: Any = item.values()
            if not _STR.issuperset(map(type, item)):  # each key's type, looked at in C
                _check_keys(item)
                spaces = None
            elif spaces is not None and item:
                spaces += 2 * len(item) - 1
        elif kind is list or kind is tuple:
            children = item
            if spaces is not None and item:
                spaces += len(item) - 1
        else:  # a subclass: its keys and items as its own iteration gives them
            spaces = None
            if isinstance(item, dict):
                _check_keys(item)
                children = item.values()
            else:
                children = item
        if _PLAIN.issuperset(map(type, children)):
            # Plain items: the plain containers among them go on the stack (none: nothing to do).
            if not _SCALARS.issuperset(map(type, children)):
                for child in children:
                    if type(child) in _PLAIN_CONTAINERS:
                        push((child, depth + 1))
            continue
        spaces = None
        for child in children:
            if isinstance(child, _CONTAINERS):
                push((child, depth + 1))
    return spaces


def _check_keys(item: dict[Any, Any]) -> None:
    """Raises InvalidArgumentError: a key of ``item`` is not a string."""
    if any(not isinstance(k, str) for k in item):
        raise InvalidArgumentError("structured observations need string keys at every level")


def plain_spaces(value: Any) -> int | None:
    """``checked_structure``'s spaces of a value without its checks (None: not plain,
    a non-string key among them)."""
    try:
        return checked_structure(value, 1 << 30)
    except InvalidArgumentError:
        return None


def json_copy(value: Any) -> Any:
    """``json.loads(json.dumps(value))`` (what a value is once stored as JSON: tuples
    become lists, other keys strings), a plain value copied through msgspec.

    Raises:
        TypeError, ValueError: as ``json.dumps`` does.
    """
    if plain_spaces(value) is not None:
        try:
            return _DECODE(_ENCODE(value))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError, msgspec.DecodeError):
            pass
    return json.loads(json.dumps(value))
