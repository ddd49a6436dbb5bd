"""securepad's benchmark suite: securepad side by side with the alternatives.

Run it from a source checkout with ``python -m benchmarks`` or ``securepad
bench`` (``--quick`` for the CI smoke run). See ``docs/performance.md``.
"""

# ``securepad bench`` checks this marker, so that an unrelated top-level
# package called "benchmarks" is never run by mistake.
SECUREPAD_BENCHMARKS = True
