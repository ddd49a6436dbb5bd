"""securepad: the hardened observation store for LLM agent runtimes."""

from typing import TYPE_CHECKING, Any

from .core.tool import SCRATCHPAD_READ_TOOL, SCRATCHPAD_READ_TOOL_STRICT
from .errors import (
    ExpiredError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    PolicyError,
    QuotaExceededError,
    SecurepadError,
    StorageFullError,
    StoreBusyError,
    StoreCorruptError,
    StoreUnavailableError,
    WrongKeyError,
)
from .keys.keyring import Keyring
from .policy import Policy
from .principal import Principal
from .store import Entry, Scratchpad
from .turn import Turn

if TYPE_CHECKING:
    from .aio import AsyncScratchpad, AsyncTurn

__all__ = [
    "SCRATCHPAD_READ_TOOL",
    "SCRATCHPAD_READ_TOOL_STRICT",
    "AsyncScratchpad",
    "AsyncTurn",
    "Entry",
    "ExpiredError",
    "IntegrityError",
    "InvalidArgumentError",
    "Keyring",
    "NotFoundError",
    "Policy",
    "PolicyError",
    "Principal",
    "QuotaExceededError",
    "Scratchpad",
    "SecurepadError",
    "StorageFullError",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreUnavailableError",
    "Turn",
    "WrongKeyError",
]


def __getattr__(name: str) -> Any:
    """The asyncio faces, imported when first named: ``import securepad`` (and
    every command of the command line) does not load asyncio."""
    if name in ("AsyncScratchpad", "AsyncTurn"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
