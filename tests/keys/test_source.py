"""What every master key source owes, written once against the interface
(``securepad.keys.source.MasterKeySource``) and run on each source."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from securepad import Keyring, Scratchpad, WrongKeyError
from securepad.errors import IntegrityError
from securepad.keys.source import MasterKeySource, SourceCheck, open_source
from tests.conftest import ALICE


def _ready(uri: str) -> MasterKeySource:
    source = open_source(uri)
    source.prepare(create=True)
    return source


def test_a_sealed_key_opens_with_its_associated_data_only(master_key_uri: str) -> None:
    source = _ready(master_key_uri)
    key, aad = secrets.token_bytes(32), b"owner-key alice 1"
    blob = source.encrypt(key, aad)
    assert key not in blob and source.decrypt(blob, aad) == key
    with pytest.raises(IntegrityError):
        source.decrypt(blob, aad + b"!")
    with pytest.raises(IntegrityError):
        source.decrypt(blob[:-1] + bytes([blob[-1] ^ 1]), aad)
    assert source.calls.total("encrypt") == 1 and source.calls.total("decrypt") == 3


def test_the_identifier_is_stable_and_the_shown_uri_has_no_secret(master_key_uri: str) -> None:
    first, second = _ready(master_key_uri), open_source(master_key_uri)
    assert first.key_id() == second.key_id()
    assert first.shown_uri in repr(first)
    assert "pin-value" not in first.shown_uri and "secret" not in first.shown_uri.lower()
    with pytest.raises(TypeError):
        __import__("pickle").dumps(first)


def test_the_audit_facts_are_checks(master_key_uri: str) -> None:
    checks = _ready(master_key_uri).inspect()
    assert checks and all(isinstance(c, SourceCheck) and c.name and c.detail for c in checks)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]


def test_a_store_costs_one_call_an_open_and_one_an_owner(master_key_uri: str, tmp_path: Path) -> None:
    with Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_uri(master_key_uri)) as pad:
        entry = pad.put(ALICE, "t", 1, "x", "sealed by a source")["scratchpad_id"]
    keyring = Keyring.from_uri(master_key_uri)
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring) as pad:
        assert keyring.source is not None
        calls = keyring.source.calls
        assert calls.total("encrypt", "decrypt") == 1
        for _ in range(3):
            assert pad.get(ALICE, entry).observation == "sealed by a source"
        assert calls.total("encrypt", "decrypt") == 2
    with pytest.raises(WrongKeyError):
        Scratchpad.open(tmp_path / "s.db", keyring=Keyring.from_key_file(tmp_path / "key"))
