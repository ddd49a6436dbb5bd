"""securepad's benchmark suite: securepad side by side with the alternatives.

Shipped inside the package: ``pip install '.[bench]'``, then ``securepad bench``
anywhere (``--quick`` for the smoke run, ``--out`` for where the results go).
See the docs' performance page.
"""
