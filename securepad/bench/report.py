"""Turning results into the markdown tables, the summary, the targets, the JSON and the chart."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .config import MiB, size_label
from .hotpath import BATCHES, DURABILITIES, PEERS, TAIL_CHARS, TAIL_ENTRY

Results = dict[str, Any]
Record = dict[str, Any]
Rows = Callable[[Record], list[list[str]]]

COLORS = {
    "securepad": "#1f77b4",
    "raw-apsw": "#7f7f7f",
    "sealed-floor": "#ff7f0e",
    "unhardened": "#d62728",
    "diskcache": "#2ca02c",
    "sqlcipher": "#9467bd",
}


def fmt_time(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_kib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _rate_cells(stats: dict[str, Any]) -> list[str]:
    return [_ms(stats["median"]), f"{stats['obs_per_s']:,.0f}", str(stats["n"])]


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


FIG = ["n", "median", "p90", "p99", "max"]


def _figures(stats: dict[str, Any]) -> list[str]:
    return [str(stats["n"]), *(fmt_time(stats[k]) for k in ("median", "p90", "p99", "max"))]


def _timed(r: Record, *last: str) -> list[list[str]]:
    return [[r["case"], *_figures(r["stats"]), fmt_rate(r["stats"]["ops_per_s"]), *last]]


def _concurrent_rows(r: Record) -> list[list[str]]:
    totals = [fmt_rate(r["stats"]["ops_per_s"]), str(r["error_count"]), str(r["lost_writes"])]
    return [
        [r["case"], op, *_figures(r[op]), fmt_rate(r[op]["ops_per_s"]), *(totals if op == "put" else ["", "", ""])]
        for op in ("put", "read")
    ]


# workload -> (heading, its columns after the backend's, its rows of one record), in the order markdown shows them.
_SECTIONS: dict[str, tuple[str, list[str], Rows]] = {
    "put": (
        "put: sequential, one process, one entry per put",
        ["size", *FIG, "ops/s", "MB/s"],
        lambda r: _timed(r, fmt_rate(r["stats"]["mb_per_s"])),
    ),
    "read": (
        "read: 2000 characters, fresh process per entry; peak RSS above the process's resting RSS",
        ["read", *FIG, "ops/s", "peak RSS Δ"],
        lambda r: _timed(r, fmt_kib(r["peak_rss_delta_kib"])),
    ),
    "concurrent": (
        "concurrent: 50/50 put/read of 4 KiB entries, processes x threads, fixed time",
        ["PxT", "op", *FIG, "op/s", "total ops/s", "errors", "lost writes"],
        _concurrent_rows,
    ),
    "resume": (
        "resume: a fresh process opens the store, history and tools ready",
        ["turn", *FIG, "resumes/s", "peak RSS Δ", "how"],
        lambda r: _timed(r, fmt_kib(r["peak_rss_delta_kib"]), r.get("api") or "SELECT by turn"),
    ),
    "gc": (
        "gc: delete expired entries (one run each; securepad also zeroes and truncates the WAL)",
        ["entries", "time", "entries/s"],
        lambda r: [[r["case"], fmt_time(r["stats"]["max"]), fmt_rate(r["stats"]["ops_per_s"])]],
    ),
    "open": (
        "open: an existing store, ready to serve",
        ["key source", *FIG],
        lambda r: [[r["case"], *_figures(r["stats"])]],
    ),
}
# hotpath section -> (heading, columns, the row of one measured record)
_HOTPATH: dict[str, tuple[str, list[str], Callable[[Record], list[str]]]] = {
    "costs": (
        "SQL statements and WAL frames of one put (load-independent)",
        ["size", "statements", "WAL frames", "raw-apsw WAL frames"],
        lambda r: [
            r["case"].removeprefix("costs "),
            *(str(r[k]) for k in ("statements", "wal_frames", "raw_wal_frames")),
        ],
    ),
    "write": (
        "4 KiB observations per second, single writes and batches",
        ["store", "durability", "call", "median per call", "observations/s", "calls"],
        lambda r: [r["store"], r["durability"], r["mode"], *_rate_cells(r["stats"])],
    ),
    "tail": (
        f"tail of {TAIL_CHARS} characters of {size_label(TAIL_ENTRY)}, in process",
        ["store", "median", "p99", "n"],
        lambda r: [r["store"], _ms(r["stats"]["median"]), _ms(r["stats"]["p99"]), str(r["stats"]["n"])],
    ),
    "listing": (
        "listing a turn, in process",
        ["store", "call", "median", "n"],
        lambda r: [r["store"], r["case"], _ms(r["stats"]["median"]), str(r["stats"]["n"])],
    ),
}


def markdown(results: Results) -> str:
    w = results["workloads"]
    out: list[str] = []
    for name, (heading, header, rows_of) in _SECTIONS.items():
        if not w.get(name):
            continue
        out.append(("" if name == "put" else "\n") + f"### {heading}\n")  # put first: no blank line above
        out.append(_table(["backend", *header], ([r["backend"], *row] for r in w[name] for row in rows_of(r))))
        errors = [f"{r['backend']} {r['case']}: {v}x {k}" for r in w[name] for k, v in r.get("errors", {}).items()]
        if errors:
            out.append("\nerrors: " + "; ".join(errors))
    out += hotpath_markdown(w.get("hotpath", []))
    if results.get("targets"):
        out.append("\n### targets (ratios measured in this run)\n")
        rows = ([t["target"], t["measured"], _verdict(t["passed"])] for t in results["targets"])
        out.append(_table(["target", "measured", "result"], rows))
    if results.get("failures"):
        failed = (f"{f['workload']} on {f['backend']}: {f['error']}" for f in results["failures"])
        out.append("\nFAILED: " + "; ".join(failed))
    if results.get("skipped"):
        out.append("\nskipped: " + "; ".join(f"{s['backend']}: {s['reason']}" for s in results["skipped"]))
    return "\n".join(out) + "\n"


def hotpath_markdown(records: list[Record]) -> list[str]:
    out: list[str] = []
    for section, (heading, header, row) in _HOTPATH.items():
        found = _section(records, section)
        if found:
            out.append(f"\n### hotpath: {heading}\n")
            out.append(_table(header, (row(r) for r in found if "skipped" not in r)))
    skipped = [r for r in records if "skipped" in r]
    if skipped:
        out.append("\nhotpath skipped: " + "; ".join(f"{r['case']}: {r['skipped']}" for r in skipped))
    return out


WIDTH = 80
_LABEL = 22  # the case column; each backend gets 11, or 10 when six share the width
_COLUMN = {"sealed-floor": "floor"}  # a backend's column heading, where its name is long
# workload -> (heading, how the cases shown begin, the figure shown); the JSON and --tables keep everything.
_SUMMARY: dict[str, tuple[str, str, Callable[[Record], str]]] = {
    "put": ("put, one entry (median)", "", lambda r: fmt_time(r["stats"]["median"])),
    "read": (
        "read 2000 chars from the tail, fresh process (median)",
        "tail ",
        lambda r: fmt_time(r["stats"]["median"]),
    ),
    "concurrent": (
        "concurrent 4 KiB put/read, processes x threads (total ops/s)",
        "",
        lambda r: fmt_rate(r["stats"]["ops_per_s"]),
    ),
    "resume": ("resume a turn, fresh process (median)", "", lambda r: fmt_time(r["stats"]["median"])),
    "gc": ("gc of expired entries (time)", "", lambda r: fmt_time(r["stats"]["max"])),
    "open": ("open an existing store (median)", "", lambda r: fmt_time(r["stats"]["median"])),
}


def _fit(text: str, width: int) -> str:
    """``text``, cut to ``width`` characters with an ellipsis where it is longer."""
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def summary(results: Results, written: Iterable[str] = ()) -> str:
    """What was measured, securepad beside each baseline, where the files are, in 80 columns."""
    meta, w = results["meta"], results["workloads"]
    backends = [b for b, info in results["backends"].items() if info.get("available", True)]
    machine = meta.get("machine", {}).get("summary", "")
    out = _wrapped(f"securepad bench ({meta.get('mode', '?')}) on {machine}; {meta.get('elapsed_s', '?')} s")
    for name, (heading, begins, figure) in _SUMMARY.items():
        records = [r for r in w.get(name, []) if str(r.get("case")).startswith(begins)]
        if not records:
            continue
        column = max(10, min(11, (WIDTH - _LABEL) // len(backends)))
        width = min(_LABEL, WIDTH - column * len(backends))
        names = (_fit(_COLUMN.get(b, b), column - 1) for b in backends)
        out += ["", heading[:WIDTH], f"{'':<{width}}" + "".join(f"{name:>{column}}" for name in names)]
        for case in dict.fromkeys(str(r["case"]) for r in records):
            label = _fit(case, width - 2)
            found = [_find(records, backend=backend, case=case) for backend in backends]
            out.append(f"  {label:<{width - 2}}" + "".join(f"{figure(r) if r else '-':>{column}}" for r in found))
    if w.get("hotpath"):
        out += ["", f"hotpath: {len(w['hotpath'])} measurements (statements, WAL frames per put) in the JSON"]
    listed = results.get("targets") or []
    if listed:
        met = sum(1 for t in listed if t["passed"])
        missed = sum(1 for t in listed if t["passed"] is False)
        out += ["", *_wrapped(f"targets: {met} of {len(listed)} met, {missed} missed (--targets lists them)")]
    for failure in results.get("failures", []):
        out += _wrapped(f"FAILED: {failure['workload']} on {failure['backend']}: {failure['error']}")
    for skipped in results.get("skipped", []):
        out += _wrapped(f"skipped {skipped['backend']}: {skipped['reason']}")
    files = list(written)
    if files:
        out += ["", *_wrapped("results: " + ", ".join(files))]
    return "\n".join(out) + "\n"


def targets_text(results: Results) -> str:
    out = ["targets (ratios measured in this run)"]
    for t in results.get("targets") or []:
        out += _wrapped(f"{_verdict(t['passed']).strip('*'):<5} {t['target']}: {t['measured']}", indent=6)
    return "\n".join(out) + "\n"


def _wrapped(text: str, indent: int = 2) -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * indent, break_long_words=True) or [""]


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else "pass" if passed else "**miss**"


def _find(records: list[Record], **match: Any) -> Record | None:
    """The first measured record (not skipped) with every field of ``match``."""
    return next((r for r in records if "skipped" not in r and all(r.get(k) == v for k, v in match.items())), None)


def _section(records: list[Record], name: str) -> list[Record]:
    return [r for r in records if r.get("section") == name]


def _target(target: str, measured: str | None, passed: bool | None, value: float | None = None) -> Record:
    """One target's line; ``measured`` None: a figure it needs is not in this run."""
    return {"target": target, "measured": measured or "not measured in this run", "passed": passed, "value": value}


_UNITS = {"ops_per_s": "ops/s", "obs_per_s": "obs/s"}


def _ratio(
    name: str,
    ours: Record | None,
    theirs: Record | None,
    key: str,
    *,
    least: float | None = None,
    most: float | None = None,
    digits: str = ".2f",
    detail: bool = False,
    why: str | None = None,
) -> Record:
    """``ours``' stats[key] over ``theirs``', at least ``least`` or at most ``most``; ``detail``
    shows both figures; a missing record is not measured, for the reason ``why``."""
    if not (ours and theirs):
        return _target(name, why, None)
    x, y = ours["stats"][key], theirs["stats"][key]
    ratio = x / y
    measured = f"{ratio:{digits}}x"
    if detail:
        both = f"{fmt_time(x)} vs {fmt_time(y)}" if key == "median" else f"{x:,.0f} vs {y:,.0f} {_UNITS[key]}"
        measured += f" ({both})"
    passed = ratio >= least if least is not None else most is not None and ratio <= most
    return _target(name, measured, passed, ratio)


def targets(results: Results) -> list[Record]:
    w = results["workloads"]
    puts, reads, conc = w.get("put", []), w.get("read", []), w.get("concurrent", [])
    found = []
    for size, floor in ((4096, 0.8), (65536, 0.8), (MiB, 0.85)):
        sp, raw = _find(puts, backend="securepad", size_bytes=size), _find(puts, backend="raw-apsw", size_bytes=size)
        name = f"put {size_label(size)}: securepad >= {floor}x raw plaintext"
        found.append(_beside_floor(_ratio(name, sp, raw, "ops_per_s", least=floor), puts, raw, size_bytes=size))
    for sp in (r for r in puts if r["backend"] == "securepad"):
        un = _find(puts, backend="unhardened", size_bytes=sp["size_bytes"])
        if un:
            ratio = sp["stats"]["ops_per_s"] / un["stats"]["ops_per_s"]
            found.append(_target(f"put {sp['case']}: securepad above unhardened", f"{ratio:.2f}x", ratio > 1, ratio))
    big = _find(reads, backend="securepad", mode="tail", entry_bytes=100 * MiB)
    ref = _find(reads, backend="securepad", mode="tail", entry_bytes=64 * 1024)
    un_big = _find(reads, backend="unhardened", mode="tail", entry_bytes=100 * MiB)
    name = "tail 2000 of 100 MiB within 3x of the same read on 64 KiB (median)"
    found.append(_ratio(name, big, ref, "median", most=3, detail=True))
    name = "tail 2000 of 100 MiB >= 100x faster than unhardened (median)"
    found.append(_ratio(name, un_big, big, "median", least=100, digits=",.0f", detail=True))
    name = "tail 2000 of 100 MiB: < 4 MiB extra peak memory"
    kib = big["peak_rss_delta_kib"] if big else None
    found.append(_target(name, fmt_kib(kib), kib < 4 * 1024, kib) if kib is not None else _target(name, None, None))
    found += _concurrent_targets(conc)
    resumes = w.get("resume", [])
    sp, un = _find(resumes, backend="securepad", steps=1000), _find(resumes, backend="unhardened", steps=1000)
    name = "resume 1000 steps within 5x of listing them from unhardened (median)"
    found.append(_ratio(name, sp, un, "median", most=5, detail=True))
    return found + hotpath_targets(w.get("hotpath", []))


def _concurrent_targets(conc: list[Record]) -> list[Record]:
    sp, raw = _find(conc, backend="securepad", case="2x4"), _find(conc, backend="raw-apsw", case="2x4")
    labels = ("2x4: 0 errors", "2x4: 0 lost writes", "2x4: put p99 <= 20 ms", "2x4: put max <= 200 ms")
    if sp:
        lost = f"{sp['lost_writes']} of {sp['acked_puts']} acknowledged"
        found = [
            _target(labels[0], str(sp["error_count"]), sp["error_count"] == 0, sp["error_count"]),
            _target(labels[1], lost, sp["lost_writes"] == 0, sp["lost_writes"]),
            _target(labels[2], fmt_time(sp["put"]["p99"]), sp["put"]["p99"] <= 0.020, sp["put"]["p99"]),
            _target(labels[3], fmt_time(sp["put"]["max"]), sp["put"]["max"] <= 0.200, sp["put"]["max"]),
        ]
    else:
        found = [_target(label, None, None) for label in labels]
    name = "2x4: throughput >= 0.5x raw plaintext"
    found.append(_ratio(name, sp, raw, "ops_per_s", least=0.5, detail=True))
    sp, raw = _find(conc, backend="securepad", case="8x1"), _find(conc, backend="raw-apsw", case="8x1")
    name = "8x1: throughput >= 0.3x raw plaintext"
    return [*found, _beside_floor(_ratio(name, sp, raw, "ops_per_s", least=0.3, detail=True), conc, raw, case="8x1")]


def _beside_floor(target: Record, records: list[Record], raw: Record | None, **match: Any) -> Record:
    """``target`` with the sealed floor's own ratio to raw apsw appended, when the
    run measured both: what any store that keeps the guarantees could reach."""
    floor = _find(records, backend="sealed-floor", **match)
    if floor and raw and target["passed"] is not None:
        ratio = floor["stats"]["ops_per_s"] / raw["stats"]["ops_per_s"]
        target = {**target, "measured": f"{target['measured']}; sealed floor {ratio:.2f}x"}
    return target


def _why(records: list[Record], store: str, **match: Any) -> str | None:
    for r in records:
        if "skipped" in r and r.get("store") == store and all(r.get(k) == v for k, v in match.items()):
            return str(r["skipped"])
    return None


def hotpath_targets(records: list[Record]) -> list[Record]:
    found = []
    costs = _section(records, "costs")
    cost, why = _find(costs, size_bytes=4096), _why(costs, "securepad")
    for label, key, limit in (("statements", "statements", 4), ("WAL frames", "wal_frames", 5)):
        value = cost[key] if cost else None
        measured = why if cost is None else str(value)
        if cost and key == "wal_frames":
            measured = f"{value} (raw apsw: {cost['raw_wal_frames']})"
        found.append(
            _target(f"put 4 KiB: <= {limit} {label}", measured, None if value is None else value <= limit, value)
        )
    writes = _section(records, "write")
    for setting in DURABILITIES:
        single = _find(writes, store="securepad", durability=setting, mode="single")
        many = _find(writes, store="securepad", durability=setting, mode=f"put_many {BATCHES[-1]}")
        why = _why(writes, "securepad", durability=setting)
        name = f"put_many 64 x 4 KiB >= 5x the rate of single puts ({setting})"
        found.append(_ratio(name, many, single, "obs_per_s", least=5, detail=True, why=why))
        for peer in PEERS:
            theirs = _find(writes, store=peer, mode="single")
            why = _why(writes, peer) or _why(writes, "securepad", durability=setting, mode="single")
            name = f"4 KiB write rate >= 3x {peer} ({setting} vs theirs)"
            found.append(_ratio(name, single, theirs, "obs_per_s", least=3, detail=True, why=why))
            why = _why(writes, peer) or _why(writes, "securepad", durability=setting)
            name = f"put_many 64 rate >= 10x {peer}'s single writes ({setting})"
            found.append(_ratio(name, many, theirs, "obs_per_s", least=10, detail=True, why=why))
    tails = _section(records, "tail")
    for peer in PEERS:
        name = f"tail {TAIL_CHARS} of 1 MiB >= 20x faster than {peer} (median)"
        ours, theirs = _find(tails, store="securepad"), _find(tails, store=peer)
        found.append(_ratio(name, theirs, ours, "median", least=20, digits=".1f", why=_why(tails, peer)))
    listing = _section(records, "listing")
    sp, un = _find(listing, store="securepad"), _find(listing, store="unhardened")
    name = f"list_for_turn {sp['steps'] if sp else 1000} steps within 5x of the unhardened listing (median)"
    return [*found, _ratio(name, sp, un, "median", most=5)]


def write_json(results: Results, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def chart(results: Results, path: Path) -> str | None:
    """A PNG of the main figures; returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); pip install matplotlib"
    w = results["workloads"]
    tails = [r for r in w.get("read", []) if r["mode"] == "tail"]
    conc = w.get("concurrent", [])
    rss, resume = "tail 2000 chars: reader's extra peak RSS (MiB)", "resume a turn in a fresh process: median (ms)"
    # (records, a bar's value, title, log scale)
    panels: list[tuple[list[Record], Callable[[Record], float], str, bool]] = [
        (w.get("put", []), lambda r: r["stats"]["mb_per_s"], "put throughput (MB/s)", True),
        (tails, lambda r: r["stats"]["median"] * 1e3, "tail 2000 chars: median (ms)", True),
        (tails, lambda r: max(r["peak_rss_delta_kib"], 1) / 1024, rss, True),
        (conc, lambda r: r["stats"]["ops_per_s"], "concurrent 50/50: total ops/s (PxT)", False),
        (conc, lambda r: r["put"]["p99"] * 1e3, "concurrent 50/50: put p99 (ms)", True),
        (w.get("resume", []), lambda r: r["stats"]["median"] * 1e3, resume, True),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    fig.suptitle(f"securepad benchmarks ({results['meta']['mode']} run, {results['meta']['machine']['summary']})")
    for ax, panel in zip(axes.flat, panels, strict=True):
        _bars(ax, *panel)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return None


def _case(r: Record) -> str:
    """A bar's case: the entry's size of a read, else the record's case."""
    return size_label(r["entry_bytes"]) if "entry_bytes" in r else str(r["case"])


def _bars(ax: Any, records: list[Record], value: Callable[[Record], float], title: str, log: bool) -> None:
    ax.set_title(title, fontsize=10)
    if not records:
        ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes)
        return
    cases = list(dict.fromkeys(_case(r) for r in records))
    backends = list(dict.fromkeys(r["backend"] for r in records))
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        xs, ys = [], []
        for j, case in enumerate(cases):
            found = next((r for r in records if r["backend"] == backend and _case(r) == case), None)
            if found is not None and value(found):
                xs.append(j + i * width - 0.4 + width / 2)
                ys.append(value(found))
        ax.bar(xs, ys, width, label=backend, color=COLORS.get(backend))
    ax.set_xticks(range(len(cases)), cases, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
