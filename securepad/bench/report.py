"""Turning results into the markdown tables, the targets, the JSON and the chart."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import hotpath_report
from .config import MiB, size_label

Results = dict[str, Any]

COLORS = {
    "securepad": "#1f77b4",
    "raw-apsw": "#7f7f7f",
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
    if w.get("put"):
        out.append("### put: sequential, one process, one entry per put\n")
        out.append(
            _table(
                ["backend", "size", *FIG, "ops/s", "MB/s"],
                (
                    [
                        r["backend"],
                        r["case"],
                        *_figures(r["stats"]),
                        fmt_rate(r["stats"]["ops_per_s"]),
                        fmt_rate(r["stats"]["mb_per_s"]),
                    ]
                    for r in w["put"]
                ),
            )
        )
    if w.get("read"):
        out.append("\n### read: 2000 characters, fresh process per entry; peak RSS above the process's resting RSS\n")
        out.append(
            _table(
                ["backend", "read", *FIG, "ops/s", "peak RSS Δ"],
                (
                    [
                        r["backend"],
                        r["case"],
                        *_figures(r["stats"]),
                        fmt_rate(r["stats"]["ops_per_s"]),
                        fmt_kib(r["peak_rss_delta_kib"]),
                    ]
                    for r in w["read"]
                ),
            )
        )
    if w.get("concurrent"):
        out.append("\n### concurrent: 50/50 put/read of 4 KiB entries, processes x threads, fixed time\n")
        rows = []
        for r in w["concurrent"]:
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
        out.append(_table(["backend", "PxT", "op", *FIG, "op/s", "total ops/s", "errors", "lost writes"], rows))
        errors = [(r["backend"], r["case"], k, v) for r in w["concurrent"] for k, v in r["errors"].items()]
        if errors:
            out.append("\nerrors: " + "; ".join(f"{b} {c}: {v}x {k}" for b, c, k, v in errors))
    if w.get("resume"):
        out.append("\n### resume: a fresh process opens the store, history and tools ready\n")
        out.append(
            _table(
                ["backend", "turn", *FIG, "resumes/s", "peak RSS Δ", "how"],
                (
                    [
                        r["backend"],
                        r["case"],
                        *_figures(r["stats"]),
                        fmt_rate(r["stats"]["ops_per_s"]),
                        fmt_kib(r["peak_rss_delta_kib"]),
                        r.get("api") or "SELECT by turn",
                    ]
                    for r in w["resume"]
                ),
            )
        )
    if w.get("gc"):
        out.append("\n### gc: delete expired entries (one run each; securepad also zeroes and truncates the WAL)\n")
        out.append(
            _table(
                ["backend", "entries", "time", "entries/s"],
                (
                    [r["backend"], r["case"], fmt_time(r["stats"]["max"]), fmt_rate(r["stats"]["ops_per_s"])]
                    for r in w["gc"]
                ),
            )
        )
    if w.get("open"):
        out.append("\n### open: an existing store, ready to serve\n")
        out.append(
            _table(
                ["backend", "key source", *FIG],
                ([r["backend"], r["case"], *_figures(r["stats"])] for r in w["open"]),
            )
        )
    out += hotpath_report.markdown(w.get("hotpath", []))
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
    found: list[dict[str, Any]] = []

    def add(target: str, measured: str | None, passed: bool | None, value: float | None = None) -> None:
        found.append(
            {"target": target, "measured": measured or "not measured in this run", "passed": passed, "value": value}
        )

    puts = w.get("put", [])
    for size, floor in ((4096, 0.5), (65536, 0.8), (MiB, 0.85)):
        sp, raw = _find(puts, "securepad", size_bytes=size), _find(puts, "raw-apsw", size_bytes=size)
        if sp and raw:
            ratio = sp["stats"]["ops_per_s"] / raw["stats"]["ops_per_s"]
            add(f"put {size_label(size)}: securepad >= {floor}x raw plaintext", f"{ratio:.2f}x", ratio >= floor, ratio)
        else:
            add(f"put {size_label(size)}: securepad >= {floor}x raw plaintext", None, None)
    for sp in (r for r in puts if r["backend"] == "securepad"):
        un = _find(puts, "unhardened", size_bytes=sp["size_bytes"])
        if un:
            ratio = sp["stats"]["ops_per_s"] / un["stats"]["ops_per_s"]
            add(f"put {sp['case']}: securepad above unhardened", f"{ratio:.2f}x", ratio > 1, ratio)

    reads = w.get("read", [])
    big = _find(reads, "securepad", mode="tail", entry_bytes=100 * MiB)
    ref = _find(reads, "securepad", mode="tail", entry_bytes=64 * 1024)
    un_big = _find(reads, "unhardened", mode="tail", entry_bytes=100 * MiB)
    if big and ref:
        ratio = big["stats"]["median"] / ref["stats"]["median"]
        add(
            "tail 2000 of 100 MiB within 3x of the same read on 64 KiB (median)",
            f"{ratio:.2f}x ({fmt_time(big['stats']['median'])} vs {fmt_time(ref['stats']['median'])})",
            ratio <= 3,
            ratio,
        )
    else:
        add("tail 2000 of 100 MiB within 3x of the same read on 64 KiB (median)", None, None)
    if big and un_big:
        ratio = un_big["stats"]["median"] / big["stats"]["median"]
        add(
            "tail 2000 of 100 MiB >= 100x faster than unhardened (median)",
            f"{ratio:,.0f}x ({fmt_time(un_big['stats']['median'])} vs {fmt_time(big['stats']['median'])})",
            ratio >= 100,
            ratio,
        )
    else:
        add("tail 2000 of 100 MiB >= 100x faster than unhardened (median)", None, None)
    if big:
        kib = big["peak_rss_delta_kib"]
        add("tail 2000 of 100 MiB: < 4 MiB extra peak memory", fmt_kib(kib), kib < 4 * 1024, kib)
    else:
        add("tail 2000 of 100 MiB: < 4 MiB extra peak memory", None, None)

    conc = w.get("concurrent", [])
    sp, raw = _find(conc, "securepad", case="2x4"), _find(conc, "raw-apsw", case="2x4")
    labels = ("2x4: 0 errors", "2x4: 0 lost writes", "2x4: put p99 <= 20 ms", "2x4: put max <= 200 ms")
    if sp:
        add(labels[0], str(sp["error_count"]), sp["error_count"] == 0, sp["error_count"])
        add(
            labels[1],
            f"{sp['lost_writes']} of {sp['acked_puts']} acknowledged",
            sp["lost_writes"] == 0,
            sp["lost_writes"],
        )
        add(labels[2], fmt_time(sp["put"]["p99"]), sp["put"]["p99"] <= 0.020, sp["put"]["p99"])
        add(labels[3], fmt_time(sp["put"]["max"]), sp["put"]["max"] <= 0.200, sp["put"]["max"])
    else:
        for label in labels:
            add(label, None, None)
    if sp and raw:
        ratio = sp["stats"]["ops_per_s"] / raw["stats"]["ops_per_s"]
        add(
            "2x4: throughput >= 0.5x raw plaintext",
            f"{ratio:.2f}x ({sp['stats']['ops_per_s']:,.0f} vs {raw['stats']['ops_per_s']:,.0f} ops/s)",
            ratio >= 0.5,
            ratio,
        )
    else:
        add("2x4: throughput >= 0.5x raw plaintext", None, None)

    resumes = w.get("resume", [])
    sp, un = _find(resumes, "securepad", steps=1000), _find(resumes, "unhardened", steps=1000)
    if sp and un:
        ratio = sp["stats"]["median"] / un["stats"]["median"]
        add(
            "resume 1000 steps within 5x of listing them from unhardened (median)",
            f"{ratio:.2f}x ({fmt_time(sp['stats']['median'])} vs {fmt_time(un['stats']['median'])})",
            ratio <= 5,
            ratio,
        )
    else:
        add("resume 1000 steps within 5x of listing them from unhardened (median)", None, None)
    hotpath_report.targets(w.get("hotpath", []), add)
    return found


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
