"""The owner heads kept opened by their sealed bytes: bytes that opened under an
owner's key once are not believed after that key is gone. An owner forgotten
(crypto-shredded) and written again has a new key of the same version; its
former owner head put back must fail authentication as it would in a store
just opened, not be served as the turns it listed."""

from __future__ import annotations

from typing import Any

import pytest

from securepad import IntegrityError, Scratchpad
from securepad.crypto.primitives import Wrapper, head_aad
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


def test_the_owner_head_a_write_sealed_is_known_opened(pad: Scratchpad, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new turn seals another owner head (it lists every turn): the next new
    turn and a read of an absent turn do not open it again."""
    pad.put(ALICE, "a", 1, "tool", "the owner's keys and heads exist", now=NOW)
    opened: list[bytes] = []
    real = Wrapper.open

    def counted(wrapper: Wrapper, blob: object, aad: bytes) -> bytes:
        opened.append(aad)
        return real(wrapper, blob, aad)

    monkeypatch.setattr(Wrapper, "open", counted)
    for turn in ("b", "c", "d"):
        pad.put(ALICE, turn, 1, "tool", "a new turn", now=NOW)
        assert pad.list_for_turn(ALICE, f"absent {turn}", now=NOW) == []
    assert head_aad(ALICE.owner_user_id, OWNER_HEAD, 1) not in opened
    assert [view["step_num"] for view in pad.list_for_turn(ALICE, "d", now=NOW)] == [1]
