"""The command line with the master key in AWS KMS (moto's server, IAM
enforced): ``--master-key-uri aws-kms://…`` and ``SECUREPAD_MASTER_KEY_URI``
on a fresh HOME, a rotation to and from a key file, ``stats`` and ``audit``
naming the key, and each failure as one typed line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_runner import Cli, as_json, ok, put
from tests.support.moto_kms import MotoKms

pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def kms_cli(cli: Cli, kms_env: MotoKms) -> Cli:
    """``cli`` whose runs see kms_env's AWS variables (the runner keeps the process's environment)."""
    return cli


def test_init_put_get_through_the_option_and_the_variable(kms_cli: Cli, kms_key: str) -> None:
    init = as_json(kms_cli("--json", "--master-key-uri", kms_key, "init"))
    assert init["key"] == f"<Keyring aws-kms: {kms_key}>"
    assert not kms_cli.key.exists()  # no key file for a store on a KMS key
    by_variable = {"SECUREPAD_MASTER_KEY_URI": kms_key}
    view = as_json(
        kms_cli("--json", "put", "--owner", "bob", "--turn", "t", "--step", "1", input="in kms\n", env=by_variable)
    )
    got = ok(kms_cli("get", "--owner", "bob", view["scratchpad_id"], env=by_variable))
    assert got.stdout == "in kms\n"
    assert not kms_cli.key.exists()


def test_stats_names_the_kms_key(kms_cli: Cli, kms_key: str) -> None:
    ok(kms_cli("--master-key-uri", kms_key, "init"))
    stats = as_json(kms_cli("--json", "--master-key-uri", kms_key, "stats"))
    assert stats["master_key"] == kms_key.removeprefix("aws-kms://")


def test_the_audit_passes_on_a_kms_key_and_says_so(kms_cli: Cli, kms_key: str) -> None:
    ok(kms_cli("--master-key-uri", kms_key, "init"))
    report = as_json(kms_cli("--json", "--master-key-uri", kms_key, "audit"))
    rows = {row["name"]: row for row in report["results"]}
    assert report["passed"], [r for r in report["results"] if not r["passed"]]
    source = rows["master key source"]["happened"]
    assert "key state Enabled" in source and "SYMMETRIC_DEFAULT" in source


def test_the_audit_fails_a_disabled_kms_key(kms_cli: Cli, kms_env: MotoKms, kms_key: str) -> None:
    ok(kms_cli("--master-key-uri", kms_key, "init"))
    kms_env.client().disable_key(KeyId=kms_key.rsplit("/", 1)[1])
    result = kms_cli("--json", "--master-key-uri", kms_key, "audit")
    assert result.exit_code != 0
    rows = {row["name"]: row for row in json.loads(result.stdout)["results"]}
    assert not rows["master key source"]["passed"]
    assert "key state Disabled" in rows["master key source"]["happened"]


def test_rotate_master_to_a_kms_key_and_back_to_a_key_file(kms_cli: Cli, kms_key: str, tmp_path: Path) -> None:
    kms_cli.env["SECUREPAD_ANCHOR"] = str(tmp_path / "anchor")  # one anchor whichever key opens the store
    ok(kms_cli("init"))
    entry = put(kms_cli, 1, "kept\n")
    report = as_json(kms_cli("--json", "keys", "rotate-master", "--new-master-key-uri", kms_key))
    assert report["owner_keys_rewrapped"] == 1 and report["source"] == "aws-kms"
    assert f"--master-key-uri {kms_key}" in report["next"]
    refused = kms_cli("get", "--owner", "bob", entry)
    assert refused.exit_code != 0 and f"held by {kms_key.removeprefix('aws-kms://')}" in refused.stderr
    assert ok(kms_cli("--master-key-uri", kms_key, "get", "--owner", "bob", entry)).stdout == "kept\n"
    new_key = tmp_path / "new.key"
    ok(kms_cli("--master-key-uri", kms_key, "keys", "rotate-master", "--new-key-file", str(new_key)))
    assert ok(kms_cli("--key-file", str(new_key), "get", "--owner", "bob", entry)).stdout == "kept\n"


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("malformed", "KeySourceUriError"),
        ("absent key", "KeySourceKeyError"),
        ("disabled key", "KeySourceKeyError"),
        ("access denied", "KeySourceLoginError"),
        ("unreachable", "KeySourceUnreachableError"),
    ],
)
def test_each_kms_failure_is_one_typed_line_naming_the_uri(
    kms_cli: Cli, kms_env: MotoKms, kms_key: str, case: str, error: str
) -> None:
    uri, env = kms_key, {}
    if case == "malformed":
        uri = kms_key + "?secret=s3cr3t"
    elif case == "absent key":
        uri = kms_key[:-12] + "000000000000"
    elif case == "disabled key":
        kms_env.client().disable_key(KeyId=kms_key.rsplit("/", 1)[1])
    elif case == "access denied":
        ok(kms_cli("--master-key-uri", kms_key, "init"))
        env = kms_env.aws_environment("no-decrypt")
    else:
        env = {"AWS_ENDPOINT_URL_KMS": "http://127.0.0.1:9"}
    result = kms_cli("--json", "--master-key-uri", uri, "init" if case != "access denied" else "stats", env=env)
    assert result.exit_code != 0
    failure = json.loads(result.stderr)["error"]
    assert failure["type"] == error, failure
    assert "\n" not in failure["message"] and uri.split("?")[0] in failure["message"]
    assert "s3cr3t" not in result.stderr + result.stdout
