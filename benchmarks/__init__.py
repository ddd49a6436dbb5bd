"""Stand-alone benchmarks, run from a checkout's root: ``python -m benchmarks.<name>``.

Not shipped in the wheel. ``securepad bench`` (the installed suite) is
``securepad.bench``; the fault proxy, PgBouncer launcher and meters these
share with the tests are in ``tests/support/``.
"""

from pathlib import Path

# Where a benchmark writes its results unless told (--out): beside the user, as ``securepad bench``.
DEFAULT_OUT = Path("securepad-bench-results")
