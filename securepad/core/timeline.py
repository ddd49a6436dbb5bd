"""The time an open store trusts for expiry: its clock, and a caller's ``now``
within bounds.

Expiry compares each entry's sealed ``expires_at`` with a time the store is
given. The sealed times are the store's; the time of a call is trusted from
this host: the clock (``time.time`` unless the store was opened with
another), or a ``now`` the caller passes. This module bounds what a caller's
``now`` may say:

- ``now`` is a finite number of seconds (NaN would make every comparison
  false, infinity every entry expired or eternal);
- the ``now`` of a call that writes or deletes by it (a put, a record, an
  extension, gc and so the start of a turn) is at most the policy's
  ``max_clock_skew_seconds`` past this host's clock: no call seals a time
  ahead of the clock (a put at ``now = 1e300`` would be expired at its own
  creation) or collects every owner's live entries ahead of time. A read's
  ``now`` is not bounded so: it persists nothing and hides entries from its
  own caller only;
- once an open store has reported an entry expired at a time (within the
  skew of the clock), the entry is not served again to an earlier ``now``:
  its later reads decide at that time or later. What a caller's ``now``
  moves for every owner is bounded by the clock: all reads decide at no
  earlier than the latest such time up to the clock at which it was
  reported; a time past the clock is remembered for that one entry alone, so
  that no caller expires another owner's entries ahead of the clock.

What is not bounded: this host's clock itself, and other processes: the
store keeps no time of its own, so another process (or host) with an
earlier clock or ``now`` serves an entry this one found expired, until gc
deletes it (a deletion is final). Hosts that share a store trust their own
clocks; docs/reliability.md says what skew between them does.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import IntegrityError, InvalidArgumentError

__all__ = ["Timeline", "check_now", "live"]

# This host's clock (as imported: a clock put in its place later is checked as any other).
_HOST_CLOCK = time.time


def check_now(now: object) -> float:
    """A finite number of seconds.

    Raises:
        InvalidArgumentError: not a number, or not finite.
    """
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise InvalidArgumentError(f"now must be a number of seconds, not {type(now).__name__}")
    try:
        value = float(now)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise InvalidArgumentError(f"now must be a finite number of seconds, not {value}")
    return value


class Timeline:
    """The times one open store uses for expiry. Safe to share between threads."""

    def __init__(self, clock: Callable[[], float], max_skew_seconds: float) -> None:
        self._clock = clock
        self._skew = float(max_skew_seconds)
        self._lock = threading.Lock()
        # The latest time, up to the clock then, at which this store told a
        # caller an entry had expired: no read of any owner decides earlier.
        self._expired_by = -math.inf
        # Entries reported expired at a time past the clock (within the skew),
        # by id: until the clock reaches that time it holds for that entry only.
        self._ahead: dict[str, float] = {}

    def read_time(self, given: object | None) -> float:
        """The time a read decides expiry at: ``given`` or the clock's, never
        before a time at which this store already reported an entry expired.
        A read persists nothing: a ``now`` ahead of the clock only hides
        entries from its own caller (the audit reads at expiry instants this
        way).

        Raises:
            InvalidArgumentError: ``given`` is not a finite number of seconds.
        """
        return max(check_now(self._clock() if given is None else given), self._expired_by)

    def entry_time(self, entry_id: str, given: object | None) -> float:
        """The time a read of the one entry ``entry_id`` decides at: ``read_time``,
        or a later time at which this store already reported that entry expired.

        Raises:
            InvalidArgumentError: ``given`` is not a finite number of seconds.
        """
        return max(self.read_time(given), self._ahead.get(entry_id, -math.inf))

    def found_expired(self, entry_id: str, at: float) -> None:
        """A read at ``at`` reported entry ``entry_id`` expired: later reads
        decide at ``at`` or later for that entry, and at ``at`` or later, up to
        the clock's time now, for every entry. A caller's ``now`` ahead of the
        clock so moves no other entry's expiry; past the clock by more than the
        skew it does not count at all (it only hid the entry from that caller)."""
        clock = self._clock()
        if type(clock) is not float or not -math.inf < clock < math.inf:  # a finite float passes as it is
            clock = check_now(clock)
        if at > clock + self._skew:
            return
        with self._lock:
            self._expired_by = max(self._expired_by, min(at, clock))
            if at > clock:
                self._ahead[entry_id] = max(at, self._ahead.get(entry_id, -math.inf))
            # A time the clock has reached holds for every entry: the floor has it.
            for passed, when in [(name, when) for name, when in self._ahead.items() if when <= clock]:
                self._expired_by = max(self._expired_by, when)
                del self._ahead[passed]

    @property
    def write_clock(self) -> Callable[[], float]:
        """What a write given no ``now`` reads its time from (``write_time(None)``): this
        host's clock itself when it is ``time.time`` (a finite float, nothing to check)."""
        return self._clock if self._clock is _HOST_CLOCK else functools.partial(self.write_time, None)

    def write_time(self, given: object | None) -> float:
        """The time a write seals (a put's ``created_at``, an extension's
        expiry) or gc collects at: ``given`` (at most the skew past this host's
        clock) or the clock's.

        Raises:
            InvalidArgumentError: ``given`` is not a finite number, or is more
                than the skew past the clock.
        """
        clock = self._clock()
        if type(clock) is not float or not -math.inf < clock < math.inf:  # a finite float passes as it is
            clock = check_now(clock)
        if given is None:
            return clock
        value = check_now(given)
        if value > clock + self._skew:
            raise InvalidArgumentError(
                f"now ({value:.3f}) is {value - clock:.0f} s past this host's clock ({clock:.3f}), more than"
                f" the policy's max_clock_skew_seconds ({self._skew:.0f}): nothing is stored, extended or"
                " collected ahead of time"
            )
        return value


def live(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The rows that expire after ``now`` (filtered here, not in the query,
    so that a turn's lookup keeps to the turn's index).

    Raises:
        IntegrityError: a clear expiry that is not a number.
    """
    for row in rows:
        if not isinstance(row["expires_at"], (float, int)):  # a tuple: ``float | int`` is made anew each time
            raise IntegrityError("the entry's clear expires_at has the wrong type")
    return [row for row in rows if row["expires_at"] > now]
