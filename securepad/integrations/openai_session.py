"""``SecurepadSession``: an OpenAI Agents SDK session whose conversation items
are sealed securepad entries of their owner.

A session is the turn ``securepad.openai:session:keyed:<HMAC of the owner and
id>`` of its owner (a session written before keyed names keeps the turn
``securepad.openai:session:<sha256 of the id>`` while it holds items); each
item is one entry (executor ``openai.session_item``) whose step number gives
its position: ``add_items`` puts each item at the session's
next step (above every live item's, chosen in the write transaction, so no
two writers share one), so items list in the order they were added and the
store's own checks refuse an item moved to another session or owner, edited,
or moved to another position. The item is kept as JSON text, in the entry's
sealed metadata when it is small (listing the session then brings it) and as
its content otherwise; the sealed metadata repeats the session id. A listing's
view fits the policy's ``inline_max_chars``: one cut to fit keeps the format
and session id (the leading fields), and its item is read from the entry
only when it is returned, so ``get_items(limit)`` and ``pop_item`` read whole
only the items they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import threading
import weakref
from typing import Any

from agents.items import TResponseInputItem
from agents.memory import SessionABC, SessionSettings

from .._steps import keyed_or_former, keyed_turn_name, newest_first, put_next
from ..errors import IntegrityError, InvalidArgumentError, NotFoundError
from ..principal import Principal
from ..store import Scratchpad

__all__ = ["TURN_PREFIX", "SecurepadSession"]

# Every turn the session uses starts with this; see SECURITY.md for what it reserves.
TURN_PREFIX = "securepad.openai:"
_ITEM = "openai.session_item"
# Items whose JSON has at most this many characters are kept in the entry's
# sealed metadata, so that listing the session brings them (no read per item).
META_ITEM_CHARS = 4 * 1024
_FORMAT = 1
# Per open store, the keyed session turns found holding items, by the principal's scope (what
# a principal finds depends on it): a former turn never shadows one (``keyed_or_former``),
# so a session object made for each request skips looking again. Each with the step this
# process's last put in it took (0: none): the next put's guess (``put_next``).
_KEYED: weakref.WeakKeyDictionary[Scratchpad, dict[tuple[Any, ...], int]] = weakref.WeakKeyDictionary()
_KEYED_LOCK = threading.Lock()
_KEYED_KEPT = 4096


class SecurepadSession(SessionABC):
    """The SDK's session protocol over an open ``Scratchpad``, for one principal.

    ``get_items(limit)`` returns the latest ``limit`` items (all with None, or
    ``session_settings.limit`` when set) oldest first; ``add_items`` appends;
    ``pop_item`` removes and returns the newest; ``clear_session`` deletes all.
    Items live ``ttl_seconds`` (default: the policy's ``max_ttl_seconds``).
    Several objects (threads, processes) may add to one session: no two items
    share a position.

    Raises (from every method): ``IntegrityError`` when a stored item fails
    authentication or is not one the session wrote; ``InvalidArgumentError``
    for a negative limit or an item that is not JSON; ``QuotaExceededError``
    and ``StoreBusyError`` as for ``Scratchpad.put``.
    """

    def __init__(
        self,
        session_id: str,
        pad: Scratchpad,
        principal: Principal,
        *,
        ttl_seconds: int | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgumentError("session_id must be a non-empty string")
        if not isinstance(pad, Scratchpad):
            raise InvalidArgumentError("SecurepadSession needs an open securepad.Scratchpad")
        if not isinstance(principal, Principal):
            raise InvalidArgumentError("principal must be a securepad.Principal")
        self.session_id = session_id
        self.session_settings = session_settings
        self.pad = pad
        self.principal = principal
        self.ttl_seconds = pad.policy.max_ttl_seconds if ttl_seconds is None else ttl_seconds
        self._keyed_turn = f"{TURN_PREFIX}session:keyed:{keyed_turn_name(pad, principal, 'session', session_id)}"
        # The name of a session's turn before keyed names: anyone can recompute it from a guess of the id.
        self._former_turn = f"{TURN_PREFIX}session:{hashlib.sha256(session_id.encode()).hexdigest()}"
        self._keyed = False  # the keyed turn was found holding items
        self._lock = threading.Lock()  # one pop or clear of this object at a time
        # The step this object's last put took: the next put's guess (``put_next``), which
        # spares reading the turn's newest step; a wrong guess only costs sealing again.
        self._last_step: int | None = None

    @property
    def turn_id(self) -> str:
        """The session's turn: its keyed name (``_steps.keyed_turn_name``: HMAC
        of the owner and session id under a key derived from the store's
        master key), unless the session was written before keyed names and its
        items are still in its former turn (the SHA-256 of the id), which it
        then keeps. Found keyed, it is remembered; otherwise looked for again
        (a live item in either turn: two small reads).

        Raises:
            IntegrityError: a turn's newest item is not the one its head recorded.
        """
        if self._keyed or self._known_keyed():
            self._keyed = True
            return self._keyed_turn
        turn, keyed = keyed_or_former(self.pad, self.principal, self._keyed_turn, self._former_turn)
        if keyed:
            self._found_keyed()
        return turn

    def _scoped(self) -> tuple[Any, ...]:
        return (*self.pad.policy.scope_columns(self.principal), self._keyed_turn)

    def _known_keyed(self) -> bool:
        return self._scoped() in _KEYED.get(self.pad, ())

    def _found_keyed(self, step: int = 0) -> None:
        self._keyed = True
        with _KEYED_LOCK:
            known = _KEYED.setdefault(self.pad, {})
            if len(known) >= _KEYED_KEPT:
                known.clear()
            known[self._scoped()] = max(step, known.get(self._scoped(), 0))

    # -- the SDK's protocol (async: the store's calls run in a worker thread) -------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError(f"limit must be None or a non-negative integer, not {limit!r}")
        return await asyncio.to_thread(self._get_items, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await asyncio.to_thread(self._add_items, list(items))

    async def pop_item(self) -> TResponseInputItem | None:
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        await asyncio.to_thread(self._clear)

    # -- the work ------------------------------------------------------------------

    def _listed(self, newest: int | None = None) -> tuple[str, list[dict[str, Any]]]:
        """The session's turn and its live item entries, oldest first, each checked
        to be one of ours; ``newest``: only that many of the newest, whose views
        alone are opened (``_steps.newest_first``: the whole turn is still checked
        against its head)."""
        turn = self.turn_id
        if newest is None:
            listed = self.pad.list_for_turn(self.principal, turn)
        else:
            listed = list(itertools.islice(newest_first(self.pad, self.principal, turn), newest))[::-1]
        for item in listed:
            self._check(turn, item)
        return turn, listed

    def _check(self, turn: str, item: dict[str, Any]) -> None:
        """Refuse (IntegrityError) a listed entry that is not one of the session's items."""
        meta = item["view"].get("metadata") or {}
        # A view fits the policy's inline_max_chars (what a model may see): one cut to fit keeps
        # the leading fields (format, session id), and the item is read when it is wanted.
        # Only a view cut before them is read here.
        if "metadata" in item["view"].get("view_cut", ()) and not {"format", "session_id"} <= meta.keys():
            meta = item["view"]["metadata"] = self._stored(turn, item["scratchpad_id"]).get("metadata") or {}
        if item["executor_name"] != _ITEM or meta.get("format") != _FORMAT or meta.get("session_id") != self.session_id:
            raise IntegrityError("an entry in the session's turn is not one of its items")

    def _stored(self, turn: str, scratchpad_id: str) -> dict[str, Any]:
        """A listed item's entry, whole: its observation as the session put it."""
        try:
            observation = self.pad.get(self.principal, scratchpad_id, turn_id=turn).observation
        except NotFoundError:
            raise IntegrityError("a listed session item is missing from the store") from None
        if not isinstance(observation, dict) or not isinstance(observation.get("metadata", {}), dict):
            raise IntegrityError("a session item is not one the session wrote")
        return observation

    def _item(self, turn: str, listed: dict[str, Any]) -> Any:
        meta = listed["view"]["metadata"]
        if "item" in meta:
            return json.loads(meta["item"])
        observation = self._stored(turn, listed["scratchpad_id"])
        if not isinstance(observation.get("content"), str):
            raise IntegrityError("a session item is not one the session wrote")
        metadata = observation.get("metadata") or {}
        if any(metadata.get(name) != value for name, value in meta.items()):
            raise IntegrityError("a session item changed while it was read")
        # Small items are in the sealed metadata (cut from the view when it is narrow), the rest are content.
        return json.loads(metadata["item"] if "item" in metadata else observation["content"])

    def _get_items(self, limit: int | None) -> list[Any]:
        if limit == 0:
            return []
        turn, listed = self._listed(limit)
        return [self._item(turn, item) for item in listed]

    def _add_items(self, items: list[Any]) -> None:
        if not items:
            return
        texts = []
        for item in items:
            try:
                texts.append(json.dumps(item, ensure_ascii=False, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"a session item is not JSON: {exc}") from None
        meta = {"format": _FORMAT, "session_id": self.session_id}
        turn = self.turn_id
        for text in texts:
            if len(text) <= META_ITEM_CHARS:
                observation = {"content": "", "metadata": {**meta, "item": text}}
            else:
                observation = {"content": text, "metadata": meta}
            # The next position: above every live item's, taken by no other writer.
            last = self._last_step
            if last is None and turn == self._keyed_turn:
                last = _KEYED.get(self.pad, {}).get(self._scoped()) or None
            guess = None if last is None else last + 1
            view = put_next(self.pad, self.principal, turn, _ITEM, observation, self.ttl_seconds, guess=guess)
            self._last_step = int(view["step_num"])
            if turn == self._keyed_turn:  # it holds an item now
                self._found_keyed(self._last_step)

    def _pop_item(self) -> Any:
        with self._lock:
            turn, listed = self._listed(1)
            if not listed:
                return None
            newest = listed[-1]
            item = self._item(turn, newest)
            with contextlib.suppress(NotFoundError):
                self.pad.delete(self.principal, newest["scratchpad_id"])
            return item

    def _clear(self) -> None:
        with self._lock:
            for item in self._listed()[1]:
                with contextlib.suppress(NotFoundError):
                    self.pad.delete(self.principal, item["scratchpad_id"])
