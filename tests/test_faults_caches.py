"""The owner-key caches are bounded (issue 18: they kept every owner ever seen)."""

from __future__ import annotations

import pytest

import securepad.store
from securepad import Principal, Scratchpad
from securepad._lru import LRUCache


def test_owner_key_caches_keep_the_most_recent_owners(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(securepad.store, "OWNER_KEY_CACHE_SIZE", 8)
    bounded = Scratchpad(pad._db, pad.keyring, pad.policy, pad._clock)
    owners = [Principal(f"owner-{i}", "a", "c") for i in range(30)]
    ids = [bounded.put(p, "t", 1, "tool", f"for {p.owner_user_id}")["scratchpad_id"] for p in owners]
    for p, sid in zip(owners, ids, strict=True):
        assert bounded.get(p, sid).observation == f"for {p.owner_user_id}"
    for cache in (bounded._owner_ciphers, bounded._latest):
        assert len(cache) == 8
    # Evicted owners' keys are unwrapped again when they come back.
    assert bounded.get(owners[0], ids[0]).observation == "for owner-0"
    assert bounded._owner_ciphers.get(("owner-0", 1)) is not None


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
