"""Server-side prepared statements inside one simple-protocol message.

Parsing and planning a statement costs the server 20 to 200 us (the quota
check's four row-level-security subqueries: 190 us), more than executing it.
Prepared once per connection, a statement is planned once: the message
carries ``PREPARE name AS ...; EXECUTE name(...)`` the first time and
``EXECUTE name(...)`` after, so the round trips stay as they were (every
statement of a message still goes in one message, parameters bound on the
client).

Prepared statements belong to the server session. Behind a transaction
pooler (PgBouncer in ``pool_mode = transaction``), consecutive transactions
of one client connection may run on different server sessions. So:

* a connection whose ``prepare_threshold`` is None (what psycopg's own
  statements need behind such a pooler, and what the PostgreSQL guide
  tells pools made for one) never prepares;
* names are unique per client connection (never reused, even after a failed
  message: a PREPARE is not undone by ROLLBACK), so a name on a server
  session always means what its client meant;
* every first message of a call on a connection that prepared anything
  starts with ``EXECUTE`` of the connection's first statement, the anchor:
  run on another server session, it fails (SQLSTATE 26000) before anything
  else in the message runs, and the store stops preparing (``Statements.missing``)
  and sends the message again. Every later message of the transaction runs
  on the anchor's session, where all the connection's statements were prepared.
"""

from __future__ import annotations

import re
import secrets
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg

from ._backend import Params

__all__ = ["MAX_PER_CONNECTION", "Message", "Statements"]

# Statements prepared per connection at most; later ones go unprepared.
MAX_PER_CONNECTION = 256

_PLACEHOLDER = re.compile(r"%%|%s")


class _Session:
    """What one client connection prepared: (schema, SQL) -> name, and its anchor."""

    __slots__ = ("anchor", "count", "names", "token")

    def __init__(self) -> None:
        self.token = secrets.token_hex(6)
        self.count = 0
        self.names: dict[tuple[str, str], str] = {}
        self.anchor: str | None = None

    def new_name(self) -> str:
        self.count += 1
        return f"securepad_{self.token}_{self.count}"


class Message:
    """One message: its text and parameters, where each statement's result
    is among the message's results, and the names it prepares."""

    __slots__ = ("announced", "params", "prepared", "results", "session", "text")

    def __init__(self, text: str, params: Params, results: list[int], session: _Session | None) -> None:
        self.text = text
        self.params = params
        self.results = results
        self.session = session
        self.prepared: dict[tuple[str, str], str] = {}
        self.announced: set[str] = set()


class Statements:
    """The prepared statements of a store's connections (``enabled`` until a
    transaction pooler is detected)."""

    def __init__(self, schema: str, *, enabled: bool = True) -> None:
        self.schema = schema
        self.enabled = enabled
        # No lock (so nothing for a forked child to inherit held): a
        # connection serves one call at a time, and each has its own key.
        self._sessions: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Session] = weakref.WeakKeyDictionary()

    def _session(self, conn: psycopg.Connection[Any]) -> _Session | None:
        if not self.enabled or conn.prepare_threshold is None:
            return None
        session = self._sessions.get(conn)
        if session is None:
            session = self._sessions[conn] = _Session()
        return session

    def message(self, conn: psycopg.Connection[Any], batch: Sequence[tuple[str, Params]], *, first: bool) -> Message:
        """``batch`` (statements in psycopg's dialect) as one message for ``conn``;
        ``first``: the first message of a call (a transaction or a query)."""
        session = self._session(conn)
        parts: list[str] = []
        params: list[Any] = []
        results: list[int] = []
        message = Message("", (), results, session)
        if session is not None and first:
            if session.anchor is None:
                anchor = session.new_name()
                parts.append(f"PREPARE {anchor} AS SELECT 1")
                message.prepared[("", "anchor")] = anchor
            else:
                anchor = session.anchor
            parts.append(f"EXECUTE {anchor}")
        for text, values in batch:
            name = self._name(session, message, text) if values else None
            if name is None:
                parts.append(text)
            else:
                if message.prepared.get((self.schema, text)) == name and name not in message.announced:
                    parts.append(f"PREPARE {name} AS {_numbered(text)}")
                    message.announced.add(name)
                parts.append(f"EXECUTE {name}({', '.join(['%s'] * len(values))})")
            params.extend(values)
            results.append(len(parts) - 1)
        message.text = "; ".join(parts)
        message.params = tuple(params)
        return message

    def _name(self, session: _Session | None, message: Message, text: str) -> str | None:
        if session is None:
            return None
        key = (self.schema, text)
        name = session.names.get(key) or message.prepared.get(key)
        if name is None and len(session.names) + len(message.prepared) < MAX_PER_CONNECTION:
            name = message.prepared[key] = session.new_name()
        return name

    def sent(self, message: Message) -> None:
        """The message ran: its new statements exist on the connection's session."""
        session = message.session
        if session is None or not message.prepared:
            return
        anchor = message.prepared.pop(("", "anchor"), None)
        if anchor is not None:
            session.anchor = anchor
        session.names.update(message.prepared)

    def missing(self) -> None:
        """A statement the connection prepared is not on the server session
        (a transaction pooler, or a reset that deallocated it): prepare no more."""
        self.enabled = False


def _numbered(text: str) -> str:
    """``%s`` placeholders as ``$1``, ``$2``...; ``%%`` stays (psycopg reads it as ``%``)."""
    counter = iter(range(1, 1 << 30))
    return _PLACEHOLDER.sub(lambda m: "%%" if m.group() == "%%" else f"${next(counter)}", text)
