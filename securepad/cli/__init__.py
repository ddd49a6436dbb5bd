"""The ``securepad`` command line: options in, one library call, output out.

No SQL and no cryptography here; everything goes through the public API.

Rules every command follows:

- The global options (``--db``, the key source, ``--policy``, ``--json``) are
  accepted before or after the subcommand, and each has an environment
  variable (listed by ``securepad --help``); the command line beats the
  environment.
- Only ``securepad init`` creates a store (and a key file with it); every other
  command on a missing store fails, naming the path and how to create one.
- Stored text is data: it is never read as rich markup, and terminal control
  sequences are removed before it reaches a terminal.
- With ``--json`` the result is JSON on stdout and an error is JSON on stderr.
- A command loads only what it uses: its own module (``group.COMMAND_MODULES``),
  the store's layers when it opens a store, rich when it prints a table, a
  progress bar or styled text.
"""

from .group import main
from .options import ENVIRONMENT
from .output import for_terminal

__all__ = ["ENVIRONMENT", "for_terminal", "main"]
