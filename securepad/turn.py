"""The runtime surface: one turn of one principal, as an agent runtime drives it
(``record`` each step, offer ``tools()``, answer with ``call_tool``, fill
``{{stepN.field}}`` with ``resolve``). A ``Turn`` keeps only its principal and
turn id, so a turn suspended in one process is resumed in another.
"""

from __future__ import annotations

import copy
import json
import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._assembly import Parts
from .core import references, reread
from .core.reread import fingerprint
from .core.tool import SCRATCHPAD_READ_TOOL, SCRATCHPAD_READ_TOOL_STRICT, tool_arguments, tool_error
from .errors import ExpiredError, InvalidArgumentError, NotFoundError, StoreUnavailableError
from .policy import Policy
from .principal import Principal
from .tables.entries import entries
from .tables.entries.open import Opened
from .tables.heads.heads import Heads
from .tables.heads.tally import extend_head
from .tables.records import Records

__all__ = ["BUDGET_FIELDS", "Turn", "extend_turn", "record_next"]

# The budget a checkpoint records: what is left of each.
BUDGET_FIELDS = ("tokens_left", "calls_left", "seconds_left")


class Turn:
    """One turn of one principal. Get one with ``Scratchpad.turn(principal, turn_id)``.
    Only this principal's entries of this turn (in the policy's scope) are ever seen;
    thread-safe, like the store."""

    __slots__ = ("_parts", "principal", "turn_id")

    def __init__(self, parts: Parts, principal: Principal, turn_id: str) -> None:
        self._parts = parts
        self.principal = principal
        self.turn_id = turn_id

    def __repr__(self) -> str:
        return f"<Turn {self.turn_id!r} of {self.principal.owner_user_id!r}>"

    def record(
        self,
        step_num: int,
        executor_name: str,
        observation: Any,
        *,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, Any] | Any:
        """Store a step's observation (encrypted) and return what goes into the model's history:
        the observation itself when its JSON has at most ``offload_threshold_bytes``
        (strings cut to ``inline_max_chars``), else the synthetic view (``ok``,
        ``scratchpad_id``, ``step_num``, ``size_bytes``, ``kind``, ``summary``, ...).

        Raises:
            InvalidArgumentError: the step is already recorded in this turn, or
                as for ``Scratchpad.put``.
            QuotaExceededError, StoreBusyError: as for ``Scratchpad.put``.
        """
        # The step is checked inside the write transaction (free_step), where no other writer can take it.
        inline = _inline(observation, step_num, self._parts.tables.policy)
        view = self._parts.putter.put(
            self.principal,
            self.turn_id,
            step_num,
            executor_name,
            observation,
            ttl_seconds,
            now=now,
            inline=inline,
            free_step=True,
        )
        return view if inline is None else inline[0]

    def record_many(
        self,
        items: Sequence[tuple[str, Any]],
        *,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> list[Any]:
        """Record ``(executor_name, observation)`` pairs at the turn's next steps, in one
        transaction: all or none. Returns what ``record`` returns for each, in order.

        Raises:
            InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``record``.
        """
        policy = self._parts.tables.policy
        return self._parts.putter.put_many(
            self.principal,
            self.turn_id,
            items,
            ttl_seconds,
            now=now,
            shown=lambda observation, step: _inline(observation, step, policy),
        )

    def history(self, *, now: float | None = None) -> list[Any]:
        """What ``record`` returned for each live step of this turn, in step order.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return [_shown(opened) for opened in self._opened(now)]

    def steps(self, *, now: float | None = None) -> list[dict[str, Any]]:
        """``history()`` with each step's ``step_num``, ``executor_name``,
        ``scratchpad_id`` and whether it was ``offloaded``; the history item is ``shown``.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return [
            {
                "step_num": opened.row["step_num"],
                "executor_name": opened.row["executor_name"],
                "scratchpad_id": opened.row["id"],
                "offloaded": "inline" not in opened.meta,
                "shown": _shown(opened),
            }
            for opened in self._opened(now)
        ]

    def tools(self, *, strict: bool = False, now: float | None = None) -> list[dict[str, Any]]:
        """``[SCRATCHPAD_READ_TOOL]`` when the turn has offloaded entries, else ``[]``;
        with ``strict=True``, ``SCRATCHPAD_READ_TOOL_STRICT`` (OpenAI's strict mode).

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        if self._parts.listings.turn_offloads(self.principal, self.turn_id, now):
            return [copy.deepcopy(SCRATCHPAD_READ_TOOL_STRICT if strict else SCRATCHPAD_READ_TOOL)]
        return []

    def _opened(self, now: float | None) -> list[Opened]:
        return self._parts.listings.turn_entries(self.principal, self.turn_id, now)

    def call_tool(self, name: object, arguments: object, *, now: float | None = None) -> dict[str, Any]:
        """Answer a model's tool call (``arguments`` a dict or a JSON string; null counts as
        not given). Returns the read's result, capped, or ``{"ok": False, "error": "..."}``
        with a message the model can act on: bad input never raises, and an id of another
        turn or owner looks like an absent one.

        Raises:
            IntegrityError: the stored entry fails authentication (tampering).
            StoreBusyError: the store could not be read in time.
        """
        try:
            args = tool_arguments(name, arguments)
        except InvalidArgumentError as exc:
            return tool_error(str(exc))
        scratchpad_id = args.pop("scratchpad_id")
        try:
            return self._parts.opener.read(self.principal, scratchpad_id, turn_id=self.turn_id, now=now, **args)
        except ExpiredError:
            return tool_error(f"the entry {scratchpad_id!r} has expired and can no longer be read")
        except NotFoundError:
            return tool_error(
                f"no entry with scratchpad_id {scratchpad_id[:40]!r} in this turn;"
                " use a scratchpad_id shown in this turn's observations"
            )
        except InvalidArgumentError as exc:
            return tool_error(str(exc))

    def resolve(self, value: Any, *, now: float | None = None) -> Any:
        """``value`` with every ``{{stepN.path}}`` / ``${stepN.path}`` in its strings replaced
        from the full stored observation of step N (dotted fields and list indexes;
        ``{{stepN}}`` is all of it). A string that is exactly one reference becomes the
        value with its type; inside a longer string it is inserted as text (JSON).

        Raises:
            InvalidArgumentError: an unknown step or field (the message names
                the reference), or binary content referenced inside a longer string.
            IntegrityError: a stored entry fails authentication.
        """
        return references.resolve(value, _step_observations(self, now))

    def resume(self, *, extend_ttl: int | None = None, now: float | None = None) -> dict[str, Any]:
        """Pick the turn up again; with ``extend_ttl``, its entries and records live that
        long from now (never less). Returns ``turn_id``, ``steps`` and ``extended`` (rows).

        Raises:
            InvalidArgumentError: ``extend_ttl`` is not a positive integer within
                the policy's ``max_ttl_seconds``.
            IntegrityError: a stored entry or record fails authentication.
            StoreBusyError: the write lock was not obtained in time.
        """
        extended = 0
        if extend_ttl is not None:
            extended = extend_turn(self._parts, self.principal, self.turn_id, extend_ttl, now)
        return {"turn_id": self.turn_id, "steps": len(self._opened(now)), "extended": extended}

    def checkpoint(
        self,
        *,
        workspace: Mapping[str, str] | None = None,
        budget: Mapping[str, int | float] | None = None,
        facts: list[str] | tuple[str, ...] | None = None,
        unresolved: list[str] | tuple[str, ...] | None = None,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Keep, encrypted, the record a runtime writes when it compacts its context:
        ``workspace`` (file -> state), ``budget`` (any of ``tokens_left``, ``calls_left``,
        ``seconds_left``), ``facts`` and ``unresolved``. Returns it as ``latest_checkpoint`` would.

        Raises:
            InvalidArgumentError: a field of the wrong shape, an unknown budget
                key, a negative budget, a bad ttl, or a record larger than the
                policy's ``max_entry_bytes``.
            QuotaExceededError: the record does not fit in the owner's quota, or is
                larger than one transaction may write (SQLite: half its ``wal_limit_bytes``).
            StoreBusyError: the write lock was not obtained in time.
        """
        payload = {
            "workspace": _string_map("workspace", workspace),
            "budget": _budget(budget),
            "facts": _string_list("facts", facts),
            "unresolved": _string_list("unresolved", unresolved),
        }
        size = len(json.dumps(payload, ensure_ascii=False).encode("utf-8"))
        limit = self._parts.tables.policy.max_entry_bytes
        if size > limit:
            raise InvalidArgumentError(f"the checkpoint has {size} bytes; the policy's max_entry_bytes is {limit}")
        saved = self._parts.records.save("checkpoints", self.principal, self.turn_id, payload, ttl_seconds, now)
        return {"turn_id": self.turn_id, **saved, **payload}

    def latest_checkpoint(self, *, now: float | None = None) -> dict[str, Any] | None:
        """The newest live checkpoint of this turn (in the principal's scope), or None.

        Raises:
            IntegrityError: the checkpoint fails authentication.
        """
        found = self._parts.records.load("checkpoints", self.principal, self.turn_id, now, latest=True)
        if not found:
            return None
        stamps = {key: found[0][key] for key in ("seq", "created_at", "expires_at")}
        return {"turn_id": self.turn_id, **stamps, **found[0]["payload"]}

    def mark_compaction(self, *, ttl_seconds: int | None = None, now: float | None = None) -> dict[str, Any]:
        """Note that the runtime compacted its context now: the sealed mark keeps which
        entries existed (paths, keyed content identities) for ``reread_report``.

        Raises:
            InvalidArgumentError: a bad ttl.
            IntegrityError: a stored entry fails authentication.
            QuotaExceededError: the mark does not fit in the owner's quota, or is
                larger than one transaction may write (SQLite: half its ``wal_limit_bytes``).
            StoreBusyError: the write lock was not obtained in time.
        """
        before = [fingerprint(opened.row, opened.meta) for opened in self._opened(now)]
        saved = self._parts.records.save(
            "compaction_marks", self.principal, self.turn_id, {"entries": before}, ttl_seconds, now
        )
        return {"turn_id": self.turn_id, **saved, "entries_before": len(before)}

    def reread_report(self, *, now: float | None = None) -> dict[str, Any]:
        """What was fetched again after the last compaction mark although stored before it
        (same ``path``/``url`` metadata, or same content). Returns ``mark`` (or None),
        ``stored_before``, ``fetched_after``, ``rereads``, ``reread_count``, ``same_path``,
        ``same_content``, ``reread_paths`` and ``ratio``.

        Raises:
            IntegrityError: a stored entry or the mark fails authentication.
        """
        marks = self._parts.records.load("compaction_marks", self.principal, self.turn_id, now, latest=True)
        after = [] if not marks else [fingerprint(opened.row, opened.meta) for opened in self._opened(now)]
        return reread.report(self.turn_id, marks[0] if marks else None, after)


def _step_observations(turn: Turn, now: float | None) -> Callable[[int, str], Any]:
    """The observation of a step of ``turn`` by its number, for ``references.resolve``."""
    steps: dict[int, str] = {}

    def observation(step: int, reference: str) -> Any:
        if not steps:
            steps.update((o.row["step_num"], o.row["id"]) for o in turn._opened(now))
        if step not in steps:
            known = ", ".join(str(s) for s in sorted(steps)) or "none"
            raise InvalidArgumentError(
                f"{reference}: unknown step {step} in turn {turn.turn_id!r} (its steps: {known})"
            )
        try:
            return turn._parts.opener.get(turn.principal, steps[step], now=now, turn_id=turn.turn_id).observation
        except NotFoundError:  # expired (or removed) since the turn was listed
            raise InvalidArgumentError(f"{reference}: step {step} is no longer stored") from None

    return observation


def extend_turn(
    parts: Parts,
    principal: Principal,
    turn_id: str,
    ttl_seconds: int | None,
    now: float | None,
) -> int:
    """``Scratchpad.extend_turn``: only the sealed metadata is re-sealed, before one short
    write transaction (a row changed meanwhile is left). Returns how many rows were extended."""
    ttl = parts.tables.ttl(ttl_seconds)
    current = parts.tables.timeline.write_time(now)
    target = current + ttl
    entry_updates = entries.prepare_extend(parts.tables, parts.listings, principal, turn_id, target, current)
    record_updates = parts.records.prepare_extend(principal, turn_id, target, current)
    owner = principal.owner_user_id
    with parts.db.transaction(owner) as conn:
        before = Heads.items(conn, owner, turn_id)  # what the updates replace, in the same transaction
        extended = entries.apply_extend(conn, entry_updates)
        records_extended = Records.apply_extend(conn, record_updates)
        parts.heads.change(
            conn, owner, turn_id, lambda head: extend_head(head, before, target, extended, records_extended)
        )
        return len(extended) + sum(len(ids) for ids in records_extended.values())


# Another process may take the step we picked; more collisions than this in a row is not a race.
_NEXT_ATTEMPTS = 8

_registry_lock = threading.Lock()
_turn_locks: weakref.WeakKeyDictionary[Parts, dict[tuple[str, str, str, str], threading.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _turn_lock(turn: Turn) -> threading.Lock:
    principal = turn.principal
    key = (principal.owner_user_id, principal.actor, principal.channel, turn.turn_id)
    with _registry_lock:
        return _turn_locks.setdefault(turn._parts, {}).setdefault(key, threading.Lock())


def _taken(turn: Turn, step_num: int, now: float | None) -> bool:
    if step_num >= 2**31:
        return False  # no such step: record refused the number itself
    try:
        turn._parts.listings.check_step_free(turn.principal, turn.turn_id, step_num, now)
    except InvalidArgumentError:
        return True  # the principal, turn and step are valid: record_next checked them
    return False


def record_next(
    turn: Turn,
    executor_name: str,
    observation: Any,
    *,
    ttl_seconds: int | None = None,
    now: float | None = None,
) -> tuple[int, Any]:
    """Record ``observation`` as the turn's next step; returns ``(step_num, shown)``
    where ``shown`` is what ``Turn.record`` returned.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
        StoreUnavailableError: as for ``Turn.record``; ``maybe_stored`` names an entry
            that may be stored: get it before calling ``record_next`` again.
    """
    with _turn_lock(turn):
        for _ in range(_NEXT_ATTEMPTS):
            step_num = turn._parts.listings.last_step(turn.principal, turn.turn_id, now) + 1
            try:
                return step_num, turn.record(step_num, executor_name, observation, ttl_seconds=ttl_seconds, now=now)
            except InvalidArgumentError:
                # Only a step that another process recorded meanwhile is worth another try.
                if not _taken(turn, step_num, now):
                    raise
            except StoreUnavailableError as exc:
                if not exc.maybe_stored:
                    raise
                raise StoreUnavailableError(
                    f"{exc}; record_next chose step {step_num} for it: calling record_next again would record"
                    " the observation a second time, at the next step, if it was stored",
                    maybe_stored=exc.maybe_stored,
                ) from None
    raise InvalidArgumentError(f"could not find a free step in turn {turn.turn_id!r}: other writers keep taking it")


def _shown(opened: Opened) -> Any:
    """What the model saw of a step: the observation itself when inline, else its view."""
    return opened.meta["inline"] if "inline" in opened.meta else opened.view()


def _inline(observation: Any, step_num: int, policy: Policy) -> tuple[Any] | None:
    """``(history item,)`` when the observation goes into the history itself, else None."""
    try:
        encoded = json.dumps(observation, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None  # bytes (or not JSON at all: put will say so)
    if len(encoded.encode("utf-8")) > policy.offload_threshold_bytes:
        return None
    return (references.cut(observation, policy.inline_max_chars, f"step{step_num}"),)


def _string_map(name: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must map each path to its state (a dict of strings)")
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise InvalidArgumentError(f"{name} must map non-empty path strings to state strings, not {key!r}")
    return dict(value)


def _string_list(name: str, value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise InvalidArgumentError(f"{name} must be a list of strings")
    return list(value)


def _budget(value: object) -> dict[str, int | float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"budget must be a dict with any of {', '.join(BUDGET_FIELDS)}")
    budget: dict[str, int | float] = {}
    for key, item in value.items():
        if key not in BUDGET_FIELDS:
            raise InvalidArgumentError(f"unknown budget field {key!r}; use {', '.join(BUDGET_FIELDS)}")
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item) or item < 0:
            raise InvalidArgumentError(f"budget {key} must be a non-negative number, not {item!r}")
        budget[key] = item
    return budget
