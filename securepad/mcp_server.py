"""The MCP server's former module path, kept for one release.

Import :mod:`securepad.integrations.mcp` instead; this module re-exports its
public names.
"""

from .integrations.mcp import *  # noqa: F403
from .integrations.mcp import __all__  # noqa: F401
