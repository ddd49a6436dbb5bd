"""Stores whose master key stays in AWS KMS (moto's server, IAM enforced): the
library face, the calls to KMS per operation, rotations to and from a key
file (under SIGKILL too), and what a failing KMS does to an open."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import apsw
import pytest

from securepad import InvalidArgumentError, Keyring, Principal, Scratchpad, WrongKeyError
from securepad.errors import IntegrityError, KeySourceKeyError, KeySourceLoginError, KeySourceUnreachableError
from securepad.keys.source import MasterKeySource
from tests.support.moto_kms import MotoKms
from tests.support.principals import ALICE, BOB

CRYPTO = ("encrypt", "decrypt")


def source_of(keyring: Keyring) -> MasterKeySource:
    assert keyring.source is not None
    return keyring.source


def test_a_store_made_on_a_kms_key_reopens_with_the_same_uri(kms_key: str, kms_env: MotoKms, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "hello " * 2000)["scratchpad_id"]
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key)) as pad:
        assert pad.get(ALICE, entry).observation == "hello " * 2000
        assert pad.keyring.kind == "aws-kms"
        assert pad.keyring.identifier == kms_key.removeprefix("aws-kms://")
    assert not list(tmp_path.glob("**/key"))  # no key file anywhere
    secret = kms_env.aws_environment()["AWS_SECRET_ACCESS_KEY"].encode()
    assert all(secret not in path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())


@pytest.mark.xdist_group("langgraph")
def test_the_frameworks_stores_round_trip_on_a_kms_key(kms_key: str, tmp_path: Path) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key)) as pad:
        asyncio.run(SecurepadSession("chat", pad, ALICE).add_items([{"role": "user", "content": "hello"}]))
        config = generate_config("thread-1")
        stored = SecurepadSaver(pad, ALICE).put(config, generate_checkpoint(), generate_metadata(), {})
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key)) as pad:
        assert asyncio.run(SecurepadSession("chat", pad, ALICE).get_items()) == [{"role": "user", "content": "hello"}]
        got = SecurepadSaver(pad, ALICE).get_tuple(stored)
        assert got is not None
        assert got.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]


def test_kms_is_called_once_per_open_and_once_per_owner_key_never_on_the_hot_path(kms_key: str, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    keyring = Keyring.from_uri(kms_key)
    with Scratchpad.open(db, keyring=keyring) as pad:
        calls = source_of(keyring).calls
        # A new store: the key checked once (DescribeKey), the anchor key sealed.
        assert calls.snapshot() == {"attributes": 1, "encrypt": 1}
        ids = [pad.put(ALICE, "t", 1, "x", "a")["scratchpad_id"], pad.put(BOB, "t", 1, "x", "b")["scratchpad_id"]]
        assert (calls.total("encrypt"), calls.total("decrypt")) == (3, 0)  # one Encrypt per owner key made
        for step in range(2, 22):
            pad.put(ALICE, "t", step, "x", "more")
            pad.get(ALICE, ids[0])
            pad.get(BOB, ids[1])
        assert calls.total(*CRYPTO) == 3  # the hot path: none
    keyring = Keyring.from_uri(kms_key)
    with Scratchpad.open(db, keyring=keyring) as pad:
        calls = source_of(keyring).calls
        assert calls.snapshot() == {"decrypt": 1}  # the open: the anchor key's Decrypt proves the key
        pad.get(ALICE, ids[0])
        assert calls.snapshot() == {"decrypt": 2}  # an owner's first read: its key, once
        for step in range(30, 50):
            pad.get(ALICE, ids[0])
            pad.put(ALICE, "t", step, "x", "c")
        assert calls.snapshot() == {"decrypt": 2}
        pad.get(BOB, ids[1])
        assert calls.snapshot() == {"decrypt": 3}


def test_an_alias_uri_costs_one_describe_more_per_open(kms_env: MotoKms, tmp_path: Path) -> None:
    arn = kms_env.new_key()
    name = f"alias/securepad-{tmp_path.name}"
    kms_env.client().create_alias(AliasName=name, TargetKeyId=arn)
    alias_uri = "aws-kms://" + arn.split(":key/")[0] + ":" + name
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(alias_uri)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "by alias")["scratchpad_id"]
    keyring = Keyring.from_uri(alias_uri)
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as pad:
        assert pad.get(ALICE, entry).observation == "by alias"
        assert source_of(keyring).calls.snapshot() == {"attributes": 1, "decrypt": 2}
    # The store recorded the key, not the alias: the key's own ARN opens it too.
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri("aws-kms://" + arn)) as pad:
        assert pad.get(ALICE, entry).observation == "by alias"


def test_another_kms_key_does_not_open_the_store_and_is_not_asked(kms_env: MotoKms, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri("aws-kms://" + kms_env.new_key())):
        pass
    other = Keyring.from_uri("aws-kms://" + kms_env.new_key())
    with pytest.raises(WrongKeyError, match="does not open this store; it was made with arn:aws:kms:"):
        Scratchpad.open(tmp_path / "s.db", keyring=other)
    assert source_of(other).calls.total(*CRYPTO) == 0


def test_a_key_file_and_a_kms_key_do_not_open_each_others_stores(kms_key: str, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "k.db", keyring=Keyring.from_uri(kms_key)):
        pass
    with Scratchpad.open(tmp_path / "f.db", keyring=Keyring.from_key_file(tmp_path / "key")):
        pass
    with pytest.raises(WrongKeyError, match=f"held by {kms_key.removeprefix('aws-kms://')}"):
        Scratchpad.open(tmp_path / "k.db", keyring=Keyring.from_key_file(tmp_path / "key"))
    with pytest.raises(WrongKeyError, match="key file, variable or passphrase"):
        Scratchpad.open(tmp_path / "f.db", keyring=Keyring.from_uri(kms_key))


def test_an_owner_key_moved_to_another_owner_is_refused_by_kms(kms_key: str, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Scratchpad.open(db, keyring=Keyring.from_uri(kms_key)) as pad:
        pad.put(ALICE, "t", 1, "x", "alice's")
        bobs = pad.put(BOB, "t", 1, "x", "bob's")["scratchpad_id"]
    conn = apsw.Connection(str(db))
    conn.execute(
        "UPDATE owner_keys SET wrapped = (SELECT wrapped FROM owner_keys WHERE owner_user_id = 'alice')"
        " WHERE owner_user_id = 'bob'"
    )
    conn.close()
    with Scratchpad.open(db, keyring=Keyring.from_uri(kms_key), anchor=False) as pad, pytest.raises(IntegrityError):
        pad.get(BOB, bobs)


@pytest.mark.parametrize("direction", ["file to kms to file", "kms to kms"])
def test_the_master_key_rotates_between_a_key_file_and_kms_keys(
    kms_env: MotoKms, tmp_path: Path, direction: str
) -> None:
    db = tmp_path / "s.db"
    start = "aws-kms://" + kms_env.new_key()
    first = Keyring.from_key_file(tmp_path / "key") if direction.startswith("file") else Keyring.from_uri(start)
    with Scratchpad.open(db, keyring=first) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "kept")["scratchpad_id"]
        pad.put(BOB, "t", 1, "x", "b")
        uri = "aws-kms://" + kms_env.new_key()
        target = Keyring.from_uri(uri)
        assert pad.rotate_master_key(target)["owner_keys_rewrapped"] == 2
        assert source_of(target).calls.total("encrypt") == 3  # two owner keys and the anchor key
        assert pad.get(ALICE, entry).observation == "kept"
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db, keyring=first)
    with Scratchpad.open(db, keyring=Keyring.from_uri(uri)) as pad:
        assert pad.get(ALICE, entry).observation == "kept"
        with pytest.raises(InvalidArgumentError, match="the new master key is the current one"):
            pad.rotate_master_key(Keyring.from_uri(uri))
        pad.rotate_master_key(Keyring.from_key_file(tmp_path / "key2"))
    with Scratchpad.open(db, keyring=Keyring.from_key_file(tmp_path / "key2")) as pad:
        assert pad.get(ALICE, entry).observation == "kept"


def test_a_disabled_key_makes_no_store(kms_env: MotoKms, tmp_path: Path) -> None:
    arn = kms_env.new_key()
    kms_env.client().disable_key(KeyId=arn.rsplit("/", 1)[1])
    with pytest.raises(KeySourceKeyError, match="is Disabled, not Enabled"):
        Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri("aws-kms://" + arn))


def test_an_open_without_kms_decrypt_is_refused_in_one_line(
    kms_key: str, kms_env: MotoKms, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key)):
        pass
    for name, value in kms_env.aws_environment("no-decrypt").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(KeySourceLoginError) as caught:
        Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(kms_key))
    assert str(caught.value).startswith(f"{kms_key}: KMS Decrypt refused: access denied")
    assert "\n" not in str(caught.value)


def test_an_open_with_kms_unreachable_fails_in_one_line_and_writes_nothing(
    kms_key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.db"
    with Scratchpad.open(db, keyring=Keyring.from_uri(kms_key)):
        pass
    before = db.read_bytes()
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", "http://127.0.0.1:9")  # discard: nothing listens
    with pytest.raises(KeySourceUnreachableError, match=r"no answer from http://127.0.0.1:9 in 3 attempts"):
        Scratchpad.open(db, keyring=Keyring.from_uri(kms_key))
    assert db.read_bytes() == before


# -- a rotation killed with SIGKILL --------------------------------------------------------

OWNERS = 60

# Opens the store with the key named by argv[2], prints "ready", rotates to argv[3].
WORKER = """
import sys
from securepad import Keyring, Scratchpad
def keyring(name):
    return Keyring.from_uri(name) if name.startswith("aws-kms:") else Keyring.from_key_file(name)
pad = Scratchpad.open(sys.argv[1], keyring=keyring(sys.argv[2]), anchor=False)
print("ready", flush=True)
pad.rotate_master_key(keyring(sys.argv[3]))
print("done", flush=True)
"""


def _keyring(name: str) -> Keyring:
    return Keyring.from_uri(name) if name.startswith("aws-kms:") else Keyring.from_key_file(name)


def _opens_with(db: Path, old: str, new: str, expected: dict[str, str]) -> str:
    """Which of ``old`` and ``new`` opens the store (exactly one does), after
    reading back a sample of owners' entries."""
    opened = []
    for name in (old, new):
        try:
            pad = Scratchpad.open(db, keyring=_keyring(name), anchor=False)
        except WrongKeyError:
            continue
        with pad:
            for owner in random.Random(len(opened)).sample(sorted(expected), 8):
                assert pad.get(Principal(owner, "a", "c"), expected[owner]).observation == f"entry of {owner}"
        opened.append(name)
    assert len(opened) == 1, f"opened with {opened}"
    return opened[0]


@pytest.mark.slow
def test_rotations_between_a_key_file_and_kms_keys_survive_sigkill(kms_env: MotoKms, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    current = str(tmp_path / "key-0")
    with Scratchpad.open(db, keyring=_keyring(current), anchor=False) as pad:
        expected = {
            f"owner-{n}": pad.put(Principal(f"owner-{n}", "a", "c"), "t", 1, "x", f"entry of owner-{n}")[
                "scratchpad_id"
            ]
            for n in range(OWNERS)
        }
    rng = random.Random(7)
    for attempt in range(1, 9):
        # Alternate between a key file and a fresh KMS key; the killing delays
        # cover the run: before the first KMS call, amid the re-wraps, after the commit.
        target = (
            "aws-kms://" + kms_env.new_key() if not current.startswith("aws-kms:") else str(tmp_path / f"key-{attempt}")
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), current, target], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()
        done = "done" in proc.communicate()[0]
        now = _opens_with(db, current, target, expected)
        assert done <= (now == target)  # a finished rotation is committed
        current = now
