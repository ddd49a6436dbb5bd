"""Every error type of ``securepad.errors`` is raised where a user relies on it."""

from __future__ import annotations

import base64
import contextlib
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import apsw
import pytest

from securepad import Keyring, Policy, Principal, Scratchpad
from securepad._steps import put_next
from securepad.errors import (
    ExpiredError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    PolicyError,
    QuotaExceededError,
    SecurepadError,
    StoreBusyError,
    WrongKeyError,
)
from securepad.storage.sqlite import Database
from tests.conftest import stable_repr
from tests.support.principals import FAST_ARGON2


def not_found_message(pad: Scratchpad, p: Principal, entry_id: object) -> str:
    """The message of the NotFoundError (exactly that type) for ``entry_id``."""
    with pytest.raises(NotFoundError) as caught:
        pad.get(p, entry_id)  # type: ignore[arg-type]
    assert type(caught.value) is NotFoundError
    return str(caught.value)


def write_policy(tmp_path: Path, text: str, name: str = "custom") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the hierarchy ------------------------------------------------------------------


def test_hierarchy() -> None:
    for error in (
        NotFoundError,
        ExpiredError,
        InvalidArgumentError,
        IntegrityError,
        WrongKeyError,
        PolicyError,
        QuotaExceededError,
        StoreBusyError,
    ):
        assert issubclass(error, SecurepadError)
        assert error.__name__.endswith("Error")
    assert issubclass(ExpiredError, NotFoundError)
    assert issubclass(InvalidArgumentError, ValueError)


# -- NotFoundError ------------------------------------------------------------------

MALFORMED_IDS: list[Any] = [
    "",
    "0" * 15,
    "0" * 17,
    "A" * 16,
    "0123456789ABCDEF",
    "f" * 1_000_000,
    "' OR 1=1 --",
    "0123456789abcdef' OR '1'='1",
    "%",
    "*",
    "0123456789abcde%",
    "0123456789abcdé",
    "0123456789abcdef".translate({c: c + 0xFEE0 for c in range(0x21, 0x7F)}),  # fullwidth look-alike
    "0123456789abcde\x00",
    "\x00" * 16,
    " 0123456789abcdef",
    "0123456789abcdef\n",
    None,
    0,
    12345678901234567,
    b"0123456789abcdef",
    ["0123456789abcdef"],
    1.5,
]


def test_absent_id(pad: Scratchpad, alice: Principal) -> None:
    pad.put(alice, "t", 1, "x", "something")
    assert not_found_message(pad, alice, secrets.token_hex(8)) == "no such entry"


@pytest.mark.parametrize("bad_id", MALFORMED_IDS, ids=lambda v: repr(v)[:24])
def test_malformed_ids_are_not_found(pad: Scratchpad, alice: Principal, bad_id: Any) -> None:
    real = pad.put(alice, "t", 1, "x", "the secret")["scratchpad_id"]
    assert not_found_message(pad, alice, bad_id) == not_found_message(pad, alice, secrets.token_hex(8))
    with pytest.raises(NotFoundError):
        pad.read(alice, bad_id, mode="full")
    # Nothing else happened to the store.
    assert pad.get(alice, real).observation == "the secret"


def test_sql_like_id_does_not_match_another_entry(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    entry_id = pad.put(alice, "t", 1, "x", "alice's secret")["scratchpad_id"]
    for forged in (f"{entry_id}' OR '1'='1", f"{entry_id[:-1]}%", f"{entry_id[:-1]}_", entry_id.upper()):
        with pytest.raises(NotFoundError):
            pad.get(alice, forged)
        with pytest.raises(NotFoundError):
            pad.get(bob, forged)


def test_another_owners_id_looks_absent(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    entry_id = pad.put(alice, "t", 1, "x", "alice's secret")["scratchpad_id"]
    assert not_found_message(pad, bob, entry_id) == not_found_message(pad, bob, secrets.token_hex(8))
    for mode in ("head", "tail", "range", "full"):
        with pytest.raises(NotFoundError) as caught:
            pad.read(bob, entry_id, mode=mode)
        assert type(caught.value) is NotFoundError
    assert pad.list_for_turn(bob, "t") == []


# -- ExpiredError -------------------------------------------------------------------


def test_own_expired_entry(pad: Scratchpad, alice: Principal) -> None:
    entry_id = pad.put(alice, "t", 1, "x", "old news", ttl_seconds=10, now=1000.0)["scratchpad_id"]
    with pytest.raises(ExpiredError):
        pad.get(alice, entry_id, now=1010.0)
    with pytest.raises(ExpiredError):
        pad.read(alice, entry_id, mode="full", now=5000.0)


def test_expired_entry_of_another_owner_is_plain_not_found(pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    entry_id = pad.put(alice, "t", 1, "x", "old news", ttl_seconds=10, now=1000.0)["scratchpad_id"]
    absent = secrets.token_hex(8)
    for get in (
        lambda i: pad.get(bob, i, now=2000.0),
        lambda i: pad.read(bob, i, mode="head", now=2000.0),
    ):
        with pytest.raises(NotFoundError) as expired:
            get(entry_id)
        with pytest.raises(NotFoundError) as missing:
            get(absent)
        assert type(expired.value) is NotFoundError
        assert str(expired.value) == str(missing.value)


# -- InvalidArgumentError ------------------------------------------------------------


@pytest.fixture
def entry_id(pad: Scratchpad, alice: Principal) -> str:
    return str(pad.put(alice, "t", 1, "x", "0123456789" * 10)["scratchpad_id"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "slice"},
        {"mode": "HEAD"},
        {"mode": ""},
        {"mode": None},
        {"mode": "head", "n": -1},
        {"mode": "tail", "n": -5},
        {"mode": "head", "n": "10"},
        {"mode": "head", "n": 2.0},
        {"mode": "head", "n": True},
        {"mode": "head", "n": None},
        {"mode": "range", "start": -1},
        {"mode": "range", "start": 0, "end": -1},
        {"mode": "range", "start": 5, "end": 4},
        {"mode": "range", "start": 500, "end": 400},
        {"mode": "range", "start": "0"},
        {"mode": "range", "start": False},
    ],
    ids=repr,
)
def test_bad_read_arguments(pad: Scratchpad, alice: Principal, entry_id: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.read(alice, entry_id, **kwargs)


def test_bad_mode_is_refused_even_for_an_absent_id(pad: Scratchpad, alice: Principal) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.read(alice, secrets.token_hex(8), mode="everything")


@pytest.mark.parametrize("step", [-1, 2**31, 1.0, "1", None, True, False], ids=repr)
def test_bad_step_num(pad: Scratchpad, alice: Principal, step: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put(alice, "t", step, "x", "data")


@pytest.mark.parametrize("ttl", [0, -1, 86401, 10**9, 1.5, "60", True], ids=repr)
def test_bad_ttl(pad: Scratchpad, alice: Principal, ttl: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put(alice, "t", 1, "x", "data", ttl_seconds=ttl)


def test_ttl_at_the_maximum_is_accepted(pad: Scratchpad, alice: Principal) -> None:
    view = pad.put(alice, "t", 1, "x", "data", ttl_seconds=86400, now=0.0)
    assert pad.get(alice, view["scratchpad_id"], now=1.0).expires_at == 86400.0


@pytest.mark.parametrize(
    "observation",
    [
        {1, 2},
        object(),
        {"when": time},
        [float("nan")],
        {"score": float("nan")},
        {"content": "text", "score": float("nan")},
        {"content": "text", "extra": {1, 2}},
        float("inf"),
        {"x": float("-inf")},
        {1: "int key"},
        {"content": "x", "nested": {("tuple",): 1}},
        "lone surrogate \ud800",
        {"content": "lone surrogate \udfff"},
    ],
    ids=stable_repr,
)
def test_observation_must_be_json(pad: Scratchpad, alice: Principal, observation: Any) -> None:
    before = pad.stats()["entries"]
    with pytest.raises(InvalidArgumentError):
        pad.put(alice, "t", 1, "x", observation)
    assert pad.stats()["entries"] == before


@pytest.mark.parametrize(
    "fields",
    [
        ("", "planner", "web"),
        ("alice", "", "web"),
        ("alice", "planner", ""),
        ("a" * 257, "planner", "web"),
        ("alice\x00", "planner", "web"),
        ("alice", "plan\nner", "web"),
        ("alice", "planner", "w\teb"),
        (None, "planner", "web"),
        (42, "planner", "web"),
        (b"alice", "planner", "web"),
        ("alice", "planner", ["web"]),
    ],
    ids=repr,
)
def test_bad_principal_fields(fields: tuple[Any, Any, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        Principal(*fields)


def test_principal_is_frozen_and_checked_on_every_call(pad: Scratchpad, alice: Principal, entry_id: str) -> None:
    with pytest.raises(AttributeError):
        alice.owner_user_id = "bob"  # type: ignore[misc]
    impostor: Any = ("alice", "planner", "web")
    for call in (
        lambda: pad.get(impostor, entry_id),
        lambda: pad.read(impostor, entry_id),
        lambda: pad.list_for_turn(impostor, "t"),
        lambda: pad.put(impostor, "t", 1, "x", "data"),
        lambda: pad.stats(impostor),
    ):
        with pytest.raises(InvalidArgumentError):
            call()


@pytest.mark.parametrize("turn", ["", "t" * 257, "tu\x00rn", 7, None], ids=repr)
def test_bad_turn_id(pad: Scratchpad, alice: Principal, turn: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put(alice, turn, 1, "x", "data")
    with pytest.raises(InvalidArgumentError):
        pad.list_for_turn(alice, turn)


@pytest.mark.parametrize("executor", ["", "e" * 257, "ex\x1bec", 3], ids=repr)
def test_bad_executor_name(pad: Scratchpad, alice: Principal, executor: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        pad.put(alice, "t", 1, executor, "data")


def test_open_needs_a_keyring(db_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        Scratchpad.open(db_path, keyring=base64.b64encode(bytes(32)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"time_cost": 0}, {"parallelism": 0}, {"memory_cost": 4}],
    ids=repr,
)
def test_bad_argon2_parameters(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        Keyring.from_passphrase("correct horse", **{**FAST_ARGON2, **kwargs})


@pytest.mark.parametrize("passphrase", ["", None, b"bytes"], ids=repr)
def test_bad_passphrase(passphrase: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        Keyring.from_passphrase(passphrase, **FAST_ARGON2)


# -- IntegrityError -----------------------------------------------------------------


def test_flipped_ciphertext_byte(db_path: Path, keyring: Keyring, alice: Principal) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        entry_id = pad.put(alice, "t", 1, "x", "authentic " * 100)["scratchpad_id"]
    conn = apsw.Connection(str(db_path))
    # A one-segment entry keeps its sealed segment in its row (migration 8).
    (data,) = conn.execute("SELECT only_segment FROM entries WHERE id = ?", (entry_id,)).fetchall()[0]
    flipped = bytearray(data)  # type: ignore[arg-type]
    flipped[10] ^= 0x80
    conn.execute("UPDATE entries SET only_segment = ? WHERE id = ?", (bytes(flipped), entry_id))
    conn.close()
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        with pytest.raises(IntegrityError):
            pad.get(alice, entry_id)
        with pytest.raises(IntegrityError):
            pad.read(alice, entry_id, mode="head", n=5)


# -- WrongKeyError ------------------------------------------------------------------


def test_wrong_key_file(db_path: Path, keyring: Keyring, tmp_path: Path, alice: Principal) -> None:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        pad.put(alice, "t", 1, "x", "data")
    other = Keyring.from_key_file(tmp_path / "other" / "key")
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db_path, keyring=other)


@pytest.mark.parametrize(
    "content",
    [b"", b"not base64 at all!", base64.b64encode(bytes(16)), base64.b64encode(bytes(33)), b"\xff\xfe" * 20],
    ids=["empty", "garbage", "16-bytes", "33-bytes", "binary"],
)
def test_key_file_without_a_key(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(WrongKeyError):
        Keyring.from_key_file(path)


def test_env_key_unset_or_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECUREPAD_TEST_KEY", raising=False)
    with pytest.raises(WrongKeyError):
        Keyring.from_env("SECUREPAD_TEST_KEY")
    for value in ("", "garbage!!", base64.b64encode(bytes(31)).decode(), "ключ"):
        monkeypatch.setenv("SECUREPAD_TEST_KEY", value)
        with pytest.raises(WrongKeyError):
            Keyring.from_env("SECUREPAD_TEST_KEY")


def test_wrong_env_key(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECUREPAD_TEST_KEY", base64.b64encode(secrets.token_bytes(32)).decode())
    Scratchpad.open(db_path, keyring=Keyring.from_env("SECUREPAD_TEST_KEY")).close()
    monkeypatch.setenv("SECUREPAD_TEST_KEY", base64.b64encode(secrets.token_bytes(32)).decode())
    with pytest.raises(WrongKeyError):
        Scratchpad.open(db_path, keyring=Keyring.from_env("SECUREPAD_TEST_KEY"))


def test_wrong_passphrase(db_path: Path) -> None:
    Scratchpad.open(db_path, keyring=Keyring.from_passphrase("correct horse", **FAST_ARGON2)).close()
    with pytest.raises(WrongKeyError) as caught:
        Scratchpad.open(db_path, keyring=Keyring.from_passphrase("battery staple", **FAST_ARGON2))
    assert "battery" not in str(caught.value)


# -- PolicyError --------------------------------------------------------------------

POLICY_CASES = [
    ("[access]\nscope = 'owner'\nfoo = 1\n", "access.foo"),
    ("[limits]\nmax_read_chars = 100\nmax_reads = 5\n", "limits.max_reads"),
    ("[audit]\nlog_everything = true\n", "audit.log_everything"),
    ("[access]\nscope = 'everyone'\n", "access.scope"),
    ("[access]\nscope = 'owner+actor'\n", "access.scope"),
    ("[access]\nscope = 1\n", "access.scope"),
    ("[limits]\nmax_read_chars = 0\n", "limits.max_read_chars"),
    ("[limits]\nmax_read_chars = -5\n", "limits.max_read_chars"),
    ("[limits]\nmax_read_chars = '16000'\n", "limits.max_read_chars"),
    ("[limits]\nmax_read_chars = 16000.0\n", "limits.max_read_chars"),
    ("[limits]\nmax_read_chars = true\n", "limits.max_read_chars"),
    ("[limits]\nowner_quota_bytes = 0\n", "limits.owner_quota_bytes"),
    ("[limits]\ndefault_ttl_seconds = 0\n", "limits.default_ttl_seconds"),
    ("[audit]\nlog_denied = 1\n", "audit.log_denied"),
    ("[audit]\nlog_reads = 'yes'\n", "audit.log_reads"),
    ("[permissions]\nscope = 'owner'\n", "permissions"),
    ("access = 'owner'\n", "access"),
    ("[limits]\ndefault_ttl_seconds = 7200\nmax_ttl_seconds = 3600\n", "default_ttl_seconds"),
    ("[limits]\nmax_entry_bytes = 2000\nowner_quota_bytes = 1000\n", "max_entry_bytes"),
    ("", "empty"),
    ("# only a comment\n", "empty"),
    ("[access\nscope = 'owner'\n", "TOML"),
]


@pytest.mark.parametrize(("text", "named"), POLICY_CASES, ids=[named for _, named in POLICY_CASES])
def test_bad_policy_file_names_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = write_policy(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        Policy.load(path)
    assert named in str(caught.value)


def test_bad_policy_refuses_to_open_the_store(tmp_path: Path, db_path: Path, keyring: Keyring) -> None:
    path = write_policy(tmp_path, "[limits]\nmax_read_chars = 'lots'\n")
    with pytest.raises(PolicyError, match=r"limits\.max_read_chars"):
        Scratchpad.open(db_path, keyring=keyring, policy=path)


def test_empty_policy_dict() -> None:
    with pytest.raises(PolicyError):
        Policy.from_dict({})


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8"])
def test_unreadable_policy_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "policy.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"[access]\nscope = '\xff\xfe'\n")
    with pytest.raises(PolicyError) as caught:
        Policy.load(path)
    assert "policy.toml" in str(caught.value)


# -- QuotaExceededError -------------------------------------------------------------


@pytest.fixture
def small_pad(tmp_path: Path, keyring: Keyring) -> Any:
    path = write_policy(
        tmp_path,
        # Room for three 1000-character entries as they cost on disk (3,025 bytes each:
        # content, sealed fields with the view, the per-row overhead), not four.
        "[access]\nscope = 'owner'\n[limits]\nmax_entry_bytes = 1000\nowner_quota_bytes = 9100\n",
        name="small",
    )
    with Scratchpad.open(tmp_path / "small" / "store.db", keyring=keyring, policy=path) as store:
        yield store


def usage(pad: Scratchpad) -> dict[str, Any]:
    """stats() for the store, minus the file sizes (SQLite may grow the WAL on a rollback)."""
    stats = pad.stats()
    del stats["file_bytes"]
    return stats


@pytest.mark.parametrize(
    "observation",
    ["x" * 1001, "é" * 501, b"\x00" * 1001, {"content": "y" * 1001, "status": 200}, {"items": list(range(400))}],
    ids=["text", "multibyte", "binary", "dict", "json"],
)
def test_entry_larger_than_max_entry_bytes(small_pad: Scratchpad, alice: Principal, observation: Any) -> None:
    small_pad.put(alice, "t", 1, "x", "first")
    before = usage(small_pad)
    with pytest.raises(QuotaExceededError):
        small_pad.put(alice, "t", 2, "x", observation)
    assert usage(small_pad) == before
    assert [e["step_num"] for e in small_pad.list_for_turn(alice, "t")] == [1]


def test_entry_of_exactly_max_entry_bytes_fits(small_pad: Scratchpad, alice: Principal) -> None:
    entry_id = small_pad.put(alice, "t", 1, "x", b"\x01" * 1000)["scratchpad_id"]
    assert small_pad.get(alice, entry_id).size_bytes == 1000


def test_side_fields_count_towards_max_entry_bytes(small_pad: Scratchpad, alice: Principal) -> None:
    """max_entry_bytes refuses larger puts: the fields stored beside ``content``
    (sealed with the entry) are part of what is stored, so they count too."""
    before = usage(small_pad)
    with pytest.raises(QuotaExceededError):
        small_pad.put(alice, "t", 1, "x", {"content": "small", "attachment": "z" * 100_000})
    assert usage(small_pad) == before


def test_owner_quota(small_pad: Scratchpad, alice: Principal, bob: Principal) -> None:
    for step in range(3):
        small_pad.put(alice, "t", step, "x", "a" * 1000, now=1000.0)
    before = usage(small_pad)
    with pytest.raises(QuotaExceededError):
        small_pad.put(alice, "t", 9, "x", "a", now=1000.0)
    assert usage(small_pad) == before
    assert small_pad.stats(alice, now=1000.0)["bytes"] == 3000
    # Quotas are per owner: bob still has room.
    small_pad.put(bob, "t", 1, "x", "b" * 1000, now=1000.0)


def test_expired_entries_do_not_count_towards_the_quota(small_pad: Scratchpad, alice: Principal) -> None:
    for step in range(3):
        small_pad.put(alice, "t", step, "x", "a" * 1000, ttl_seconds=10, now=1000.0)
    with pytest.raises(QuotaExceededError):
        small_pad.put(alice, "t", 3, "x", "a", now=1005.0)
    small_pad.put(alice, "t", 3, "x", "a" * 1000, now=1010.0)


# -- StoreBusyError -----------------------------------------------------------------


@pytest.fixture
def impatient_pad(db_path: Path, keyring: Keyring) -> Any:
    Scratchpad.open(db_path, keyring=keyring).close()
    store = Scratchpad(Database(db_path, busy_timeout_ms=50), keyring, Policy.default(), time.time)
    yield store
    store.close()


@pytest.fixture
def writer_lock(db_path: Path, impatient_pad: Scratchpad) -> Any:
    """Another connection holding the write lock, as a slow writer elsewhere would."""
    conn = apsw.Connection(str(db_path))
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    conn.execute("ROLLBACK")
    conn.close()


def test_put_while_another_writer_holds_the_lock(
    impatient_pad: Scratchpad, writer_lock: apsw.Connection, alice: Principal
) -> None:
    with pytest.raises(StoreBusyError):
        impatient_pad.put(alice, "t", 1, "x", "data")
    with pytest.raises(StoreBusyError):
        impatient_pad.gc()


def test_writers_of_one_process_queued_behind_a_busy_lock_each_wait_the_busy_timeout(
    impatient_pad: Scratchpad, writer_lock: apsw.Connection, alice: Principal
) -> None:
    """The integrations' writes of one store take one lock in this process
    (``writer_lock``): one waiting behind the others raises StoreBusyError within
    about the busy timeout of its own, not the others' timeouts added up."""
    waited: list[float] = []

    def write(n: int) -> None:
        started = time.monotonic()
        with contextlib.suppress(StoreBusyError):
            put_next(impatient_pad, alice, "t", "x", f"item {n}", guess=n + 1)
        waited.append(time.monotonic() - started)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(waited) == 16
    assert max(waited) < 6 * 0.05  # two waits of 50 ms at most, with room for a slow machine (16 added up: 0.8 s)


def test_reads_go_on_while_a_writer_holds_the_lock(
    db_path: Path, keyring: Keyring, alice: Principal, impatient_pad: Scratchpad
) -> None:
    entry_id = impatient_pad.put(alice, "t", 1, "x", "still readable")["scratchpad_id"]
    conn = apsw.Connection(str(db_path))
    conn.execute("BEGIN IMMEDIATE")
    try:
        assert impatient_pad.get(alice, entry_id).observation == "still readable"
        assert impatient_pad.stats(alice)["entries"] == 1
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    impatient_pad.put(alice, "t", 2, "x", "and writable again")


def test_opening_while_another_writer_holds_the_lock(db_path: Path, writer_lock: apsw.Connection) -> None:
    with pytest.raises(StoreBusyError):
        Database(db_path, busy_timeout_ms=50)


def test_gc_while_a_reader_holds_a_snapshot(
    db_path: Path, impatient_pad: Scratchpad, alice: Principal, bob: Principal
) -> None:
    """A reader elsewhere can keep the WAL from being truncated; gc still deletes,
    and says so either by returning or with StoreBusyError, never a raw SQLite error."""
    expired = impatient_pad.put(alice, "t", 1, "x", "old", ttl_seconds=1, now=1000.0)["scratchpad_id"]
    reader = apsw.Connection(str(db_path))
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM entries").fetchall()
    try:
        impatient_pad.put(bob, "t", 1, "x", "new")
        with contextlib.suppress(StoreBusyError):
            assert impatient_pad.gc(now=2000.0) == 1
    finally:
        reader.execute("COMMIT")
        reader.close()
    with pytest.raises(NotFoundError):
        impatient_pad.get(alice, expired, now=1000.5)
