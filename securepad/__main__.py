"""``python -m securepad``: the command line, as the ``securepad`` script runs it."""

from .cli import main

main(prog_name="securepad")
