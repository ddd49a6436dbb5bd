"""The ``hotpath`` workload's tables and the hot path's targets that it measures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import size_label
from .hotpath import BATCHES, DURABILITIES, PEERS, TAIL_CHARS, TAIL_ENTRY

Record = dict[str, Any]
Add = Callable[[str, "str | None", "bool | None", "float | None"], None]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _section(records: list[Record], name: str) -> list[Record]:
    return [r for r in records if r.get("section") == name]


def markdown(records: list[Record]) -> list[str]:
    """The hot-path tables (costs, write rates, tail, listing), each with its skipped rows."""
    out: list[str] = []
    costs = _section(records, "costs")
    if costs:
        out.append("\n### hotpath: SQL statements and WAL frames of one put (load-independent)\n")
        rows = [
            [r["case"].removeprefix("costs "), str(r["statements"]), str(r["wal_frames"]), str(r["raw_wal_frames"])]
            for r in costs
            if "skipped" not in r
        ]
        out.append(_table(["size", "statements", "WAL frames", "raw-apsw WAL frames"], rows))
    writes = _section(records, "write")
    if writes:
        out.append("\n### hotpath: 4 KiB observations per second, single writes and batches\n")
        rows = [
            [
                r["store"],
                r["durability"],
                r["mode"],
                _ms(r["stats"]["median"]),
                f"{r['stats']['obs_per_s']:,.0f}",
                str(r["stats"]["n"]),
            ]
            for r in writes
            if "skipped" not in r
        ]
        out.append(_table(["store", "durability", "call", "median per call", "observations/s", "calls"], rows))
    tails = _section(records, "tail")
    if tails:
        out.append(f"\n### hotpath: tail of {TAIL_CHARS} characters of {size_label(TAIL_ENTRY)}, in process\n")
        rows = [
            [r["store"], _ms(r["stats"]["median"]), _ms(r["stats"]["p99"]), str(r["stats"]["n"])]
            for r in tails
            if "skipped" not in r
        ]
        out.append(_table(["store", "median", "p99", "n"], rows))
    listing = _section(records, "listing")
    if listing:
        out.append("\n### hotpath: listing a turn, in process\n")
        rows = [[r["store"], r["case"], _ms(r["stats"]["median"]), str(r["stats"]["n"])] for r in listing]
        out.append(_table(["store", "call", "median", "n"], rows))
    skipped = [r for r in records if "skipped" in r]
    if skipped:
        out.append("\nhotpath skipped: " + "; ".join(f"{r['case']}: {r['skipped']}" for r in skipped))
    return out


def _find(records: list[Record], **match: Any) -> Record | None:
    for r in records:
        if "skipped" not in r and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def targets(records: list[Record], add: Add) -> None:
    """The hot path's targets that the hotpath workload measures, each as a ratio from this run."""
    cost = _find(_section(records, "costs"), size_bytes=4096)
    why = _why(_section(records, "costs"), "securepad")
    for label, key, limit in (("statements", "statements", 4), ("WAL frames", "wal_frames", 5)):
        value = cost[key] if cost else None
        measured = why if cost is None else str(value)
        if cost and key == "wal_frames":
            measured = f"{value} (raw apsw: {cost['raw_wal_frames']})"
        add(f"put 4 KiB: <= {limit} {label}", measured, _le(value, limit), value)
    writes = _section(records, "write")
    for setting in DURABILITIES:
        single = _find(writes, store="securepad", durability=setting, mode="single")
        many = _find(writes, store="securepad", durability=setting, mode=f"put_many {BATCHES[-1]}")
        why = _why(writes, "securepad", durability=setting)
        _ratio(add, f"put_many 64 x 4 KiB >= 5x the rate of single puts ({setting})", many, single, 5, why)
        for peer in PEERS:
            theirs = _find(writes, store=peer, mode="single")
            why = _why(writes, peer) or _why(writes, "securepad", durability=setting, mode="single")
            _ratio(add, f"4 KiB write rate >= 3x {peer} ({setting} vs theirs)", single, theirs, 3, why)
            why = _why(writes, peer) or _why(writes, "securepad", durability=setting)
            _ratio(add, f"put_many 64 rate >= 10x {peer}'s single writes ({setting})", many, theirs, 10, why)
    tails = _section(records, "tail")
    ours = _find(tails, store="securepad")
    for peer in PEERS:
        theirs = _find(tails, store=peer)
        label = f"tail {TAIL_CHARS} of 1 MiB >= 20x faster than {peer} (median)"
        if ours and theirs:
            ratio = theirs["stats"]["median"] / ours["stats"]["median"]
            add(label, f"{ratio:.1f}x", ratio >= 20, ratio)
        else:
            add(label, _why(tails, peer), None, None)
    listing = _section(records, "listing")
    sp, un = _find(listing, store="securepad"), _find(listing, store="unhardened")
    steps = sp["steps"] if sp else None
    label = f"list_for_turn {steps or 1000} steps within 5x of the unhardened listing (median)"
    if sp and un:
        ratio = sp["stats"]["median"] / un["stats"]["median"]
        add(label, f"{ratio:.2f}x", ratio <= 5, ratio)
    else:
        add(label, None, None, None)


def _why(records: list[Record], store: str, **match: Any) -> str | None:
    """The reason a figure is missing: the skipped record that stands for it, if any."""
    for r in records:
        if "skipped" in r and r.get("store") == store and all(r.get(k) == v for k, v in match.items()):
            return str(r["skipped"])
    return None


def _le(value: int | None, limit: int) -> bool | None:
    return None if value is None else value <= limit


def _ratio(
    add: Add, label: str, ours: Record | None, theirs: Record | None, floor: float, why: str | None = None
) -> None:
    if ours and theirs:
        a, b = ours["stats"]["obs_per_s"], theirs["stats"]["obs_per_s"]
        ratio = a / b
        add(label, f"{ratio:.2f}x ({a:,.0f} vs {b:,.0f} obs/s)", ratio >= floor, ratio)
    else:
        add(label, why, None, None)
