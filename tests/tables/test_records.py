"""Compaction checkpoints, compaction marks and the re-read report."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import IntegrityError, InvalidArgumentError, Keyring, Policy, Principal, Scratchpad, Turn
from securepad.store import parts

NOW = 3_000_000.0
TURN = "turn-cp"
CANARY = "canary-fact-7f3a91"


@pytest.fixture
def turn(pad: Scratchpad, alice: Principal) -> Turn:
    return pad.turn(alice, TURN, now=NOW)


def read_file(turn: Turn, step: int, path: str, content: str, *, key: str = "path") -> dict[str, Any]:
    result = turn.record(step, "read_file", {"content": content, "metadata": {key: path}}, now=NOW)
    assert isinstance(result, dict)
    return result


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_round_trip(turn: Turn) -> None:
    saved = turn.checkpoint(
        workspace={"src/app.py": "modified", "tests/test_app.py": "created"},
        budget={"tokens_left": 12000, "calls_left": 7, "seconds_left": 95.5},
        facts=["the crash is in parse()", "tests pass on main"],
        unresolved=["flaky test_upload"],
        now=NOW,
    )
    assert saved["seq"] == 1 and saved["turn_id"] == TURN
    assert saved["created_at"] == NOW and saved["expires_at"] == NOW + 3600
    assert turn.latest_checkpoint(now=NOW) == saved


def test_latest_checkpoint_is_the_newest(turn: Turn) -> None:
    assert turn.latest_checkpoint(now=NOW) is None
    turn.checkpoint(facts=["first"], now=NOW)
    turn.checkpoint(facts=["second"], now=NOW)  # same time: the sequence decides
    latest = turn.latest_checkpoint(now=NOW)
    assert latest is not None and latest["facts"] == ["second"] and latest["seq"] == 2


def test_empty_checkpoint_has_every_field(turn: Turn) -> None:
    saved = turn.checkpoint(now=NOW)
    assert {k: saved[k] for k in ("workspace", "budget", "facts", "unresolved")} == {
        "workspace": {},
        "budget": {},
        "facts": [],
        "unresolved": [],
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"workspace": ["a.py"]},
        {"workspace": {"a.py": 1}},
        {"workspace": {"": "modified"}},
        {"workspace": {3: "modified"}},
        {"budget": {"tokens": 5}},
        {"budget": {"tokens_left": -1}},
        {"budget": {"calls_left": True}},
        {"budget": {"seconds_left": float("nan")}},
        {"budget": {"seconds_left": "10"}},
        {"budget": 100},
        {"facts": "one fact"},
        {"facts": ["ok", 2]},
        {"unresolved": [None]},
        {"ttl_seconds": 0},
        {"ttl_seconds": 10**9},
    ],
    ids=repr,
)
def test_bad_checkpoint_fields_are_refused(turn: Turn, fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        turn.checkpoint(now=NOW, **fields)
    assert turn.latest_checkpoint(now=NOW) is None


def test_checkpoint_larger_than_max_entry_bytes_is_refused(tmp_path: Path, keyring: Keyring, alice: Principal) -> None:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": {"max_entry_bytes": 1000}})
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring, policy=policy) as pad:
        turn = pad.turn(alice, TURN, now=NOW)
        with pytest.raises(InvalidArgumentError, match="max_entry_bytes"):
            turn.checkpoint(facts=["x" * 2000], now=NOW)


def test_checkpoints_expire_and_gc_removes_them(pad: Scratchpad, turn: Turn, db_path: Path) -> None:
    turn.checkpoint(facts=["short"], ttl_seconds=60, now=NOW)
    turn.mark_compaction(ttl_seconds=60, now=NOW)
    assert turn.latest_checkpoint(now=NOW + 61) is None
    assert turn.reread_report(now=NOW + 61)["mark"] is None
    pad.gc(now=NOW + 61)
    assert count_rows(db_path, "checkpoints") == count_rows(db_path, "compaction_marks") == 0


def test_checkpoints_belong_to_their_owner(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    pad.turn(alice, TURN, now=NOW).checkpoint(facts=[CANARY], now=NOW)
    assert pad.turn(bob, TURN, now=NOW).latest_checkpoint(now=NOW) is None
    assert pad.turn(alice, "another-turn", now=NOW).latest_checkpoint(now=NOW) is None


def test_checkpoints_follow_the_policy_scope(tmp_path: Path, keyring: Keyring) -> None:
    policy = Policy.load("policies/strict.toml")
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring, policy=policy) as pad:
        planner, coder = Principal("alice", "planner", "web"), Principal("alice", "coder", "web")
        pad.turn(planner, TURN, now=NOW).checkpoint(facts=["planner's"], now=NOW)
        assert pad.turn(coder, TURN, now=NOW).latest_checkpoint(now=NOW) is None
        # Numbered within the coder's scope: the planner's record is not counted.
        assert pad.turn(coder, TURN, now=NOW).checkpoint(facts=["coder's"], now=NOW)["seq"] == 1
        latest = pad.turn(planner, TURN, now=NOW).latest_checkpoint(now=NOW)
        assert latest is not None and latest["facts"] == ["planner's"]


def test_checkpoints_survive_owner_key_rotation_and_die_with_the_owner(
    pad: Scratchpad, turn: Turn, db_path: Path
) -> None:
    turn.checkpoint(facts=["before rotation"], now=NOW)
    turn.mark_compaction(now=NOW)
    rotated = pad.rotate_owner_key("alice")
    assert rotated["complete"] and rotated["retired_versions"] == [1]
    latest = turn.latest_checkpoint(now=NOW)
    assert latest is not None and latest["facts"] == ["before rotation"]
    assert turn.reread_report(now=NOW)["mark"] is not None
    pad.forget_owner("alice")
    assert count_rows(db_path, "checkpoints") == count_rows(db_path, "compaction_marks") == 0


# -- at rest ------------------------------------------------------------------------------------


def count_rows(db_path: Path, table: str) -> int:
    conn = apsw.Connection(str(db_path))
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchall()[0][0])  # type: ignore[arg-type]
    finally:
        conn.close()


def test_checkpoints_and_marks_are_encrypted_at_rest(pad: Scratchpad, turn: Turn, db_path: Path) -> None:
    read_file(turn, 1, f"/secret/{CANARY}.txt", f"content {CANARY}")
    turn.checkpoint(workspace={f"/src/{CANARY}.py": f"state {CANARY}"}, facts=[CANARY], unresolved=[CANARY], now=NOW)
    turn.mark_compaction(now=NOW)
    for suffix in ("", "-wal"):
        path = Path(f"{db_path}{suffix}")
        if path.exists():
            assert CANARY.encode() not in path.read_bytes()
    parts(pad).db.checkpoint()
    assert CANARY.encode() not in db_path.read_bytes()
    conn = apsw.Connection(str(db_path))
    columns = [row[1] for row in conn.execute("PRAGMA table_info(checkpoints)")]
    conn.close()
    assert columns == [
        "id",
        "owner_user_id",
        "actor",
        "channel",
        "turn_id",
        "seq",
        "key_version",
        "created_at",
        "expires_at",
        "wrapped_key",
        "sealed",
    ]


TAMPERS = [
    ("turn_id", "UPDATE {table} SET turn_id = 'other-turn'"),
    ("seq", "UPDATE {table} SET seq = seq + 10"),
    ("expires_at", "UPDATE {table} SET expires_at = expires_at + 1000"),
    ("created_at", "UPDATE {table} SET created_at = created_at - 1"),
    ("actor", "UPDATE {table} SET actor = 'coder'"),
    ("created_at as text", "UPDATE {table} SET created_at = 'yesterday'"),
    ("seq as text", "UPDATE {table} SET seq = 'x'"),
    (
        "sealed",
        "UPDATE {table} SET sealed = substr(sealed, 1, 20)"
        " || CASE WHEN substr(sealed, 21, 1) = x'00' THEN x'01' ELSE x'00' END || substr(sealed, 22)",
    ),
    (
        "wrapped_key",
        "UPDATE {table} SET wrapped_key = substr(wrapped_key, 1, 20)"
        " || CASE WHEN substr(wrapped_key, 21, 1) = x'00' THEN x'01' ELSE x'00' END || substr(wrapped_key, 22)",
    ),
]


@pytest.mark.parametrize(("what", "sql"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_tampered_checkpoints_fail_authentication(
    pad: Scratchpad, alice: Principal, db_path: Path, what: str, sql: str
) -> None:
    turn = pad.turn(alice, TURN, now=NOW)
    turn.checkpoint(facts=["real"], now=NOW)
    conn = apsw.Connection(str(db_path))
    conn.execute(sql.format(table="checkpoints"))
    conn.close()
    where = "other-turn" if what == "turn_id" else TURN
    with pytest.raises(IntegrityError):
        pad.turn(alice, where, now=NOW).latest_checkpoint(now=NOW)


def test_swapped_sealed_payloads_fail(pad: Scratchpad, turn: Turn, db_path: Path) -> None:
    turn.checkpoint(facts=["old"], now=NOW)
    turn.checkpoint(facts=["new"], now=NOW)
    conn = apsw.Connection(str(db_path))
    rows = list(conn.execute("SELECT seq, wrapped_key, sealed FROM checkpoints ORDER BY seq"))
    conn.execute("UPDATE checkpoints SET wrapped_key = ?, sealed = ? WHERE seq = 2", (rows[0][1], rows[0][2]))
    conn.close()
    with pytest.raises(IntegrityError):
        turn.latest_checkpoint(now=NOW)


def test_a_mark_moved_to_another_owner_fails(pad: Scratchpad, alice: Principal, bob: Principal, db_path: Path) -> None:
    pad.turn(alice, TURN, now=NOW).mark_compaction(now=NOW)
    pad.turn(bob, TURN, now=NOW).record(1, "echo", "bob's", now=NOW)  # bob gets a key
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE compaction_marks SET owner_user_id = 'bob'")
    conn.close()
    with pytest.raises(IntegrityError):
        pad.turn(bob, TURN, now=NOW).reread_report(now=NOW)


# -- compaction marks and the re-read report ------------------------------------------------------


def test_report_without_a_mark_is_empty(turn: Turn) -> None:
    read_file(turn, 1, "/a", "x" * 5000)
    report = turn.reread_report(now=NOW)
    assert report["mark"] is None and report["reread_count"] == 0 and report["ratio"] == 0.0


def test_rereads_after_the_mark_by_path_and_by_content(turn: Turn) -> None:
    big = "data " * 2000
    read_file(turn, 1, "/repo/a.py", big + "A")
    read_file(turn, 2, "https://example.com/spec", big + "B", key="url")
    read_file(turn, 3, "/repo/c.py", big + "C")
    mark = turn.mark_compaction(now=NOW)
    assert mark["entries_before"] == 3 and mark["seq"] == 1
    read_file(turn, 4, "/repo/a.py", big + "A changed")  # same path, new content
    read_file(turn, 5, "https://example.com/spec", big + "B", key="url")  # same url, same content
    read_file(turn, 6, "/tmp/copy-of-c.py", big + "C")  # same content, other path
    read_file(turn, 7, "/repo/new.py", big + "N")  # new
    turn.record(8, "ls", {"files": ["x"]}, now=NOW)  # no path at all
    report = turn.reread_report(now=NOW)
    assert report["mark"] == {"seq": 1, "created_at": NOW}
    assert report["stored_before"] == 3 and report["fetched_after"] == 5
    assert [(r["step_num"], r["same_path"], r["same_content"], r["first_step"]) for r in report["rereads"]] == [
        (4, True, False, 1),
        (5, True, True, 2),
        (6, False, True, 3),
    ]
    assert report["reread_count"] == 3 and report["same_path"] == 2 and report["same_content"] == 2
    assert report["reread_paths"] == ["/repo/a.py", "https://example.com/spec"]
    assert report["ratio"] == pytest.approx(3 / 5)


def test_the_latest_mark_counts(turn: Turn) -> None:
    read_file(turn, 1, "/a", "A" * 5000)
    turn.mark_compaction(now=NOW)
    read_file(turn, 2, "/a", "A" * 5000)
    turn.mark_compaction(now=NOW)
    read_file(turn, 3, "/b", "B" * 5000)
    report = turn.reread_report(now=NOW)
    assert report["mark"]["seq"] == 2  # type: ignore[index]
    assert report["stored_before"] == 2 and report["fetched_after"] == 1 and report["reread_count"] == 0


def test_report_remembers_entries_that_expired_after_the_mark(turn: Turn) -> None:
    turn.record(1, "read_file", {"content": "A" * 5000, "metadata": {"path": "/a"}}, ttl_seconds=60, now=NOW)
    turn.mark_compaction(now=NOW)
    turn.record(2, "read_file", {"content": "A" * 5000, "metadata": {"path": "/a"}}, now=NOW + 100)
    report = turn.reread_report(now=NOW + 100)
    assert report["reread_count"] == 1 and report["rereads"][0]["first_step"] == 1


def test_another_owners_identical_content_is_not_a_reread(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    alices = pad.turn(alice, TURN, now=NOW)
    alices.mark_compaction(now=NOW)
    read_file(alices, 1, "/shared/readme", "same bytes " * 500)
    bobs = pad.turn(bob, TURN, now=NOW)
    read_file(bobs, 1, "/shared/readme", "same bytes " * 500)
    bobs.mark_compaction(now=NOW)
    assert alices.reread_report(now=NOW)["reread_count"] == 0
    assert bobs.reread_report(now=NOW)["reread_count"] == 0


def test_content_identity_is_keyed_per_owner(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    """Equal contents of two owners get different identities, and neither is a
    plain hash anyone could compute from a guess."""
    text = "the same observation " * 100
    pad.put(alice, TURN, 1, "x", text)
    pad.put(bob, TURN, 1, "x", text)
    ids = [parts(pad).listings.turn_entries(who, TURN, NOW)[0].meta["content_id"] for who in (alice, bob)]
    assert ids[0] != ids[1]
    plain = hashlib.sha256(text.encode()).hexdigest()
    assert all(plain not in cid and hashlib.sha256(b"text" + text.encode()).hexdigest() not in cid for cid in ids)
    pad.put(alice, TURN, 2, "x", text)
    assert parts(pad).listings.turn_entries(alice, TURN, NOW)[1].meta["content_id"] == ids[0]


@pytest.fixture
def two_stores(tmp_path: Path, keyring: Keyring) -> Iterator[tuple[Scratchpad, Scratchpad]]:
    with (
        Scratchpad.open(tmp_path / "one.db", keyring=keyring) as one,
        Scratchpad.open(tmp_path / "two.db", keyring=keyring) as two,
    ):
        yield one, two


def test_content_identity_differs_between_stores(two_stores: tuple[Scratchpad, Scratchpad], alice: Principal) -> None:
    one, two = two_stores
    for store in two_stores:
        store.put(alice, TURN, 1, "x", "same text")
    assert (
        parts(one).listings.turn_entries(alice, TURN, NOW)[0].meta["content_id"]
        != parts(two).listings.turn_entries(alice, TURN, NOW)[0].meta["content_id"]
    )
