"""Synthetic views: what the model sees instead of a large observation.

text: head and tail with the exact number of characters omitted between;
binary: size and a SHA-256 prefix, never a preview;
structured: the item count and field names, never the items.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

__all__ = ["SUMMARY_EDGE_CHARS", "binary_summary", "fit_view", "scalars", "structure", "text_summary"]

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


def binary_summary(data: bytes) -> str:
    """Size and a SHA-256 prefix of binary content."""
    return f"binary, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}"


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


def _json_size(value: Any) -> int:
    """``len(json.dumps(value, ensure_ascii=False))``: what the model is shown of a view, in characters."""
    return len(json.dumps(value, ensure_ascii=False))


# msgspec's JSON escapes the characters ``json.dumps(..., ensure_ascii=False)`` escapes, each to
# as many characters (tests/core/test_views.py holds it for every code point), in a fraction of the work.
_ENCODE = msgspec.json.Encoder().encode
_LITERALS = {None: 4, True: 4, False: 5}


def _text_size(text: str) -> int:
    """``_json_size`` of a string."""
    try:
        encoded = _ENCODE(text)
    except UnicodeEncodeError:  # a lone surrogate: json writes it as it is
        return _json_size(text)
    return len(encoded) if text.isascii() else len(encoded.decode())


def _item_size(value: Any) -> int:
    """``_json_size`` of a view's value: strings, numbers and literals measured without json's encoder."""
    kind = type(value)
    if kind is str:
        return _text_size(value)
    if kind is int:
        return len(int.__repr__(value))
    if kind is bool or value is None:
        return _LITERALS[value]
    if (kind is dict or kind is list) and not value:
        return 2
    return _json_size(value)


def _view_size(view: dict[str, Any]) -> int:
    """``_json_size`` of a view (a dict of string keys): ``{"key": value, ...}`` with json's separators."""
    if not view:
        return 2
    size = 4 * len(view)
    # One pass, the usual values (text, whole numbers) measured in line: every put measures its view.
    for key, value in view.items():
        if type(key) is not str:
            return _json_size(view)
        size += _KEY_SIZES.get(key) or _text_size(key)
        kind = type(value)
        if kind is int:
            size += len(int.__repr__(value))
        elif kind is str:
            size += _text_size(value)
        else:
            size += _item_size(value)
    return size


def fit_view(view: dict[str, Any], kept_scalars: dict[str, Any], limit: int) -> dict[str, Any]:
    """``{**kept_scalars, **view}`` if its JSON (with the id the store adds)
    fits in ``limit`` characters; else the view cut to fit: the summary
    shortened, schema names, metadata fields and scalars kept only while they
    fit, and ``view_cut`` naming what was cut (read the entry for the rest).
    Only the core (step, size, kind) can overrun a limit too small for it."""
    whole = {**kept_scalars, **view}
    if _view_size(whole) + _VIEW_FRAME <= limit:
        return whole
    budget = limit - _VIEW_FRAME - _CUT_RESERVE
    fitted: dict[str, Any] = {key: view[key] for key in _CORE if key in view}
    cut: list[str] = []

    def room() -> int:
        return budget - _json_size(fitted)

    for key in _OPTIONAL:
        if key not in view:
            continue
        value = view[key]
        cost = len(json.dumps(key)) + 4 + _json_size(value)  # ', "key": value'
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
        if len(json.dumps(key)) + 4 + _json_size(value) <= room():
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
    while cut > 0 and _json_size(text[:cut] + "…") > room:
        cut = max(0, min(cut - 1, cut - (_json_size(text[:cut] + "…") - room)))
    return text[:cut] + "…" if cut else ""


def _prefix_fitting(items: list[Any], room: int, *, pairs: bool = False) -> list[Any]:
    """The longest prefix of ``items`` whose JSON (a list, or a dict for pairs) fits in ``room``."""
    kept: list[Any] = []
    used = 2  # the brackets
    for item in items:
        cost = (len(json.dumps(item[0])) + 2 + _json_size(item[1]) if pairs else _json_size(item)) + 2
        if used + cost > room:
            break
        kept.append(item)
        used += cost
    return kept
