"""The owner heads kept opened by their sealed bytes: bytes that opened under an
owner's key once are not believed after that key is gone. An owner forgotten
(crypto-shredded) and written again has a new key of the same version; its
former owner head put back must fail authentication as it would in a store
just opened, not be served as the turns it listed."""

from __future__ import annotations

from typing import Any

import pytest

from securepad import IntegrityError, Scratchpad
from securepad.tables.heads.heads import OWNER_HEAD
from tests.support.principals import ALICE, NOW
from tests.support.tamper_edits import owner_heads, put_back, raw_edit


def test_a_forgotten_owners_head_put_back_is_refused(pad: Scratchpad, store_location: Any) -> None:
    pad.put(ALICE, "a", 1, "tool", "before", now=NOW)
    assert pad.list_for_turn(ALICE, "absent", now=NOW) == []  # opens (and keeps) the owner head
    with raw_edit(pad, store_location) as raw:
        old = owner_heads(raw, (OWNER_HEAD,))
    pad.forget_owner(ALICE.owner_user_id)
    pad.put(ALICE, "b", 1, "tool", "after", now=NOW)  # a new key, of the same version
    with raw_edit(pad, store_location) as raw:
        assert [row[2] for row in owner_heads(raw, (OWNER_HEAD,))] == [row[2] for row in old]
        put_back(raw, old)
    with Scratchpad.open(store_location, keyring=pad.keyring) as fresh, pytest.raises(IntegrityError):
        fresh.put(ALICE, "c", 1, "tool", "a new turn", now=NOW)
    with pytest.raises(IntegrityError):
        pad.put(ALICE, "d", 1, "tool", "a new turn", now=NOW)
