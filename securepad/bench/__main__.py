"""``python -m benchmarks``: run the suite."""

from .runner import main

raise SystemExit(main())
