"""Stores whose master key stays in a PKCS#11 token (SoftHSM2): the library
face, the cost in calls to the token, and what keeps the sources apart."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from securepad import InvalidArgumentError, Keyring, Principal, Scratchpad, WrongKeyError
from securepad.errors import IntegrityError, KeySourceKeyError, KeySourceUriError
from securepad.keys.source import MasterKeySource, open_source
from tests.conftest import ALICE, BOB
from tests.support.softhsm import SoftHsm

CRYPTO = ("encrypt", "decrypt")


def source_of(keyring: Keyring) -> MasterKeySource:
    assert keyring.source is not None
    return keyring.source


def test_a_store_made_on_a_token_key_reopens_with_the_same_uri(softhsm: SoftHsm, tmp_path: Path) -> None:
    uri = softhsm.uri()
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(uri)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "hello " * 2000)["scratchpad_id"]
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(uri)) as pad:
        assert pad.get(ALICE, entry).observation == "hello " * 2000
        assert pad.keyring.kind == "pkcs11"
        assert softhsm.user_pin not in repr(pad.keyring)


def test_the_token_is_called_once_per_open_and_once_per_owner_key_never_on_the_hot_path(
    softhsm: SoftHsm, tmp_path: Path
) -> None:
    uri, db = softhsm.uri(), tmp_path / "s.db"
    keyring = Keyring.from_uri(uri)
    with Scratchpad.open(db, keyring=keyring) as pad:
        calls = source_of(keyring).calls
        assert calls.snapshot()["encrypt"] == 1 and calls.total("decrypt") == 0  # the new store's anchor key
        ids = [pad.put(ALICE, "t", 1, "x", "a")["scratchpad_id"], pad.put(BOB, "t", 1, "x", "b")["scratchpad_id"]]
        assert (calls.total("encrypt"), calls.total("decrypt")) == (3, 0)  # one per owner key made
        for step in range(2, 22):
            pad.put(ALICE, "t", step, "x", "more")
            pad.get(ALICE, ids[0])
            pad.get(BOB, ids[1])
        assert calls.total(*CRYPTO) == 3  # the hot path: none
    keyring = Keyring.from_uri(uri)
    with Scratchpad.open(db, keyring=keyring) as pad:
        calls = source_of(keyring).calls
        # The open: the anchor key's unwrap proves the key. The session, the
        # search for the key and its identifier are the process's, done once.
        assert calls.snapshot() == {"decrypt": 1}
        pad.get(ALICE, ids[0])
        assert calls.total(*CRYPTO) == 2  # an owner's first read: its key, once
        for step in range(30, 50):
            pad.get(ALICE, ids[0])
            pad.put(ALICE, "t", step, "x", "c")
        assert calls.total(*CRYPTO) == 2
        pad.get(BOB, ids[1])
        assert calls.snapshot() == {"decrypt": 3}


def test_an_owner_key_rotation_costs_a_call_for_the_new_key_and_one_for_the_old(
    softhsm: SoftHsm, tmp_path: Path
) -> None:
    keyring = Keyring.from_uri(softhsm.uri())
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "kept")["scratchpad_id"]
        before = source_of(keyring).calls.total(*CRYPTO)
        pad.rotate_owner_key(ALICE.owner_user_id)
        # The new key made (one encrypt), the old one unwrapped again (the rotation drops the cache).
        assert source_of(keyring).calls.snapshot()["encrypt"] == 3
        assert source_of(keyring).calls.total(*CRYPTO) - before == 2
        assert pad.get(ALICE, entry).observation == "kept"


def test_an_absent_label_is_created_for_a_new_store_only(softhsm: SoftHsm, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(softhsm.uri())):
        pass
    with pytest.raises(KeySourceKeyError, match="holds no key labelled"):
        Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(softhsm.uri()))


def test_a_key_file_and_a_token_key_do_not_open_each_others_stores(softhsm: SoftHsm, tmp_path: Path) -> None:
    uri = softhsm.uri()
    with Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_uri(uri)):
        pass
    with Scratchpad.open(tmp_path / "f.db", keyring=Keyring.from_key_file(tmp_path / "key")):
        pass
    with pytest.raises(WrongKeyError, match="held by pkcs11:token=securepad;serial="):
        Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_key_file(tmp_path / "key"))
    with pytest.raises(WrongKeyError, match="key file, variable or passphrase"):
        Scratchpad.open(tmp_path / "f.db", keyring=Keyring.from_uri(uri))


def test_another_token_key_does_not_open_the_store(softhsm: SoftHsm, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_uri(softhsm.uri())):
        pass
    other = softhsm.uri()
    with Scratchpad.open(tmp_path / "o.db", keyring=Keyring.from_uri(other)):
        pass
    with pytest.raises(WrongKeyError, match="does not open this store; it was made with pkcs11:"):
        Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_uri(other))


def _meta(db: Path) -> dict[str, str]:
    import apsw

    conn = apsw.Connection(str(db))
    try:
        return {k: v for k, v in conn.execute("SELECT key, value FROM store_meta")}
    finally:
        conn.close()


def _set_meta(db: Path, key: str, value: str) -> None:
    import apsw

    conn = apsw.Connection(str(db))
    try:
        conn.execute("UPDATE store_meta SET value = ? WHERE key = ?", (value, key))
    finally:
        conn.close()


def test_a_key_check_pointed_at_another_token_key_is_refused_by_the_anchor_key(
    softhsm: SoftHsm, tmp_path: Path
) -> None:
    from securepad.crypto.primitives import source_key_check

    db = tmp_path / "t.db"
    with Scratchpad.open(db, keyring=Keyring.from_uri(softhsm.uri())):
        pass
    other_uri = softhsm.uri()
    other = Keyring.from_uri(other_uri)
    with Scratchpad.open(tmp_path / "o.db", keyring=other):
        pass
    # The clear key check edited to name the other key: the anchor key, wrapped by the first, does not open.
    _set_meta(db, "key_check", source_key_check(source_of(other).key_id(), _meta(db)["store_id"]))
    with pytest.raises(WrongKeyError, match="does not open this store's wrapped anchor key"):
        Scratchpad.open(db, keyring=Keyring.from_uri(other_uri))


def test_a_deleted_anchor_key_is_an_integrity_error(softhsm: SoftHsm, tmp_path: Path) -> None:
    import apsw

    uri = softhsm.uri()
    with Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_uri(uri)):
        pass
    conn = apsw.Connection(str(tmp_path / "t.db"))
    conn.execute("DELETE FROM store_meta WHERE key = 'anchor_key'")
    conn.close()
    with pytest.raises(IntegrityError, match="anchor key was deleted"):
        Scratchpad.open(tmp_path / "t.db", keyring=Keyring.from_uri(uri), anchor=False)


def test_the_store_records_the_key_id_and_never_a_secret(softhsm: SoftHsm, tmp_path: Path) -> None:
    keyring = Keyring.from_uri(softhsm.uri(pin="value"))
    with Scratchpad.open(tmp_path / "t.db", keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "x", "a")
    meta = _meta(tmp_path / "t.db")
    assert meta["master_source"] == source_of(keyring).key_id()
    assert meta["key_check"].startswith("source:") and meta["kdf"] == "null"
    for path in tmp_path.iterdir():
        assert softhsm.user_pin.encode() not in path.read_bytes()


@pytest.mark.parametrize("direction", ["file to token to file", "token to token"])
def test_the_master_key_rotates_between_a_key_file_and_token_keys(
    softhsm: SoftHsm, tmp_path: Path, direction: str
) -> None:
    db = tmp_path / "s.db"
    first = Keyring.from_key_file(tmp_path / "key") if direction.startswith("file") else Keyring.from_uri(softhsm.uri())
    with Scratchpad.open(db, keyring=first) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "kept")["scratchpad_id"]
        pad.put(BOB, "t", 1, "x", "b")
        uri = softhsm.uri()
        token = Keyring.from_uri(uri)
        assert pad.rotate_master_key(token)["owner_keys_rewrapped"] == 2
        assert source_of(token).calls.total("encrypt") == 3  # two owner keys and the anchor key
        assert pad.get(ALICE, entry).observation == "kept"
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db, keyring=first)
    with Scratchpad.open(db, keyring=Keyring.from_uri(uri)) as pad:
        assert pad.get(ALICE, entry).observation == "kept"
        with pytest.raises(InvalidArgumentError, match="the new master key is the current one"):
            pad.rotate_master_key(Keyring.from_uri(uri))
        if direction.startswith("file"):
            pad.rotate_master_key(Keyring.from_key_file(tmp_path / "key2"))
    if direction.startswith("file"):
        assert "master_source" not in _meta(db)
        with Scratchpad.open(db, keyring=Keyring.from_key_file(tmp_path / "key2")) as pad:
            assert pad.get(ALICE, entry).observation == "kept"


def test_a_malformed_uri_is_refused_before_any_store_is_touched(tmp_path: Path) -> None:
    with pytest.raises(KeySourceUriError):
        Keyring.from_uri("pkcs11:token=t")
    assert not (tmp_path / "s.db").exists()


@pytest.mark.xdist_group("langgraph")
def test_the_frameworks_stores_round_trip_on_a_token_key(softhsm: SoftHsm, tmp_path: Path) -> None:
    from agents.memory import SessionSettings  # noqa: F401 - the SDK is installed with the test extra
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    from securepad.integrations.langgraph import SecurepadSaver
    from securepad.integrations.openai_agents import SecurepadSession

    uri = softhsm.uri()
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(uri)) as pad:
        session = SecurepadSession("chat", pad, ALICE)
        asyncio.run(session.add_items([{"role": "user", "content": "hello"}]))
        saver = SecurepadSaver(pad, ALICE)
        config = generate_config("thread-" + secrets.token_hex(2))
        stored = saver.put(config, generate_checkpoint(), generate_metadata(), {})
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(uri)) as pad:
        assert asyncio.run(SecurepadSession("chat", pad, ALICE).get_items()) == [{"role": "user", "content": "hello"}]
        got = SecurepadSaver(pad, ALICE).get_tuple(stored)
        assert (
            got is not None and got.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
        )


def test_a_new_process_calls_the_token_four_times_to_open_and_once_per_owner(softhsm: SoftHsm, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    uri = softhsm.uri()
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(uri)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "a")["scratchpad_id"]
    code = (
        "import json, sys\n"
        "from securepad import Keyring, Principal, Scratchpad\n"
        "keyring = Keyring.from_uri(sys.argv[2])\n"
        "pad = Scratchpad.open(sys.argv[1], keyring=keyring)\n"
        "opened = keyring.source.calls.snapshot()\n"
        "pad.get(Principal('alice', 'planner', 'web'), sys.argv[3])\n"
        "pad.get(Principal('alice', 'planner', 'web'), sys.argv[3])\n"
        "print(json.dumps([opened, keyring.source.calls.snapshot()]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s.db"), uri, entry], capture_output=True, text=True, check=True
    )
    opened, read = json.loads(run.stdout)
    assert opened == {"session": 1, "find": 1, "attributes": 1, "decrypt": 1}
    assert read == {**opened, "decrypt": 2}


def test_no_file_the_store_writes_holds_the_token_keys_bytes(softhsm: SoftHsm, tmp_path: Path) -> None:
    """A key of known value put in the token (as an HSM's key ceremony would),
    then used as the master key: its bytes, raw, hex or base64, are in none
    of the store's files, its key files' place or the token's own files."""
    import base64

    import pkcs11

    value, label = secrets.token_bytes(32), "known-" + secrets.token_hex(4)
    # Through the process's session on the token (a second python-pkcs11 library
    # object of the module would finalize the module when collected).
    helper = open_source(softhsm.uri())
    helper.prepare(create=True)
    a = pkcs11.Attribute
    helper._link.token().session.create_object(  # type: ignore[attr-defined]
        {
            a.CLASS: pkcs11.ObjectClass.SECRET_KEY,
            a.KEY_TYPE: pkcs11.KeyType.AES,
            a.VALUE: value,
            a.LABEL: label,
            a.TOKEN: True,
            a.PRIVATE: True,
            a.SENSITIVE: True,
            a.EXTRACTABLE: False,
            a.ENCRYPT: True,
            a.DECRYPT: True,
        }
    )
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(softhsm.uri(label))) as pad:
        for n in range(20):
            pad.put(Principal(f"owner-{n}", "a", "c"), "t", 1, "x", "an observation")
        pad.rotate_owner_key("owner-0")
    forms = [value, value.hex().encode(), base64.b64encode(value)]
    files = [p for root in (tmp_path, softhsm.root) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "s.db" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(form in data for form in forms), path


def test_a_postgresql_store_on_a_token_key_round_trips_and_rotates(
    softhsm: SoftHsm, pg_dsn: str, tmp_path: Path
) -> None:
    uri = softhsm.uri()
    with Scratchpad.open(pg_dsn, keyring=Keyring.from_uri(uri)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "on postgresql")["scratchpad_id"]
    keyring = Keyring.from_uri(uri)
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        assert pad.get(ALICE, entry).observation == "on postgresql"
        assert source_of(keyring).calls.total(*CRYPTO) == 2
        pad.rotate_master_key(Keyring.from_key_file(tmp_path / "key"))
    with pytest.raises(WrongKeyError, match="key file, variable or passphrase"):
        Scratchpad.open(pg_dsn, keyring=Keyring.from_uri(uri))
    with Scratchpad.open(pg_dsn, keyring=Keyring.from_key_file(tmp_path / "key")) as pad:
        assert pad.get(ALICE, entry).observation == "on postgresql"
        pad.rotate_master_key(Keyring.from_uri(uri))
    with Scratchpad.open(pg_dsn, keyring=Keyring.from_uri(uri)) as pad:
        assert pad.get(ALICE, entry).observation == "on postgresql"
