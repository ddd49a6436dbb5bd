"""``record_next``: record an observation as the turn's next free step.

It lives in ``turn.py`` (it needs the turn's parts); this module keeps the
import path the adapters use.
"""

from __future__ import annotations

from .turn import record_next

__all__ = ["record_next"]
