"""Key lifecycle: master and owner key rotation, crypto-shredding."""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path
from typing import Any

import apsw
import pytest
from click.testing import CliRunner

from securepad import Keyring, Principal, Scratchpad
from securepad.cli import main
from securepad.errors import InvalidArgumentError, NotFoundError, WrongKeyError
from securepad.tables.entries.open import Opener
from tests.support.principals import FAST_ARGON2


def _fill(pad: Scratchpad, owner: Principal, count: int, turn: str = "t") -> dict[str, str]:
    return {
        pad.put(owner, turn, i, "tool", f"{owner.owner_user_id} entry {i} " * 20)[
            "scratchpad_id"
        ]: f"{owner.owner_user_id} entry {i} " * 20
        for i in range(count)
    }


def _assert_readable(pad: Scratchpad, owner: Principal, expected: dict[str, str]) -> None:
    for entry_id, content in expected.items():
        assert pad.get(owner, entry_id).observation == content


def _owner_versions(db_path: Path, owner: str) -> list[int]:
    conn = apsw.Connection(str(db_path))
    try:
        return [
            int(v)
            for (v,) in conn.execute(
                "SELECT version FROM owner_keys WHERE owner_user_id = ? ORDER BY version", (owner,)
            )
        ]
    finally:
        conn.close()


@pytest.mark.parametrize("target", ["file", "env", "passphrase"])
def test_master_rotation_to_each_source(
    pad: Scratchpad,
    alice: Principal,
    bob: Principal,
    store_location: Any,
    keyring: Keyring,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
) -> None:
    expected = {**_fill(pad, alice, 5), **_fill(pad, bob, 5)}
    monkeypatch.setenv("NEW_MASTER", base64.b64encode(os.urandom(32)).decode())
    new = {
        "file": lambda: Keyring.from_key_file(tmp_path / "new" / "key"),
        "env": lambda: Keyring.from_env("NEW_MASTER", keep_in_env=True),  # read again below
        "passphrase": lambda: Keyring.from_passphrase("correct horse battery staple", **FAST_ARGON2),
    }[target]()
    report = pad.rotate_master_key(new)
    assert report["owner_keys_rewrapped"] == 2
    # The open store keeps working, for old owners and new ones.
    _assert_readable(pad, alice, {k: v for k, v in expected.items() if v.startswith("alice")})
    carol = Principal("carol", "a", "c")
    carol_id = pad.put(carol, "t", 1, "tool", "carol's")["scratchpad_id"]
    pad.close()
    with pytest.raises(WrongKeyError):
        Scratchpad.open(store_location, keyring=keyring)
    reopened = {
        "file": lambda: Keyring.from_key_file(tmp_path / "new" / "key"),
        "env": lambda: Keyring.from_env("NEW_MASTER"),
        "passphrase": lambda: Keyring.from_passphrase("correct horse battery staple", **FAST_ARGON2),
    }[target]()
    with Scratchpad.open(store_location, keyring=reopened) as again:
        _assert_readable(again, alice, {k: v for k, v in expected.items() if v.startswith("alice")})
        _assert_readable(again, bob, {k: v for k, v in expected.items() if v.startswith("bob")})
        assert again.get(carol, carol_id).observation == "carol's"


def test_master_rotation_from_passphrase_to_key_file(tmp_path: Path, alice: Principal) -> None:
    db = tmp_path / "s.db"
    with Scratchpad.open(db, keyring=Keyring.from_passphrase("old words", **FAST_ARGON2)) as pad:
        expected = _fill(pad, alice, 3)
        pad.rotate_master_key(Keyring.from_key_file(tmp_path / "key"))
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db, keyring=Keyring.from_passphrase("old words", **FAST_ARGON2))
    with Scratchpad.open(db, keyring=Keyring.from_key_file(tmp_path / "key")) as pad:
        _assert_readable(pad, alice, expected)


def test_master_rotation_to_the_same_key_is_refused(pad: Scratchpad, keyring: Keyring) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.rotate_master_key(keyring)


def test_other_handle_with_the_old_master_key_cannot_wrap_new_owner_keys(
    store_location: Any, keyring: Keyring, alice: Principal, tmp_path: Path
) -> None:
    with (
        Scratchpad.open(store_location, keyring=keyring) as first,
        Scratchpad.open(store_location, keyring=keyring) as stale,
    ):
        _fill(first, alice, 1)
        first.rotate_master_key(Keyring.from_key_file(tmp_path / "new-key"))
        with pytest.raises(WrongKeyError):
            stale.put(Principal("dave", "a", "c"), "t", 1, "tool", "x")


def test_owner_rotation_rewraps_and_retires(pad: Scratchpad, alice: Principal, bob: Principal, db_path: Path) -> None:
    mine, theirs = _fill(pad, alice, 30), _fill(pad, bob, 3)
    seen: list[tuple[int, int]] = []
    report = pad.rotate_owner_key("alice", progress=lambda done, total: seen.append((done, total)))
    assert report["version"] == 2 and report["item_keys_rewrapped"] == 30
    assert report["retired_versions"] == [1] and report["complete"]
    assert seen[-1] == (30, 30)
    assert _owner_versions(db_path, "alice") == [2]
    assert _owner_versions(db_path, "bob") == [1]
    _assert_readable(pad, alice, mine)
    _assert_readable(pad, bob, theirs)
    # New writes use the new version, from this handle and from one that cached version 1.
    new_id = pad.put(alice, "t", 99, "tool", "after rotation")["scratchpad_id"]
    assert pad.get(alice, new_id).observation == "after rotation"
    assert pad.rotate_owner_key("alice")["version"] == 3


def test_owner_rotation_seen_by_a_handle_that_cached_the_old_version(
    db_path: Path, keyring: Keyring, alice: Principal
) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as rotator, Scratchpad.open(db_path, keyring=keyring) as other:
        old = _fill(other, alice, 3)  # `other` caches version 1
        rotator.rotate_owner_key("alice")
        new_id = other.put(alice, "t", 50, "tool", "written by the stale handle")["scratchpad_id"]
        _assert_readable(other, alice, old)
        assert rotator.get(alice, new_id).observation == "written by the stale handle"
    assert _owner_versions(db_path, "alice") == [2]


def test_rotating_an_unknown_owner_is_not_found(pad: Scratchpad) -> None:
    with pytest.raises(NotFoundError):
        pad.rotate_owner_key("nobody")


def _file_bytes(db_path: Path) -> bytes:
    return b"".join(
        Path(f"{db_path}{suffix}").read_bytes()
        for suffix in ("", "-wal", "-shm", "-journal")
        if Path(f"{db_path}{suffix}").exists()
    )


def test_forget_owner_leaves_no_ciphertext_or_wrapped_key(
    pad: Scratchpad, alice: Principal, bob: Principal, db_path: Path
) -> None:
    mine = _fill(pad, alice, 10)
    theirs = _fill(pad, bob, 5)
    raw = apsw.Connection(str(db_path))
    secrets_on_disk = [
        bytes(b)
        for (b,) in raw.execute(  # type: ignore[misc]
            "SELECT data FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE owner_user_id = 'alice')"
            " UNION ALL SELECT only_segment FROM entries WHERE owner_user_id = 'alice' AND only_segment IS NOT NULL"
        )
    ]
    secrets_on_disk += [
        bytes(b)
        for (b,) in raw.execute(  # type: ignore[misc]
            "SELECT wrapped_key FROM entries WHERE owner_user_id = 'alice'"
        )
    ]
    secrets_on_disk += [
        bytes(b)
        for (b,) in raw.execute(  # type: ignore[misc]
            "SELECT wrapped FROM owner_keys WHERE owner_user_id = 'alice'"
        )
    ]
    raw.close()
    report = pad.forget_owner("alice")
    assert report["entries"] == 10 and report["owner_keys"] == 1 and report["segments"] == 10
    assert report["wal_truncated"]
    on_disk = _file_bytes(db_path)
    for blob in secrets_on_disk:
        assert blob[:32] not in on_disk
    for entry_id in mine:
        with pytest.raises(NotFoundError):
            pad.get(alice, entry_id)
    _assert_readable(pad, bob, theirs)
    # The owner id can be used again: it gets a fresh key.
    again = pad.put(alice, "t", 1, "tool", "a new life")["scratchpad_id"]
    assert pad.get(alice, again).observation == "a new life"


def test_rotation_while_threads_put_and_read(pad: Scratchpad, alice: Principal) -> None:
    expected = _fill(pad, alice, 200)
    errors: list[BaseException] = []
    written: dict[str, str] = {}
    stop = threading.Event()

    def writer(n: int) -> None:
        i = 0
        while not stop.is_set():
            content = f"writer {n} item {i}"
            try:
                written[pad.put(alice, f"live-{n}", i, "tool", content)["scratchpad_id"]] = content
                entry_id = next(iter(expected))
                assert pad.get(alice, entry_id).observation == expected[entry_id]
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            assert pad.rotate_owner_key(
                "alice",
            )["complete"] in (True, False)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    pad.rotate_owner_key("alice")  # finishes anything a racing writer left on an older version
    _assert_readable(pad, alice, expected)
    _assert_readable(pad, alice, written)


def test_a_rotation_between_a_reads_row_and_its_key_is_no_integrity_error(
    pad: Scratchpad, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get reads the entry's row (key version 1), then a rotation re-wraps it
    and retires version 1, then the get authenticates: it still returns the
    entry (a failed first try is read again on a consistent pair, never
    reported as tampering: the race behind test_rotation_while_threads_put_and_read)."""
    expected = _fill(pad, alice, 3)
    entry_id = next(iter(expected))
    original = Opener.authenticate
    rotated: list[dict[str, Any]] = []

    def rotate_first(self: Opener, row: dict[str, Any]) -> Any:
        if not rotated:
            rotated.append(pad.rotate_owner_key("alice"))
        return original(self, row)

    monkeypatch.setattr(Opener, "authenticate", rotate_first)
    assert pad.get(alice, entry_id).observation == expected[entry_id]
    assert rotated[0]["retired_versions"] == [1]
    monkeypatch.undo()
    _assert_readable(pad, alice, expected)


def test_cli_rotate_and_forget(tmp_path: Path, alice: Principal) -> None:
    db, key = tmp_path / "s.db", tmp_path / "key"
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        expected = _fill(pad, alice, 4)
    runner = CliRunner()
    base = ["--db", str(db), "--key-file", str(key), "--json"]
    result = runner.invoke(main, [*base, "keys", "rotate-owner", "alice"])
    assert result.exit_code == 0, result.output
    assert '"item_keys_rewrapped": 4' in result.output
    result = runner.invoke(main, [*base, "keys", "rotate-master", "--new-key-file", str(tmp_path / "key2")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, [*base, "stats"])
    assert result.exit_code == 1 and "WrongKeyError" in result.output
    base2 = ["--db", str(db), "--key-file", str(tmp_path / "key2"), "--json"]
    with Scratchpad.open(db, keyring=Keyring.from_key_file(tmp_path / "key2")) as pad:
        _assert_readable(pad, alice, expected)
    result = runner.invoke(main, [*base2, "forget-owner", "alice", "--yes"])
    assert result.exit_code == 0, result.output
    assert '"entries": 4' in result.output
    result = runner.invoke(main, [*base2, "keys", "rotate-master"])
    assert result.exit_code == 2
