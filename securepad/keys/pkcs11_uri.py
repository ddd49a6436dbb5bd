"""RFC 7512 PKCS#11 URIs naming a master key: parsed strictly, shown without the PIN.

``pkcs11:token=…;object=…?module-path=…&pin-source=…``: path attributes name
the token and the key, query attributes the module and where the PIN is. An
attribute given twice, unknown (other than a vendor's ``x-…``), empty or
badly percent-encoded is refused; so is a URI that names no key (``object``),
no token or no module. ``shown()`` is the canonical form without ``pin-value``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, unquote_to_bytes

from ..errors import KeySourceUriError
from .source import redact_uri

__all__ = ["Pkcs11Uri", "quote_value"]

# Path attributes (RFC 7512, section 2.3) this source reads; others are refused.
_PATH_ATTRIBUTES = frozenset({"token", "serial", "slot-id", "manufacturer", "model", "object", "id", "type"})
_QUERY_ATTRIBUTES = frozenset({"module-path", "module-name", "pin-source", "pin-value"})
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Pkcs11Uri:
    """A parsed RFC 7512 URI naming one secret key (values percent-decoded)."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    id: bytes | None = field(default=None)

    @classmethod
    def parse(cls, uri: str) -> Pkcs11Uri:
        """Raises KeySourceUriError: not a ``pkcs11:`` URI, a repeated, unknown or
        empty attribute, no ``object`` (the key's label), no token, no module."""
        shown = redact_uri(uri)
        if not isinstance(uri, str) or not uri[:7].lower() == "pkcs11:":
            raise KeySourceUriError(f"{shown!r} is not a pkcs11: URI")
        body = uri[7:]
        if "#" in body:
            raise KeySourceUriError(f"master key URI {shown!r}: a PKCS#11 URI has no fragment")
        path_part, _, query_part = body.partition("?")
        path, key_id = _attributes(path_part, ";", _PATH_ATTRIBUTES, shown)
        query, _ = _attributes(query_part, "&", _QUERY_ATTRIBUTES, shown)
        if "object" not in path:
            raise KeySourceUriError(f"master key URI {shown!r} names no key: add object=<the key's label>")
        if not {"token", "serial", "slot-id"} & path.keys():
            raise KeySourceUriError(f"master key URI {shown!r} names no token: add token=<the token's label>")
        if path.get("type", "secret-key") != "secret-key":
            raise KeySourceUriError(
                f"master key URI {shown!r}: the master key is a secret-key object, not {path['type']}"
            )
        if not {"module-path", "module-name"} & query.keys():
            raise KeySourceUriError(
                f"master key URI {shown!r} names no PKCS#11 module: add ?module-path=/path/to/module.so"
            )
        if "slot-id" in path and not path["slot-id"].isdigit():
            raise KeySourceUriError(f"master key URI {shown!r}: slot-id must be a decimal number")
        return cls(path, query, key_id)

    def shown(self) -> str:
        """The URI in canonical form without ``pin-value``."""
        parts = [f"{name}={quote_value(value)}" for name, value in self.path.items() if name != "id"]
        if self.id is not None:
            parts.append("id=" + "".join(f"%{b:02x}" for b in self.id))
        query = [f"{name}={quote_value(value)}" for name, value in self.query.items() if name != "pin-value"]
        return "pkcs11:" + ";".join(parts) + ("?" + "&".join(query) if query else "")


def quote_value(value: str) -> str:
    """A value percent-encoded for a PKCS#11 URI (RFC 7512's safe characters left as they are)."""
    return quote(value, safe="/:-_.~@!$'()*+,")


def _attributes(part: str, separator: str, known: frozenset[str], shown: str) -> tuple[dict[str, str], bytes | None]:
    values: dict[str, str] = {}
    key_id: bytes | None = None
    if not part:
        return values, key_id
    for item in part.split(separator):
        name, equals, raw = item.partition("=")
        name = name.lower()
        if not equals or not raw:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} has no value")
        if name not in known and not name.startswith("x-"):
            raise KeySourceUriError(f"master key URI {shown!r}: unknown attribute {name!r}")
        if name in values:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is given twice")
        if _BAD_PERCENT.search(raw):
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is badly percent-encoded")
        if name == "id":
            key_id = unquote_to_bytes(raw)
            values[name] = key_id.hex()
            continue
        try:
            values[name] = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise KeySourceUriError(f"master key URI {shown!r}: attribute {name!r} is not UTF-8") from None
    return values, key_id
