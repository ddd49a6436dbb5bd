"""securepad: the hardened observation store for LLM agent runtimes."""

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .aio import AsyncScratchpad, AsyncTurn
    from .core.tool import SCRATCHPAD_READ_TOOL, SCRATCHPAD_READ_TOOL_STRICT
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

# The names beside the errors, each imported from its module when first named:
# ``import securepad`` (and every command of the command line) loads only what
# it uses; the store's layers, the key sources and asyncio wait until named.
_LAZY = {
    "SCRATCHPAD_READ_TOOL": ".core.tool",
    "SCRATCHPAD_READ_TOOL_STRICT": ".core.tool",
    "AsyncScratchpad": ".aio",
    "AsyncTurn": ".aio",
    "Entry": ".store",
    "Keyring": ".keys.keyring",
    "Policy": ".policy",
    "Principal": ".principal",
    "Scratchpad": ".store",
    "Turn": ".turn",
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, imported when first named (and kept as an attribute)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
