"""No raw key bytes in the locals of a traceback.

Error reporters that capture locals (Sentry, rich tracebacks, ``pytest
--showlocals``) render every frame's variables with ``repr``. Every failure
path that touches keys is provoked here and its traceback rendered with
``traceback.TracebackException(..., capture_locals=True)``; no master, owner or
item key may appear in it, raw, hex or base64.

To know the keys, the test unwraps them itself from the file with the
master key (``KeyHandle._key`` is read here, and only here, on purpose).
"""

from __future__ import annotations

import base64
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from traceback import TracebackException
from typing import Any

import apsw
import pytest

from securepad import IntegrityError, Keyring, Scratchpad, WrongKeyError
from securepad.crypto.primitives import HEADS_ERA, KeyHandle, Wrapper, item_key_aad, owner_key_aad, record_key_aad
from tests.support.principals import ALICE, FAST_ARGON2

NOW = 2_000_000.0
TURN = "turn-keys"


def _forms(key: bytes) -> list[str]:
    """Every way a key could show in a rendered local."""
    return [
        repr(key)[2:-1],
        key.hex(),
        key.hex().upper(),
        base64.b64encode(key).decode(),
        base64.urlsafe_b64encode(key).decode(),
        repr(bytearray(key))[12:-2],
        repr(list(key))[1:-1],
    ]


def _raw(handle: KeyHandle) -> bytes:
    return handle._key


def _keys_in_file(db_path: Path, master: KeyHandle) -> dict[str, bytes]:
    """The master key and every owner and item key stored in the file."""
    conn = apsw.Connection(str(db_path))
    try:
        store_id = str(conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchall()[0][0])
        wrap = Wrapper.for_master(master, store_id)
        found = {"master": _raw(master)}
        owners: dict[tuple[str, int], Wrapper] = {}
        for owner, version, wrapped in conn.execute("SELECT owner_user_id, version, wrapped FROM owner_keys"):
            key = wrap.unwrap(bytes(wrapped), owner_key_aad(store_id, owner, version, HEADS_ERA))  # type: ignore[arg-type]
            found[f"owner {owner} v{version}"] = _raw(key)
            owners[(str(owner), int(version))] = Wrapper.of(key)  # type: ignore[arg-type]
        tables: list[tuple[str, Callable[[str, str, int], bytes]]] = [
            ("entries", item_key_aad),
            ("checkpoints", record_key_aad),
            ("compaction_marks", record_key_aad),
        ]
        for table, aad in tables:
            for row_id, owner, version, wrapped in conn.execute(
                f"SELECT id, owner_user_id, key_version, wrapped_key FROM {table}"
            ):
                item = owners[(str(owner), int(version))].unwrap(bytes(wrapped), aad(row_id, owner, version))  # type: ignore[arg-type]
                found[f"{table} {row_id}"] = _raw(item)
    finally:
        conn.close()
    return found


def _rendered(exc: BaseException) -> str:
    return "".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())


def _securepad_locals(exc: BaseException) -> str:
    """The rendered locals of the traceback's frames inside securepad (the chained exceptions' too)."""
    out = []
    seen: TracebackException | None = traceback.TracebackException.from_exception(exc, capture_locals=True)
    while seen is not None:
        for frame in seen.stack:
            if f"{os.sep}securepad{os.sep}" in frame.filename and frame.locals:
                out.extend(f"{frame.name}: {name} = {value}" for name, value in frame.locals.items())
        seen = seen.__cause__ or seen.__context__
    return "\n".join(out)


def _assert_no_key(exc: BaseException, keys: dict[str, bytes]) -> None:
    assert _securepad_locals(exc), "the traceback shows no securepad frame's locals"
    text = _rendered(exc)
    for name, key in keys.items():
        for form in _forms(key):
            assert form not in text, f"the {name} key shows in a traceback's locals"


def _attempt(call: Callable[[], Any]) -> BaseException | None:
    """The exception ``call`` raised, if any. Its traceback starts in this frame,
    which holds no key (the test's own frames, which do, stay out of it)."""
    try:
        call()
    except BaseException as exc:  # any exception: its traceback is what is checked
        return exc
    return None


def _raised(call: Callable[[], Any]) -> BaseException:
    exc = _attempt(call)
    assert exc is not None, "the call did not fail"
    return exc


class _Stop(Exception):
    """Raised from a progress callback, as an interrupted caller would."""


def _stop(done: int, total: int) -> None:
    raise _Stop(f"{done}/{total}")


# (file, keyring, every key by name, entry ids by name)
Store = tuple[Path, Keyring, dict[str, bytes], dict[str, str]]


@pytest.fixture
def store(
    db_path: Path, key_file: Path, keyring: Keyring
) -> Iterator[tuple[Path, Keyring, dict[str, bytes], dict[str, str]]]:
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        turn = pad.turn(ALICE, TURN, now=NOW)
        ids = {
            # two segments (in the segments table); the json one keeps its one segment in its row
            "text": turn.record(1, "read", {"content": "x" * 70_000, "metadata": {"path": "a"}}, now=NOW),
            "json": turn.record(2, "list", {"rows": list(range(3000))}, now=NOW),
        }
        turn.checkpoint(facts=["f"], now=NOW)
        turn.mark_compaction(now=NOW)
        pad.rotate_owner_key("alice")
        entry_ids = {name: view["scratchpad_id"] for name, view in ids.items()}
    master = KeyHandle(base64.b64decode(key_file.read_bytes().strip()))
    yield db_path, keyring, _keys_in_file(db_path, master), entry_ids


def _edit(db_path: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    conn = apsw.Connection(str(db_path))
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


TAMPERS: dict[str, str] = {
    "entry wrapped key": "UPDATE entries SET wrapped_key = zeroblob(60)",
    "entry commitment": "UPDATE entries SET commitment = zeroblob(32)",
    "entry metadata": "UPDATE entries SET sealed_meta = zeroblob(100)",
    "entry segment": "UPDATE segments SET data = zeroblob(length(data))",
    "entry segment in its row": "UPDATE entries SET only_segment = zeroblob(length(only_segment))",
    "owner key": "UPDATE owner_keys SET wrapped = zeroblob(60)",
    "owner key deleted": "DELETE FROM owner_keys",
    "record payload": "UPDATE checkpoints SET sealed = zeroblob(100)",
    "mark payload": "UPDATE compaction_marks SET sealed = zeroblob(100)",
    "record wrapped key": "UPDATE checkpoints SET wrapped_key = zeroblob(60)",
}


def _calls(pad: Scratchpad, ids: dict[str, str]) -> dict[str, Callable[[], Any]]:
    turn = pad.turn(ALICE, TURN, now=NOW)
    return {
        "get": lambda: pad.get(ALICE, ids["text"], now=NOW),
        "read": lambda: pad.read(ALICE, ids["json"], "grep", pattern="7", now=NOW),
        "history": lambda: turn.history(now=NOW),
        "resolve": lambda: turn.resolve("{{step2.rows.5}}", now=NOW),
        "latest_checkpoint": lambda: turn.latest_checkpoint(now=NOW),
        "reread_report": lambda: turn.reread_report(now=NOW),
        "resume": lambda: turn.resume(extend_ttl=60, now=NOW),
        "put": lambda: pad.put(ALICE, TURN, 9, "x", "new", now=NOW),
    }


@pytest.mark.slow
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_tampered_rows_fail_without_keys_in_the_traceback(store: Any, tamper: str) -> None:
    db_path, keyring, keys, ids = store
    _edit(db_path, TAMPERS[tamper])
    failed = 0
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        for call in _calls(pad, ids).values():
            exc = _attempt(call)
            if isinstance(exc, IntegrityError):
                failed += 1
                _assert_no_key(exc, keys)
                # A public type, not a private subclass a caller would have to walk the MRO of.
                assert type(exc) is IntegrityError, type(exc)
    assert failed, f"tampering with the {tamper} made no call fail"


def test_a_wrong_master_key_fails_without_keys_in_the_traceback(store: Any, tmp_path: Path) -> None:
    db_path, _, keys, _ = store
    exc = _raised(lambda: Scratchpad.open(db_path, keyring=Keyring.from_key_file(tmp_path / "other-key")))
    assert isinstance(exc, WrongKeyError)
    _assert_no_key(exc, keys)


def test_a_wrong_passphrase_fails_without_keys_in_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "pass.db"
    with Scratchpad.open(path, keyring=Keyring.from_passphrase("right horse", **FAST_ARGON2)) as pad:
        pad.put(ALICE, TURN, 1, "x", "text", now=NOW)
    exc = _raised(lambda: Scratchpad.open(path, keyring=Keyring.from_passphrase("wrong horse", **FAST_ARGON2)))
    assert isinstance(exc, WrongKeyError)
    text = _securepad_locals(exc)
    assert text and "right horse" not in text and "wrong horse" not in text


def test_an_interrupted_master_rotation_leaves_no_key_in_the_traceback(store: Any, tmp_path: Path) -> None:
    db_path, keyring, keys, _ = store
    new_key_file = tmp_path / "new-key"
    new_keyring = Keyring.create_key_file(new_key_file)  # its bytes are needed before the rotation
    keys = {**keys, "new master": base64.b64decode(new_key_file.read_bytes().strip())}
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        exc = _raised(lambda: pad.rotate_master_key(new_keyring, progress=_stop))
        assert isinstance(exc, _Stop)
        _assert_no_key(exc, keys)
        assert pad.get(ALICE, store[3]["text"], now=NOW).observation["content"] == "x" * 70_000


def test_an_interrupted_owner_rotation_leaves_no_key_in_the_traceback(store: Any) -> None:
    db_path, keyring, keys, _ = store
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        exc = _raised(lambda: pad.rotate_owner_key("alice", progress=_stop))
        assert isinstance(exc, _Stop)
        # The new version's key was made during this rotation: read it from the file too.
        master = _master_of(keys)
    keys = {**keys, **_keys_in_file(db_path, master)}
    _assert_no_key(exc, keys)


def _master_of(keys: dict[str, bytes]) -> KeyHandle:
    return KeyHandle(keys["master"])


def test_the_check_sees_a_key_that_is_there() -> None:
    """The detector works: a frame holding a raw key is caught."""
    key = bytes(range(32))

    def leaky(raw_key: bytes) -> None:
        raise ValueError("boom")

    exc = _raised(lambda: leaky(key))
    text = _rendered(exc)
    assert all(form in text for form in _forms(key)[:1])
    assert "raw_key = b'" in text
