"""Policies: the shipped files load, scopes narrow access inside an owner, and no
policy lets one owner reach another's entries."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad.errors import ExpiredError, InvalidArgumentError, NotFoundError
from securepad.policy import bundled_policy_path

POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
POLICY_FILES = sorted(POLICY_DIR.glob("*.toml"))
SCOPES = ("owner", "owner+channel", "owner+channel+actor")


def test_the_shipped_policies_are_there() -> None:
    assert {p.stem for p in POLICY_FILES} >= {"default", "strict", "channel"}


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: p.name)
def test_each_policy_file_loads_and_runs_a_store(path: Path, tmp_path: Path, keyring: Keyring) -> None:
    policy = Policy.load(path)
    assert policy.name == path.stem
    assert policy.scope in SCOPES
    assert policy.default_ttl_seconds <= policy.max_ttl_seconds
    assert policy.max_entry_bytes <= policy.owner_quota_bytes
    p = Principal("alice", "planner", "web")
    with Scratchpad.open(tmp_path / "store.db", keyring=keyring, policy=path) as pad:
        assert pad.policy == policy
        text = "policy check " * 2000
        entry_id = pad.put(p, "t", 1, "x", text, now=1000.0)["scratchpad_id"]
        assert pad.get(p, entry_id, now=1000.0).observation == text
        full = pad.read(p, entry_id, mode="full", now=1000.0)
        shown = len(full["content"])
        assert full["content"] == text[:shown]
        assert policy.max_read_chars - 1000 < shown < policy.max_read_chars
        assert len(json.dumps(full, ensure_ascii=False)) <= policy.max_read_chars
        assert pad.get(p, entry_id, now=1000.0).expires_at == 1000.0 + policy.default_ttl_seconds
        with pytest.raises(InvalidArgumentError):
            pad.put(p, "t", 2, "x", "data", ttl_seconds=policy.max_ttl_seconds + 1)


def test_policy_files_have_the_documented_scopes() -> None:
    assert Policy.load(POLICY_DIR / "default.toml").scope == "owner"
    assert Policy.load(POLICY_DIR / "channel.toml").scope == "owner+channel"
    strict = Policy.load(POLICY_DIR / "strict.toml")
    default = Policy.load(POLICY_DIR / "default.toml")
    assert strict.scope == "owner+channel+actor"
    # "strict" is stricter than the default on every limit.
    for limit in ("max_read_chars", "max_entry_bytes", "owner_quota_bytes", "default_ttl_seconds", "max_ttl_seconds"):
        assert getattr(strict, limit) <= getattr(default, limit), limit


def test_default_policy_is_found_without_a_path(db_path: Path, keyring: Keyring) -> None:
    default = Policy.default()
    assert default.name == "default"
    assert default.as_dict() == Policy.load(POLICY_DIR / "default.toml").as_dict()
    assert bundled_policy_path("default").is_file()
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        assert pad.policy == default
    with Scratchpad.open(db_path, keyring=keyring, policy=default) as pad:
        assert pad.policy == default


def test_default_policy_values() -> None:
    """The values DESIGN.md gives for the default policy."""
    policy = Policy.default()
    assert policy.as_dict() == {
        "scope": "owner",
        "offload_threshold_bytes": 4096,
        "inline_max_chars": 1500,
        "max_read_chars": 16000,
        "max_entry_bytes": 104857600,
        "owner_quota_bytes": 1073741824,
        "default_ttl_seconds": 3600,
        "max_ttl_seconds": 86400,
        "log_denied": True,
        "log_reads": False,
        "max_json_depth": 100,
        "max_clock_skew_seconds": 300,
        "allow_shared_files": False,
        "wal_limit_bytes": 268435456,
        "incremental_vacuum": False,
        "durability": "normal",
        "anchor_sync": "interval",
        "anchor_interval_seconds": 1,
        "call_timeout_seconds": 60,
        "name": "default",
    }


def test_policy_from_a_path_string(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=str(POLICY_DIR / "strict.toml")) as pad:
        assert pad.policy.name == "strict"
        assert pad.policy.max_read_chars == 8000


# -- scopes -------------------------------------------------------------------------

# Principals of alice (two actors, two channels) and of bob (same actor and channel names).
ALICE_WEB_PLANNER = Principal("alice", "planner", "web")
ALICE_WEB_CODER = Principal("alice", "coder", "web")
ALICE_SLACK_PLANNER = Principal("alice", "planner", "slack")
ALICE_SLACK_CODER = Principal("alice", "coder", "slack")
BOB_WEB_PLANNER = Principal("bob", "planner", "web")
EVERYONE = (ALICE_WEB_PLANNER, ALICE_WEB_CODER, ALICE_SLACK_PLANNER, ALICE_SLACK_CODER, BOB_WEB_PLANNER)


def may_see(scope: str, reader: Principal, writer: Principal) -> bool:
    """The rule the scope states, written out independently of the library."""
    if reader.owner_user_id != writer.owner_user_id:
        return False
    if scope in ("owner+channel", "owner+channel+actor") and reader.channel != writer.channel:
        return False
    return not (scope == "owner+channel+actor" and reader.actor != writer.actor)


def open_scoped(tmp_path: Path, keyring: Keyring, scope: str) -> Scratchpad:
    policy = Policy.from_dict({"access": {"scope": scope}}, name=scope)
    return Scratchpad.open(tmp_path / scope / "store.db", keyring=keyring, policy=policy)


@pytest.fixture(params=SCOPES)
def scoped(request: pytest.FixtureRequest, tmp_path: Path, keyring: Keyring) -> Iterator[tuple[str, Scratchpad]]:
    scope: str = request.param
    with open_scoped(tmp_path, keyring, scope) as pad:
        yield scope, pad


def test_scope_narrows_get_read_list_and_stats(scoped: tuple[str, Scratchpad]) -> None:
    scope, pad = scoped
    written: dict[str, tuple[Principal, str]] = {}
    for step, writer in enumerate(EVERYONE):
        content = f"written by {writer}"
        entry_id = pad.put(writer, "turn-1", step, "x", content * 3, now=1000.0)["scratchpad_id"]
        written[entry_id] = (writer, content * 3)
    for reader in EVERYONE:
        visible = []
        for entry_id, (writer, content) in written.items():
            if may_see(scope, reader, writer):
                visible.append(entry_id)
                assert pad.get(reader, entry_id, now=1000.0).observation == content
                assert pad.read(reader, entry_id, mode="full", now=1000.0)["content"] == content
            else:
                with pytest.raises(NotFoundError) as caught:
                    pad.get(reader, entry_id, now=1000.0)
                assert type(caught.value) is NotFoundError
                assert str(caught.value) == "no such entry"
                with pytest.raises(NotFoundError):
                    pad.read(reader, entry_id, mode="head", now=1000.0)
        listed = pad.list_for_turn(reader, "turn-1", now=1000.0)
        assert sorted(item["scratchpad_id"] for item in listed) == sorted(visible)
        stats = pad.stats(reader, now=1000.0)
        assert stats["entries"] == len(visible)
        assert stats["bytes"] == sum(len(written[i][1]) for i in visible)
        assert stats["scope"] == scope


def test_expired_entry_outside_the_scope_is_plain_not_found(tmp_path: Path, keyring: Keyring) -> None:
    with open_scoped(tmp_path, keyring, "owner+channel") as pad:
        entry_id = pad.put(ALICE_SLACK_PLANNER, "t", 1, "x", "old", ttl_seconds=10, now=1000.0)["scratchpad_id"]
        with pytest.raises(ExpiredError):
            pad.get(ALICE_SLACK_PLANNER, entry_id, now=2000.0)
        with pytest.raises(NotFoundError) as caught:
            pad.get(ALICE_WEB_PLANNER, entry_id, now=2000.0)
        assert type(caught.value) is NotFoundError
        assert str(caught.value) == "no such entry"


names = st.sampled_from(["alice", "bob", "carol"])
actors = st.sampled_from(["planner", "coder"])
channels = st.sampled_from(["web", "slack"])
principals = st.builds(Principal, names, actors, channels)


@pytest.mark.slow
@given(scope=st.sampled_from(SCOPES), writers=st.lists(principals, min_size=1, max_size=6), reader=principals)
def test_isolation_property(
    tmp_path_factory: pytest.TempPathFactory,
    keyring: Keyring,
    scope: str,
    writers: list[Principal],
    reader: Principal,
) -> None:
    with open_scoped(tmp_path_factory.mktemp("iso"), keyring, scope) as pad:
        ids = {}
        for step, writer in enumerate(writers):
            ids[pad.put(writer, "shared-turn", step, "x", f"{writer}#{step}")["scratchpad_id"]] = writer
        seen = {item["scratchpad_id"] for item in pad.list_for_turn(reader, "shared-turn")}
        assert seen == {i for i, writer in ids.items() if may_see(scope, reader, writer)}
        for entry_id, writer in ids.items():
            try:
                pad.get(reader, entry_id)
            except NotFoundError:
                assert not may_see(scope, reader, writer)
            else:
                assert may_see(scope, reader, writer)


def test_no_policy_crosses_owners(tmp_path: Path, keyring: Keyring) -> None:
    """Whatever the scope and whichever other fields match, another owner's entry is not found."""
    for scope, (writer, reader) in itertools.product(
        SCOPES, [(ALICE_WEB_PLANNER, BOB_WEB_PLANNER), (BOB_WEB_PLANNER, ALICE_WEB_PLANNER)]
    ):
        with open_scoped(tmp_path / writer.owner_user_id, keyring, scope) as pad:
            entry_id = pad.put(writer, "turn-1", 1, "x", "private")["scratchpad_id"]
            with pytest.raises(NotFoundError):
                pad.get(reader, entry_id)
            assert pad.list_for_turn(reader, "turn-1") == []
            assert pad.stats(reader)["entries"] == 0
    for path in POLICY_FILES:
        with Scratchpad.open(tmp_path / f"{path.stem}.db", keyring=keyring, policy=path) as pad:
            entry_id = pad.put(ALICE_WEB_PLANNER, "t", 1, "x", "private")["scratchpad_id"]
            with pytest.raises(NotFoundError):
                pad.get(BOB_WEB_PLANNER, entry_id)
            assert pad.stats(BOB_WEB_PLANNER)["entries"] == 0


def test_scope_columns_always_start_with_the_owner() -> None:
    for scope in SCOPES:
        policy = Policy.from_dict({"access": {"scope": scope}})
        assert policy.scope_columns(BOB_WEB_PLANNER)[0] == ("owner_user_id", "bob")


def test_the_same_file_under_two_policies(tmp_path: Path, keyring: Keyring) -> None:
    """A policy narrows what a store shows; the entries are the same file's."""
    path = tmp_path / "store.db"
    with Scratchpad.open(path, keyring=keyring, policy=POLICY_DIR / "default.toml") as pad:
        entry_id = pad.put(ALICE_SLACK_CODER, "t", 1, "x", "from slack")["scratchpad_id"]
        assert pad.get(ALICE_WEB_PLANNER, entry_id).observation == "from slack"
    with Scratchpad.open(path, keyring=keyring, policy=POLICY_DIR / "channel.toml") as pad:
        with pytest.raises(NotFoundError):
            pad.get(ALICE_WEB_PLANNER, entry_id)
        assert pad.get(ALICE_SLACK_PLANNER, entry_id).observation == "from slack"
    with Scratchpad.open(path, keyring=keyring, policy=POLICY_DIR / "strict.toml") as pad:
        with pytest.raises(NotFoundError):
            pad.get(ALICE_SLACK_PLANNER, entry_id)
        assert pad.get(ALICE_SLACK_CODER, entry_id).observation == "from slack"
