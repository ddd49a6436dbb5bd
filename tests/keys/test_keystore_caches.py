"""The owner-key caches are bounded (they kept every owner ever seen)."""

from __future__ import annotations

import time

import pytest

import securepad.keys.keystore
from securepad import Principal, Scratchpad
from securepad.keys.keystore import LRUCache
from securepad.store import parts


def test_owner_key_caches_keep_the_most_recent_owners(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(securepad.keys.keystore, "OWNER_KEY_CACHE_SIZE", 8)
    bounded = Scratchpad(parts(pad).db, pad.keyring, pad.policy, time.time)
    owners = [Principal(f"owner-{i}", "a", "c") for i in range(30)]
    ids = [bounded.put(p, "t", 1, "tool", f"for {p.owner_user_id}")["scratchpad_id"] for p in owners]
    for p, sid in zip(owners, ids, strict=True):
        assert bounded.get(p, sid).observation == f"for {p.owner_user_id}"
    sizes = parts(bounded).keys.cache_sizes()
    assert sizes["owner_keys"] == sizes["latest"] == 8
    # Evicted owners' keys are unwrapped again when they come back.
    assert bounded.get(owners[0], ids[0]).observation == "for owner-0"
    assert parts(bounded).keys.is_cached("owner-0", 1)


def test_lru_order() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache["a"] = 1
    cache["b"] = 2
    assert cache.get("a") == 1  # a is now the most recent
    cache["c"] = 3
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    cache.discard_if(lambda key: key == "a")
    assert len(cache) == 1 and cache.pop("c") == 3 and cache.pop("c") is None
    with pytest.raises(ValueError, match="maxsize"):
        LRUCache(0)
