"""Synthetic views: what the model sees instead of a large observation.

text: head and tail with the exact number of characters omitted between;
binary: size and a SHA-256 prefix, never a preview;
structured: the item count and field names, never the items.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["SUMMARY_EDGE_CHARS", "binary_summary", "scalars", "structure", "text_summary"]

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
