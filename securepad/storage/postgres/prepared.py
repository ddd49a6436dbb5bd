"""Server-side prepared statements in one pipeline of the extended protocol.

Parsing and planning a statement costs the server more than executing it: a
message carries Parse for a statement the first time on a connection and only
Bind and Execute after. One not prepared goes as an unnamed Parse, Bind and
Execute in the same pipeline.

Prepared statements belong to the server session, and behind a transaction
pooler consecutive transactions of one connection may run on different ones:

* a connection whose ``prepare_threshold`` is None never prepares;
* names are unique per client connection, never reused (ROLLBACK does not
  undo a Parse), so a name on a server session means what its client meant;
* every first message of a call on a connection that prepared anything
  starts with an Execute of its first statement, the anchor: on another
  server session it fails (SQLSTATE 26000) before anything else runs, and the
  store stops preparing (``Statements.missing``) and sends the message again.
"""

from __future__ import annotations

import functools
import re
import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..base import Params

__all__ = ["EXECUTE", "MAX_PER_CONNECTION", "PREPARE", "QUERY", "Command", "Message", "Statements", "numbered"]

# Statements prepared per connection at most; later ones go unprepared.
MAX_PER_CONNECTION = 256

_PLACEHOLDER = re.compile(r"%%|%s")


@dataclass(slots=True, eq=False)
class _Session:
    """What one client connection prepared: (schema, SQL) -> name, and its anchor."""

    token: str = field(default_factory=lambda: secrets.token_hex(6))
    count: int = 0
    names: dict[tuple[str, str], str] = field(default_factory=dict)
    anchor: str | None = None
    plans: dict[_PlanKey, _Plan] = field(default_factory=dict)

    def new_name(self) -> str:
        self.count += 1
        return f"securepad_{self.token}_{self.count}"


# What a message asks of the server, in order (``Message.commands``):
PREPARE = 0  # (PREPARE, name, text): Parse of a named statement (its result: no rows)
EXECUTE = 1  # (EXECUTE, name, params): Bind and Execute of a named statement
QUERY = 2  # (QUERY, text, params): Parse, Bind and Execute of the unnamed statement
Command = tuple[int, str, Params]
# A message's shape once every statement in it has its name: the commands
# before the statements (the anchor), then each statement's kind and name (or
# text), by whether it is a call's first message and the statements' texts.
_PlanKey = tuple[bool, tuple[str, ...]]
_Plan = tuple[tuple[Command, ...], tuple[tuple[int, str], ...]]


@dataclass(slots=True, eq=False)
class Message:
    """One message: its commands, where each statement's result is among the
    message's results, and the names it prepares."""

    session: _Session | None
    commands: list[Command] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    prepared: dict[tuple[str, str], str] = field(default_factory=dict)


class Statements:
    """The prepared statements of a store's connections (``enabled`` until a
    transaction pooler is detected)."""

    def __init__(self, schema: str, *, enabled: bool = True) -> None:
        self.schema = schema
        self.enabled = enabled
        # No lock: a connection serves one call at a time, and each has its own key.
        self._sessions: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Session] = weakref.WeakKeyDictionary()
        # The plans of messages on connections that prepare nothing (``message``).
        self._plans: dict[_PlanKey, _Plan] = {}

    def _session(self, conn: psycopg.Connection[Any]) -> _Session | None:
        if not self.enabled or conn.prepare_threshold is None:
            return None
        session = self._sessions.get(conn)
        if session is None:
            session = self._sessions[conn] = _Session()
        return session

    def message(self, conn: psycopg.Connection[Any], batch: Sequence[tuple[str, Params]], *, first: bool) -> Message:
        """``batch`` (in psycopg's dialect) as one message for ``conn``; ``first``:
        a call's first message. A message that prepares nothing new is
        remembered by its texts, and the next with the same texts is made from
        it without a name lookup per statement."""
        session = self._session(conn)
        message = Message(session)
        plans = self._plans if session is None else session.plans
        key = (first, tuple([text for text, _ in batch]))
        plan = plans.get(key)
        if plan is not None:
            before, kinds = plan
            commands = message.commands = [*before]
            commands.extend([(kind, what, values) for (kind, what), (_, values) in zip(kinds, batch, strict=True)])
            message.results = list(range(len(before), len(commands)))
            return message
        commands = message.commands
        if session is not None and first:
            if session.anchor is None:
                anchor = session.new_name()
                commands.append((PREPARE, anchor, ("SELECT 1",)))
                message.prepared[("", "anchor")] = anchor
            else:
                anchor = session.anchor
            commands.append((EXECUTE, anchor, ()))
        announced: set[str] = set()
        for text, values in batch:
            name = self._name(session, message, text) if values else None
            if name is None:
                commands.append((QUERY, numbered(text), values))
            else:
                if name not in announced and message.prepared.get((self.schema, text)) == name:
                    commands.append((PREPARE, name, (numbered(text),)))
                    announced.add(name)
                commands.append((EXECUTE, name, values))
            message.results.append(len(commands) - 1)
        if not message.prepared and len(plans) < MAX_PER_CONNECTION:
            before = tuple(commands[: message.results[0]]) if message.results else tuple(commands)
            plans[key] = (before, tuple([(commands[i][0], commands[i][1]) for i in message.results]))
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


@functools.lru_cache(maxsize=512)
def numbered(text: str) -> str:
    """psycopg's dialect in the server's: ``%s`` placeholders as ``$1``, ``$2``..., ``%%`` as ``%``."""
    counter = iter(range(1, 1 << 30))
    return _PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else f"${next(counter)}", text)
