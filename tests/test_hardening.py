"""Shared directories and key files (5), the master key in the
environment (10), deeply nested JSON (11)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from securepad import InvalidArgumentError, Keyring, Policy, Principal, QuotaExceededError, Scratchpad, SecurepadError
from tests.support.principals import ALICE


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _key_file(path: Path, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64encode(secrets.token_bytes(32)) + b"\n")
    path.chmod(mode)
    return path


# -- 5: files others may read, plant or replace -------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_a_key_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _key_file(tmp_path / "cfg" / "key", mode)
    with pytest.raises(SecurepadError, match=f"chmod 600 {path}"):
        Keyring.from_key_file(path)
    assert Keyring.from_key_file(path, allow_shared=True).kind == "file"  # the documented override
    path.chmod(0o600)
    assert Keyring.from_key_file(path).kind == "file"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = _key_file(tmp_path / "cfg" / "key")
    os.chown(path, 4321, 4321)
    with pytest.raises(SecurepadError, match="belongs to uid 4321"):
        Keyring.from_key_file(path)


def test_a_key_planted_in_a_world_writable_directory_is_refused(tmp_path: Path, db_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    planted = _key_file(shared / "key")
    with pytest.raises(SecurepadError, match="chmod o-w"):
        Keyring.from_key_file(planted)
    planted.unlink()
    # Nor is a new key created there for a new store.
    with pytest.raises(SecurepadError, match="chmod o-w"):
        Scratchpad.open(db_path, keyring=Keyring.from_key_file(shared / "key"))
    assert not (shared / "key").exists()


def test_store_files_are_created_private(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "tool", "x" * 10_000)
        for suffix in ("", "-wal", "-shm"):
            assert _mode(Path(f"{db_path}{suffix}")) == 0o600, suffix


def test_a_precreated_database_file_others_may_read_is_refused(db_path: Path, keyring: Keyring) -> None:
    db_path.parent.mkdir(parents=True, mode=0o700)
    db_path.touch()
    db_path.chmod(0o666)
    with pytest.raises(SecurepadError, match=f"chmod 600 {db_path}"):
        Scratchpad.open(db_path, keyring=keyring)
    assert not Path(f"{db_path}-wal").exists()
    allowed = Policy.from_dict({"access": {"scope": "owner", "allow_shared_files": True}})
    with Scratchpad.open(db_path, keyring=keyring, policy=allowed) as pad:
        pad.put(ALICE, "t", 1, "tool", "shared on purpose")


def test_a_data_directory_others_may_write_is_refused(tmp_path: Path, keyring: Keyring) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    with pytest.raises(SecurepadError, match="chmod o-w"):
        Scratchpad.open(data / "store.db", keyring=keyring)
    assert not (data / "store.db").exists()


def test_the_shared_files_override_is_a_policy_flag() -> None:
    assert Policy.default().allow_shared_files is False
    with pytest.raises(SecurepadError, match="allow_shared_files"):
        Policy.from_dict({"access": {"scope": "owner", "allow_shared_files": "yes"}})


# -- 10: the master key leaves the environment once read ----------------------------------


def test_from_env_removes_the_master_key_from_the_environment(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    monkeypatch.setenv("SECUREPAD_TEST_KEY", key)
    keyring = Keyring.from_env("SECUREPAD_TEST_KEY")
    assert "SECUREPAD_TEST_KEY" not in os.environ
    shell = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('SECUREPAD_TEST_KEY', 'unset'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.strip() == "unset"  # a tool's subprocess cannot print it
    with Scratchpad.open(db_path, keyring=keyring) as pad:  # the keyring still works
        pad.put(ALICE, "t", 1, "tool", "x")
    monkeypatch.setenv("SECUREPAD_TEST_KEY", key)
    Keyring.from_env("SECUREPAD_TEST_KEY", keep_in_env=True)
    assert os.environ["SECUREPAD_TEST_KEY"] == key


def test_a_bad_env_key_stays_where_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECUREPAD_TEST_KEY", "garbage!!")
    with pytest.raises(SecurepadError):
        Keyring.from_env("SECUREPAD_TEST_KEY")
    assert os.environ["SECUREPAD_TEST_KEY"] == "garbage!!"


# -- 11: deeply nested JSON -----------------------------------------------------------------


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.mark.parametrize("wrap", [lambda v: v, lambda v: {"content": "text", "metadata": {"deep": v}}])
def test_deep_json_is_an_invalid_argument_not_a_recursion_error(db_path: Path, keyring: Keyring, wrap: object) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(InvalidArgumentError, match="max_json_depth"):
            pad.put(ALICE, "t", 1, "tool", wrap(_nested(3000)))  # type: ignore[operator]
        assert pad.list_for_turn(ALICE, "t") == []
        with pytest.raises(InvalidArgumentError, match="max_json_depth"):
            pad.put(ALICE, "t", 1, "tool", wrap(_nested(60)))  # type: ignore[operator]
        # Within the policy's limit: stored and read back whole.
        view = pad.put(ALICE, "t", 2, "tool", wrap(_nested(40)))  # type: ignore[operator]
        assert pad.get(ALICE, view["scratchpad_id"]).observation == wrap(_nested(40))  # type: ignore[operator]


# -- 7: what reaches the model is bounded ----------------------------------------------------


def _view_json(view: dict[str, object]) -> int:
    return len(json.dumps(view, ensure_ascii=False))


@pytest.mark.parametrize(
    "observation",
    [
        {f"field_{i}": i for i in range(30_000)},  # a flat dict: every scalar and key name
        {"content": "log\n" * 5000, "metadata": {f"m{i}": "v" * 50 for i in range(5000)}},
        {"items": [{f"k{i}": 1 for i in range(3000)}], "note": "n" * 150},
        {"content": '"\\\n' * 5000, "metadata": {"path": "/a"}},  # escapes count as the model sees them
    ],
    ids=["flat dict", "huge metadata", "huge schema", "escaped text"],
)
@pytest.mark.parametrize("limit", [1500, 300])
def test_the_view_fits_inline_max_chars_as_json(
    db_path: Path, keyring: Keyring, observation: dict[str, object], limit: int
) -> None:
    policy = Policy.from_dict({"access": {"scope": "owner"}, "limits": {"inline_max_chars": limit}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        view = pad.put(ALICE, "t", 1, "tool", observation)
        assert _view_json(view) <= limit
        assert view["view_cut"]  # says what was left out
        again = pad.get(ALICE, view["scratchpad_id"])
        assert again.observation == observation  # nothing is lost: only the view is cut


def test_a_view_that_fits_is_unchanged(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        view = pad.put(ALICE, "t", 1, "tool", {"content": "x" * 5000, "metadata": {"path": "/a"}, "status": 200})
        assert "view_cut" not in view and view["metadata"] == {"path": "/a"} and view["status"] == 200


# -- 4 and 6: the quota counts every row, and says nothing of other scopes ------------------


def _quota_pad(db_path: Path, keyring: Keyring, quota: int, scope: str = "owner") -> Scratchpad:
    policy = Policy.from_dict(
        {"access": {"scope": scope}, "limits": {"owner_quota_bytes": quota, "max_entry_bytes": quota}}
    )
    return Scratchpad.open(db_path, keyring=keyring, policy=policy)


def test_empty_entries_count_against_the_quota(db_path: Path, keyring: Keyring) -> None:
    """3,000 empty entries grew a file by 15 MB under a 1,000-byte quota."""
    with _quota_pad(db_path, keyring, 100_000) as pad:
        stored = 0
        with pytest.raises(QuotaExceededError):
            for step in range(3000):
                pad.put(ALICE, "t", step, "tool", "")
                stored += 1
        assert 0 < stored <= 100_000 // 512
        assert pad.stats(ALICE)["stored_bytes"] <= 100_000


def test_checkpoints_and_marks_count_against_the_quota(db_path: Path, keyring: Keyring) -> None:
    """6 MB of checkpoints were stored under a 1 MB quota."""
    with _quota_pad(db_path, keyring, 1_000_000) as pad:
        turn = pad.turn(ALICE, "t")
        written = 0
        with pytest.raises(QuotaExceededError, match="record"):
            for _ in range(60):
                turn.checkpoint(facts=["f" * 1000] * 100)  # about 100 KB each
                written += 1
        assert 5 <= written <= 10
        with pytest.raises(QuotaExceededError):
            pad.put(ALICE, "t", 1, "tool", "x" * 200_000)  # the records leave no room for it


def test_the_quota_message_tells_nothing_of_other_scopes(db_path: Path, keyring: Keyring) -> None:
    web, slack = Principal("alice", "planner", "web"), Principal("alice", "planner", "slack")
    with _quota_pad(db_path, keyring, 200_000, scope="owner+channel") as pad:
        pad.put(web, "t", 1, "tool", "w" * 150_000)
        hidden = pad.stats(web)["stored_bytes"]
        with pytest.raises(QuotaExceededError) as caught:
            pad.put(slack, "t", 1, "tool", "s" * 100_000)
        assert str(hidden) not in str(caught.value) and "live" not in str(caught.value)


def test_checkpoint_and_mark_numbers_count_only_the_callers_scope(db_path: Path, keyring: Keyring) -> None:
    """MAX(seq) over the whole turn told a web principal of slack's records."""
    web, slack = Principal("alice", "planner", "web"), Principal("alice", "planner", "slack")
    policy = Policy.from_dict({"access": {"scope": "owner+channel"}})
    with Scratchpad.open(db_path, keyring=keyring, policy=policy) as pad:
        for _ in range(2):
            pad.turn(slack, "t").checkpoint(facts=["slack's"])
        mine = pad.turn(web, "t").checkpoint(facts=["web's"])
        assert mine["seq"] == 1
        latest = pad.turn(web, "t").latest_checkpoint()
        assert latest is not None and latest["seq"] == 1 and latest["facts"] == ["web's"]
        second = pad.turn(web, "t").checkpoint(facts=["web's again"])
        assert second["seq"] == 2
        assert pad.turn(slack, "t").latest_checkpoint()["seq"] == 2  # type: ignore[index]


@pytest.mark.parametrize("max_read_chars", [16000, 2000])
def test_every_tool_result_fits_the_read_cap_as_the_json_the_model_sees(
    tmp_path: Path, keyring: Keyring, max_read_chars: int
) -> None:
    """Content, escapes and the result's own fields (match_lines, hint, the echoed
    pattern) together fit max_read_chars."""
    policy_file = tmp_path / "p.toml"
    policy_file.write_text(f'[access]\nscope = "owner"\n[limits]\nmax_read_chars = {max_read_chars}\n')
    text = "".join(f'line {i}: "quoted" ERROR \\ tab\there\n' for i in range(20000))
    p = Principal("alice", "agent", "web")
    with Scratchpad.open(tmp_path / "store.db", keyring=keyring, policy=policy_file) as pad:
        cap = pad.policy.max_read_chars
        turn = pad.turn(p, "t")
        entry_id = turn.record(1, "tool", text)["scratchpad_id"]
        long_pattern = "ERROR|" + "|".join(f"nomatch{i}" for i in range(90))
        calls = [
            {"mode": "full"},
            {"mode": "head", "n": 10**6},
            {"mode": "tail", "n": 10**6},
            {"mode": "range", "start": 5, "end": 10**6},
            {"mode": "lines", "start": 1, "end": 20000},
            {"mode": "grep", "pattern": "ERROR", "max_matches": 10**4},
            {"mode": "grep", "pattern": long_pattern, "max_matches": 10**4, "context": 2},
        ]
        for call in calls:
            result = turn.call_tool("scratchpad_read", {"scratchpad_id": entry_id, **call})
            assert result["ok"] is True, result
            assert len(json.dumps(result, ensure_ascii=False)) <= cap, call["mode"]
            assert result["content"], call["mode"]
