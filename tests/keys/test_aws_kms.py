"""The aws-kms master key source against moto's KMS server, IAM enforced: the
source alone (sealing, its failures, its URI); the store on it further down."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad.errors import (
    IntegrityError,
    KeySourceError,
    KeySourceKeyError,
    KeySourceLoginError,
    KeySourceModuleError,
    KeySourceTokenError,
    KeySourceUnreachableError,
    KeySourceUriError,
)
from securepad.keys.aws_kms import AwsKmsSource, KmsLimits
from securepad.keys.source import open_source
from tests.support.moto_kms import MotoKms

AAD = b"\x00\x00\x00\x09owner-key\x00\x00\x00\x05store\x00\x00\x00\x05alice\x00\x00\x00\x011"
KEY = bytes(range(32))


def test_a_key_sealed_by_kms_opens_with_the_same_associated_data(kms_key: str) -> None:
    source = open_source(kms_key)
    blob = source.encrypt(KEY, AAD)
    assert KEY not in blob
    assert source.decrypt(blob, AAD) == KEY
    assert source.calls.snapshot() == {"encrypt": 1, "decrypt": 1}


@given(plaintext=st.binary(min_size=1, max_size=64), aad=st.binary(max_size=300))
def test_any_small_secret_and_associated_data_round_trip(kms_key: str, plaintext: bytes, aad: bytes) -> None:
    source = open_source(kms_key)
    assert source.decrypt(source.encrypt(plaintext, aad), aad) == plaintext


def test_other_associated_data_fails_authentication(kms_key: str) -> None:
    source = open_source(kms_key)
    blob = source.encrypt(KEY, AAD)
    with pytest.raises(IntegrityError, match="failed authentication"):
        source.decrypt(blob, AAD.replace(b"alice", b"bobby"))


def test_an_altered_wrapped_key_fails_authentication(kms_key: str) -> None:
    source = open_source(kms_key)
    blob = bytearray(source.encrypt(KEY, AAD))
    blob[-1] ^= 1
    with pytest.raises(IntegrityError, match="failed authentication"):
        source.decrypt(bytes(blob), AAD)


def test_a_key_wrapped_under_another_kms_key_fails_authentication_without_a_call(
    kms_key: str, kms_env: MotoKms
) -> None:
    blob = open_source("aws-kms://" + kms_env.new_key()).encrypt(KEY, AAD)
    source = open_source(kms_key)
    with pytest.raises(IntegrityError, match="sealed under another KMS key"):
        source.decrypt(blob, AAD)
    assert source.calls.total() == 0


def test_a_blob_of_another_format_fails_without_a_call(kms_key: str) -> None:
    source = open_source(kms_key)
    with pytest.raises(IntegrityError, match="not in its format"):
        source.decrypt(b"\x02" + bytes(100), AAD)
    assert source.calls.total() == 0


def test_parsing_a_uri_makes_no_call(kms_key: str) -> None:
    source = open_source(kms_key)
    assert source.shown_uri == kms_key
    assert source.key_id() == kms_key.removeprefix("aws-kms://")
    assert source.calls.total() == 0


def test_an_alias_resolves_to_its_key_with_one_describe(kms_env: MotoKms) -> None:
    arn = kms_env.new_key()
    kms_env.client().create_alias(AliasName="alias/securepad-test", TargetKeyId=arn)
    alias_arn = arn.split(":key/")[0] + ":alias/securepad-test"
    source = open_source("aws-kms://" + alias_arn)
    assert source.key_id() == arn
    assert source.calls.snapshot() == {"attributes": 1}
    assert source.decrypt(source.encrypt(KEY, AAD), AAD) == KEY


def test_a_new_store_checks_the_key_is_a_usable_symmetric_key(kms_key: str) -> None:
    source = open_source(kms_key)
    source.prepare(create=True)
    source.prepare(create=True)
    assert source.calls.snapshot() == {"attributes": 1}


def test_a_disabled_key_is_refused_for_a_new_store_and_the_audit_says_so(kms_env: MotoKms) -> None:
    arn = kms_env.new_key()
    kms_env.client().disable_key(KeyId=arn.rsplit("/", 1)[1])
    source = open_source("aws-kms://" + arn)
    with pytest.raises(KeySourceKeyError, match=r"^aws-kms://arn:aws:kms:.*is Disabled, not Enabled$"):
        source.prepare(create=True)
    checks = {c.name: c for c in source.inspect()}
    assert not checks["key-enabled"].ok


def test_a_signing_key_is_refused_for_a_new_store(kms_env: MotoKms) -> None:
    arn = kms_env.new_key(KeyUsage="SIGN_VERIFY", KeySpec="ECC_NIST_P256")
    with pytest.raises(KeySourceKeyError, match="not ENCRYPT_DECRYPT"):
        open_source("aws-kms://" + arn).prepare(create=True)


def test_an_absent_key_is_a_typed_error_naming_the_uri(kms_env: MotoKms) -> None:
    arn = kms_env.new_key()
    absent = arn[:-12] + "000000000000"
    source = open_source("aws-kms://" + absent)
    with pytest.raises(KeySourceKeyError) as caught:
        source.encrypt(KEY, AAD)
    message = str(caught.value)
    assert message.startswith(f"aws-kms://{absent}: KMS Encrypt: the key is absent")
    assert "\n" not in message


def test_access_denied_is_a_typed_error(kms_key: str, kms_env: MotoKms, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = open_source(kms_key).encrypt(KEY, AAD)
    for name, value in kms_env.aws_environment("no-decrypt").items():
        monkeypatch.setenv(name, value)
    source = open_source(kms_key)
    with pytest.raises(KeySourceLoginError, match=r"KMS Decrypt refused: access denied") as caught:
        source.decrypt(blob, AAD)
    assert "\n" not in str(caught.value)


def test_rejected_credentials_are_a_typed_error(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(KeySourceLoginError) as caught:
        open_source(kms_key).encrypt(KEY, AAD)
    assert "not-the-secret" not in str(caught.value)


def test_no_credentials_is_a_typed_error(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(KeySourceLoginError, match="no usable AWS credentials"):
        open_source(kms_key).encrypt(KEY, AAD)


def test_a_closed_port_is_unreachable_after_bounded_retries(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", f"http://127.0.0.1:{port}")
    with pytest.raises(KeySourceUnreachableError, match=rf"no answer from http://127.0.0.1:{port} in 3 attempts"):
        open_source(kms_key).encrypt(KEY, AAD)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An endpoint that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_silent_endpoint_hits_the_read_deadline(kms_key: str, silent_server: str, kms_env: MotoKms) -> None:
    env = {**kms_env.aws_environment(), "AWS_ENDPOINT_URL_KMS": silent_server}
    source = AwsKmsSource(
        kms_key.removeprefix("aws-kms://"),
        environ=env,
        limits=KmsLimits(connect_timeout=0.5, read_timeout=0.2, max_attempts=2),
    )
    with pytest.raises(KeySourceUnreachableError, match=r"in 2 attempts \(0.5 s to connect, 0.2 s to read each\)"):
        source.encrypt(KEY, AAD)
    assert source.calls.snapshot() == {"encrypt": 1}


def test_plain_http_off_loopback_is_refused(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", "http://kms.example.com")
    with pytest.raises(KeySourceTokenError, match="https, or plain http to a loopback address"):
        open_source(kms_key).encrypt(KEY, AAD)


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("aws-kms://arn:aws:kms:us-east-1:123456789012:key/x", "aws-kms://arn:aws:kms:us-east-1:123456789012:key/x"),
        ("aws-kms://AKIAEXAMPLE:se+cret@kms", "aws-kms://…"),
        ("aws-kms://arn:aws:kms:us-east-1:123456789012:key/1?secret=s3cr3t", "key/1: an aws-kms URI takes no"),
        ("aws-kms://arn:aws:kms:us-east-1:123456789012:alias/a#frag", "takes no parameters"),
        ("aws-kms:arn:aws:kms:us-east-1:123456789012:key/x", "starts with aws-kms://"),
    ],
)
def test_a_malformed_uri_is_refused_without_echoing_secrets(uri: str, shown: str) -> None:
    with pytest.raises(KeySourceUriError) as caught:
        open_source(uri)
    assert shown in str(caught.value)
    assert "s3cr3t" not in str(caught.value) and "se+cret" not in str(caught.value)


def test_the_source_shows_its_uri_and_cannot_be_pickled(kms_key: str) -> None:
    source = open_source(kms_key)
    assert repr(source) == f"<AwsKmsSource {kms_key}>"
    with pytest.raises(TypeError):
        pickle.dumps(source)


def test_the_audit_facts_of_a_good_key(kms_key: str) -> None:
    checks = {c.name: c for c in open_source(kms_key).inspect()}
    assert all(c.ok for c in checks.values()), checks
    assert set(checks) == {
        "key-enabled",
        "key-usage-encrypt-decrypt",
        "key-spec-symmetric",
        "key-material-in-kms",
        "no-credentials-in-uri",
    }


def test_without_boto3_the_source_says_which_extra_to_install(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    source = AwsKmsSource(
        kms_key.removeprefix("aws-kms://"), environ={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "fresh"}
    )
    with pytest.raises(KeySourceModuleError, match=r"needs boto3: pip install 'securepad\[aws-kms\]'"):
        source.prepare()


def test_an_unknown_profile_is_a_typed_error(kms_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(KeySourceTokenError, match="the AWS profile, region or endpoint is unusable"):
        open_source(kms_key).encrypt(KEY, AAD)


def test_any_other_refusal_by_kms_is_still_one_typed_line(kms_key: str) -> None:
    with pytest.raises(KeySourceError) as caught:
        open_source(kms_key).encrypt(bytes(5000), AAD)  # past KMS's 4 KiB plaintext limit
    assert type(caught.value) is KeySourceError
    assert str(caught.value).startswith(f"{kms_key}: KMS Encrypt failed (ValidationException")
    assert "\n" not in str(caught.value)


def test_a_forked_child_unwraps_with_its_parents_source(kms_key: str) -> None:
    source = open_source(kms_key)
    blob = source.encrypt(KEY, AAD)  # the parent's client exists now
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: the same source object, a client of its own (per process)
        try:
            os.write(write, source.decrypt(blob, AAD))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == KEY
    assert os.waitpid(child, 0)[1] == 0
    assert source.decrypt(blob, AAD) == KEY
