"""The read modes and the bounds of their arguments, shared by the reads
(``read_modes``) and the model's read tool (``tool``): plain constants, so
that the tool's schema is built without loading the reads themselves."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_MATCHES", "DEFAULT_N", "MAX_CONTEXT", "MODES"]

MODES = ("head", "tail", "range", "full", "lines", "grep")
DEFAULT_N = 2000
DEFAULT_MAX_MATCHES = 50
# Context lines around each grep match, before and after.
MAX_CONTEXT = 50
