"""psycopg_pool's warnings, relayed through the library's logger at a bounded rate.

During an outage psycopg_pool warns for every failed reconnection of every
pooled connection, and Python prints each on stderr. The relay takes the
"psycopg.pool" logger over (unless the application gave it handlers): the
first warning goes on to "securepad.postgres" at once, later ones within
``RELAY_INTERVAL_S`` are counted and reported with the next that goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["POOL_LOGGER", "RELAY_INTERVAL_S", "PoolLogRelay", "relay_pool_warnings"]

POOL_LOGGER = "psycopg.pool"
# At most one relayed warning per this many seconds.
RELAY_INTERVAL_S = 10.0
_install_lock = threading.Lock()


class PoolLogRelay(logging.Handler):
    """Passes a warning on to ``target``, then at most one per ``interval_s``,
    saying how many it held back meanwhile."""

    def __init__(
        self, target: logging.Logger, interval_s: float = RELAY_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(logging.WARNING)
        self._target, self._interval_s, self._clock = target, interval_s, clock
        self._gate = threading.Lock()
        self._next = float("-inf")
        self.held = 0  # warnings held back since the last one passed on

    def emit(self, record: logging.LogRecord) -> None:
        now = self._clock()
        with self._gate:
            if now < self._next:
                self.held += 1
                return
            held, self.held = self.held, 0
            self._next = now + self._interval_s
        more = f" ({held} more like it in the last {self._interval_s:g} s)" if held else ""
        self._target.warning("PostgreSQL connection pool: %s%s", record.getMessage(), more)


def relay_pool_warnings() -> None:
    """Install the relay on the "psycopg.pool" logger, once per process; a
    logger the application gave handlers of its own is left as it is."""
    pool_log = logging.getLogger(POOL_LOGGER)
    with _install_lock:
        if pool_log.handlers:
            return
        pool_log.addHandler(PoolLogRelay(logging.getLogger("securepad.postgres")))
        pool_log.propagate = False
