"""securepad's benchmark suite, securepad beside the alternatives: ``pip install
'.[bench]'``, then ``securepad bench`` (the docs' performance page)."""
