"""Which encoding for the header digest input and the sealed metadata.

``python -m securepad.bench.encoding [--repeat N] [--json]``

Per call, in microseconds (the best of five rounds, so the figures say what
the code costs rather than how loaded the machine was), and in bytes:

- ``header digest``: the input of an entry's header digest (the AAD of its
  segments and metadata), built and hashed: the JSON object of the first
  format beside a fixed ``struct`` layout (what ``crypto.Header.digest``
  writes since format 2) and msgpack (msgspec);
- ``listing AAD``: what a listing part is bound to (fifteen clear columns),
  packed by ``struct`` and by msgpack (what ``crypto.listing_aad`` writes);
- ``listing part``, ``entry metadata``: encode and decode of what a listing
  shows of an entry (its view, its history item, its content identity) and of
  what only a read needs (shape, other fields, segment and line index), for
  three observation shapes (text, text with fields, structured JSON), with
  the standard library's ``json``, msgspec's JSON and msgspec's msgpack.

The samples are built by ``securepad.core.shaping`` itself, so they have the
sizes and shapes real entries have (a text view carries its 1,000-character
summary). The encodings' other properties (what they can carry) are in the
docstring of ``shaping.pack``, the store's choice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import timeit
from collections.abc import Callable
from typing import Any

import msgspec

from securepad.bench import data
from securepad.crypto.formats import ENTRY_FORMAT, Header, listing_aad
from securepad.policy import Policy

from ..core import shaping

__all__ = ["main", "run"]

Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]


def _codecs() -> dict[str, Codec]:
    """name -> (encode, decode): the candidates, and what the store uses (``shaping.pack``)."""
    json_encoder, json_decoder = msgspec.json.Encoder(), msgspec.json.Decoder()
    pack_encoder, pack_decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    return {
        "json (stdlib, format 1)": (shaping.dumps, json.loads),
        "msgspec json": (json_encoder.encode, json_decoder.decode),
        "msgspec msgpack": (pack_encoder.encode, pack_decoder.decode),
        "shaping.pack (format 2)": (shaping.pack, shaping.unpack),
    }


def _samples() -> dict[str, dict[str, Any]]:
    """Observation shape -> {"listing": ..., "entry": ...}, as an entry at step 3 stores them."""
    text = data.text(4096, salt=13)
    observations: dict[str, Any] = {
        "text 4 KiB": text,
        "text + fields": {"content": text, "metadata": {"path": "src/app.py", "lines": 120}, "exit_code": 0},
        "structured": {"results": [{"title": f"result {i}", "url": f"https://example.org/{i}"} for i in range(40)]},
    }
    policy = Policy()
    samples = {}
    for name, value in observations.items():
        kind, shape, content, rest = shaping.classify(value, policy.max_json_depth)
        size = len(content.encode() if isinstance(content, str) else content)
        view = shaping.view(kind, 3, size, content, rest, value, policy.inline_max_chars)
        samples[name] = {
            "listing": {"view": view, "content_id": "1:" + "ab" * 32},
            "entry": {"shape": shape, "rest": rest, "counts": [size], "breaks": [size // 50], "lines": size // 50},
        }
    return samples


def _best(call: Callable[[], object], repeat: int) -> float:
    """Microseconds per call: the best of five rounds of ``repeat`` calls."""
    return min(timeit.repeat(call, number=repeat, repeat=5)) / repeat * 1e6


def _header(entry_format: int) -> Header:
    return Header("0123456789abcdef", "alice", "turn-0001", "text", 4096, 4096, 1, 1, entry_format)


def _digests(repeat: int) -> list[dict[str, Any]]:
    """``Header.digest`` of each format, and the same fields packed by msgpack."""
    first, second = _header(1), _header(ENTRY_FORMAT)
    encode = msgspec.msgpack.Encoder().encode
    names = ("entry_id", "owner_user_id", "turn_id", "kind", "size_bytes", "size_chars", "segment_count")

    def as_msgpack() -> bytes:
        return hashlib.sha256(encode([getattr(second, n) for n in names])).digest()

    return [
        {"case": "header digest", "codec": codec, "bytes": 32, "encode_us": _best(call, repeat)}
        for codec, call in (
            ("json (format 1)", first.digest),
            ("struct (format 2)", second.digest),
            ("msgspec msgpack", as_msgpack),
        )
    ]


# A listing's row, as the database hands it over (crypto.listing_aad binds these).
_ROW: dict[str, Any] = {
    "id": "0123456789abcdef",
    "owner_user_id": "alice",
    "turn_id": "turn-0001",
    "key_version": 1,
    "actor": "agent",
    "channel": "web",
    "step_num": 3,
    "executor_name": "read_file",
    "content_kind": "text",
    "size_bytes": 4096,
    "size_chars": 4096,
    "segment_count": 1,
    "created_at": 1.9e9,
    "expires_at": 1.9e9 + 3600,
    "commitment": bytes(32),
}
_TEXTS = ("id", "owner_user_id", "turn_id", "actor", "channel", "executor_name", "content_kind")
_NUMBERS = struct.Struct(">iQQQQdd")


def _listing_aads(repeat: int) -> list[dict[str, Any]]:
    """A listing part's AAD: the same columns packed by ``struct`` (lengths,
    fixed-width numbers, strings) and by msgpack (what ``listing_aad`` does)."""

    def as_struct() -> bytes:
        texts = [_ROW[name].encode() for name in _TEXTS]
        numbers = _NUMBERS.pack(
            *(_ROW[n] for n in ("step_num", "key_version", "size_bytes", "size_chars", "segment_count")),
            _ROW["created_at"],
            _ROW["expires_at"],
        )
        return b"".join((struct.pack(">7I", *map(len, texts)), numbers, *texts, _ROW["commitment"]))

    return [
        {"case": "listing AAD", "codec": codec, "bytes": len(call()), "encode_us": _best(call, repeat)}
        for codec, call in (("struct", as_struct), ("msgspec msgpack (format 2)", lambda: listing_aad(_ROW)))
    ]


def _row(
    case: str, codec: str, value: Any, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any], repeat: int
) -> dict[str, Any]:
    blob = encode(value)
    if decode(blob) != json.loads(json.dumps(value)):
        raise AssertionError(f"{codec} does not give the {case} back")
    return {
        "case": case,
        "codec": codec,
        "bytes": len(blob),
        "encode_us": _best(lambda: encode(value), repeat),
        "decode_us": _best(lambda: decode(blob), repeat),
    }


def run(repeat: int = 20000) -> list[dict[str, Any]]:
    """Every case: one row per (case, codec)."""
    rows = _digests(repeat) + _listing_aads(repeat)
    for shape, parts in _samples().items():
        for part, value in parts.items():
            case = f"{'listing part' if part == 'listing' else 'entry metadata'}, {shape}"
            rows += [_row(case, codec, value, *pair, repeat) for codec, pair in _codecs().items()]
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | codec | bytes | encode µs | decode µs |", "|---|---|---|---|---|"]
    for row in rows:
        decode = f"{row['decode_us']:.2f}" if "decode_us" in row else "-"
        lines.append(f"| {row['case']} | {row['codec']} | {row['bytes']} | {row['encode_us']:.2f} | {decode} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20000, help="calls per round (five rounds, the best kept)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = run(args.repeat)
    print(json.dumps(rows, indent=2) if args.json else _table(rows))


if __name__ == "__main__":
    main()
