"""Large observations through a store: what is put comes back, whole and by
every read mode, at the sizes around a segment's; and content a little over a
segment is one segment, put and read with a small entry's statements."""

from __future__ import annotations

import base64
import hashlib
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import Keyring, Policy, Scratchpad
from securepad.bench.costs import measure
from securepad.core import shaping
from securepad.core.shaping import SEGMENT_BYTES, SEGMENT_SLACK
from securepad.crypto.primitives import ContentIdentity
from securepad.store import parts, sqlite_of
from securepad.tables.entries.prepare import Prepared
from tests.support.principals import AGENT_ALICE as ALICE

# Sizes where segments are cut, and a little either side.
EDGES = [0, 1, SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 5, SEGMENT_BYTES + SEGMENT_SLACK]
EDGES += [SEGMENT_BYTES + SEGMENT_SLACK + 1, 3 * SEGMENT_BYTES + 7, 4 * SEGMENT_BYTES + SEGMENT_SLACK + 1]
CAP = 4 * SEGMENT_BYTES  # a read may return a few segments at once


def make(kind: str, size: int, seed: int) -> str | bytes:
    """``size`` bytes of content of ``kind``: binary, ASCII lines, or text of many-byte characters."""
    rnd = random.Random(seed)
    if kind == "binary":
        return rnd.randbytes(size)
    if kind == "ascii":
        line = "".join(rnd.choice("abc \t") for _ in range(rnd.randint(0, 120)))
        text = (line + rnd.choice(["\n", "\r\n", "\r"])) * (size // (len(line) + 1) + 1)
        return text[:size]
    alphabet = "aé€😀\n\u2028"
    text = "".join(rnd.choice(alphabet) for _ in range(size // 2 + 1))
    while len(text.encode()) > size:  # about ``size`` bytes, cut on a character
        text = text[: len(text) - (len(text.encode()) - size + 3) // 4 - 1]
    return text


def test_what_is_put_comes_back_whole_and_by_every_read_mode(db_path: Path, keyring: Keyring) -> None:
    policy = Policy.from_dict({"limits": {"max_read_chars": CAP}})
    steps = itertools.count(1)
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:

        @settings(max_examples=30, deadline=None)
        @given(
            kind=st.sampled_from(["binary", "ascii", "unicode"]),
            size=st.sampled_from(EDGES) | st.integers(0, 5 * SEGMENT_BYTES),
            seed=st.integers(0, 2**16),
            start=st.integers(0, 5 * SEGMENT_BYTES),
            span=st.integers(0, 2 * SEGMENT_BYTES),
            dict_shape=st.booleans(),
        )
        def round_trip(kind: str, size: int, seed: int, start: int, span: int, dict_shape: bool) -> None:
            value = make(kind, size, seed)
            observation: Any = {"content": value, "metadata": {"seed": seed}} if dict_shape else value
            entry = pad.put(ALICE, "t", next(steps), "tool", observation)["scratchpad_id"]
            assert pad.get(ALICE, entry).observation == observation
            check_reads(pad, entry, value, start, span)

        round_trip()


def check_reads(pad: Scratchpad, entry: str, value: str | bytes, start: int, span: int) -> None:
    """Every read mode of ``entry`` returns the plain slice of ``value`` it names, where it was asked to."""
    end = min(start + span, len(value))
    start = min(start, end)
    wanted = {"head": (0, span), "tail": (len(value) - span, len(value)), "full": (0, len(value))}
    for mode in ("head", "tail", "range", "full"):
        result = pad.read(ALICE, entry, mode, n=span, start=start, end=end)
        got = result["content"]
        if isinstance(value, bytes):
            got = base64.b64decode(got)
        meta = result["metadata"]
        assert got == value[meta["start"] : meta["end"]], mode
        low, high = wanted.get(mode, (start, end))
        assert meta["start"] == max(low, 0) or (mode == "tail" and meta["capped"]), mode
        assert meta["end"] == min(high, len(value)) or (mode != "tail" and meta["capped"]), mode
    if isinstance(value, str):
        lines = pad.read(ALICE, entry, "lines", start=1, end=3)
        assert lines["content"] == "".join(value.splitlines(keepends=True)[:3])
        assert lines["metadata"]["total_lines"] == len(value.splitlines())


def test_a_value_a_little_over_a_segment_is_put_and_read_as_a_small_one(db_path: Path, keyring: Keyring) -> None:
    """A 64 KiB value with its encoding's header (a checkpoint's channel value) is
    one segment, in its row: a put runs a small entry's statements (no segments
    rows, the one-transaction put), and a read a small entry's."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 0, "tool", "warm-up")
        small = {"content": b"x" * 100, "metadata": {"v": 1}}
        large = {"content": random.Random(1).randbytes(SEGMENT_BYTES + 5), "metadata": {"v": 1}}
        put = {
            name: measure(pad, lambda step=step, value=value: pad.put(ALICE, "t", step, "tool", value))
            for step, (name, value) in enumerate((("small", small), ("large", large)), start=1)
        }
        assert put["large"]["statements"] == put["small"]["statements"] == 4, put
        ids = [item["scratchpad_id"] for item in pad.list_for_turn(ALICE, "t")]
        (segments,) = sqlite_of(pad).query("SELECT COUNT(*) AS n FROM segments", admin=True)
        assert segments["n"] == 0
        got: dict[str, Any] = {}
        costs = {name: measure(pad, lambda i=i, name=name: got.update({name: pad.get(ALICE, i)})) for name, i in (
            ("small", ids[1]), ("large", ids[2]))}  # fmt: skip
        assert costs["large"]["statements"] == costs["small"]["statements"], costs
        assert got["large"].observation == large


def test_binary_content_is_hashed_once_for_its_view_and_its_identity(db_path: Path, keyring: Keyring) -> None:
    """A binary entry's identity is taken from the SHA-256 its view shows a prefix of
    (equal contents, put alone or in a batch, with other fields or none, compare equal);
    a text entry's from its content, as ever."""
    data = random.Random(7).randbytes(SEGMENT_BYTES * 2 + 9)
    digest = hashlib.sha256(data).digest()
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        view = pad.put(ALICE, "t", 1, "tool", data)
        assert view["summary"].endswith(f"sha256 {digest.hex()[:16]}")
        pad.put(ALICE, "t", 2, "tool", {"content": data, "metadata": {"path": "/a"}})
        pad.put_many(ALICE, "t", [(3, "tool", data), (4, "tool", data[:-1]), (5, "tool", "text")])
        listed = parts(pad).listings.turn_entries(ALICE, "t", None)
        ids = {entry.row["step_num"]: entry.meta["content_id"] for entry in listed}
        identity = parts(pad).keys.identity(ALICE.owner_user_id, listed[0].row["key_version"])
    assert ids[1] == ids[2] == ids[3] == identity.of_digest("binary", len(data), digest)
    assert ids[4] != ids[1]
    assert ids[5] == identity.of("text", [b"text"])


def test_content_put_unidentified_is_not_hashed_and_reads_back_whole(
    db_path: Path, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put with ``identified=False`` (a saver's values, read back by id alone) neither
    hashes binary content nor takes any content's identity: its view's summary gives the
    size alone, its listing part has no ``content_id``; it is sealed, costed and read as any."""
    data = random.Random(8).randbytes(3 * SEGMENT_BYTES + 9)
    hashed: list[int] = []
    identities: list[str] = []
    real_digest, real_of, real_of_digest = shaping.binary_digest, ContentIdentity.of, ContentIdentity.of_digest
    monkeypatch.setattr(shaping, "binary_digest", lambda content: hashed.append(len(content)) or real_digest(content))
    monkeypatch.setattr(ContentIdentity, "of", lambda *a: identities.append("of") or real_of(*a))
    monkeypatch.setattr(ContentIdentity, "of_digest", lambda *a: identities.append("digest") or real_of_digest(*a))
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        putter = parts(pad).putter
        view = putter.put(ALICE, "t", 1, "tool", {"content": data, "metadata": {"k": 1}}, identified=False)
        text = putter.put(ALICE, "t", 2, "tool", "some text", identified=False)
        # A next-step put guessing a step below the turn's next: its view is made again, unhashed too.
        again = putter.put(ALICE, "t", 1, "tool", data, free_step=True, next_step=True, identified=False)
        assert again["step_num"] == 3 and again["summary"] == f"binary, {len(data)} bytes"
        assert hashed == [] and identities == []
        assert view["summary"] == f"binary, {len(data)} bytes"
        assert text["summary"] == "some text"
        listed = parts(pad).listings.turn_entries(ALICE, "t", None)
        assert ["content_id" in entry.meta for entry in listed] == [False, False, False]
        assert listed[2].meta["view"]["summary"] == again["summary"]
        assert pad.get(ALICE, view["scratchpad_id"]).observation == {"content": data, "metadata": {"k": 1}}
        assert pad.read(ALICE, view["scratchpad_id"], "range", start=SEGMENT_BYTES - 2, end=SEGMENT_BYTES + 2)
        assert pad.verify()["ok"]
        # The least the row can cost counts no content identity: at most what it costs.
        prepared = Prepared.of({"content": data, "metadata": {"k": 1}}, 1, pad.policy, identified=False)
        (row,) = sqlite_of(pad).query("SELECT stored_bytes FROM entries WHERE id = ?", (view["scratchpad_id"],))
        assert prepared.cost_floor(ALICE, "t", "tool") <= row["stored_bytes"]
        # Put identified (the default), the same content is hashed once and identified.
        pad.put(ALICE, "t", 4, "tool", data)
        assert hashed == [len(data)] and identities == ["digest"]
