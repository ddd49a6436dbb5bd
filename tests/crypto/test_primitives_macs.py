"""The MACs and length-prefixed inputs every put computes, against their plain definitions:
the turn-head term and the content identity (OpenSSL's HMAC object, copied per message)
are HMAC-SHA256 as ``hmac.new`` computes it; ``lp_texts`` is ``lp`` of its texts."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from securepad.crypto.primitives import TAG, ContentIdentity, CounterSeal, KeyHandle, derive, lp, lp_texts

_KEY = KeyHandle(bytes(range(32)))


@given(first=st.text(max_size=20), second=st.text(max_size=20), third=st.none() | st.text(max_size=20))
def test_lp_texts_is_lp_of_its_texts(first: str, second: str, third: str | None) -> None:
    parts = [first, second] if third is None else [first, second, third]
    assert lp_texts(first, second, third) == lp(*parts)


@given(message=st.binary(max_size=200))
def test_a_term_is_hmac_sha256_under_the_anchor_key_in_its_domain(message: bytes) -> None:
    seal = CounterSeal(_KEY, "store-1")
    mac = hmac.new(bytes(range(32)), lp(TAG, "term", "store-1") + message, hashlib.sha256)
    assert seal.term(message) == int.from_bytes(mac.digest(), "big")


@given(segments=st.lists(st.binary(max_size=100), max_size=4), kind=st.sampled_from(["text", "binary", "json"]))
def test_a_content_identity_is_hmac_sha256_of_its_segments(segments: list[bytes], kind: str) -> None:
    identity = ContentIdentity(_KEY, "store-1", "alice", 3)
    key = derive(_KEY, "content-identity", lp("store-1", "alice"))
    size = sum(len(segment) for segment in segments)
    mac = hmac.new(key, lp("content", kind, str(size)) + b"".join(segments), hashlib.sha256)
    assert identity.of(kind, segments) == f"3:{mac.hexdigest()}"


@given(data=st.binary(max_size=300), kind=st.sampled_from(["binary", "text"]))
def test_a_content_identity_of_a_digest_is_hmac_sha256_of_the_digest_in_its_own_domain(data: bytes, kind: str) -> None:
    identity = ContentIdentity(_KEY, "store-1", "alice", 3)
    key = derive(_KEY, "content-identity", lp("store-1", "alice"))
    digest = hashlib.sha256(data).digest()
    mac = hmac.new(key, lp("content-sha256", kind, str(len(data))) + digest, hashlib.sha256)
    assert identity.of_digest(kind, len(data), digest) == f"3:{mac.hexdigest()}"
    # Never the identity of other content: the digest's domain is not the content's.
    assert identity.of_digest(kind, len(data), digest) != identity.of(kind, [digest])


@given(owner=st.text(max_size=20), turn=st.text(max_size=20))
def test_an_owner_term_is_hmac_sha256_of_owner_and_turn_in_its_own_domain(owner: str, turn: str) -> None:
    seal = CounterSeal(_KEY, "store-1")
    mac = hmac.new(bytes(range(32)), lp(TAG, "owner-turn", "store-1") + lp(owner, turn), hashlib.sha256)
    assert seal.owner_term(owner, turn) == int.from_bytes(mac.digest(), "big")
    assert seal.owner_term(owner, turn) != seal.term(lp(owner, turn))  # not a row's term
    assert seal.owner_term(owner, turn) != CounterSeal(_KEY, "store-2").owner_term(owner, turn)


def test_an_owner_term_binds_the_owner_and_the_turn_apart() -> None:
    seal = CounterSeal(_KEY, "store-1")
    assert seal.owner_term("ab", "c") != seal.owner_term("a", "bc")
    assert seal.owner_term("alice", "t") != seal.owner_term("bob", "t")
