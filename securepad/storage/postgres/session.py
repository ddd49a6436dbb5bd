"""What every call on a PostgreSQL store begins with: its settings, and a write's advisory locks.

Each call's first statement sets, for its transaction only: the role, the
schema as search path, ``securepad.owner`` (what the row-level policies
show), the lock and statement timeouts and ``synchronous_commit``. A write's
also takes its advisory locks: the store's shared and the owner's (a write of
one turn: the owner's shared, then the turn's, always in that order), or the
store's alone for store-wide housekeeping.
"""

from __future__ import annotations

from ..base import Params
from .connections import HOUSEKEEPING_FACTOR
from .migrate import ADMIN_ROLE, APP_ROLE, lock_key

__all__ = ["SYNCHRONOUS_COMMIT", "Session"]

_SETTINGS = (
    "SELECT set_config('role', %s, true), set_config('search_path', %s, true),"
    " set_config('securepad.owner', %s, true), set_config('lock_timeout', %s, true),"
    " set_config('statement_timeout', %s, true), set_config('synchronous_commit', %s, true)"
)
# A write transaction's first statement after BEGIN, built once: a string
# made per call is hashed anew at each cache lookup.
_OPENING_TURN = (
    _SETTINGS + ", pg_advisory_xact_lock_shared(%s), pg_advisory_xact_lock_shared(%s), pg_advisory_xact_lock(%s)"
)
_OPENING_OWNER = _SETTINGS + ", pg_advisory_xact_lock_shared(%s), pg_advisory_xact_lock(%s)"
_OPENING_STORE = _SETTINGS + ", pg_advisory_xact_lock(%s)"
_OPENING_TRY_STORE = _SETTINGS + ", pg_try_advisory_xact_lock(%s) AS locked"
# The policy's durability -> synchronous_commit (docs/reliability.md): "normal"
# may lose the last commits in a server crash, never part of one.
SYNCHRONOUS_COMMIT = {"normal": "off", "full": "on"}


class Session:
    """The first statement of each call on the store in ``schema``."""

    def __init__(self, schema: str, *, lock_timeout_ms: int, statement_timeout_ms: int, durability: str) -> None:
        self.schema = schema
        # How long a transaction waits for an advisory or row lock (the server's ``lock_timeout``).
        self.lock_timeout = f"{int(lock_timeout_ms)}ms"
        self._statement_ms = int(statement_timeout_ms)
        self._synchronous_commit = SYNCHRONOUS_COMMIT[durability]
        self._store_lock = lock_key("securepad-store", schema)

    def settings(self, owner: str | None, admin: bool) -> tuple[str, Params]:
        """A call's settings, for ``owner`` (None: no owner's rows), as housekeeping or not."""
        statement_ms = self._statement_ms * (HOUSEKEEPING_FACTOR if admin else 1)
        params = (
            ADMIN_ROLE if admin else APP_ROLE,
            self.schema,
            owner or "",
            self.lock_timeout,
            f"{statement_ms}ms",
            self._synchronous_commit,
        )
        return _SETTINGS, params

    def opening(self, owner: str | None, *, admin: bool, wait: bool, turn: str | None) -> tuple[str, Params]:
        """A write transaction's first statement: the settings and its advisory
        locks; with neither owner nor ``wait``, it tries the store's lock and answers ``locked``."""
        if owner is not None and turn is not None:  # the owner's lock shared, then its turn's (always that order)
            text, locks = _OPENING_TURN, self.turn_locks(owner, turn)
        elif owner is not None:
            text, locks = _OPENING_OWNER, (self._store_lock, lock_key("securepad-owner", self.schema, owner))
        elif wait:
            text, locks = _OPENING_STORE, (self._store_lock,)
        else:
            text, locks = _OPENING_TRY_STORE, (self._store_lock,)
        return text, (*self.settings(owner, admin)[1], *locks)

    def turn_locks(self, owner: str, turn: str) -> Params:
        """The advisory locks of a write of one turn: the store's and the owner's shared, the turn's."""
        return (
            self._store_lock,
            lock_key("securepad-owner", self.schema, owner),
            lock_key("securepad-turn", self.schema, owner, turn),
        )
