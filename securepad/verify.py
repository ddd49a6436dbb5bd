"""``Scratchpad.verify``: the whole-store check of heads, entries and records.

One pass over the heads (each opened once), one over the entries (each
authenticated with all its segments) and one over each record table, so the
time is linear in the store. Nothing is taken on trust: every row is
authenticated before it is compared with its turn's head, and every head
before its lists are used. Expiry is legitimate: a row whose *sealed* expiry
has passed may be absent.
"""

from __future__ import annotations

import time
from typing import Any

from ._records import TABLES, Records
from .entries import Entries
from .errors import IntegrityError
from .heads import OWNER_HEAD, RECORD_KINDS, USAGE_HEAD, HeadEdit, Heads, Tally, entry_item, record_item

__all__ = ["verify_store"]

Problem = dict[str, Any]


def verify_store(entries: Entries, records: Records, heads: Heads, now: float) -> dict[str, Any]:
    """What is wrong in the store, and where (see ``Scratchpad.verify``)."""
    started = time.perf_counter()
    problems: list[Problem] = []
    opened = heads.all_heads()
    turn_heads, owner_heads = _check_heads(opened, problems)
    for owner in heads.owners_without_heads():
        problems.append(
            _problem(
                owner, None, None, "owner head", "the owner has a key but no heads: its turns and heads were removed"
            )
        )
    counted = {"entries": 0, **dict.fromkeys(TABLES, 0)}
    found: dict[tuple[str, str], HeadEdit] = {}
    usage: dict[str, int] = {}

    def tally(where: tuple[str, str]) -> HeadEdit:
        if where not in found:
            found[where] = heads.tally_of(*where)
        return found[where]

    for row in entries.all_rows():
        counted["entries"] += 1
        usage[row["owner_user_id"]] = usage.get(row["owner_user_id"], 0) + int(row["stored_bytes"])
        where = (row["owner_user_id"], row["turn_id"])
        try:
            tally(where).add("e", row["id"], entry_item(row))
            entries.verify_row(row)
            if where not in turn_heads:
                raise IntegrityError("the entry's turn has no head")
        except IntegrityError as exc:
            problems.append(_problem(*where, row["id"], "entry", str(exc)))
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
                problems.append(_problem(*where, row["id"], table[:-1], str(exc)))
    for (owner, turn_id), sealed in turn_heads.items():
        try:
            heads.same_tally(sealed, tally((owner, turn_id)).tally, turn_id)
        except IntegrityError as exc:
            problems.append(_problem(owner, turn_id, None, "turn", str(exc)))
    problems += _usage_problems(owner_heads, usage)
    return {
        "ok": not problems,
        "owners": len(opened),
        "turns": len(turn_heads),
        **counted,
        "problems": problems,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _check_heads(
    opened: dict[str, dict[str, Tally | set[str] | int | IntegrityError]], problems: list[Problem]
) -> tuple[dict[tuple[str, str], Tally], dict[str, int | None]]:
    """The turn heads that opened, by (owner, turn), and each owner's usage
    total (None: no usage head); what is wrong with the heads themselves goes to ``problems``."""
    turn_heads: dict[tuple[str, str], Tally] = {}
    totals: dict[str, int | None] = {}
    for owner, by_turn in opened.items():
        turns = by_turn.get(OWNER_HEAD)
        if isinstance(turns, IntegrityError):
            problems.append(_problem(owner, None, None, "owner head", str(turns)))
        elif turns is None:
            problems.append(_problem(owner, None, None, "owner head", "the owner's turn heads have no owner head"))
        usage = by_turn.get(USAGE_HEAD)
        if isinstance(usage, IntegrityError):
            problems.append(_problem(owner, None, None, "owner usage", str(usage)))
        else:
            totals[owner] = usage if isinstance(usage, int) else None
        listed = turns if isinstance(turns, set) else None
        for turn_id, head in by_turn.items():
            if turn_id in (OWNER_HEAD, USAGE_HEAD):
                continue
            if isinstance(head, IntegrityError):
                problems.append(_problem(owner, turn_id, None, "turn head", str(head)))
            elif isinstance(head, Tally):
                turn_heads[(owner, turn_id)] = head
            if listed is not None and turn_id not in listed:
                problems.append(_problem(owner, turn_id, None, "turn head", "a turn head the owner head does not list"))
        for turn_id in sorted(listed or ()):
            if turn_id not in by_turn:
                problems.append(_problem(owner, turn_id, None, "turn head", "the turn and its head were removed"))
    return turn_heads, totals


def _usage_problems(totals: dict[str, int | None], usage: dict[str, int]) -> list[Problem]:
    """The quota's running totals (sealed in the usage heads) against the sum of
    the entries' stored_bytes (which the turn heads authenticate)."""
    problems: list[Problem] = []
    for owner, total in sorted(totals.items()):
        if total is None:
            problems.append(_problem(owner, None, None, "owner usage", "the owner has no usage head"))
        elif total != usage.get(owner, 0):
            problems.append(
                _problem(owner, None, None, "owner usage", f"counts {total} bytes, the entries {usage.get(owner, 0)}")
            )
    return problems


def _problem(owner: str, turn_id: str | None, item_id: str | None, what: str, problem: str) -> Problem:
    return {"owner_user_id": owner, "turn_id": turn_id, "id": item_id, "what": what, "problem": problem}
