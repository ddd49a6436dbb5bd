"""A local AWS KMS for the tests: moto's stand-alone server on 127.0.0.1.

``start_moto`` runs ``moto_server`` as a child process on a free loopback
port. ``enforce_iam`` then turns on moto's IAM checks: from there on every
request must be signed by an IAM user ``add_user`` made, and is checked
against that user's policy, so a test acting as the ``securepad`` user (the
documented actions, no more) fails if the source calls anything else.
``aws_environment`` is what a process needs to act as one of those users;
the fixtures (``moto_kms``, ``kms_env``, ``kms_key``) are in tests/conftest.py.

moto checks less than AWS does (docs/how-to/aws-kms.md says what): it
evaluates identity policies against ``"Resource": "*"`` only, and it
encrypts and decrypts under a disabled key.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGION = "us-east-1"

# What securepad's aws-kms source calls (docs/how-to/aws-kms.md, the IAM policy).
SECUREPAD_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:DescribeKey"]

# Every AWS variable a test must not inherit from the machine it runs on.
AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_KMS",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@dataclass
class MotoKms:
    """A running moto server and the IAM users made on it."""

    endpoint: str
    process: subprocess.Popen[bytes]
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (access key id, secret)

    def client(self, service: str = "kms", user: str = "admin") -> Any:
        import boto3

        access, secret = self.users.get(user, ("setup", "setup"))
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
        )

    def new_key(self, **options: Any) -> str:
        """A new KMS key's ARN: symmetric, for encryption, unless ``options``
        say otherwise (moto leaves the usage unset when it is not given)."""
        options = {"KeyUsage": "ENCRYPT_DECRYPT", "KeySpec": "SYMMETRIC_DEFAULT", **options}
        return str(self.client().create_key(Description="securepad test master key", **options)["KeyMetadata"]["Arn"])

    def add_user(self, name: str, actions: list[str]) -> None:
        """An IAM user allowed ``actions`` (on ``"Resource": "*"``: moto matches no other)."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        self.users[name] = (key["AccessKeyId"], key["SecretAccessKey"])

    def enforce_iam(self) -> None:
        """From now on moto checks every request's signature and the user's policy."""
        request = urllib.request.Request(
            self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def aws_environment(self, user: str = "securepad") -> dict[str, str]:
        """The variables a process needs to act as ``user`` against this server."""
        access, secret = self.users[user]
        return {"AWS_ENDPOINT_URL_KMS": self.endpoint, "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(log: Path) -> MotoKms:
    """moto_server on a free loopback port, answering (a few tries: the port
    is chosen before the server binds it).

    Raises:
        RuntimeError: moto_server is not installed or does not start.
    """
    command = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if command is None:
        raise RuntimeError("moto_server is not installed: pip install -e '.[test]' installs moto[server]")
    for _ in range(5):
        endpoint = f"http://127.0.0.1:{_free_port()}"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [command, "-H", "127.0.0.1", "-p", endpoint.rsplit(":", 1)[1]],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(endpoint + "/moto-api/data.json", timeout=1):
                    return MotoKms(endpoint, process)
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        process.kill()
        process.wait()
    raise RuntimeError(f"moto_server did not start; its log: {log}")
