"""The keyring: key file, environment variable and passphrase sources; secrets stay hidden."""

from __future__ import annotations

import base64
import copy
import json
import multiprocessing
import os
import pickle
import stat
import threading
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Scratchpad
from securepad.errors import WrongKeyError
from securepad.keys.keyring import KeyHandle
from tests.support.principals import ALICE, FAST_ARGON2


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def opens(db_path: Path, keyring: Keyring) -> bool:
    """Does ``keyring`` open the store at ``db_path`` (creating it if needed)?"""
    try:
        Scratchpad.open(db_path, keyring=keyring).close()
    except WrongKeyError:
        return False
    return True


# -- key file -----------------------------------------------------------------------


def test_key_file_is_created_private(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / "config" / "securepad" / "key"
    keyring = Keyring.from_key_file(path)
    assert not path.exists()  # created only together with a new store
    assert opens(db_path, keyring)
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert len(base64.b64decode(path.read_bytes().strip(), validate=True)) == 32
    # No temporary file left behind: the key, and the store's snapshot-rollback anchor and its lock.
    names = sorted(p.name for p in path.parent.iterdir())
    assert len(names) == 3 and names[2] == "key"
    assert names[0].startswith("anchor-") and names[1] == names[0] + ".lock"
    assert mode(path.parent / names[0]) == 0o600


def test_key_file_is_reused(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / "key"
    first = Keyring.from_key_file(path)
    assert opens(db_path, first)
    content = path.read_bytes()
    again = Keyring.from_key_file(path)
    assert path.read_bytes() == content
    assert opens(db_path, again)
    assert again.key_file == path
    assert again.kind == "file"


def test_each_new_key_file_holds_a_new_key(tmp_path: Path, db_path: Path) -> None:
    assert opens(db_path, Keyring.from_key_file(tmp_path / "one"))
    assert opens(tmp_path / "other.db", Keyring.from_key_file(tmp_path / "two"))
    assert not opens(db_path, Keyring.from_key_file(tmp_path / "two"))
    assert (tmp_path / "one").read_bytes() != (tmp_path / "two").read_bytes()


def test_opening_an_existing_store_never_creates_a_key_file(tmp_path: Path, db_path: Path) -> None:
    assert opens(db_path, Keyring.from_key_file(tmp_path / "one"))
    with pytest.raises(WrongKeyError, match="does not exist"):
        Scratchpad.open(db_path, keyring=Keyring.from_key_file(tmp_path / "absent"))
    assert not (tmp_path / "absent").exists()


def test_racing_threads_create_one_key(tmp_path: Path) -> None:
    path = tmp_path / "race" / "key"
    barrier = threading.Barrier(8)
    keyrings: list[Keyring] = []
    errors: list[BaseException] = []

    def create(number: int) -> None:
        keyring = Keyring.from_key_file(path)
        keyrings.append(keyring)
        barrier.wait()
        try:
            Scratchpad.open(tmp_path / f"store{number}.db", keyring=keyring).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    final = Keyring.from_key_file(path)
    assert all(opens(tmp_path / f"store{n}.db", final) for n in range(8))
    # One key; beside it each store's anchor and its lock, no temporary file.
    names = [p.name for p in path.parent.iterdir()]
    assert "key" in names and len(names) == 1 + 2 * 8
    assert all(n == "key" or n.startswith("anchor-") for n in names)


def _race_for_key(path: str, db_path: str, barrier: Any) -> None:
    barrier.wait()
    keyring = Keyring.from_key_file(path)
    Scratchpad.open(db_path, keyring=keyring).close()


@pytest.mark.slow
def test_racing_processes_create_one_key(tmp_path: Path) -> None:
    """Each process creates the key file if it can and opens its own store with
    the key it got; every store then opens with the key left in the file."""
    ctx = multiprocessing.get_context("spawn")
    path = tmp_path / "race" / "key"
    barrier = ctx.Barrier(3)
    stores = [tmp_path / f"store{i}.db" for i in range(3)]
    procs = [ctx.Process(target=_race_for_key, args=(str(path), str(db), barrier)) for db in stores]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    final = Keyring.from_key_file(path)
    assert all(opens(db, final) for db in stores)


# -- environment variable -----------------------------------------------------------


def test_from_env(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    monkeypatch.setenv("SECUREPAD_TEST_KEY", key)
    keyring = Keyring.from_env("SECUREPAD_TEST_KEY")
    assert keyring.kind == "env"
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry_id = pad.put(ALICE, "t", 1, "x", "from env")["scratchpad_id"]
    monkeypatch.setenv("SECUREPAD_TEST_KEY", f"  {key}\n")  # surrounding whitespace is not part of the key
    with Scratchpad.open(db_path, keyring=Keyring.from_env("SECUREPAD_TEST_KEY")) as pad:
        assert pad.get(ALICE, entry_id).observation == "from env"
    # The same key from a file opens the same store: the source does not matter, the key does.
    (db_path.parent / "key").write_text(key)
    (db_path.parent / "key").chmod(0o600)
    assert opens(db_path, Keyring.from_key_file(db_path.parent / "key"))


def test_from_env_default_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECUREPAD_MASTER_KEY", raising=False)
    with pytest.raises(WrongKeyError, match="SECUREPAD_MASTER_KEY"):
        Keyring.from_env()
    monkeypatch.setenv("SECUREPAD_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    assert Keyring.from_env().kind == "env"


# -- passphrase ---------------------------------------------------------------------


def kdf_record(db_path: Path) -> dict[str, Any]:
    conn = apsw.Connection(str(db_path))
    try:
        (value,) = conn.execute("SELECT value FROM store_meta WHERE key = 'kdf'").fetchall()[0]
    finally:
        conn.close()
    record: dict[str, Any] = json.loads(str(value))
    return record


def test_passphrase_keeps_salt_and_parameters_in_the_store(db_path: Path) -> None:
    with Scratchpad.open(db_path, keyring=Keyring.from_passphrase("correct horse", **FAST_ARGON2)) as pad:
        entry_id = pad.put(ALICE, "t", 1, "x", "behind a passphrase")["scratchpad_id"]
    record = kdf_record(db_path)
    assert record["alg"] == "argon2id"
    assert len(base64.b64decode(record["salt"])) >= 16
    assert {k: record[k] for k in FAST_ARGON2} == FAST_ARGON2
    assert "correct horse" not in json.dumps(record)
    # Reopening uses the stored salt and parameters, whatever the new keyring asks for.
    again = Keyring.from_passphrase("correct horse", time_cost=2, memory_cost=128, parallelism=2)
    with Scratchpad.open(db_path, keyring=again) as pad:
        assert pad.get(ALICE, entry_id).observation == "behind a passphrase"
    assert kdf_record(db_path) == record


def test_passphrase_stores_have_their_own_salts(tmp_path: Path) -> None:
    keyring = Keyring.from_passphrase("same words", **FAST_ARGON2)
    assert opens(tmp_path / "one.db", keyring)
    assert opens(tmp_path / "two.db", keyring)
    assert kdf_record(tmp_path / "one.db")["salt"] != kdf_record(tmp_path / "two.db")["salt"]


def test_passphrase_and_key_file_do_not_open_each_others_stores(tmp_path: Path) -> None:
    passphrase = Keyring.from_passphrase("correct horse", **FAST_ARGON2)
    key_file = Keyring.from_key_file(tmp_path / "key")
    assert opens(tmp_path / "p.db", passphrase)
    assert opens(tmp_path / "k.db", key_file)
    assert not opens(tmp_path / "p.db", key_file)
    assert not opens(tmp_path / "k.db", passphrase)
    assert not opens(tmp_path / "p.db", Keyring.from_passphrase("correct horse!", **FAST_ARGON2))


def test_unreadable_kdf_record_is_a_wrong_key(db_path: Path) -> None:
    keyring = Keyring.from_passphrase("correct horse", **FAST_ARGON2)
    assert opens(db_path, keyring)
    record = kdf_record(db_path)
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE store_meta SET value = ? WHERE key = 'kdf'", (json.dumps({**record, "salt": "!!"}),))
    conn.close()
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db_path, keyring=keyring)


# -- secrets stay hidden ------------------------------------------------------------


def secret_forms(raw: bytes) -> list[str]:
    return [base64.b64encode(raw).decode(), raw.hex(), repr(raw)]


def test_reprs_hide_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "key"
    from_file = Keyring.create_key_file(path)
    file_key = base64.b64decode(path.read_bytes())
    env_key = os.urandom(32)
    monkeypatch.setenv("SECUREPAD_TEST_KEY", base64.b64encode(env_key).decode())
    from_env = Keyring.from_env("SECUREPAD_TEST_KEY")
    from_passphrase = Keyring.from_passphrase("hunter2 is my passphrase", **FAST_ARGON2)
    handle = KeyHandle(file_key)
    shown = " ".join(
        [repr(from_file), str(from_file), repr(from_env), repr(from_passphrase), repr(handle), str(handle)]
    )
    for secret in secret_forms(file_key) + secret_forms(env_key) + ["hunter2"]:
        assert secret not in shown
    assert "hidden" in repr(handle)
    with Scratchpad.open(tmp_path / "store.db", keyring=from_file) as pad:
        for secret in secret_forms(file_key):
            assert secret not in repr(pad)
            assert secret not in repr(vars(pad))


def test_keys_cannot_be_pickled_or_copied(tmp_path: Path) -> None:
    keyring = Keyring.from_key_file(tmp_path / "key")
    handle = KeyHandle(os.urandom(32))
    for secret in (keyring, handle, Keyring.from_passphrase("words", **FAST_ARGON2)):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            with pytest.raises(TypeError):
                pickle.dumps(secret, protocol=protocol)
        with pytest.raises(TypeError):
            copy.deepcopy(secret)
    with Scratchpad.open(tmp_path / "store.db", keyring=keyring) as pad, pytest.raises(TypeError):
        pickle.dumps(pad)


def test_key_handles_compare_by_identity() -> None:
    raw = os.urandom(32)
    assert KeyHandle(raw) != KeyHandle(raw)


# -- the store file -----------------------------------------------------------------


def test_store_files_are_private(tmp_path: Path, keyring: Keyring) -> None:
    db_path = tmp_path / "data" / "store.db"
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(ALICE, "t", 1, "x", "data")
        assert mode(db_path) == 0o600
        assert mode(db_path.parent) == 0o700
        for suffix in ("-wal", "-shm"):
            side = Path(f"{db_path}{suffix}")
            assert side.exists()
            assert mode(side) == 0o600, suffix


def test_store_file_is_private_whatever_the_umask(tmp_path: Path, keyring: Keyring) -> None:
    old = os.umask(0o000)
    try:
        db_path = tmp_path / "lax" / "store.db"
        with Scratchpad.open(db_path, keyring=keyring) as pad:
            pad.put(ALICE, "t", 1, "x", "data")
            assert mode(db_path) == 0o600
            assert mode(Path(f"{db_path}-wal")) == 0o600
        key = tmp_path / "lax-config" / "key"
        Keyring.create_key_file(key)
        assert mode(key) == 0o600
        assert mode(key.parent) == 0o700
    finally:
        os.umask(old)
