"""AWS KMS as the master key's source: ``aws-kms://arn:aws:kms:…`` (Tink's URI form).

Each wrapped key is one ``Encrypt``/``Decrypt`` whose encryption context
carries the associated data, so a wrapped key moved to another owner, version
or store does not decrypt. What this module enforces:

1. The URI names a key or alias ARN only: credentials come from boto3's chain.
2. Another endpoint comes from ``AWS_ENDPOINT_URL_KMS`` or ``AWS_ENDPOINT_URL``;
   plain ``http`` only to loopback.
3. Every call is bounded (``KmsLimits``); every failure is one typed line
   naming the URI and the call, never the encryption context.
4. A wrapped key carries its key's tag: a blob of another key fails before any call.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..errors import (
    IntegrityError,
    KeySourceError,
    KeySourceKeyError,
    KeySourceLoginError,
    KeySourceModuleError,
    KeySourceTokenError,
    KeySourceUnreachableError,
    KeySourceUriError,
    SecurepadError,
)
from .source import MasterKeySource, SourceCheck

__all__ = ["PREFIX", "AwsKmsSource", "KmsLimits"]

PREFIX = "aws-kms://"

# A key id is a UUID, or mrk-<32 hex> for a multi-Region key.
_ARN = re.compile(
    r"arn:aws(?:-[a-z]+)*:kms:(?P<region>[a-z]{2}(?:-[a-z]+)+-\d{1,2}):\d{12}:"
    r"(?P<resource>key/(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})"
    r"|alias/[A-Za-z0-9/_-]{1,250})"
)
# What a malformed URI may show of itself: ARN characters only (no '@', '+', '=').
_SHOWABLE = re.compile(r"[A-Za-z0-9:/_.-]{1,300}")

# A wrapped key: this format byte, the key's tag (``_tag``), KMS's ciphertext blob.
_FORMAT = b"\x01"
_TAG_BYTES = 8
# The encryption context's one entry: securepad's associated data, in base64.
_CONTEXT_KEY = "securepad-aad"

# What a store's KMS key must be: DescribeKey's field and value, the audit's check, what it shows,
# and why a new store refuses another value.
_FIT = (
    ("KeyState", "Enabled", "key-enabled", "key state {}", "is {}, not Enabled"),
    ("KeyUsage", "ENCRYPT_DECRYPT", "key-usage-encrypt-decrypt", "usage {}", "is for {}, not ENCRYPT_DECRYPT"),
    (
        "KeySpec",
        "SYMMETRIC_DEFAULT",
        "key-spec-symmetric",
        "key spec {}",
        "is {}, not a symmetric key (SYMMETRIC_DEFAULT)",
    ),
)
# KMS's error codes, by what they mean to the operator.
_INTEGRITY = frozenset({"InvalidCiphertextException", "IncorrectKeyException"})
_LOGIN = frozenset(
    {
        *("AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "InvalidClientTokenId"),
        *("InvalidSignatureException", "SignatureDoesNotMatch", "IncompleteSignature", "MissingAuthenticationToken"),
        *("ExpiredTokenException", "ExpiredToken"),
    }
)
_KEY = frozenset(
    {
        *("NotFoundException", "DisabledException", "KMSInvalidStateException", "InvalidKeyUsageException"),
        *("KeyUnavailableException", "InvalidArnException"),
    }
)
_BUSY = frozenset(
    {
        *("DependencyTimeoutException", "KMSInternalException", "ThrottlingException", "LimitExceededException"),
        *("ServiceUnavailable", "InternalFailure"),
    }
)


@dataclass(frozen=True)
class KmsLimits:
    """Per attempt a connect and a read deadline (seconds), and the attempts in all
    (botocore's standard retries): an unreachable KMS fails within 3 * (2 + 5) + 1 + 2 = 24 s."""

    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    max_attempts: int = 3


# A boto3 client is thread-safe but not fork-safe and costs tens of milliseconds to
# make: one per process, endpoint, region, credentials and limits.
_CLIENTS: dict[tuple[object, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()


class AwsKmsSource(MasterKeySource):
    """A KMS key as the master key; no call is made before the first use."""

    scheme: ClassVar[str] = "aws-kms"

    def __init__(self, arn: str, *, environ: Mapping[str, str] | None = None, limits: KmsLimits | None = None) -> None:
        """``environ`` (default ``os.environ``) gives the endpoint and credentials.
        Raises KeySourceUriError: ``arn`` is not a KMS key or alias ARN."""
        match = _ARN.fullmatch(arn)
        if match is None:
            raise KeySourceUriError(
                f"{_shown(arn)}: not a KMS key or alias ARN"
                " (aws-kms://arn:aws:kms:<region>:<account>:key/<key id>, or …:alias/<name>)"
            )
        super().__init__(PREFIX + arn)
        self._arn = arn
        self._region = match["region"]
        self._env = environ if environ is not None else os.environ
        self._limits = limits if limits is not None else KmsLimits()
        # The key's ARN: the URI's, or the alias's target once DescribeKey said it.
        self._key_arn: str | None = None if match["resource"].startswith("alias/") else arn
        self._usable = False  # DescribeKey found the key fit for a new store

    @classmethod
    def from_uri(cls, uri: str, *, environ: Mapping[str, str] | None = None) -> AwsKmsSource:
        """Raises KeySourceUriError: not ``aws-kms://``, a query or fragment, or no ARN."""
        if not uri.startswith(PREFIX):
            raise KeySourceUriError(f"an AWS KMS key URI starts with {PREFIX}")
        rest = uri[len(PREFIX) :]
        arn = re.split(r"[?#]", rest, maxsplit=1)[0]
        if arn != rest:
            raise KeySourceUriError(
                f"{_shown(arn)}: an aws-kms URI takes no parameters; credentials come from the AWS"
                " environment, another endpoint from AWS_ENDPOINT_URL_KMS"
            )
        return cls(arn, environ=environ)

    def prepare(self, *, create: bool = False) -> None:
        """Make the client; resolve an alias ARN, and with ``create`` check that the
        key is an enabled symmetric encryption key (one ``DescribeKey``; none is created).

        Raises:
            KeySourceModuleError: boto3 is not installed.
            KeySourceTokenError: the endpoint is unusable (plain http off loopback).
            KeySourceLoginError: no credentials, or they are rejected or not allowed.
            KeySourceKeyError: the key is absent, disabled, pending deletion,
                or not a symmetric encryption key.
            KeySourceUnreachableError: KMS did not answer within ``KmsLimits``.
        """
        self._client()
        if self._key_arn is not None and (self._usable or not create):
            return
        meta = self._describe()
        self._key_arn = str(meta["Arn"])
        if create:
            for field, value, _, _, refused in _FIT:
                if meta.get(field) != value:
                    raise KeySourceKeyError(f"{self.shown_uri}: the KMS key {refused.format(meta.get(field))}")
            self._usable = True

    def key_id(self) -> str:
        """The key's ARN (an alias resolved to the key it names)."""
        if self._key_arn is None:
            self.prepare()
        assert self._key_arn is not None
        return self._key_arn

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        key = self.key_id()
        answer = self._call(
            "encrypt", "Encrypt", KeyId=key, Plaintext=plaintext, EncryptionContext=_context(associated_data)
        )
        return _FORMAT + _tag(key) + bytes(answer["CiphertextBlob"])

    def decrypt(self, ciphertext: bytes, associated_data: bytes) -> bytes:
        """Raises IntegrityError: not this format, sealed under another key (no call
        is made), altered, or sealed with other associated data."""
        head = len(_FORMAT) + _TAG_BYTES
        if not isinstance(ciphertext, bytes) or len(ciphertext) <= head or ciphertext[:1] != _FORMAT:
            raise IntegrityError(f"a key wrapped by {self.shown_uri} is not in its format")
        key = self.key_id()
        if ciphertext[1:head] != _tag(key):
            raise IntegrityError(f"a key wrapped by {self.shown_uri} was sealed under another KMS key")
        context = _context(associated_data)
        answer = self._call(
            "decrypt", "Decrypt", CiphertextBlob=ciphertext[head:], KeyId=key, EncryptionContext=context
        )
        return bytes(answer["Plaintext"])

    def inspect(self) -> list[SourceCheck]:
        """The audit's facts about the key, from one ``DescribeKey``."""
        meta = self._describe()
        origin, endpoint = meta.get("Origin"), self._endpoint()
        where = f"; endpoint {_shown_endpoint(endpoint)}" if endpoint else ""
        imported = " (imported: a copy of the key may exist outside KMS)" if origin == "EXTERNAL" else ""
        return [
            *(
                SourceCheck(name, meta.get(field) == value, f"{self.shown_uri}: {shown.format(meta.get(field))}")
                for field, value, name, shown, _ in _FIT
            ),
            SourceCheck("key-material-in-kms", origin != "EXTERNAL", f"{self.shown_uri}: origin {origin}{imported}"),
            SourceCheck(
                "no-credentials-in-uri",
                True,
                f"the URI names the key only; credentials from the AWS environment{where}",
            ),
        ]

    def _describe(self) -> dict[str, Any]:
        return dict(self._call("attributes", "DescribeKey", KeyId=self._arn)["KeyMetadata"])

    def _call(self, counted: str, call: str, **params: Any) -> dict[str, Any]:
        client = self._client()
        from botocore import xform_name  # DescribeKey -> describe_key

        method = getattr(client, xform_name(call))
        self.calls.add(counted)
        try:
            return dict(method(**params))
        except Exception as exc:
            raise self._failure(exc, call) from None

    def _endpoint(self) -> str | None:
        return self._env.get("AWS_ENDPOINT_URL_KMS") or self._env.get("AWS_ENDPOINT_URL") or None

    def _client(self) -> Any:
        endpoint = self._endpoint()
        if endpoint is not None:
            _check_endpoint(endpoint, self.shown_uri)
        env = self._env
        # Keys in ``environ`` are handed to boto3 (so that the one given is used); else boto3's chain.
        access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        keys = (access, secret, env.get("AWS_SESSION_TOKEN")) if access and secret else (None, None, None)
        profile = None if access and secret else env.get("AWS_PROFILE")
        cache_key = (os.getpid(), self._region, endpoint, keys, profile, self._limits)
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(cache_key)
            if client is None:
                client = _CLIENTS[cache_key] = self._new_client(endpoint, keys, profile)
        return client

    def _new_client(self, endpoint: str | None, keys: tuple[str | None, ...], profile: str | None) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise KeySourceModuleError(
                f"{self.shown_uri}: the aws-kms source needs boto3: pip install 'securepad[aws-kms]'"
            ) from None
        limits = self._limits
        try:
            session = boto3.session.Session(
                aws_access_key_id=keys[0],
                aws_secret_access_key=keys[1],
                aws_session_token=keys[2],
                profile_name=profile,
                region_name=self._region,
            )
            return session.client(
                "kms",
                endpoint_url=endpoint,
                config=Config(
                    connect_timeout=limits.connect_timeout,
                    read_timeout=limits.read_timeout,
                    retries={"max_attempts": limits.max_attempts, "mode": "standard"},
                ),
            )
        except Exception as exc:
            raise self._failure(exc, "client") from None

    def _failure(self, exc: Exception, call: str) -> SecurepadError:
        from botocore import exceptions as bx

        where = f"{self.shown_uri}: KMS {call}"
        if isinstance(exc, bx.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            said = _one_line(str(error.get("Message", "")))
            detail = f"{code}: {said}" if said else code
            if code in _INTEGRITY and call == "Decrypt":
                return IntegrityError(
                    f"a key wrapped by {self.shown_uri} failed authentication"
                    " (altered, or sealed with other associated data)"
                )
            if code in _LOGIN or status in (401, 403):
                return KeySourceLoginError(f"{where} refused: access denied or credentials rejected ({detail})")
            if code in _KEY:
                return KeySourceKeyError(f"{where}: the key is absent, disabled or unusable ({detail})")
            if code in _BUSY or status >= 500:
                return KeySourceUnreachableError(f"{where} failed in {self._limits.max_attempts} attempts ({detail})")
            return KeySourceError(f"{where} failed ({detail})")
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError | bx.CredentialRetrievalError):
            return KeySourceLoginError(f"{where}: no usable AWS credentials ({type(exc).__name__})")
        if isinstance(exc, bx.ProfileNotFound | bx.NoRegionError | bx.InvalidRegionError):
            return KeySourceTokenError(f"{where}: the AWS profile, region or endpoint is unusable ({exc})")
        if isinstance(exc, bx.HTTPClientError | bx.EndpointConnectionError):
            endpoint = _shown_endpoint(self._endpoint()) or f"KMS in {self._region}"
            limits = self._limits
            return KeySourceUnreachableError(
                f"{where}: no answer from {endpoint} in {limits.max_attempts} attempts"
                f" ({limits.connect_timeout:g} s to connect, {limits.read_timeout:g} s to read each)"
            )
        if isinstance(exc, SecurepadError):
            return exc
        return KeySourceError(f"{where} failed ({type(exc).__name__})")


def _shown(arn: str) -> str:
    return PREFIX + arn if _SHOWABLE.fullmatch(arn) else PREFIX + "…"


def _tag(key_arn: str) -> bytes:
    """From the key id, which a multi-Region key's replicas share (they decrypt each other's blobs)."""
    return hashlib.sha256(key_arn.rsplit("/", 1)[-1].encode()).digest()[:_TAG_BYTES]


def _context(associated_data: bytes) -> dict[str, str]:
    return {_CONTEXT_KEY: base64.b64encode(associated_data).decode("ascii")}


def _one_line(text: str) -> str:
    """AWS's message when it is one short line of prose (not an XML page)."""
    text = " ".join(text.split())
    if text.startswith("<"):
        return ""
    return text if len(text) <= 300 else text[:299] + "…"


def _shown_endpoint(endpoint: str | None) -> str:
    if not endpoint:  # shown without user info
        return ""
    parts = urlsplit(endpoint)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


def _check_endpoint(endpoint: str, shown_uri: str) -> None:
    """Raises KeySourceTokenError: not a URL, or plain http off loopback (keys in clear off this machine)."""
    try:
        parts = urlsplit(endpoint)
        host, _ = parts.hostname or "", parts.port
    except ValueError:
        raise KeySourceTokenError(f"{shown_uri}: AWS_ENDPOINT_URL_KMS is not a URL") from None
    if (parts.scheme == "https" and host) or (parts.scheme == "http" and _loopback(host)):
        return
    raise KeySourceTokenError(
        f"{shown_uri}: KMS endpoint {_shown_endpoint(endpoint)} refused: https, or plain http to a loopback address"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
