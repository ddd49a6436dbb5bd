"""The snapshot-rollback anchor: an older copy of the store, put back
in place of the current one, is refused; a genuine store never is, across
crashes between a commit and the anchor write and concurrent writers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import IntegrityError, InvalidArgumentError, PolicyError, WrongKeyError
from tests.support.anchors import copy_store, put_back
from tests.support.paths import FIXTURES
from tests.support.principals import ALICE

EVERY_COMMIT = Policy.from_dict({"storage": {"anchor_sync": "commit"}})


def anchor_of(keyring: Keyring, pad_or_store_id: Any) -> Path:
    store_id = pad_or_store_id if isinstance(pad_or_store_id, str) else pad_or_store_id.store_id
    assert keyring.key_file is not None
    return keyring.key_file.parent / f"anchor-{store_id}"


def counters(db_path: Path, anchor: Path) -> tuple[int, int]:
    """(the store's write counter, the anchor's), read from the files."""
    conn = apsw.Connection(str(db_path))
    try:
        (row,) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    finally:
        conn.close()
    return int(str(row[0]).split(":")[0]), int(json.loads(anchor.read_text())["counter"])


def record(db_path: Path, keyring: Keyring, step: int, turn: str = "t1", **options: Any) -> None:
    with Scratchpad.open(db_path, keyring=keyring, **options) as pad:
        pad.turn(ALICE, turn).record(step, "shell", f"step {step}")


@pytest.fixture
def rolled_back(db_path: Path, keyring: Keyring, tmp_path: Path) -> Path:
    """The issue's edit: close the store, copy its files, record one more step, put the old copy back."""
    record(db_path, keyring, 1)
    copy_store(db_path, tmp_path / "copy")
    record(db_path, keyring, 2)
    put_back(tmp_path / "copy", db_path)
    return db_path


# -- snapshot rollback -------------------------------------------------------------------


def test_a_genuine_store_opens_again_and_again(db_path: Path, keyring: Keyring) -> None:
    for step in range(1, 6):
        record(db_path, keyring, step)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        anchor = pad.stats()["anchor"]
        assert len(pad.turn(ALICE, "t1").history()) == 5
    assert anchor["path"] == str(anchor_of(keyring, pad)) and anchor["sync"] == "interval"
    store, anchored = counters(db_path, anchor_of(keyring, pad))
    assert store == anchored >= 5  # every session's close anchored its writes


def test_an_older_copy_put_back_is_refused(rolled_back: Path, keyring: Keyring) -> None:
    with pytest.raises(IntegrityError, match=r"snapshot rollback: the store .* below its anchor") as caught:
        Scratchpad.open(rolled_back, keyring=keyring)
    assert "adopt_anchor=True" in str(caught.value)  # and what the user does


def test_every_sync_policy_refuses_the_older_copy(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    for number, sync in enumerate(("commit", "interval", "close")):
        policy = Policy.from_dict({"storage": {"anchor_sync": sync}})
        db = tmp_path / f"data{number}" / "store.db"
        record(db, keyring, 1, policy=policy)
        copy_store(db, tmp_path / f"copy{number}")
        record(db, keyring, 2, policy=policy)
        put_back(tmp_path / f"copy{number}", db)
        with pytest.raises(IntegrityError, match="snapshot rollback"):
            Scratchpad.open(db, keyring=keyring, policy=policy)


def test_adopting_the_copy_accepts_it_and_checks_again_from_there(rolled_back: Path, keyring: Keyring) -> None:
    with Scratchpad.open(rolled_back, keyring=keyring, adopt_anchor=True) as pad:
        assert pad.list_for_turn(ALICE, "t1")[0]["step_num"] == 1
    record(rolled_back, keyring, 2)  # the copy is the store now
    with Scratchpad.open(rolled_back, keyring=keyring) as pad:
        assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1, 2]


def test_a_counter_rolled_back_while_the_store_is_open_stops_the_next_write(db_path: Path, keyring: Keyring) -> None:
    with Scratchpad.open(db_path, keyring=keyring, policy=EVERY_COMMIT) as pad:
        turn = pad.turn(ALICE, "t1")
        turn.record(1, "shell", "one")
        conn = apsw.Connection(str(db_path))
        ((older,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
        turn.record(2, "shell", "two")
        conn.execute("UPDATE store_meta SET value = ? WHERE key = 'write_counter'", (older,))
        conn.close()
        with pytest.raises(IntegrityError, match="snapshot rollback"):
            turn.record(3, "shell", "three")
        assert [e["step_num"] for e in pad.list_for_turn(ALICE, "t1")] == [1, 2]  # step 3 was not written


def test_the_copy_of_a_store_rotated_to_another_key_file_is_still_refused(
    db_path: Path, keyring: Keyring, tmp_path: Path
) -> None:
    record(db_path, keyring, 1)
    copy_store(db_path, tmp_path / "copy")
    new_keyring = Keyring.from_key_file(tmp_path / "elsewhere" / "key")
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.rotate_master_key(new_keyring)
        pad.turn(ALICE, "t1").record(2, "shell", "two")
    assert anchor_of(new_keyring, pad).exists()  # the anchor followed the key file
    with Scratchpad.open(db_path, keyring=new_keyring) as pad:
        assert len(pad.list_for_turn(ALICE, "t1")) == 2
    put_back(tmp_path / "copy", db_path)
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db_path, keyring=new_keyring)  # the copy's keys are wrapped under the old master key
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        Scratchpad.open(db_path, keyring=keyring)  # and the old key's anchor saw the rotation's writes


# -- the anchor missing, damaged, forged; the store's counter altered -------------------------


def test_a_missing_anchor_is_refused_and_says_what_to_do(db_path: Path, keyring: Keyring) -> None:
    record(db_path, keyring, 1)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        anchor = anchor_of(keyring, pad)
    anchor.unlink()
    with pytest.raises(IntegrityError, match=r"the anchor .* is missing") as caught:
        Scratchpad.open(db_path, keyring=keyring)
    assert "anchor=" in str(caught.value) and "adopt_anchor=True" in str(caught.value)
    Scratchpad.open(db_path, keyring=keyring, adopt_anchor=True).close()
    assert anchor.exists()
    Scratchpad.open(db_path, keyring=keyring).close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "is damaged"),
        ("not json", "is damaged"),
        ('{"counter": -1, "tag": "00"}', "is damaged"),
        ('{"counter": 1}', "is damaged"),
        ('{"format": 1, "counter": 99, "tag": "' + "0" * 64 + '"}', "forged"),
    ],
)
def test_a_damaged_or_forged_anchor_is_refused(db_path: Path, keyring: Keyring, body: str, message: str) -> None:
    record(db_path, keyring, 1)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        anchor = anchor_of(keyring, pad)
    anchor.write_text(body)
    with pytest.raises(IntegrityError, match=message):
        Scratchpad.open(db_path, keyring=keyring)


def test_another_stores_anchor_is_refused(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    record(db_path, keyring, 1)
    other = tmp_path / "other" / "store.db"
    record(other, keyring, 1)
    record(other, keyring, 2)
    with Scratchpad.open(db_path, keyring=keyring) as pad, Scratchpad.open(other, keyring=keyring) as second:
        mine, theirs = anchor_of(keyring, pad), anchor_of(keyring, second)
    shutil.copy(theirs, mine)
    with pytest.raises(IntegrityError, match="forged or belongs to another store"):
        Scratchpad.open(db_path, keyring=keyring)


@pytest.mark.parametrize("value", ["99:" + "0" * 64, "garbage", "1:"])
def test_an_altered_store_counter_is_refused(db_path: Path, keyring: Keyring, value: str) -> None:
    record(db_path, keyring, 1)
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE store_meta SET value = ? WHERE key = 'write_counter'", (value,))
    conn.close()
    with pytest.raises(IntegrityError, match="write counter was altered"):
        Scratchpad.open(db_path, keyring=keyring)


def test_a_deleted_store_counter_is_a_rollback(db_path: Path, keyring: Keyring) -> None:
    record(db_path, keyring, 1)
    conn = apsw.Connection(str(db_path))
    conn.execute("DELETE FROM store_meta WHERE key = 'write_counter'")
    conn.close()
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        Scratchpad.open(db_path, keyring=keyring)


# -- where the anchor lives ------------------------------------------------------------------


def test_an_existing_store_opens_and_starts_its_anchor(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "store.db"
    shutil.copy(FIXTURES / "store_v1.db", db)
    db.chmod(0o600)
    key = tmp_path / "keys" / "key"
    key.parent.mkdir(mode=0o700)
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    keyring = Keyring.from_key_file(key)
    with Scratchpad.open(db, keyring=keyring) as pad:
        # The first open builds the old store's turn heads: one write, counted.
        assert pad.stats()["anchor"]["anchored"] in (0, 1)
    assert counters(db, anchor_of(keyring, pad)) == (1, 1)
    copy_store(db, tmp_path / "copy")
    record(db, keyring, 1, turn="new")
    put_back(tmp_path / "copy", db)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        Scratchpad.open(db, keyring=keyring)


def test_an_env_keyring_has_an_anchor_only_where_it_is_told(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECUREPAD_MASTER_KEY", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
    keyring = Keyring.from_env(keep_in_env=True)
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        assert pad.stats()["anchor"] is None  # no key file to put it beside: SECURITY.md says to give one
    anchor = tmp_path / "state" / "store.anchor"
    record(db_path, keyring, 1, anchor=anchor)
    assert json.loads(anchor.read_text())["counter"] >= 1
    assert anchor.stat().st_mode & 0o777 == 0o600
    copy_store(db_path, tmp_path / "copy")
    record(db_path, keyring, 2, anchor=anchor)
    put_back(tmp_path / "copy", db_path)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        Scratchpad.open(db_path, keyring=keyring, anchor=anchor)


def test_bad_anchor_options_are_refused(db_path: Path, keyring: Keyring) -> None:
    with pytest.raises(InvalidArgumentError, match="store's own directory"):
        Scratchpad.open(db_path, keyring=keyring, anchor=db_path.parent / "anchor")
    with pytest.raises(InvalidArgumentError, match="anchor must be a path"):
        Scratchpad.open(db_path, keyring=keyring, anchor=True)
    with pytest.raises(PolicyError, match="anchor_sync must be one of"):
        Policy.from_dict({"storage": {"anchor_sync": "sometimes"}})
    with Scratchpad.open(db_path, keyring=keyring, anchor=False) as pad:
        assert pad.stats()["anchor"] is None


def test_a_postgresql_store_takes_no_anchor_file(pg_dsn: str, keyring: Keyring, tmp_path: Path) -> None:
    """On PostgreSQL the history is the server's (WAL, PITR): see SECURITY.md."""
    with pytest.raises(InvalidArgumentError, match="options of SQLite stores"):
        Scratchpad.open(pg_dsn, keyring=keyring, anchor=tmp_path / "anchor")
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        pad.turn(ALICE, "t1").record(1, "shell", "one")
        assert pad.stats()["anchor"] is None


# -- crashes and concurrent writers ------------------------------------------------------------

# The forks run in a fresh, single-threaded interpreter: forking the test
# process (whose other tests leave thread pools behind) could copy a held lock.
_HELPER = r"""
import json, os, random, signal, sys, time
from pathlib import Path
import apsw
from securepad import Keyring, Policy, Principal, Scratchpad

db, key, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
keyring = Keyring.from_key_file(key)
ALICE = Principal("alice", "planner", "web")


def write(turn, steps, policy, ready=None):
    code = 1
    try:
        with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
            t = pad.turn(ALICE, turn)
            if ready is not None:
                os.write(ready, b"x")
            for step in range(1, steps + 1):
                t.record(step, "shell", f"{turn} {step}")
        code = 0
    finally:
        os._exit(code)


def counters(anchor):
    conn = apsw.Connection(str(db))
    ((value,),) = conn.execute("SELECT value FROM store_meta WHERE key = 'write_counter'").fetchall()
    conn.close()
    return int(str(value).split(":")[0]), json.loads(anchor.read_text())["counter"]


with Scratchpad.open(db, keyring=keyring) as pad:
    anchor = Path(pad.stats()["anchor"]["path"])
if mode == "kill":
    policy = Policy.from_dict({"storage": {"anchor_sync": "commit"}})
    rng, ahead, behind = random.Random(14), 0, 0
    # At least 200 kills, and more (up to 1,000) until 20 of them landed between
    # a commit and its anchor write: on a loaded machine fewer kills hit the window.
    for kill in range(1000):
        if kill >= 200 and ahead >= 20:
            break
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_read)
            write(f"k{kill}", 10_000, policy, ready_write)
        os.close(ready_write)
        os.read(ready_read, 1)  # the child has opened the store
        os.close(ready_read)
        time.sleep(rng.uniform(0, 0.01))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        store, anchored = counters(anchor)
        behind += store < anchored
        ahead += store > anchored  # killed after a commit, before its anchor write
        Scratchpad.open(db, keyring=keyring).close()  # raises on a false alarm
    print(json.dumps({"ahead": ahead, "behind": behind}))
else:
    policy = Policy.from_dict({"storage": {"anchor_sync": mode}})
    children = []
    for number in range(4):
        pid = os.fork()
        if pid == 0:
            write(f"c{number}", 25, policy)
        children.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in children]
    with Scratchpad.open(db, keyring=keyring) as pad:
        stored = sum(len(pad.list_for_turn(ALICE, f"c{n}")) for n in range(4))
    store, anchored = counters(anchor)
    print(json.dumps({"statuses": statuses, "stored": stored, "store": store, "anchored": anchored}))
"""


def helper(db_path: Path, key_file: Path, mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _HELPER, str(db_path), str(key_file), mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
def test_sigkill_between_commit_and_anchor_write_never_looks_like_a_rollback(
    db_path: Path, keyring: Keyring, key_file: Path
) -> None:
    record(db_path, keyring, 1, policy=EVERY_COMMIT)
    result = helper(db_path, key_file, "kill")  # 200 kills or more, each followed by an open that checks
    assert result["behind"] == 0  # the anchor was never ahead of the store
    assert result["ahead"] >= 20  # and the window between a commit and its anchor write was hit, many times


@pytest.mark.parametrize("sync", ["commit", "interval"])
def test_concurrent_writers_keep_the_anchor_at_most_the_store(
    db_path: Path, keyring: Keyring, key_file: Path, sync: str
) -> None:
    record(db_path, keyring, 1)
    result = helper(db_path, key_file, sync)  # four processes writing 25 steps each at once
    assert result["statuses"] == [0, 0, 0, 0]
    assert result["stored"] == 4 * 25
    assert result["store"] == result["anchored"]  # every writer's close anchored its writes, none went past
