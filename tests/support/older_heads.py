"""Stores as an older version of securepad left them, made from a store of
today's format (for the tests of their conversion at open)."""

from __future__ import annotations

import json

from securepad import Scratchpad
from securepad.store import parts
from securepad.tables.heads.heads import OWNER_HEAD, USAGE_HEAD


def as_format_2(pad: Scratchpad, purpose: str = "turn-heads-era") -> int:
    """Every turn head sealed again as format 2 (no bytes, no reservation), the
    flag the token of format 2 (``purpose``: ``turn-heads`` before the heads
    era), each usage head the sum of its owner's bytes: a store written before
    the turn reservations."""
    heads = parts(pad).heads
    rows = parts(pad).db.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads", admin=True)
    done = 0
    used: dict[str, int] = {}
    with parts(pad).db.transaction(admin=True) as conn:
        for row in rows:
            if row["turn_id"] in (OWNER_HEAD, USAGE_HEAD):
                continue
            body = json.loads(heads.open_body(row, row["owner_user_id"], row["turn_id"]))
            used[row["owner_user_id"]] = used.get(row["owner_user_id"], 0) + body["b"]
            old = {key: value for key, value in body.items() if key not in ("b", "r")} | {"f": 2}
            heads.write_body(conn, row["owner_user_id"], row["turn_id"], json.dumps(old).encode(), row["key_version"])
            done += 1
        for owner, total in used.items():
            heads.write_body(conn, owner, USAGE_HEAD, str(total).encode())
        seal = parts(pad).keys.counter_seal
        conn.execute("UPDATE store_meta SET value = ? WHERE key = 'turn_heads'", (f"2:{seal.tag(purpose, 2)}",))
    return done
