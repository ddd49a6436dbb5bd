"""The command line with the master key in a PKCS#11 token (SoftHSM2):
``--master-key-uri``, ``SECUREPAD_MASTER_KEY_URI``, a rotation to and from a
key file, ``stats`` and ``audit`` naming the source, typed one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.support.cli_runner import Cli, as_json, ok, put
from tests.support.softhsm import SoftHsm

pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def token_cli(cli: Cli, softhsm: SoftHsm) -> Cli:
    return cli


def test_init_put_get_through_the_option_and_the_variable(token_cli: Cli, softhsm: SoftHsm) -> None:
    uri = softhsm.uri()
    init = as_json(token_cli("--json", "--master-key-uri", uri, "init"))
    assert init["key"].startswith("<Keyring pkcs11: pkcs11:token=securepad;object=")
    assert not token_cli.key.exists()  # no key file is made for a store on a token key
    env = {"SECUREPAD_MASTER_KEY_URI": uri}
    view = as_json(
        token_cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", input="on a token\n", env=env)
    )
    got = ok(token_cli("get", "--owner", "bob", view["scratchpad_id"], env=env))
    assert got.stdout == "on a token\n"
    assert not token_cli.key.exists()


def test_stats_names_the_token_key_without_its_pin(token_cli: Cli, softhsm: SoftHsm) -> None:
    uri = softhsm.uri(pin="value")
    ok(token_cli("--master-key-uri", uri, "init"))
    stats = as_json(token_cli("--json", "--master-key-uri", uri, "stats"))
    assert stats["master_key"].startswith("pkcs11:token=securepad;serial=")
    assert softhsm.user_pin not in json.dumps(stats)


def test_the_audit_passes_on_a_token_key_and_says_so(token_cli: Cli, softhsm: SoftHsm) -> None:
    uri = softhsm.uri()
    ok(token_cli("--master-key-uri", uri, "init"))
    report = as_json(token_cli("--json", "--master-key-uri", uri, "audit"))
    rows = {row["name"]: row for row in report["results"]}
    assert report["passed"], [r for r in report["results"] if not r["passed"]]
    source = rows["master key source"]["happened"]
    assert "cannot be read out of the token" in source and "never shown" in source
    assert "no key file recorded" in rows["no key file left for a token or KMS key"]["happened"]


def test_the_audit_fails_a_pin_in_the_uri(token_cli: Cli, softhsm: SoftHsm) -> None:
    uri = softhsm.uri(pin="value")
    ok(token_cli("--master-key-uri", uri, "init"))
    result = token_cli("--json", "--master-key-uri", uri, "audit")
    assert result.exit_code != 0
    rows = {row["name"]: row for row in json.loads(result.stdout)["results"]}
    assert not rows["master key source"]["passed"]
    assert "pin-not-in-uri" in rows["master key source"]["happened"]
    assert softhsm.user_pin not in result.stdout + result.stderr


def test_rotate_master_to_a_token_key_and_back_to_a_key_file(token_cli: Cli, softhsm: SoftHsm) -> None:
    ok(token_cli("init"))
    entry = put(token_cli, 1, "kept\n")
    uri = softhsm.uri()
    report = as_json(token_cli("--json", "keys", "rotate-master", "--new-master-key-uri", uri))
    assert report["owner_keys_rewrapped"] == 1 and report["source"] == "pkcs11"
    assert "--master-key-uri pkcs11:token=securepad" in report["next"] and str(token_cli.key) in report["next"]
    refused = token_cli("get", "--owner", "bob", entry)
    assert refused.exit_code != 0 and "held by pkcs11:token=securepad" in refused.stderr
    assert ok(token_cli("--master-key-uri", uri, "get", "--owner", "bob", entry)).stdout == "kept\n"
    audit = token_cli("--json", "--master-key-uri", uri, "audit")
    rows = {row["name"]: row for row in json.loads(audit.stdout)["results"]}
    assert not rows["no key file left for a token or KMS key"]["passed"]  # the old key file still opens old copies
    new_key = token_cli.key.parent / "new.key"  # beside the first: where the store's anchor is
    ok(token_cli("--master-key-uri", uri, "keys", "rotate-master", "--new-key-file", str(new_key)))
    assert ok(token_cli("--key-file", str(new_key), "get", "--owner", "bob", entry)).stdout == "kept\n"


def test_a_key_option_on_the_command_line_wins_over_the_variable(token_cli: Cli, softhsm: SoftHsm) -> None:
    ok(token_cli("init"))
    entry = put(token_cli, 1, "file\n")
    env = {"SECUREPAD_MASTER_KEY_URI": softhsm.uri()}
    got = token_cli("--key-file", str(token_cli.key), "get", "--owner", "bob", entry, env=env)
    assert ok(got).stdout == "file\n"


def test_two_key_options_and_two_new_keys_are_usage_errors(token_cli: Cli, softhsm: SoftHsm) -> None:
    result = token_cli("--master-key-uri", softhsm.uri(), "--key-file", "k", "init")
    assert result.exit_code == 2 and "two key sources" in result.stderr
    ok(token_cli("init"))
    both = token_cli("keys", "rotate-master", "--new-master-key-uri", softhsm.uri(), "--new-key-file", "k2")
    assert both.exit_code == 2 and "exactly one of" in both.stderr
    install = token_cli("keys", "rotate-master", "--install", "--new-master-key-uri", softhsm.uri())
    assert install.exit_code == 2 and "--install installs a key file" in install.stderr


@pytest.mark.parametrize(
    "case, error",
    [
        ("malformed", "KeySourceUriError"),
        ("no module", "KeySourceModuleError"),
        ("no token", "KeySourceTokenError"),
        ("wrong pin", "KeySourceLoginError"),
        ("no key", "KeySourceKeyError"),
    ],
)
def test_each_source_failure_is_one_typed_line_without_the_pin(
    token_cli: Cli, softhsm: SoftHsm, case: str, error: str
) -> None:
    from tests.support.softhsm import PIN_TRIALS_TOKEN

    ok(token_cli("--master-key-uri", softhsm.uri("exists"), "init"))
    uris = {
        "malformed": softhsm.uri(pin="value").replace("object=", "colour=red;object="),
        "no module": softhsm.uri("exists", pin="value").replace(softhsm.module, "/nonexistent/libp11.so"),
        "no token": softhsm.uri("exists", token="no-such-token", pin="value"),
        "wrong pin": softhsm.uri("exists", token=PIN_TRIALS_TOKEN, pin="env:WRONG_PIN"),
        "no key": softhsm.uri("absent", pin="value"),
    }
    result = token_cli("--json", "--master-key-uri", uris[case], "stats", env={"WRONG_PIN": "0000-0000"})
    assert result.exit_code != 0
    failure = json.loads(result.stderr)["error"]
    assert failure["type"] == error, failure
    assert "\n" not in failure["message"] and softhsm.user_pin not in result.stderr + result.stdout
