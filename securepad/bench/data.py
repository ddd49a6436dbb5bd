"""Deterministic observation text: the same bytes for every backend, regenerable
from a salt, so the concurrent workload can check every acknowledged put."""

from __future__ import annotations

import base64
import functools
import random

_BLOCK_BYTES = 1 << 20
_LINE = 99  # characters per line before the newline: log-like text


@functools.cache
def _block() -> str:
    """1 MiB of printable ASCII in 100-character lines (ASCII: one byte per character)."""
    raw = base64.b64encode(random.Random(1).randbytes(_BLOCK_BYTES)).decode("ascii")
    lines = [raw[i : i + _LINE] for i in range(0, len(raw), _LINE)]
    return "\n".join(lines)[:_BLOCK_BYTES]


def text(size: int, salt: int = 0) -> str:
    """ASCII text of exactly ``size`` characters (and bytes); different salts give different text."""
    head = f"entry {salt:020d}\n"
    if size <= len(head):
        return head[:size]
    block = _block()
    pos = (salt * 7919) % len(block)
    parts = [head]
    missing = size - len(head)
    while missing:
        piece = block[pos : pos + missing]
        parts.append(piece)
        missing -= len(piece)
        pos = 0
    return "".join(parts)
