"""``Scratchpad.verify``: the whole-store check of heads, entries and records.

One pass over the heads, one over the entries (each authenticated with all
its segments) and one over each record table: linear in the store. Every row
is authenticated before it is compared with its turn's head, every head
before its lists are used; a row past its *sealed* expiry may be absent. For
a turn whose entries differ from its head, verify names the steps it still
holds, the head's last step and the steps below it with no authenticated
entry. Every read is made in one read snapshot (``Backend.snapshot``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from ..errors import IntegrityError
from ..storage.base import Backend
from ..tables.entries.entries import every_row
from ..tables.entries.open import Opener
from ..tables.heads.heads import OWNER_HEAD, RECORD_KINDS, USAGE_HEAD, HeadEdit, Heads, Tally, entry_item, record_item
from ..tables.heads.members import HeadsNotCounted
from ..tables.heads.owner import counter_problems
from ..tables.records import TABLES, Records

__all__ = ["verify_store"]

Problem = dict[str, Any]

# What an operator does about an owner whose heads do not add up to its owner head.
_WAY_OUT = (
    "; the owner's new turns are refused until its heads add up again: restore the store from a backup, drop the"
    " removed turn by name when it is known (`drop_turn`, `securepad turn drop`), or count the owner's turns anew"
    " from the heads present (`recount_turns`, `securepad turn recount`), which keeps its other turns and gives up"
    " the removed one"
)
Steps = list[list[int]]  # runs of step numbers, [first, last] each


class _Problems(list[Problem]):
    def add(self, owner: str, turn_id: str | None, item_id: str | None, what: str, problem: str) -> Problem:
        found = {"owner_user_id": owner, "turn_id": turn_id, "id": item_id, "what": what, "problem": problem}
        self.append(found)
        return found


def verify_store(db: Backend, opener: Opener, records: Records, heads: Heads, now: float) -> dict[str, Any]:
    """What is wrong in the store, and where (``Scratchpad.verify``), read in one snapshot.

    Raises:
        StoreBusyError, StoreUnavailableError: the snapshot could not be had.
    """
    with db.snapshot():
        return _verify(db, opener, records, heads, now)


def _verify(db: Backend, opener: Opener, records: Records, heads: Heads, now: float) -> dict[str, Any]:
    started = time.perf_counter()
    problems = _Problems()
    opened = heads.all_heads()
    turn_heads, owner_heads = _check_heads(opened, problems)
    for owner in heads.owners.owners_without_heads():
        problems.add(
            owner, None, None, "owner head", "the owner has a key but no heads: its turns and heads were removed"
        )
    counted = {"entries": 0, **dict.fromkeys(TABLES, 0)}
    found: dict[tuple[str, str], HeadEdit] = {}
    steps: dict[tuple[str, str], list[int]] = {}  # each turn's authenticated steps, in order
    stored: set[str] = set()  # every entry id in the store, authenticated or not

    def tally(where: tuple[str, str]) -> HeadEdit:
        if where not in found:
            found[where] = heads.tally_of(*where)
        return found[where]

    for row in every_row(db):
        counted["entries"] += 1
        stored.add(row["id"])
        where = (row["owner_user_id"], row["turn_id"])
        try:
            tally(where).add("e", row["id"], entry_item(row))
            opener.verify_row(row)
            steps.setdefault(where, []).append(int(row["step_num"]))
            if where not in turn_heads:
                raise IntegrityError("the entry's turn has no head")
        except IntegrityError as exc:
            problems.add(*where, row["id"], "entry", str(exc))
    for table in TABLES:
        for row in records.all_rows(table):
            counted[table] += 1
            where = (row["owner_user_id"], row["turn_id"])
            try:
                tally(where).add(RECORD_KINDS[table], row["id"], record_item(row))
                records.verify_row(table, row)
                if where not in turn_heads:
                    raise IntegrityError("the record's turn has no head")
            except IntegrityError as exc:
                problems.add(*where, row["id"], table[:-1], str(exc))
    reserved = _turn_problems(turn_heads, tally, steps, stored, now, problems)
    _usage_problems(owner_heads, reserved, problems)
    for owner, counted_turn, what in counter_problems(heads.owners, db):  # an owner's heads put back from an older copy
        problems.add(owner, counted_turn, None, "owner head", f"{what}: put back from an older copy")
    for problem in problems:
        if problem["what"] == "turn":  # no write goes into it from this process while it fails
            heads.found_tampered(problem["owner_user_id"], problem["turn_id"], problem["problem"])
    return {
        "ok": not problems,
        "owners": len(opened),
        "turns": len(turn_heads),
        **counted,
        "problems": list(problems),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _turn_problems(
    turn_heads: dict[tuple[str, str], Tally],
    tally: Callable[[tuple[str, str]], HeadEdit],
    steps: dict[tuple[str, str], list[int]],
    stored: set[str],
    now: float,
    problems: _Problems,
) -> dict[str, int]:
    """Each turn's head compared with the rows found for it (``problems``
    appended); the reservations per owner."""
    reserved: dict[str, int] = {}
    for (owner, turn_id), sealed in turn_heads.items():
        rows = tally((owner, turn_id)).tally
        reserved[owner] = reserved.get(owner, 0) + sealed.r
        try:
            sealed.check_found(rows, turn_id)
        except IntegrityError as exc:
            problem = problems.add(owner, turn_id, None, "turn", str(exc))
            if _entries_differ(sealed, rows):
                problem.update(_steps_named(sealed, steps.get((owner, turn_id), []), stored, now))
                problem["problem"] += _steps_text(problem)
            continue
        if sealed.b != rows.b:
            problems.add(owner, turn_id, None, "turn usage", f"counts {sealed.b} bytes, its entries {rows.b}")
    return reserved


def _check_heads(
    opened: dict[str, dict[str, Tally | set[str] | int | IntegrityError]], problems: _Problems
) -> tuple[dict[tuple[str, str], Tally], dict[str, int | None]]:
    """The turn heads that opened, by (owner, turn), and each owner's usage
    total (None: no usage head); what is wrong with the heads themselves goes to ``problems``."""
    turn_heads: dict[tuple[str, str], Tally] = {}
    totals: dict[str, int | None] = {}
    for owner, by_turn in opened.items():
        turns = by_turn.get(OWNER_HEAD)
        if isinstance(turns, HeadsNotCounted):
            problems.add(owner, None, None, "owner head", f"{turns}{_WAY_OUT}")
        elif isinstance(turns, IntegrityError):
            problems.add(owner, None, None, "owner head", str(turns))
        elif turns is None:
            problems.add(owner, None, None, "owner head", "the owner's turn heads have no owner head")
        usage = by_turn.get(USAGE_HEAD)
        if isinstance(usage, IntegrityError):
            problems.add(owner, None, None, "owner usage", str(usage))
        else:
            totals[owner] = usage if isinstance(usage, int) else None
        listed = turns if isinstance(turns, set) else None
        for turn_id, head in by_turn.items():
            if turn_id in (OWNER_HEAD, USAGE_HEAD):
                continue
            if isinstance(head, IntegrityError):
                problems.add(owner, turn_id, None, "turn head", str(head))
            elif isinstance(head, Tally):
                turn_heads[(owner, turn_id)] = head
            if listed is not None and turn_id not in listed:
                problems.add(owner, turn_id, None, "turn head", "a turn head the owner head does not list")
        for turn_id in sorted(listed or ()):
            if turn_id not in by_turn:
                problems.add(owner, turn_id, None, "turn head", "the turn and its head were removed")
    return turn_heads, totals


def _usage_problems(totals: dict[str, int | None], reserved: dict[str, int], problems: _Problems) -> None:
    """The usage heads' reservations against the sum of the turns' (which cover their entries)."""
    for owner, total in sorted(totals.items()):
        if total is None:
            problems.add(owner, None, None, "owner usage", "the owner has no usage head")
        elif total != reserved.get(owner, 0):
            problems.add(
                owner, None, None, "owner usage", f"reserves {total} bytes, its turns {reserved.get(owner, 0)}"
            )


def _entries_differ(sealed: Tally, rows: Tally) -> bool:
    """Whether the turn's entries (not only its records) differ from its head (``Tally.check_found``'s tests)."""
    return (
        (rows.n["e"], rows.d["e"]) != (sealed.n["e"], sealed.d["e"])
        or rows.last > sealed.last
        or (sealed.newest is not None and sealed.newest != rows.newest)
    )


def _steps_named(sealed: Tally, present: list[int], stored: set[str], now: float) -> dict[str, Any]:
    """A turn whose entries differ from its head: ``steps`` (runs), ``last_step``
    (the head's), ``missing_steps`` (runs of 1..last_step with no authenticated
    entry), ``newest_removed`` (the head's newest entry's step when its row is
    gone before its sealed expiry, else None)."""
    newest = sealed.newest
    removed = None
    if newest is not None and newest[0] not in stored and float(newest[2]) > now:
        removed = int(newest[1])
    return {
        "steps": _runs(present),
        "last_step": sealed.last,
        "missing_steps": _gaps(present, sealed.last),
        "newest_removed": removed,
    }


def _runs(ordered: list[int]) -> Steps:
    """Sorted step numbers (repeats allowed) as runs ``[first, last]``."""
    runs: Steps = []
    for step in ordered:
        if runs and step <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], step)
        else:
            runs.append([step, step])
    return runs


def _gaps(ordered: list[int], last: int) -> Steps:
    """The runs of 1..``last`` that ``ordered`` (sorted) does not hold: between its runs, and the ends."""
    ends = [[0, 0], *_runs([step for step in ordered if 1 <= step <= last]), [last + 1, last + 1]]
    return [[before[1] + 1, after[0] - 1] for before, after in itertools.pairwise(ends) if after[0] > before[1] + 1]


def _steps_text(named: dict[str, Any]) -> str:
    def runs(found: Steps) -> str:
        return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in found) or "none"

    text = f"; steps present: {runs(named['steps'])}; the head's last step: {named['last_step']}"
    if named["missing_steps"]:
        missing = named["missing_steps"]
        text += (
            f"; no authenticated entry for step{'' if missing == [[missing[0][0]] * 2] else 's'} {runs(missing)}"
            " (removed, altered, or expired and collected; or never recorded)"
        )
    if named["newest_removed"] is not None:
        text += f"; the head's newest entry (step {named['newest_removed']}) is gone before its sealed expiry: removed"
    return text
