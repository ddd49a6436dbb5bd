"""One fixture for every master key source: ``master_key_uri`` is a fresh
key's URI on each source whose test support is present (a SoftHSM2 token;
an AWS KMS key on the local emulator), so the behaviour every source owes
(tests/keys/test_source.py) is written once."""

from __future__ import annotations

import importlib.util

import pytest

#: (source, the fixture that gives a fresh key's URI), for the sources whose support is present.
SOURCES = [("pkcs11", "softhsm")] + (
    [("aws-kms", "kms_key")] if importlib.util.find_spec("tests.support.moto_kms") is not None else []
)


@pytest.fixture(
    params=[pytest.param(name, marks=pytest.mark.slow) if name == "aws-kms" else name for name, _ in SOURCES]
)
def master_key_uri(request: pytest.FixtureRequest) -> str:
    """A URI naming a new key on one source (each source in turn); the KMS
    emulator's runs are server runs, left out of ``-m "not slow"``."""
    fixture = dict(SOURCES)[request.param]
    value = request.getfixturevalue(fixture)
    return str(value.uri()) if request.param == "pkcs11" else str(value)
