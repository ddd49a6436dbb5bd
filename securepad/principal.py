"""Who is asking: ``Principal(owner_user_id, actor, channel)``."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidArgumentError

__all__ = ["Principal"]

# A step is an integer from 0 to STEP_LIMIT - 1 (a signed 32-bit column on PostgreSQL).
STEP_LIMIT = 2**31

# Identifiers go into SQL parameters, AAD and HKDF info; bounding them keeps
# headers small and rejects junk early with a typed error.
MAX_IDENTIFIER_CHARS = 256


def check_identifier(name: str, value: object) -> str:
    """Return ``value`` if it is a usable identifier, else raise InvalidArgumentError."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > MAX_IDENTIFIER_CHARS:
        raise InvalidArgumentError(f"{name} must have 1 to {MAX_IDENTIFIER_CHARS} characters")
    if "\x00" in value or not value.isprintable():
        raise InvalidArgumentError(f"{name} must not contain control characters")
    return value


def check_step_num(step_num: object) -> None:
    """Raise InvalidArgumentError unless ``step_num`` is an integer from 0 to 2**31-1."""
    if isinstance(step_num, bool) or not isinstance(step_num, int) or not 0 <= step_num < STEP_LIMIT:
        raise InvalidArgumentError(f"step_num must be an integer from 0 to 2**31-1, not {step_num!r}")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of every store operation.

    ``owner_user_id`` is the tenant boundary: no policy lets one owner read
    another's entries. ``actor`` (the agent or sub-agent) and ``channel``
    (web, slack, cli...) narrow access inside an owner when the policy's
    scope asks for it.

    Raises:
        InvalidArgumentError: a field is not a non-empty printable string of
            at most 256 characters.
    """

    owner_user_id: str
    actor: str
    channel: str

    def __post_init__(self) -> None:
        check_identifier("owner_user_id", self.owner_user_id)
        check_identifier("actor", self.actor)
        check_identifier("channel", self.channel)
