"""The PKCS#11 master key source (keys/pkcs11.py) against real SoftHSM2 tokens."""

from __future__ import annotations

import os
import re
import secrets
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from securepad.errors import (
    IntegrityError,
    KeySourceKeyError,
    KeySourceLoginError,
    KeySourceModuleError,
    KeySourceTokenError,
    KeySourceUriError,
)
from securepad.keys.pkcs11 import Pkcs11Uri
from securepad.keys.source import open_source
from tests.support.softhsm import PIN_TRIALS_TOKEN, SoftHsm


def test_a_key_made_by_the_source_is_sensitive_and_never_leaves_the_token(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    source.prepare(create=True)
    assert {c.name: c.ok for c in source.inspect()} == {
        "key-not-extractable": True,
        "key-sensitive": True,
        "key-on-token": True,
        "pin-not-in-uri": True,
        "pin-file-private": True,
    }
    assert source.calls.snapshot()["create"] == 1
    source.close()


def test_sealed_keys_open_only_with_their_associated_data(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    source.prepare(create=True)
    secret = secrets.token_bytes(32)
    blob = source.encrypt(secret, b"owner alice v1")
    assert len(blob) == 60
    assert source.decrypt(blob, b"owner alice v1") == secret
    with pytest.raises(IntegrityError):
        source.decrypt(blob, b"owner bob v1")
    with pytest.raises(IntegrityError):
        source.decrypt(blob[:-1] + bytes([blob[-1] ^ 1]), b"owner alice v1")
    with pytest.raises(IntegrityError):
        source.decrypt(blob[:20], b"owner alice v1")


def test_a_blob_of_another_key_does_not_open(softhsm: SoftHsm) -> None:
    one, two = (open_source(softhsm.uri()) for _ in range(2))
    one.prepare(create=True)
    two.prepare(create=True)
    with pytest.raises(IntegrityError):
        two.decrypt(one.encrypt(b"k" * 32, b"a"), b"a")
    assert one.key_id() != two.key_id()


def test_the_key_id_names_the_key_not_the_spelling_of_the_uri(
    softhsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    label = "same-" + secrets.token_hex(4)
    first = open_source(softhsm.uri(label))
    first.prepare(create=True)
    monkeypatch.setenv("TEST_PIN", softhsm.user_pin)
    second = open_source(softhsm.uri(label, pin="env:TEST_PIN"))
    assert first.key_id() == second.key_id()
    assert first.key_id().startswith("pkcs11:token=securepad;serial=")
    assert softhsm.user_pin not in first.key_id()


def test_an_absent_label_is_created_only_when_asked(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    with pytest.raises(KeySourceKeyError, match="holds no key labelled"):
        source.prepare()
    source.prepare(create=True)
    source.prepare()


def test_a_wrong_pin_is_a_login_error_that_does_not_show_the_pin(
    softhsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PIN", "wrong-pin-1234")
    source = open_source(softhsm.uri(token=PIN_TRIALS_TOKEN, pin="env:TEST_PIN"))
    with pytest.raises(KeySourceLoginError, match="refused the PIN") as caught:
        source.prepare(create=True)
    assert "wrong-pin-1234" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_unset_pin_variable_and_an_absent_pin_are_login_errors(
    softhsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_PIN", raising=False)
    monkeypatch.delenv("SECUREPAD_PKCS11_PIN", raising=False)
    with pytest.raises(KeySourceLoginError, match="NO_SUCH_PIN is not set"):
        open_source(softhsm.uri(pin="env:NO_SUCH_PIN")).prepare()
    with pytest.raises(KeySourceLoginError, match="no PIN"):
        open_source(softhsm.uri(pin="none")).prepare()


def test_a_missing_token_and_a_missing_module_are_typed(softhsm: SoftHsm) -> None:
    with pytest.raises(KeySourceTokenError, match="no token matches"):
        open_source(softhsm.uri(token="no-such-token")).prepare()
    uri = softhsm.uri().replace(softhsm.module, "/nonexistent/libnothing.so")
    with pytest.raises(KeySourceModuleError, match=re.escape("no PKCS#11 module at /nonexistent/libnothing.so")):
        open_source(uri).prepare()


def test_the_pin_value_never_shows(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri(pin="value"))
    assert softhsm.user_pin not in source.shown_uri
    assert softhsm.user_pin not in repr(source)
    source.prepare(create=True)
    assert {c.name: c.ok for c in source.inspect()}["pin-not-in-uri"] is False
    with pytest.raises(KeySourceUriError) as caught:
        open_source(softhsm.uri(pin="value") + "&bogus=1")
    assert softhsm.user_pin not in str(caught.value)


@pytest.mark.parametrize(
    "uri, message",
    [
        ("pkcs11:object=k?module-path=/m.so", "names no token"),
        ("pkcs11:token=t?module-path=/m.so", "names no key"),
        ("pkcs11:token=t;object=k", "names no PKCS#11 module"),
        ("pkcs11:token=t;object=k;object=j?module-path=/m.so", "given twice"),
        ("pkcs11:token=t;object=k;colour=red?module-path=/m.so", "unknown attribute 'colour'"),
        ("pkcs11:token=t;object=%zz?module-path=/m.so", "badly percent-encoded"),
        ("pkcs11:token=t;object=?module-path=/m.so", "has no value"),
        ("pkcs11:token=t;object=k;type=private?module-path=/m.so", "secret-key object"),
        ("pkcs11:token=t;object=k;slot-id=x?module-path=/m.so", "decimal"),
        ("pkcs11:token=t;object=k?module-path=/m.so#frag", "no fragment"),
        ("vault://k", "unknown scheme"),
    ],
)
def test_malformed_uris_are_refused_before_any_call(uri: str, message: str) -> None:
    with pytest.raises(KeySourceUriError, match=message):
        open_source(uri)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=200)
@given(token=_text, obj=_text, key_id=st.none() | st.binary(min_size=1, max_size=8))
def test_the_shown_uri_parses_back_to_the_same_key(token: str, obj: str, key_id: bytes | None) -> None:
    extra = ";id=" + "".join(f"%{b:02x}" for b in key_id) if key_id else ""
    from urllib.parse import quote

    path = f"token={quote(token, safe='')};object={quote(obj, safe='')}{extra}"
    uri = Pkcs11Uri.parse(f"pkcs11:{path}?module-path=/m.so&pin-value=1234")
    again = Pkcs11Uri.parse(uri.shown())
    assert (again.path, again.id) == (uri.path, uri.id)
    assert "pin-value" not in uri.shown() and "pin-value" not in again.query


def test_the_source_is_shared_safely_between_threads(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    source.prepare(create=True)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for n in range(50):
                data = secrets.token_bytes(32)
                assert source.decrypt(source.encrypt(data, str(n).encode()), str(n).encode()) == data
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert source.calls.total("encrypt") == 200


def test_a_forked_child_opens_its_own_session(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    source.prepare(create=True)
    blob = source.encrypt(b"x" * 32, b"aad")
    pid = os.fork()
    if pid == 0:
        try:
            ok = source.decrypt(blob, b"aad") == b"x" * 32 and source.decrypt(source.encrypt(b"y", b"b"), b"b") == b"y"
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert source.decrypt(blob, b"aad") == b"x" * 32


def test_a_lost_session_is_opened_again_once(softhsm: SoftHsm) -> None:
    source = open_source(softhsm.uri())
    source.prepare(create=True)
    source._link.token().session.close()  # the token forgets the session (as after a device reset)
    before = source.calls.total("session")
    assert source.decrypt(source.encrypt(b"z" * 32, b"a"), b"a") == b"z" * 32
    assert source.calls.total("session") == before + 1
