"""The runtime surface: one turn of one principal, as an agent runtime drives it.

``pad.turn(principal, turn_id)`` gives a ``Turn``. Each step the runtime calls
``record`` and puts what it returns into the model's history; it offers the
model ``tools()``, answers its ``scratchpad_read`` calls with ``call_tool``,
and passes every other tool's arguments through ``resolve`` so that
``{{stepN.field}}`` references are filled from the stored observations.

A ``Turn`` keeps nothing but its principal and turn id: everything comes from
the store on each call, so a turn suspended in one process is resumed in
another with ``pad.turn(principal, turn_id)`` on the same store and key.
"""

from __future__ import annotations

import copy
import json
import math
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ._assembly import Parts
from .core import read_modes, reread
from .core.reread import fingerprint
from .errors import ExpiredError, InvalidArgumentError, NotFoundError, StoreUnavailableError
from .policy import Policy
from .principal import Principal
from .tables.entries import entries
from .tables.entries.rows import Opened
from .tables.heads.heads import Heads
from .tables.heads.tally import extend_head
from .tables.records import Records

__all__ = [
    "BUDGET_FIELDS",
    "SCRATCHPAD_READ_TOOL",
    "SCRATCHPAD_READ_TOOL_STRICT",
    "TOOL_NAME",
    "Turn",
    "extend_turn",
    "record_next",
]

TOOL_NAME = "scratchpad_read"

# The budget a checkpoint records: what is left of each.
BUDGET_FIELDS = ("tokens_left", "calls_left", "seconds_left")

# Tool arguments arrive from a model: bound what we parse and accept.
MAX_ARGUMENT_CHARS = 64 * 1024
MAX_TOOL_INT = 2**31 - 1
_MODE_ARGUMENTS: dict[str, frozenset[str]] = {
    "head": frozenset({"n"}),
    "tail": frozenset({"n"}),
    "range": frozenset({"start", "end"}),
    "full": frozenset(),
    "lines": frozenset({"start", "end"}),
    "grep": frozenset({"pattern", "max_matches", "context", "start", "end"}),
}
_INT_ARGUMENTS = ("n", "start", "end", "max_matches", "context")
_ALL_ARGUMENTS = frozenset({"scratchpad_id", "mode", "pattern", *_INT_ARGUMENTS})

SCRATCHPAD_READ_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Read a stored observation that was too large for the conversation, by the scratchpad_id"
            " shown in its summary. Reads return at most a few thousand characters; the result's"
            " metadata says whether it was cut and where to continue."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "scratchpad_id": {
                    "type": "string",
                    "description": "The scratchpad_id from the observation's summary (16 hex characters).",
                },
                "mode": {
                    "type": "string",
                    "enum": list(read_modes.MODES),
                    "description": (
                        "head/tail: first/last n characters; range: characters start..end (end exclusive);"
                        " full: everything up to the read cap; lines: lines start..end (1-based, inclusive);"
                        " grep: lines matching pattern, as 'N:line' (context lines as 'N-line')."
                        " Binary entries support head, tail, range and full (base64). Default: head."
                    ),
                },
                "n": {"type": "integer", "minimum": 0, "description": "head/tail: how many characters."},
                "start": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "range: first character (0-based); lines/grep: first line (1-based).",
                },
                "end": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "range: end character (exclusive); lines/grep: last line (inclusive).",
                },
                "pattern": {
                    "type": "string",
                    "description": (
                        "grep: an RE2 regular expression (no backreferences or look-around); (?i) ignores case."
                        " Each line is matched on its own. A grep that uses up its work budget returns the"
                        " lines found so far with metadata.budget_exhausted true; go on from metadata.next_line."
                    ),
                },
                "max_matches": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (
                        f"grep: stop after this many matching lines (default {read_modes.DEFAULT_MAX_MATCHES})."
                    ),
                },
                "context": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": read_modes.MAX_CONTEXT,
                    "description": "grep: lines of context before and after each match (default 0).",
                },
            },
            "required": ["scratchpad_id"],
            "additionalProperties": False,
        },
    },
}


def _strict_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool under OpenAI's strict function-calling rules: every property
    required, the optional ones nullable (the handler takes null as "not
    given"), and no range keywords (the handler checks ranges; their messages
    tell the model what to send instead)."""
    strict = copy.deepcopy(tool)
    function = strict["function"]
    params = function["parameters"]
    optional = [name for name in params["properties"] if name not in params["required"]]
    for name, spec in params["properties"].items():
        spec.pop("minimum", None)
        if "maximum" in spec:
            spec["description"] += f" At most {spec.pop('maximum')}."
        if name not in optional:
            continue
        if "enum" in spec:
            # A nullable enum as anyOf: the enum itself stays a list of strings.
            params["properties"][name] = {
                "anyOf": [{"type": spec["type"], "enum": spec["enum"]}, {"type": "null"}],
                "description": spec["description"],
            }
        else:
            spec["type"] = [spec["type"], "null"]
    params["required"] = list(params["properties"])
    function["description"] += " Pass null for every argument the mode does not use."
    function["strict"] = True
    return strict


# ``SCRATCHPAD_READ_TOOL`` for OpenAI's strict mode (``"strict": true``); the
# same handler answers both.
SCRATCHPAD_READ_TOOL_STRICT: dict[str, Any] = _strict_tool(SCRATCHPAD_READ_TOOL)

# {{step3.items.0.name}} or ${step3.items.0.name}; a path part is anything but
# dots, braces and white space.
_PATH = r"((?:\.[^.{}\s]+)*)"
_REFERENCE = re.compile(r"\{\{\s*step(\d{1,10})" + _PATH + r"\s*\}\}|\$\{\s*step(\d{1,10})" + _PATH + r"\s*\}")


class Turn:
    """One turn of one principal. Get one with ``Scratchpad.turn(principal, turn_id)``.

    Every method reads and writes through the store's authorized path: only
    this principal's entries of this turn (within the policy's scope) are
    ever seen. Safe to use from several threads, like the store.
    """

    __slots__ = ("_parts", "principal", "turn_id")

    def __init__(self, parts: Parts, principal: Principal, turn_id: str) -> None:
        self._parts = parts
        self.principal = principal
        self.turn_id = turn_id

    def __repr__(self) -> str:
        return f"<Turn {self.turn_id!r} of {self.principal.owner_user_id!r}>"

    # -- steps ------------------------------------------------------------------------

    def record(
        self,
        step_num: int,
        executor_name: str,
        observation: Any,
        *,
        ttl_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, Any] | Any:
        """Store a step's observation (encrypted, whatever its size) and return
        what goes into the model's history.

        That is the observation itself when its JSON has at most the policy's
        ``offload_threshold_bytes`` (strings cut to ``inline_max_chars``, with
        the number of characters omitted), else the synthetic view: ``ok``,
        ``scratchpad_id``, ``step_num``, ``size_bytes``, ``kind``, ``summary``,
        ``metadata``, the top-level scalars and, for structured results,
        ``list_field``, ``count``, ``schema`` and ``ref_hint``. Binary content
        has no JSON form and always gets the view.

        Raises:
            InvalidArgumentError: the step is already recorded in this turn, or
                as for ``Scratchpad.put``.
            QuotaExceededError, StoreBusyError: as for ``Scratchpad.put``.
        """
        # The step is checked inside the write transaction (free_step), where no
        # other writer (another process too) can take it meanwhile: on
        # PostgreSQL in the same round trip as the transaction's other read_modes.
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
        """Record several observations, ``(executor_name, observation)`` each
        (an agent's parallel tool calls), at the turn's next steps (after its
        highest live one, consecutively), in one transaction: all or none.
        Returns what ``record`` returns for each, in order.

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
        """What the model saw of each live step of this turn, in step order,
        exactly as ``record`` returned it.

        Raises:
            IntegrityError: a stored entry fails authentication.
        """
        return [opened.meta["inline"] if "inline" in opened.meta else opened.view() for opened in self._opened(now)]

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
                "shown": opened.meta["inline"] if "inline" in opened.meta else opened.view(),
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

    # -- the tool handler -----------------------------------------------------------------

    def call_tool(self, name: object, arguments: object, *, now: float | None = None) -> dict[str, Any]:
        """Answer a model's tool call: ``arguments`` as a dict or a JSON string.
        An argument that is null counts as not given (the strict schema has the
        model send every argument).

        Returns the read's result, or ``{"ok": False, "error": "..."}`` with a
        message the model can act on for anything wrong with the call: unknown
        tool, malformed JSON, unknown or misplaced arguments, wrong types,
        negative or huge numbers, start > end, an invalid pattern, or an id
        that is not an entry of this turn and principal (absent, another
        turn's or another owner's: one message for all). Never returns more
        than the policy's read cap. Bad input never raises; what raises is not
        the model's doing.

        Raises:
            IntegrityError: the stored entry fails authentication (tampering).
            StoreBusyError: the store could not be read in time.
        """
        try:
            args = _tool_arguments(name, arguments)
        except InvalidArgumentError as exc:
            return _error(str(exc))
        scratchpad_id = args.pop("scratchpad_id")
        try:
            return self._parts.opener.read(self.principal, scratchpad_id, turn_id=self.turn_id, now=now, **args)
        except ExpiredError:
            return _error(f"the entry {scratchpad_id!r} has expired and can no longer be read")
        except NotFoundError:
            return _error(
                f"no entry with scratchpad_id {scratchpad_id[:40]!r} in this turn;"
                " use a scratchpad_id shown in this turn's observations"
            )
        except InvalidArgumentError as exc:
            return _error(str(exc))

    # -- references -----------------------------------------------------------------------

    def resolve(self, value: Any, *, now: float | None = None) -> Any:
        """``value`` with every ``{{stepN.path}}`` / ``${stepN.path}`` replaced.

        References are looked for in strings anywhere inside lists, tuples and
        dict values. A path is dotted field names and list indexes into the
        full stored observation of step N of this turn (never its summary);
        ``{{stepN}}`` is the whole observation, and ``.content`` also names a
        text or binary observation itself. A string that is exactly one
        reference becomes the value, keeping its type (bytes stay bytes);
        inside a longer string a value is inserted as text (JSON for numbers,
        lists and dicts).

        Raises:
            InvalidArgumentError: an unknown step or field (the message names
                the reference), or binary content referenced inside a longer string.
            IntegrityError: a stored entry fails authentication.
        """
        return _Resolver(self, now).walk(value)

    # -- resumption ---------------------------------------------------------------------

    def resume(self, *, extend_ttl: int | None = None, now: float | None = None) -> dict[str, Any]:
        """Pick the turn up again (in this or another process). With
        ``extend_ttl``, the turn's entries, checkpoints and compaction marks
        live ``extend_ttl`` seconds from now (never less than they had).

        Returns ``turn_id``, ``steps`` (live steps) and ``extended`` (how many
        rows got a later expiry).

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

    # -- compaction -----------------------------------------------------------------------

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
        """Keep the fixed-field record a runtime writes when it compacts its context,
        encrypted like an entry.

        ``workspace`` maps each file changed to its state ("created",
        "modified at step 4", ...); ``budget`` has any of ``tokens_left``,
        ``calls_left``, ``seconds_left``; ``facts`` are what has been
        established, ``unresolved`` the open problems. Returns the checkpoint
        as ``latest_checkpoint`` would.

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
        record = found[0]
        return {
            "turn_id": self.turn_id,
            "seq": record["seq"],
            "created_at": record["created_at"],
            "expires_at": record["expires_at"],
            **record["payload"],
        }

    def mark_compaction(self, *, ttl_seconds: int | None = None, now: float | None = None) -> dict[str, Any]:
        """Note that the runtime compacted its context now. The mark keeps
        (sealed) which entries existed, their paths and keyed content
        identities, for ``reread_report``.

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
        """What was fetched again after the last compaction mark although it had
        been stored before it: same path (observation metadata ``path`` or
        ``url``) or identical content (keyed per-owner hash).

        Returns ``mark`` (its ``seq`` and ``created_at``, or None when the turn
        has no mark), ``stored_before``, ``fetched_after``, ``rereads`` (one
        item per re-fetching step), ``reread_count``, ``same_path``,
        ``same_content``, ``reread_paths`` and ``ratio`` (re-reads / steps after).

        Raises:
            IntegrityError: a stored entry or the mark fails authentication.
        """
        marks = self._parts.records.load("compaction_marks", self.principal, self.turn_id, now, latest=True)
        after = [] if not marks else [fingerprint(opened.row, opened.meta) for opened in self._opened(now)]
        return reread.report(self.turn_id, marks[0] if marks else None, after)


def extend_turn(
    parts: Parts,
    principal: Principal,
    turn_id: str,
    ttl_seconds: int | None,
    now: float | None,
) -> int:
    """``Scratchpad.extend_turn``: the turn's live entries and records in the
    principal's scope live ``ttl_seconds`` from now, never less than they had.

    Only the small sealed metadata is re-sealed, all of it before one short
    write transaction; a row that changed meanwhile is left as the other
    writer made it. Returns how many rows were extended.
    """
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


# Another process may take the step we picked between our look and our write;
# each retry looks again. More collisions than this in a row is not a race.
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
    """Record ``observation`` as the turn's next step (one more than its highest
    live step, 1 for an empty turn); returns ``(step_num, shown)`` where
    ``shown`` is what ``Turn.record`` returned for the model's history.

    Raises:
        InvalidArgumentError, QuotaExceededError, StoreBusyError: as for ``Turn.record``.
        StoreUnavailableError: as for ``Turn.record``; when the outcome is
            unknown, ``maybe_stored`` names the entry that may be stored at the
            step chosen: get it before calling ``record_next`` again, which
            would take the next step.
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


# -- helpers ----------------------------------------------------------------------------


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def _inline(observation: Any, step_num: int, policy: Policy) -> tuple[Any] | None:
    """``(history item,)`` when the observation goes into the history itself, else None."""
    try:
        encoded = json.dumps(observation, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None  # bytes (or not JSON at all: put will say so)
    if len(encoded.encode("utf-8")) > policy.offload_threshold_bytes:
        return None
    return (_cut(observation, policy.inline_max_chars, f"step{step_num}"),)


def _cut(value: Any, limit: int, path: str) -> Any:
    """Strings inside ``value`` cut to ``limit`` characters, saying how much was
    omitted and, when it can be written, the reference to the full text."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        ref = f"{{{{{path}}}}}"
        where = f"; {ref} is the full text" if _REFERENCE.fullmatch(ref) else ""
        return f"{value[:limit]}[... {len(value) - limit} characters omitted{where} ...]"
    if isinstance(value, dict):
        return {key: _cut(item, limit, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(item, limit, f"{path}.{index}") for index, item in enumerate(value)]
    return value


def _tool_arguments(name: object, arguments: object) -> dict[str, Any]:
    """Validated keyword arguments for ``Scratchpad.read`` (plus ``scratchpad_id``).

    Raises:
        InvalidArgumentError: with a message for the model.
    """
    if name != TOOL_NAME:
        shown = repr(name)[:60]
        raise InvalidArgumentError(f"unknown tool {shown}; the only tool here is {TOOL_NAME!r}")
    if isinstance(arguments, str | bytes):
        if len(arguments) > MAX_ARGUMENT_CHARS:
            raise InvalidArgumentError(f"the arguments are longer than {MAX_ARGUMENT_CHARS} characters")
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(
                f"the arguments are not valid JSON ({exc.msg} at character {exc.pos});"
                ' send an object like {"scratchpad_id": "...", "mode": "head", "n": 2000}'
            ) from None
        except (RecursionError, UnicodeDecodeError, ValueError):
            raise InvalidArgumentError("the arguments are not valid JSON; send a JSON object") from None
    if not isinstance(arguments, dict):
        raise InvalidArgumentError(
            f"the arguments must be a JSON object, not {type(arguments).__name__};"
            ' send {"scratchpad_id": "...", "mode": "..."}'
        )
    # null is "not given": the strict schema makes the model send every argument.
    arguments = {key: value for key, value in arguments.items() if value is not None}
    unknown = sorted(str(key)[:40] for key in arguments if key not in _ALL_ARGUMENTS)
    if unknown:
        raise InvalidArgumentError(
            f"unknown argument(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_ALL_ARGUMENTS))}"
        )
    scratchpad_id = arguments.get("scratchpad_id")
    if not isinstance(scratchpad_id, str):
        raise InvalidArgumentError(
            "scratchpad_id is required: the 16-character id shown in the observation's summary, as a string"
        )
    mode = arguments.get("mode", "head")
    if not isinstance(mode, str) or mode not in _MODE_ARGUMENTS:
        raise InvalidArgumentError(f"mode must be one of {', '.join(read_modes.MODES)}, not {str(mode)[:40]!r}")
    given = set(arguments) - {"scratchpad_id", "mode"}
    misplaced = sorted(given - _MODE_ARGUMENTS[mode])
    if misplaced:
        allowed = ", ".join(sorted(_MODE_ARGUMENTS[mode])) or "no other arguments"
        raise InvalidArgumentError(f"mode {mode!r} does not take {', '.join(misplaced)}; it takes {allowed}")
    args: dict[str, Any] = {"scratchpad_id": scratchpad_id, "mode": mode}
    for key in _INT_ARGUMENTS:
        if key in arguments:
            args[key] = _tool_int(key, arguments[key])
    if mode == "grep":
        pattern = arguments.get("pattern")
        if not isinstance(pattern, str):
            raise InvalidArgumentError("mode 'grep' needs pattern: a string (RE2 regular expression)")
        args["pattern"] = pattern
    return args


def _tool_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, not {repr(value)[:40]}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be 0 or more, not {value}")
    if value > MAX_TOOL_INT:
        raise InvalidArgumentError(f"{name} is too large: at most {MAX_TOOL_INT}")
    return value


class _Resolver:
    """One ``resolve`` call: each step's observation is fetched at most once."""

    def __init__(self, turn: Turn, now: float | None) -> None:
        self._turn = turn
        self._now = now
        self._steps: dict[int, str] | None = None
        self._observations: dict[int, Any] = {}

    def walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, dict):
            return {key: self.walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.walk(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.walk(item) for item in value)
        return value

    def _string(self, text: str) -> Any:
        whole = _REFERENCE.fullmatch(text)
        if whole is not None:
            return self._value(whole)

        def embed(match: re.Match[str]) -> str:
            value = self._value(match)
            if isinstance(value, str):
                return value
            if isinstance(value, bytes):
                raise InvalidArgumentError(
                    f"{match.group(0)} is binary content: it can only be a whole argument, not part of a string"
                )
            return json.dumps(value, ensure_ascii=False)

        return _REFERENCE.sub(embed, text)

    def _value(self, match: re.Match[str]) -> Any:
        step_text = match.group(1) if match.group(1) is not None else match.group(3)
        path_text = match.group(2) if match.group(1) is not None else match.group(4)
        step = int(step_text)
        parts = [part for part in path_text.split(".") if part]
        node = self._observation(step, match.group(0))
        if parts and parts[0] == "content" and isinstance(node, str | bytes):
            parts = parts[1:]  # a text or binary observation is its own content
        walked = f"step{step}"
        for part in parts:
            node = _field(node, part, walked, match.group(0))
            walked = f"{walked}.{part}"
        return node

    def _observation(self, step: int, reference: str) -> Any:
        if step in self._observations:
            return self._observations[step]
        turn = self._turn
        if self._steps is None:
            self._steps = {o.row["step_num"]: o.row["id"] for o in turn._opened(self._now)}
        if step not in self._steps:
            known = ", ".join(str(s) for s in sorted(self._steps)) or "none"
            raise InvalidArgumentError(
                f"{reference}: unknown step {step} in turn {turn.turn_id!r} (its steps: {known})"
            )
        try:
            entry = turn._parts.opener.get(turn.principal, self._steps[step], now=self._now, turn_id=turn.turn_id)
        except NotFoundError:  # expired (or removed) since the turn was listed
            raise InvalidArgumentError(f"{reference}: step {step} is no longer stored") from None
        self._observations[step] = entry.observation
        return entry.observation


def _field(node: Any, part: str, walked: str, reference: str) -> Any:
    """``node[part]`` for a dict key or a list index, or InvalidArgumentError naming the reference."""
    if isinstance(node, dict):
        if part in node:
            return node[part]
        keys = ", ".join(sorted(str(k) for k in node)[:20]) or "none"
        raise InvalidArgumentError(f"{reference}: {walked} has no field {part!r} (its fields: {keys})")
    if isinstance(node, list):
        if part.isascii() and part.isdigit() and int(part) < len(node):
            return node[int(part)]
        raise InvalidArgumentError(
            f"{reference}: {walked} is a list of {len(node)} items; {part!r} is not an index in it"
        )
    raise InvalidArgumentError(f"{reference}: {walked} is {_kind(node)}, it has no field {part!r}")


def _kind(node: Any) -> str:
    if isinstance(node, str):
        return "text"
    if isinstance(node, bytes):
        return "binary content"
    return "a number" if isinstance(node, int | float) and not isinstance(node, bool) else "a scalar"


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
