"""Turning results into the markdown tables, the targets, the JSON and the chart."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import hotpath_report
from .config import MiB, size_label

Results = dict[str, Any]

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
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def fmt_kib(kib: int | None) -> str:
    if kib is None:
        return "-"
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _figures(stats: dict[str, Any]) -> list[str]:
    return [str(stats["n"]), *(fmt_time(stats[k]) for k in ("median", "p90", "p99", "max"))]


FIG = ["n", "median", "p90", "p99", "max"]


def markdown(results: Results) -> str:
    """Every workload's table, then the targets."""
    w = results["workloads"]
    out: list[str] = []
    for name, (heading, section) in _SECTIONS.items():
        if w.get(name):
            # put comes first: no blank line above its heading.
            out.append(("" if name == "put" else "\n") + f"### {heading}\n")
            out.extend(section(w[name]))
    out += hotpath_report.markdown(w.get("hotpath", []))  # its own headings, one per part
    if results.get("targets"):
        out.append("\n### targets (ratios measured in this run)\n")
        out.append(
            _table(
                ["target", "measured", "result"],
                ([t["target"], t["measured"], _verdict(t["passed"])] for t in results["targets"]),
            )
        )
    if results.get("failures"):
        failed = (f"{f['workload']} on {f['backend']}: {f['error']}" for f in results["failures"])
        out.append("\nFAILED: " + "; ".join(failed))
    if results.get("skipped"):
        out.append("\nskipped: " + "; ".join(f"{s['backend']}: {s['reason']}" for s in results["skipped"]))
    return "\n".join(out) + "\n"


def _put_table(records: list[dict[str, Any]]) -> list[str]:
    rows = (
        [
            r["backend"],
            r["case"],
            *_figures(r["stats"]),
            fmt_rate(r["stats"]["ops_per_s"]),
            fmt_rate(r["stats"]["mb_per_s"]),
        ]
        for r in records
    )
    return [_table(["backend", "size", *FIG, "ops/s", "MB/s"], rows)]


def _read_table(records: list[dict[str, Any]]) -> list[str]:
    rows = (
        [
            r["backend"],
            r["case"],
            *_figures(r["stats"]),
            fmt_rate(r["stats"]["ops_per_s"]),
            fmt_kib(r["peak_rss_delta_kib"]),
        ]
        for r in records
    )
    return [_table(["backend", "read", *FIG, "ops/s", "peak RSS Δ"], rows)]


def _concurrent_table(records: list[dict[str, Any]]) -> list[str]:
    """One row per operation (put, read); the totals, errors and lost writes on the put row."""
    rows = []
    for r in records:
        for op in ("put", "read"):
            rows.append(
                [
                    r["backend"],
                    r["case"],
                    op,
                    *_figures(r[op]),
                    fmt_rate(r[op]["ops_per_s"]),
                    fmt_rate(r["stats"]["ops_per_s"]) if op == "put" else "",
                    str(r["error_count"]) if op == "put" else "",
                    str(r["lost_writes"]) if op == "put" else "",
                ]
            )
    out = [_table(["backend", "PxT", "op", *FIG, "op/s", "total ops/s", "errors", "lost writes"], rows)]
    errors = [(r["backend"], r["case"], k, v) for r in records for k, v in r["errors"].items()]
    if errors:
        out.append("\nerrors: " + "; ".join(f"{b} {c}: {v}x {k}" for b, c, k, v in errors))
    return out


def _resume_table(records: list[dict[str, Any]]) -> list[str]:
    rows = (
        [
            r["backend"],
            r["case"],
            *_figures(r["stats"]),
            fmt_rate(r["stats"]["ops_per_s"]),
            fmt_kib(r["peak_rss_delta_kib"]),
            r.get("api") or "SELECT by turn",
        ]
        for r in records
    )
    return [_table(["backend", "turn", *FIG, "resumes/s", "peak RSS Δ", "how"], rows)]


def _gc_table(records: list[dict[str, Any]]) -> list[str]:
    rows = ([r["backend"], r["case"], fmt_time(r["stats"]["max"]), fmt_rate(r["stats"]["ops_per_s"])] for r in records)
    return [_table(["backend", "entries", "time", "entries/s"], rows)]


def _open_table(records: list[dict[str, Any]]) -> list[str]:
    return [
        _table(["backend", "key source", *FIG], ([r["backend"], r["case"], *_figures(r["stats"])] for r in records))
    ]


# workload -> (heading, its table), in the order markdown shows them.
_SECTIONS: dict[str, tuple[str, Callable[[list[dict[str, Any]]], list[str]]]] = {
    "put": ("put: sequential, one process, one entry per put", _put_table),
    "read": (
        "read: 2000 characters, fresh process per entry; peak RSS above the process's resting RSS",
        _read_table,
    ),
    "concurrent": ("concurrent: 50/50 put/read of 4 KiB entries, processes x threads, fixed time", _concurrent_table),
    "resume": ("resume: a fresh process opens the store, history and tools ready", _resume_table),
    "gc": ("gc: delete expired entries (one run each; securepad also zeroes and truncates the WAL)", _gc_table),
    "open": ("open: an existing store, ready to serve", _open_table),
}


# -- the summary a person reads (80 columns) -----------------------------------------------

WIDTH = 80
_LABEL = 22  # the case column; each backend gets 11
# workload -> (heading, which cases, the figure shown); the JSON and --tables keep everything.
_SUMMARY: dict[str, tuple[str, Callable[[str], bool], Callable[[dict[str, Any]], str]]] = {
    "put": ("put, one entry (median)", lambda case: True, lambda r: fmt_time(r["stats"]["median"])),
    "read": (
        "read 2000 chars from the tail, fresh process (median)",
        lambda case: case.startswith("tail "),
        lambda r: fmt_time(r["stats"]["median"]),
    ),
    "concurrent": (
        "concurrent 4 KiB put/read, processes x threads (total ops/s)",
        lambda case: True,
        lambda r: fmt_rate(r["stats"]["ops_per_s"]),
    ),
    "resume": ("resume a turn, fresh process (median)", lambda case: True, lambda r: fmt_time(r["stats"]["median"])),
    "gc": ("gc of expired entries (time)", lambda case: True, lambda r: fmt_time(r["stats"]["max"])),
    "open": ("open an existing store (median)", lambda case: True, lambda r: fmt_time(r["stats"]["median"])),
}


def summary(results: Results, written: Iterable[str] = ()) -> str:
    """What was measured, securepad beside each baseline, where the files are:
    lines of at most 80 columns. The targets are counted, not listed (``targets_text``)."""
    meta, w = results["meta"], results["workloads"]
    backends = [b for b, info in results["backends"].items() if info.get("available", True)]
    machine = meta.get("machine", {}).get("summary", "")
    out = _wrapped(f"securepad bench ({meta.get('mode', '?')}) on {machine}; {meta.get('elapsed_s', '?')} s")
    for name, (heading, chosen, figure) in _SUMMARY.items():
        records = [r for r in w.get(name, []) if chosen(str(r.get("case")))]
        if not records:
            continue
        out += ["", heading[:WIDTH], f"{'':<{_LABEL}}" + "".join(f"{b[:10]:>11}" for b in backends)]
        cases = list(dict.fromkeys(str(r["case"]) for r in records))
        for case in cases:
            label = case if len(case) <= _LABEL - 2 else case[: _LABEL - 3] + "\u2026"
            cells = []
            for backend in backends:
                found = _find(records, backend, case=case)
                cells.append(f"{figure(found) if found else '-':>11}")
            out.append(f"  {label:<{_LABEL - 2}}" + "".join(cells))
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
    """The targets, one per line (wrapped at 80 columns): result, target, figure."""
    out = ["targets (ratios measured in this run)"]
    for t in results.get("targets") or []:
        out += _wrapped(f"{_verdict(t['passed']).strip('*'):<5} {t['target']}: {t['measured']}", indent=6)
    return "\n".join(out) + "\n"


def _wrapped(text: str, indent: int = 2) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * indent, break_long_words=True) or [""]


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else "pass" if passed else "**miss**"


# -- targets ---------------------------------------------------------------------------------


def _find(records: list[dict[str, Any]], backend: str, **match: Any) -> dict[str, Any] | None:
    for r in records:
        if r["backend"] == backend and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def targets(results: Results) -> list[dict[str, Any]]:
    """The issue's targets, each a ratio of two figures from this run."""
    w = results["workloads"]
    return [
        *_put_targets(w.get("put", [])),
        *_read_targets(w.get("read", [])),
        *_concurrent_targets(w.get("concurrent", [])),
        *_resume_targets(w.get("resume", [])),
        *_hotpath_targets(w.get("hotpath", [])),
    ]


def _hotpath_targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    hotpath_report.targets(records, lambda *target: found.append(_target(*target)))
    return found


def _target(target: str, measured: str | None, passed: bool | None, value: float | None = None) -> dict[str, Any]:
    """One target's line; ``measured`` None: a figure it needs is not in this run."""
    return {"target": target, "measured": measured or "not measured in this run", "passed": passed, "value": value}


def _put_targets(puts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """securepad's put rate against raw plaintext (per size) and against the unhardened store."""
    found = []
    for size, floor in ((4096, 0.5), (65536, 0.8), (MiB, 0.85)):
        name = f"put {size_label(size)}: securepad >= {floor}x raw plaintext"
        sp, raw = _find(puts, "securepad", size_bytes=size), _find(puts, "raw-apsw", size_bytes=size)
        if sp and raw:
            ratio = sp["stats"]["ops_per_s"] / raw["stats"]["ops_per_s"]
            found.append(_target(name, f"{ratio:.2f}x", ratio >= floor, ratio))
        else:
            found.append(_target(name, None, None))
    for sp in (r for r in puts if r["backend"] == "securepad"):
        un = _find(puts, "unhardened", size_bytes=sp["size_bytes"])
        if un:
            ratio = sp["stats"]["ops_per_s"] / un["stats"]["ops_per_s"]
            found.append(_target(f"put {sp['case']}: securepad above unhardened", f"{ratio:.2f}x", ratio > 1, ratio))
    return found


def _read_targets(reads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tail of a 100 MiB entry: against 64 KiB, against the unhardened store, its memory."""
    big = _find(reads, "securepad", mode="tail", entry_bytes=100 * MiB)
    ref = _find(reads, "securepad", mode="tail", entry_bytes=64 * 1024)
    un_big = _find(reads, "unhardened", mode="tail", entry_bytes=100 * MiB)
    found = []
    name = "tail 2000 of 100 MiB within 3x of the same read on 64 KiB (median)"
    if big and ref:
        ratio = big["stats"]["median"] / ref["stats"]["median"]
        times = f"({fmt_time(big['stats']['median'])} vs {fmt_time(ref['stats']['median'])})"
        found.append(_target(name, f"{ratio:.2f}x {times}", ratio <= 3, ratio))
    else:
        found.append(_target(name, None, None))
    name = "tail 2000 of 100 MiB >= 100x faster than unhardened (median)"
    if big and un_big:
        ratio = un_big["stats"]["median"] / big["stats"]["median"]
        times = f"({fmt_time(un_big['stats']['median'])} vs {fmt_time(big['stats']['median'])})"
        found.append(_target(name, f"{ratio:,.0f}x {times}", ratio >= 100, ratio))
    else:
        found.append(_target(name, None, None))
    name = "tail 2000 of 100 MiB: < 4 MiB extra peak memory"
    if big:
        kib = big["peak_rss_delta_kib"]
        found.append(_target(name, fmt_kib(kib), kib < 4 * 1024, kib))
    else:
        found.append(_target(name, None, None))
    return found


def _concurrent_targets(conc: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """2 processes x 4 threads: no errors, no lost writes, put latency, throughput against raw plaintext."""
    sp, raw = _find(conc, "securepad", case="2x4"), _find(conc, "raw-apsw", case="2x4")
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
    if sp and raw:
        ratio = sp["stats"]["ops_per_s"] / raw["stats"]["ops_per_s"]
        rates = f"({sp['stats']['ops_per_s']:,.0f} vs {raw['stats']['ops_per_s']:,.0f} ops/s)"
        found.append(_target(name, f"{ratio:.2f}x {rates}", ratio >= 0.5, ratio))
    else:
        found.append(_target(name, None, None))
    return found


def _resume_targets(resumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resuming a 1000-step turn against listing it from the unhardened store."""
    sp, un = _find(resumes, "securepad", steps=1000), _find(resumes, "unhardened", steps=1000)
    name = "resume 1000 steps within 5x of listing them from unhardened (median)"
    if sp and un:
        ratio = sp["stats"]["median"] / un["stats"]["median"]
        times = f"({fmt_time(sp['stats']['median'])} vs {fmt_time(un['stats']['median'])})"
        return [_target(name, f"{ratio:.2f}x {times}", ratio <= 5, ratio)]
    return [_target(name, None, None)]


# -- files -------------------------------------------------------------------------------------


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
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    fig.suptitle(f"securepad benchmarks ({results['meta']['mode']} run, {results['meta']['machine']['summary']})")
    _bars(axes[0][0], w.get("put", []), "case", lambda r: r["stats"]["mb_per_s"], "put throughput (MB/s)", log=True)
    tails = [r for r in w.get("read", []) if r["mode"] == "tail"]
    _bars(
        axes[0][1],
        tails,
        "entry_bytes",
        lambda r: r["stats"]["median"] * 1e3,
        "tail 2000 chars: median (ms)",
        log=True,
        label=lambda r: size_label(r["entry_bytes"]),
    )
    _bars(
        axes[0][2],
        tails,
        "entry_bytes",
        lambda r: max(r["peak_rss_delta_kib"], 1) / 1024,
        "tail 2000 chars: reader's extra peak RSS (MiB)",
        log=True,
        label=lambda r: size_label(r["entry_bytes"]),
    )
    conc = w.get("concurrent", [])
    _bars(axes[1][0], conc, "case", lambda r: r["stats"]["ops_per_s"], "concurrent 50/50: total ops/s (PxT)")
    _bars(axes[1][1], conc, "case", lambda r: r["put"]["p99"] * 1e3, "concurrent 50/50: put p99 (ms)", log=True)
    _bars(
        axes[1][2],
        w.get("resume", []),
        "steps",
        lambda r: r["stats"]["median"] * 1e3,
        "resume a turn in a fresh process: median (ms)",
        log=True,
        label=lambda r: r["case"],
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return None


def _bars(
    ax: Any, records: list[dict[str, Any]], key: str, value: Any, title: str, *, log: bool = False, label: Any = None
) -> None:
    ax.set_title(title, fontsize=10)
    if not records:
        ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes)
        return
    cases: list[Any] = []
    names: dict[Any, str] = {}
    for r in records:
        if r[key] not in cases:
            cases.append(r[key])
            names[r[key]] = label(r) if label else str(r[key])
    backends = list(dict.fromkeys(r["backend"] for r in records))
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        xs, ys = [], []
        for j, case in enumerate(cases):
            found: dict[str, Any] | None = next(
                (r for r in records if r["backend"] == backend and r[key] == case), None
            )
            if found is not None and value(found):
                xs.append(j + i * width - 0.4 + width / 2)
                ys.append(value(found))
        ax.bar(xs, ys, width, label=backend, color=COLORS.get(backend))
    ax.set_xticks(range(len(cases)), [names[c] for c in cases], fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
