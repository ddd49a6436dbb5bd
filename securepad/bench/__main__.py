"""``python -m securepad.bench``: the same as ``securepad bench``."""

from ..cli import bench

bench(prog_name="python -m securepad.bench")
