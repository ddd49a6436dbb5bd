"""Summaries of latency samples: median, p90, p99, max, throughput."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples: Sequence[float], *, nbytes: int | None = None, wall_s: float | None = None) -> dict[str, Any]:
    """Latency figures in seconds, and throughput: over ``wall_s`` when the operations
    ran concurrently, else over their sum; ``nbytes`` per operation gives MB/s."""
    ordered = sorted(samples)
    n = len(ordered)
    busy = wall_s if wall_s is not None else sum(ordered)
    ops = n / busy if n and busy > 0 else 0.0
    return {
        "n": n,
        "median": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else math.nan,
        "mean": busy / n if n and wall_s is None else (sum(ordered) / n if n else math.nan),
        "ops_per_s": ops,
        "mb_per_s": ops * nbytes / 1e6 if nbytes is not None else None,
    }


def within(samples: list[float], budget_s: float, min_ops: int, max_ops: int) -> Iterator[int]:
    """0, 1, 2, ...: while ``samples`` holds fewer than ``max_ops``, and fewer than ``min_ops`` or ``budget_s`` runs."""
    began = time.perf_counter()
    while len(samples) < max_ops and (len(samples) < min_ops or time.perf_counter() - began < budget_s):
        yield len(samples)


def timed(call: Callable[[int], object], budget_s: float, min_ops: int, max_ops: int) -> list[float]:
    """The seconds of each ``call(i)``, i = 0, 1, 2, ...: as many calls as ``within`` allows."""
    samples: list[float] = []
    for i in within(samples, budget_s, min_ops, max_ops):
        t0 = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - t0)
    return samples
