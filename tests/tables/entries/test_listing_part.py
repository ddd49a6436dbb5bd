"""The listing part of an entry: what a listing shows, sealed under
one key per owner and key version, bound to its entry; and its encoding.

A listing opens only these parts: no per-entry key derivation, unwrap or
header digest. Every edit of the part, or of a clear column it is bound to,
is refused by the listing and by a read; a row without its part (nulled)
is opened through the entry's own key, which refuses it too.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad import IntegrityError, Keyring, NotFoundError, Policy, Principal, Scratchpad
from securepad.core.shaping import PACKED_JSON, PACKED_MSGPACK, pack, unpack
from securepad.crypto.formats import ENTRY_FORMAT, LISTING_FORMAT, Header
from securepad.crypto.primitives import WORK
from securepad.storage.sqlite import SCHEMA_VERSION
from securepad.store import parts, sqlite_of
from tests.support.paths import FIXTURES
from tests.support.principals import AGENT_ALICE as ALICE
from tests.support.principals import AGENT_BOB as BOB
from tests.support.store_costs import listing_costs

REFUSED = (IntegrityError, NotFoundError)


@dataclass
class Store:
    path: Path
    keyring: Keyring
    ids: dict[str, str]
    clock: Callable[[], float] = time.time  # a fixture's store: the host's clock at its time

    def open(self) -> Scratchpad:
        return Scratchpad.open(self.path, keyring=self.keyring, clock=self.clock)

    def edit(self, sql: str, params: tuple[Any, ...]) -> None:
        conn = apsw.Connection(str(self.path))
        try:
            with conn:
                conn.execute(sql, params)
            assert conn.changes() >= 1
        finally:
            conn.close()

    def column(self, name: str, column: str) -> Any:
        conn = apsw.Connection(str(self.path))
        try:
            return conn.execute(f"SELECT {column} FROM entries WHERE id = ?", (self.ids[name],)).fetchall()[0][0]
        finally:
            conn.close()


@pytest.fixture
def store(db_path: Path, keyring: Keyring) -> Iterator[Store]:
    ids = {}
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        ids["a1"] = pad.put(ALICE, "t1", 1, "read_file", {"content": "one\n" * 50, "metadata": {"path": "a.py"}})[
            "scratchpad_id"
        ]
        ids["a2"] = pad.put(ALICE, "t1", 2, "search", {"results": [{"n": i} for i in range(5)]})["scratchpad_id"]
        ids["a_other_turn"] = pad.put(ALICE, "t2", 1, "read_file", "other turn")["scratchpad_id"]
        ids["b1"] = pad.put(BOB, "t1", 1, "read_file", "bob's")["scratchpad_id"]
    yield Store(db_path, keyring, ids)


def _refused(store: Store, principal: Principal, turn: str, name: str) -> None:
    """The listing of the turn and the read of the entry both refuse it."""
    with store.open() as pad:
        with pytest.raises(REFUSED):
            pad.list_for_turn(principal, turn)
        with pytest.raises(REFUSED):
            pad.turn(principal, turn).history()
        with pytest.raises(REFUSED):
            pad.get(principal, store.ids[name])


def test_new_entries_have_a_listing_part_and_list_as_they_were_put(store: Store) -> None:
    part = store.column("a1", "sealed_listing")
    assert isinstance(part, bytes) and part[0] == LISTING_FORMAT
    with store.open() as pad:
        listed = pad.list_for_turn(ALICE, "t1")
        assert [item["step_num"] for item in listed] == [1, 2]
        assert listed[0]["view"]["metadata"] == {"path": "a.py"} and listed[0]["executor_name"] == "read_file"
        assert listed[1]["view"]["list_field"] == "results"
        assert pad.get(ALICE, store.ids["a1"]).observation["metadata"] == {"path": "a.py"}
        assert pad.get(ALICE, store.ids["a1"]).view == listed[0]["view"]


def test_a_listing_derives_no_key_per_entry(store: Store) -> None:
    with store.open() as pad:
        for step in range(3, 43):
            pad.put(ALICE, "t1", step, "tool", f"observation {step}")
        costs = listing_costs(pad, ALICE, "t1")
        assert costs["entries"] == 42
        # The owner key and its listing key are cached since the puts.
        assert (costs["key_derivations"], costs["key_unwraps"], costs["header_digests"]) == (0, 0, 0)
    with store.open() as pad:  # a fresh open: the owner key once, its listing key once, for 42 entries
        costs = listing_costs(pad, ALICE, "t1")
        assert (costs["key_derivations"], costs["key_unwraps"], costs["header_digests"]) == (1, 1, 0)


def test_a_flipped_bit_in_the_listing_part_is_refused(store: Store) -> None:
    part = bytearray(store.column("a1", "sealed_listing"))
    part[len(part) // 2] ^= 0x01
    store.edit("UPDATE entries SET sealed_listing = ? WHERE id = ?", (bytes(part), store.ids["a1"]))
    _refused(store, ALICE, "t1", "a1")


def test_a_listing_part_of_an_unknown_format_is_refused(store: Store) -> None:
    part = bytearray(store.column("a1", "sealed_listing"))
    part[0] = LISTING_FORMAT + 1
    store.edit("UPDATE entries SET sealed_listing = ? WHERE id = ?", (bytes(part), store.ids["a1"]))
    _refused(store, ALICE, "t1", "a1")


@pytest.mark.parametrize(
    ("source", "target", "principal", "turn"),
    [
        ("a2", "a1", ALICE, "t1"),  # another entry of the turn
        ("a_other_turn", "a1", ALICE, "t1"),  # another turn's entry
        ("b1", "a1", ALICE, "t1"),  # another owner's entry
        ("a1", "b1", BOB, "t1"),  # into another owner's entry
    ],
    ids=["entry", "turn", "owner", "into-owner"],
)
def test_a_listing_part_moved_from_another_entry_is_refused(
    store: Store, source: str, target: str, principal: Principal, turn: str
) -> None:
    moved = store.column(source, "sealed_listing")
    store.edit("UPDATE entries SET sealed_listing = ? WHERE id = ?", (moved, store.ids[target]))
    _refused(store, principal, turn, target)


def test_two_listing_parts_swapped_are_refused(store: Store) -> None:
    one, two = store.column("a1", "sealed_listing"), store.column("a2", "sealed_listing")
    store.edit("UPDATE entries SET sealed_listing = ? WHERE id = ?", (two, store.ids["a1"]))
    store.edit("UPDATE entries SET sealed_listing = ? WHERE id = ?", (one, store.ids["a2"]))
    _refused(store, ALICE, "t1", "a1")


def test_a_nulled_listing_part_goes_the_slow_path_and_is_refused_there(store: Store) -> None:
    """Without its part a row looks like one written before the listing part: it is
    opened with its item key, whose header digest (format 1) does not match
    what the entry was sealed with, so it is refused, never listed unauthenticated."""
    store.edit("UPDATE entries SET sealed_listing = NULL WHERE id = ?", (store.ids["a1"],))
    _refused(store, ALICE, "t1", "a1")
    with store.open() as pad:  # the other entries still list and read
        assert pad.list_for_turn(ALICE, "t2")[0]["scratchpad_id"] == store.ids["a_other_turn"]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("actor", "someone-else"),
        ("channel", "other"),
        ("executor_name", "shell"),
        ("content_kind", "binary"),
        ("size_bytes", 1),
        ("size_chars", 1),
        ("created_at", 1.0),
        ("commitment", bytes(32)),
        ("key_version", 2),
        ("step_num", 7),
        ("expires_at", 4e9),
    ],
)
def test_each_clear_column_bound_to_the_listing_part_is_checked(store: Store, column: str, value: Any) -> None:
    store.edit(f"UPDATE entries SET {column} = ? WHERE id = ?", (value, store.ids["a1"]))
    _refused(store, ALICE, "t1", "a1")


def test_a_listing_shows_only_what_its_part_holds_and_a_read_checks_the_rest(store: Store) -> None:
    """The entry's own sealed metadata (shape, fields, index) is not opened by
    a listing; a read of the entry refuses it when it was altered."""
    meta = bytearray(store.column("a1", "sealed_meta"))
    meta[-1] ^= 0x01
    store.edit("UPDATE entries SET sealed_meta = ? WHERE id = ?", (bytes(meta), store.ids["a1"]))
    with store.open() as pad:
        assert len(pad.list_for_turn(ALICE, "t1")) == 2
        with pytest.raises(IntegrityError):
            pad.get(ALICE, store.ids["a1"])
        with pytest.raises(IntegrityError):
            pad.read(ALICE, store.ids["a1"])


def test_an_extension_reseals_the_listing_part(store: Store) -> None:
    before = store.column("a1", "sealed_listing")
    with store.open() as pad:
        expiry = pad.list_for_turn(ALICE, "t1")[0]["expires_at"]
        assert pad.turn(ALICE, "t1").resume(extend_ttl=86400)["extended"] >= 2
        listed = pad.list_for_turn(ALICE, "t1")
        assert listed[0]["expires_at"] > expiry
        assert pad.get(ALICE, store.ids["a1"]).expires_at == listed[0]["expires_at"]
    assert store.column("a1", "sealed_listing") != before


def test_an_owner_key_rotation_reseals_the_listing_parts(store: Store) -> None:
    with store.open() as pad:
        report = pad.rotate_owner_key("alice")
        assert report["complete"] and report["retired_versions"] == [1]
        assert [item["step_num"] for item in pad.list_for_turn(ALICE, "t1")] == [1, 2]
        assert pad.get(ALICE, store.ids["a2"]).observation == {"results": [{"n": i} for i in range(5)]}
    assert store.column("a1", "key_version") == 2
    with store.open() as pad:
        costs = listing_costs(pad, ALICE, "t1")
        assert (costs["key_unwraps"], costs["header_digests"]) == (1, 0)  # the new owner key only


def test_a_next_step_put_seals_the_step_it_took(store: Store) -> None:
    """A stale guess (step 1 is taken) makes the write transaction take step 3
    and seal the listing part again for it: its view's reference names step 3."""
    with store.open() as pad:
        entries = parts(pad).putter
        view = entries.put(ALICE, "t1", 1, "tool", {"items": [1, 2, 3]}, free_step=True, next_step=True)
        assert view["step_num"] == 3 and "{{step3.items}}" in view["ref_hint"]
        listed = pad.list_for_turn(ALICE, "t1")
        assert [item["step_num"] for item in listed] == [1, 2, 3]
        assert listed[-1]["view"] == {k: v for k, v in view.items()}
        assert pad.get(ALICE, view["scratchpad_id"]).observation == {"items": [1, 2, 3]}
        assert pad.verify()["ok"]


# -- the encodings ----------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_pack_gives_back_what_json_would(value: Any) -> None:
    blob = pack(value)
    assert blob[0] in (PACKED_MSGPACK, PACKED_JSON)
    back = unpack(blob)
    assert back == json.loads(json.dumps(value))
    assert _same_types(back, json.loads(json.dumps(value)))


def _same_types(one: Any, two: Any) -> bool:
    if isinstance(one, dict):
        return isinstance(two, dict) and list(one) == list(two) and all(_same_types(one[k], two[k]) for k in one)
    if isinstance(one, list):
        return isinstance(two, list) and all(_same_types(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, float) and math.isnan(one):
        return False
    return type(one) is type(two)


def test_integers_beyond_64_bits_are_kept_as_json() -> None:
    assert pack({"n": 2**64 - 1})[0] == PACKED_MSGPACK
    assert pack({"n": 2**64})[0] == PACKED_JSON
    assert unpack(pack({"n": -(2**70)})) == {"n": -(2**70)}


@pytest.mark.parametrize("blob", [b"", b"\x03\x80", b"\x01\xc1", b"\x02{"])
def test_an_undecodable_or_unknown_encoding_is_an_integrity_error(blob: bytes) -> None:
    with pytest.raises(IntegrityError):
        unpack(blob)


_identifiers = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(_identifiers, _identifiers, _identifiers, _identifiers),
    st.tuples(_identifiers, _identifiers, _identifiers, _identifiers),
    st.tuples(*(st.integers(0, 2**40) for _ in range(3))),
)
def test_the_binary_header_digest_tells_every_field_apart(
    texts: tuple[str, ...], other: tuple[str, ...], numbers: tuple[int, ...]
) -> None:
    one = Header(*texts, *numbers, 1, ENTRY_FORMAT)
    two = Header(*other, *numbers, 1, ENTRY_FORMAT)
    assert (one.digest() == two.digest()) == (texts == other)
    assert one.digest() != Header(*texts, *numbers, 1, 1).digest()  # the format is part of the domain
    assert one.digest() == Header(*texts, *numbers, 9, ENTRY_FORMAT).digest()  # the key version is bound elsewhere


def test_a_header_out_of_range_is_an_integrity_error() -> None:
    with pytest.raises(IntegrityError):
        Header("0123456789abcdef", "alice", "t", "text", -1, 0, 1, 1, ENTRY_FORMAT).digest()


# -- migration 9: stores written before the listing part ------------------------------------------


V7 = json.loads((FIXTURES / "store_v7.json").read_text())
V7_NOW = V7["now"]


@pytest.fixture
def v7_store(tmp_path: Path) -> Store:
    """A private copy of tests/fixtures/store_v7.db (written by main at e7494e0), its key and anchor."""
    db, keys = tmp_path / "store.db", tmp_path / "keys"
    keys.mkdir()
    shutil.copy(FIXTURES / "store_v7.db", db)
    db.chmod(0o600)
    (keys / "key").write_bytes((FIXTURES / "store_v7.key").read_bytes())
    (keys / "key").chmod(0o600)
    anchor = keys / f"anchor-{V7['store_id']}"
    anchor.write_bytes((FIXTURES / "store_v7.anchor").read_bytes())
    anchor.chmod(0o600)
    ids = {name: entry["id"] for name, entry in V7["entries"].items()}
    return Store(db, Keyring.from_key_file(keys / "key"), ids, lambda: V7_NOW)


def _listing_parts(store: Store) -> dict[str, bytes | None]:
    conn = apsw.Connection(str(store.path))
    try:
        return {str(i): p for i, p in conn.execute("SELECT id, sealed_listing FROM entries")}  # type: ignore[misc]
    finally:
        conn.close()


def test_migration_9_adds_the_column_and_old_rows_list_through_their_item_keys(v7_store: Store) -> None:
    old_views = {entry["id"]: entry["view"] for entry in [*V7["entries"].values(), *V7["batch"]]}
    with v7_store.open() as pad:
        assert sqlite_of(pad).query("PRAGMA user_version")[0]["user_version"] == SCHEMA_VERSION
        assert set(_listing_parts(v7_store).values()) == {None}
        costs = listing_costs(pad, ALICE, "turn-fixture")
        assert costs["entries"] == len(old_views)
        assert costs["header_digests"] == costs["entries"]  # each opened with its own key, as before
        listed = pad.list_for_turn(ALICE, "turn-fixture", now=V7_NOW)
        assert {item["scratchpad_id"]: _sorted(item["view"]) for item in listed} == old_views
        new = pad.put(ALICE, "turn-fixture", 99, "new_tool", "written now", now=V7_NOW)["scratchpad_id"]
        after = listing_costs(pad, ALICE, "turn-fixture")
        assert after["entries"] == costs["entries"] + 1
        assert after["header_digests"] == costs["entries"]  # the new entry lists by its listing part
        assert pad.list_for_turn(ALICE, "turn-fixture", now=V7_NOW)[-1]["scratchpad_id"] == new
    parts_now = _listing_parts(v7_store)
    assert parts_now[new] is not None and parts_now[v7_store.ids["text"]] is None


def test_an_old_turn_extended_and_rotated_keeps_each_row_in_its_format(v7_store: Store) -> None:
    text = v7_store.ids["text"]
    with v7_store.open() as pad:
        new = pad.put(ALICE, "turn-fixture", 99, "new_tool", "written now", now=V7_NOW)["scratchpad_id"]
        before = (v7_store.column("text", "sealed_meta"), _listing_parts(v7_store)[new])
        extended = pad.extend_turn(ALICE, "turn-fixture", 86_400, now=V7_NOW)
        assert extended == len(V7["entries"]) + len(V7["batch"]) + 1
        # Format 1: the metadata under the item key holds the expiry; format 2: the listing part.
        assert v7_store.column("text", "sealed_meta") != before[0] and _listing_parts(v7_store)[text] is None
        assert _listing_parts(v7_store)[new] != before[1]
        assert pad.rotate_owner_key("alice")["complete"]
        listed = {item["scratchpad_id"]: item for item in pad.list_for_turn(ALICE, "turn-fixture", now=V7_NOW)}
        assert listed[new]["expires_at"] == listed[text]["expires_at"] == V7_NOW + 86_400
        assert pad.get(ALICE, text, now=V7_NOW).expires_at == V7_NOW + 86_400
        assert pad.get(ALICE, new, now=V7_NOW).observation == "written now"
        report = pad.verify(now=V7_NOW)
        assert report["ok"], report["problems"]


def _sorted(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


# -- PostgreSQL -------------------------------------------------------------------------------------


def test_on_postgresql_parts_are_checked_re_sealed_by_extension_and_rotation(pg_dsn: str, keyring: Keyring) -> None:
    psycopg = pytest.importorskip("psycopg")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        first = pad.put(ALICE, "t1", 1, "read_file", "one")["scratchpad_id"]
        second = pad.put(ALICE, "t1", 2, "read_file", "two")["scratchpad_id"]
        assert listing_costs_free(pad)
        assert pad.extend_turn(ALICE, "t1", 86_400) == 2  # the app role may re-seal the part
        assert pad.rotate_owner_key("alice")["complete"]
        assert [item["scratchpad_id"] for item in pad.list_for_turn(ALICE, "t1")] == [first, second]
        with psycopg.connect(pg_dsn, autocommit=True) as admin:  # the database's owner edits rows in place
            admin.execute(
                "UPDATE securepad.entries SET sealed_listing ="
                " (SELECT sealed_listing FROM securepad.entries WHERE id = %s) WHERE id = %s",
                (second, first),
            )
        with pytest.raises(IntegrityError):
            pad.list_for_turn(ALICE, "t1")
        with pytest.raises(IntegrityError):
            pad.get(ALICE, first)


def listing_costs_free(pad: Scratchpad) -> bool:
    """No per-entry key work in a listing on PostgreSQL either (WORK counts the process's key work)."""
    before = WORK.snapshot()
    pad.list_for_turn(ALICE, "t1")
    after = WORK.snapshot()
    return all(after[name] == before[name] for name in after)


def test_a_put_overtaken_by_a_rotation_while_sealing_seals_again(
    db_path: Path, keyring: Keyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing key of a version a rotation retired meanwhile cannot be
    derived again: the put seals once more under the newest version."""
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "before")
        keys = parts(pad).keys
        derive = keys.sealing
        rotations: list[dict[str, Any]] = []

        def sealing(owner: str, version: int) -> Any:
            if not rotations:  # the first seal: a rotation completes before the keys are derived
                rotations.append({})
                rotations[0] = pad.rotate_owner_key(owner)
            return derive(owner, version)

        monkeypatch.setattr(keys, "sealing", sealing)
        entry = pad.put(ALICE, "t", 2, "tool", "during")["scratchpad_id"]
        assert rotations[0]["retired_versions"] == [1]
        assert pad.get(ALICE, entry).observation == "during"
        assert [item["step_num"] for item in pad.list_for_turn(ALICE, "t")] == [1, 2]
    assert Store(db_path, keyring, {"e": entry}).column("e", "key_version") == 2


# -- what a listing selects ---------------------------------------------------------------------

# The columns only a format-1 row needs (its item key and metadata).
FORMAT_ONE_COLUMNS = ("wrapped_key", "nonce_prefix", "sealed_meta")


def _statements(pad: Scratchpad, call: Callable[[], object]) -> list[str]:
    """The SQL of every statement ``call`` ran on this thread's connection (triggers' apart)."""
    conn = sqlite_of(pad).conn
    found: list[str] = []

    def trace(event: dict[str, Any]) -> None:
        if not event.get("trigger"):
            found.append(event["sql"])

    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        call()
    finally:
        conn.trace_v2(0, None)
    return found


def test_a_listing_of_new_entries_selects_none_of_the_format_1_columns(store: Store) -> None:
    with store.open() as pad:
        turn = pad.turn(ALICE, "t1")
        for call in (lambda: pad.list_for_turn(ALICE, "t1"), turn.history, turn.tools):
            call()  # warm
            statements = _statements(pad, call)
            assert statements and not [sql for sql in statements if any(c in sql for c in FORMAT_ONE_COLUMNS)]
        assert len(_statements(pad, lambda: pad.list_for_turn(ALICE, "t1"))) == 2  # the rows, and the turn head


def test_an_old_turn_fetches_its_format_1_rows_whole_in_one_more_statement(v7_store: Store) -> None:
    with v7_store.open() as pad:
        new = pad.put(ALICE, "turn-fixture", 99, "new_tool", "written now", now=V7_NOW)["scratchpad_id"]
        listing = lambda: pad.list_for_turn(ALICE, "turn-fixture", now=V7_NOW)  # noqa: E731
        listed = listing()
        statements = _statements(pad, listing)
        assert len(statements) == 3, statements
        whole = [sql for sql in statements if all(column in sql for column in FORMAT_ONE_COLUMNS)]
        assert len(whole) == 1 and "sealed_listing IS NULL" in whole[0]
        assert listed[-1]["scratchpad_id"] == new and len(listed) == len(V7["entries"]) + len(V7["batch"]) + 1


@pytest.mark.parametrize("change", ["gone", "changed"])
def test_a_format_1_row_that_changes_before_it_is_fetched_whole_fails_the_listing(
    v7_store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The whole format-1 row must be the row the listing checked against the
    turn head: one that is gone or holds other values fails the listing."""
    with v7_store.open() as pad:
        access = parts(pad).access
        fetch = access.rows

        def rows(*args: Any, **kwargs: Any) -> Any:
            found = fetch(*args, **kwargs)
            if "sealed_listing IS NULL" in args[3]:  # the format-1 rows, fetched whole
                return found[1:] if change == "gone" else [{**found[0], "step_num": 999}, *found[1:]]
            return found

        monkeypatch.setattr(access, "rows", rows)
        with pytest.raises(IntegrityError, match="changed while its turn was listed"):
            pad.list_for_turn(ALICE, "turn-fixture", now=V7_NOW)


def test_entries_of_one_step_list_in_creation_order(db_path: Path, keyring: Keyring) -> None:
    """Entries of other channels may share a step (a channel's scope checks its own
    steps); a scope that sees them all lists them in the order they were put."""
    channels = [f"c{i}" for i in range(8)]
    with Scratchpad.open(
        db_path, keyring=keyring, policy=Policy.from_dict({"access": {"scope": "owner+channel"}})
    ) as pad:
        for i, channel in enumerate(channels):
            pad.put(Principal("alice", "agent", channel), "t", 1, "tool", channel, now=1000.0 + i)
        pad.put(Principal("alice", "agent", "c0"), "t", 2, "tool", "after", now=1000.0)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        listed = pad.list_for_turn(Principal("alice", "agent", "c0"), "t", now=1010.0)
        assert [item["summary"] for item in listed] == [*channels, "after"]
        assert [item["scratchpad_id"] for item in listed] == [
            item["scratchpad_id"] for item in pad.list_for_turn(ALICE, "t", now=1010.0)
        ]
