"""securepad: the hardened observation store for LLM agent runtimes."""

from .aio import AsyncScratchpad, AsyncTurn
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
