"""A batch seals each entry as a put does: ``EntrySealer`` (one owner, turn and
key version, what they share built once) gives each entry its own item key and
nonce prefix; put_many stores what as many puts store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import IntegrityError, Keyring, Principal, Scratchpad
from securepad.core import shaping
from securepad.crypto.formats import ENTRY_FORMAT, EntrySealer, Header, open_entry
from securepad.crypto.primitives import WORK, KeyHandle, Wrapper
from securepad.store import parts, sqlite_of
from securepad.tables.entries.prepare import split

ALICE = Principal("alice", "agent", "web")
NOW = 1_000_000.0
# What may differ between an entry a batch stored and the same one a put stored: its id and turn, and what is random.
_RANDOM = (
    "id",
    "turn_id",
    "wrapped_key",
    "nonce_prefix",
    "commitment",
    "sealed_meta",
    "only_segment",
    "sealed_listing",
)


def _header(entry_id: str, turn: str, kind: str, sizes: tuple[int, int], count: int) -> Header:
    return Header(entry_id, "alice", turn, kind, *sizes, count, 3, ENTRY_FORMAT)


@pytest.mark.parametrize("content", ["", "one line", "a\nb\r\nc" * 3000, "é" * 40_000, b"\x00\x01" * 40_000])
def test_an_entry_a_sealer_seals_opens_as_its_header_says(content: str | bytes) -> None:
    owner = Wrapper.of(KeyHandle.random())
    segments = split(content)[0]
    kind = "binary" if isinstance(content, bytes) else "text"
    sizes = (sum(map(len, segments)), 0 if isinstance(content, bytes) else len(content))
    sealer = EntrySealer(owner, "alice", "turn", 3)
    before = WORK.snapshot()
    wrapped, prefix, commitment, sealed_meta, sealed = sealer.seal("0123456789abcdef", kind, sizes, b"meta", segments)
    after = WORK.snapshot()
    # One item key: one HKDF, one header digest.
    assert [after[n] - before[n] for n in ("key_derivations", "header_digests")] == [1, 1]
    header = _header("0123456789abcdef", "turn", kind, sizes, len(segments))
    cipher = open_entry(owner, header, wrapped, prefix, commitment)
    assert cipher.open_meta(sealed_meta) == b"meta"
    last = len(sealed) - 1
    opened = b"".join(cipher.open_segment(seq, blob, seq == last) for seq, blob in enumerate(sealed))
    assert opened == (content if isinstance(content, bytes) else content.encode())


@pytest.mark.parametrize(
    "other",
    [
        {"entry_id": "fedcba9876543210"},
        {"turn": "other"},
        {"kind": "json"},
        {"sizes": (5, 4)},
    ],
)
def test_a_sealed_entry_is_bound_to_its_id_turn_kind_and_sizes(other: dict[str, Any]) -> None:
    owner = Wrapper.of(KeyHandle.random())
    wrapped, prefix, commitment, _, sealed = EntrySealer(owner, "alice", "turn", 3).seal(
        "0123456789abcdef", "text", (5, 5), b"m", [b"hello"]
    )
    fields: dict[str, Any] = {"entry_id": "0123456789abcdef", "turn": "turn", "kind": "text", "sizes": (5, 5)}
    header = _header(**{**fields, **other}, count=1)
    with pytest.raises(IntegrityError):
        cipher = open_entry(owner, header, wrapped, prefix, commitment)
        cipher.open_segment(0, sealed[0], True)


def test_the_entries_of_a_batch_have_their_own_keys_and_nonces() -> None:
    sealer = EntrySealer(Wrapper.of(KeyHandle.random()), "alice", "turn", 3)
    sealed = [sealer.seal(f"{i:016x}", "text", (1, 1), b"m", [b"x"]) for i in range(20)]
    for column in range(5):  # wrapped key, nonce prefix, commitment, sealed metadata and segment
        assert len({repr(entry[column]) for entry in sealed}) == 20, column


def _rows(pad: Scratchpad, turn: str) -> list[dict[str, Any]]:
    cursor = sqlite_of(pad).conn.execute("SELECT * FROM entries WHERE turn_id = ? ORDER BY step_num", (turn,))
    names = [d[0] for d in cursor.getdescription()]
    return [dict(zip(names, values, strict=True)) for values in cursor]


def _listing(pad: Scratchpad, row: dict[str, Any]) -> Any:
    return shaping.unpack(parts(pad).keys.listing_key(row["owner_user_id"], row["key_version"]).open(row))


def _same_as_puts(pad: Scratchpad, observations: list[Any], serial: int) -> None:
    """put_many of ``observations`` stores what as many puts store: views, rows (but for ids and
    what is random), listing parts (the content identity included), and what a read returns."""
    batch, single = f"b{serial:08d}", f"s{serial:08d}"  # names of one length: the rows cost the same
    items = [(step, f"tool{step}", obs) for step, obs in enumerate(observations)]
    views = pad.put_many(ALICE, batch, items, 600, now=NOW)
    alone = [pad.put(ALICE, single, step, executor, obs, 600, now=NOW) for step, executor, obs in items]
    assert [{**v, "scratchpad_id": None} for v in views] == [{**v, "scratchpad_id": None} for v in alone]
    many, puts = _rows(pad, batch), _rows(pad, single)
    assert len(many) == len(puts) == len(observations)
    for got, want in zip(many, puts, strict=True):
        assert {k: v for k, v in got.items() if k not in _RANDOM} == {k: v for k, v in want.items() if k not in _RANDOM}
        for name in _RANDOM[2:]:
            assert len(got[name] or b"") == len(want[name] or b""), name
        assert _listing(pad, got) == _listing(pad, want)  # the view, and the content identity
    for view, obs in zip(views, observations, strict=True):
        entry = pad.get(ALICE, view["scratchpad_id"], now=NOW)
        assert entry.observation == obs
        assert entry.view == view


_OBSERVATIONS = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    st.lists(st.integers(), max_size=5),
    st.fixed_dictionaries({"content": st.text(max_size=80), "metadata": st.fixed_dictionaries({"path": st.text()})}),
)
_SERIAL = iter(range(10**8))


@given(st.lists(_OBSERVATIONS, min_size=1, max_size=6))
def test_put_many_stores_what_as_many_puts_store(db_path: Path, keyring: Keyring, observations: list[Any]) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        _same_as_puts(pad, observations, next(_SERIAL))


def test_put_many_of_entries_of_several_segments_stores_what_puts_store(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        _same_as_puts(pad, ["line\n" * 30_000, os.urandom(150_000), "small", "ü" * 50_000], 0)
