"""Run the suite: ``securepad bench [--quick]``; print an 80-column summary, write
``<out>/<mode>.json`` and ``<out>/<mode>.png``. Nothing is asserted about timings."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from . import report
from .backends import BACKENDS, Backend
from .config import Config
from .floor import SealedFloorBackend
from .workloads import WORKLOADS

Records = list[dict[str, Any]]
Step = Callable[[str, str], None]  # (backend, what it does now)
# The default backends, and the sealed floor, run only when named.
RUNNABLE: dict[str, type[Backend]] = {**BACKENDS, SealedFloorBackend.name: SealedFloorBackend}


def parse_names(field: str, given: str | None) -> list[str]:
    """The comma-separated backends, workloads or operations of ``given`` (None: the default ones).
    Raises ValueError: an unknown name (the message lists the known ones)."""
    from .instructions import OPERATIONS

    known = {"operations": OPERATIONS, "backends": RUNNABLE, "workloads": WORKLOADS}[field]
    if not given:
        return list(BACKENDS if field == "backends" else known)
    chosen = [x.strip() for x in given.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise ValueError(f"unknown {field}: {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


def main(
    *,
    out: Path,
    quick: bool = False,
    tiny: bool = False,
    workdir: Path | None = None,
    backends: Sequence[str] = tuple(BACKENDS),
    workloads: Sequence[str] = tuple(WORKLOADS),
    progress: bool = True,
    chart: bool = True,
    show_targets: bool = False,
    show_tables: bool = False,
) -> int:
    """Run the suite, print its summary and write ``<out>/<mode>.json`` (and ``.png``)."""
    config = Config().tiny() if tiny else Config().quick() if quick else Config()
    results = run(config, backends, workloads, workdir=workdir, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{config.mode}.json"
    png_path = out / f"{config.mode}.png"
    written = [json_path]
    skipped = report.chart(results, png_path) if chart else None
    results["meta"]["chart"] = png_path.name if chart and not skipped else None
    if skipped:
        Console().print(f"chart skipped: {skipped}", markup=False, highlight=False)
    elif chart:
        written.append(png_path)
    report.write_json(results, json_path)
    print(_text(results, [str(p) for p in written], show_targets, show_tables), end="")
    return 1 if results["failures"] else 0


def print_saved(path: Path, *, show_targets: bool = False, show_tables: bool = False) -> None:
    """Print the summary of a saved run's JSON."""
    print(_text(json.loads(path.read_text(encoding="utf-8")), [str(path)], show_targets, show_tables), end="")


def _text(results: dict[str, Any], written: list[str], show_targets: bool, show_tables: bool) -> str:
    parts = [report.markdown(results) + "\n"] if show_tables else []
    parts.append(report.summary(results, written))
    if show_targets:
        parts.append("\n" + report.targets_text(results))
    return "".join(parts)


def run(
    config: Config, backends: Sequence[str], workloads: Sequence[str], *, workdir: Path | None, progress: bool
) -> dict[str, Any]:
    err = Console(stderr=True)
    started = time.time()
    available, skipped = [], []
    for name in backends:
        reason = RUNNABLE[name].unavailable()
        if reason:
            skipped.append({"backend": name, "reason": reason})
            err.print(Text.assemble(("skipping ", "yellow"), (f"{name}:", "yellow"), f" {reason}"), highlight=False)
        else:
            available.append(name)
    scratch = Path(tempfile.mkdtemp(prefix="securepad-bench-", dir=workdir))
    results: dict[str, Any] = {
        "meta": {
            "mode": config.mode,
            "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "machine": machine(scratch, config.scaling_seconds),
            "config": asdict(config),
            "command": "securepad bench" + (" --quick" if config.mode == "quick" else ""),
            "memory_method": (
                "peak RSS (Linux VmHWM, i.e. ru_maxrss) minus the RSS before the measured operations,"
                " the high-water mark reset through /proc/self/clear_refs; fresh process per entry"
            ),
        },
        "backends": {
            name: {"description": RUNNABLE[name].description, "available": name in available} for name in backends
        },
        "workloads": {},
        "skipped": skipped,
        "failures": [],
    }
    total = sum(WORKLOADS[w][1](config) * len(available) for w in workloads)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    bar = Progress(*columns, console=err, disable=not progress, transient=False)
    try:
        with bar:
            task = bar.add_task("benchmarks", total=total)
            for workload in workloads:
                started_at = bar.tasks[task].completed

                def step(name: str, what: str, workload: str = workload) -> None:
                    bar.update(task, description=f"{workload:<10} {name:<10} {what}", advance=1)

                found = _interleaved(workload, config, available, scratch, step, results["failures"])
                results["workloads"][workload] = found
                bar.update(task, completed=started_at + WORKLOADS[workload][1](config) * len(available))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results["targets"] = report.targets(results)
    results["meta"]["elapsed_s"] = round(time.time() - started, 1)
    results["meta"]["machine"]["loadavg_end"] = _loadavg()
    return results


def _interleaved(
    workload: str, config: Config, names: list[str], scratch: Path, step: Step, failures: Records
) -> Records:
    """Run one workload case by case on every backend back to back, so that a figure and
    its baseline share the machine's state; a backend that fails drops out of this workload."""
    cases = {name: WORKLOADS[workload][0](config, name, scratch, functools.partial(step, name)) for name in names}
    records: Records = []
    while cases:
        for name, pending in list(cases.items()):
            try:
                records += next(pending)
            except StopIteration:
                del cases[name]
            except Exception as exc:  # one broken backend must not cost the whole run
                del cases[name]
                failures.append({"workload": workload, "backend": name, "error": f"{type(exc).__name__}: {exc}"})
                Console(stderr=True).print(
                    f"[red]failed:[/red] {workload} on {name}: {type(exc).__name__}: {exc}", highlight=False
                )
    order = {name: i for i, name in enumerate(names)}
    return sorted(records, key=lambda r: order[r["backend"]])  # stable: each backend's cases stay in order


def machine(workdir: Path, scaling_seconds: float = 0.5) -> dict[str, Any]:
    import sqlite3

    import apsw

    cpu = _proc_field("/proc/cpuinfo", "model name") or "unknown"
    mem_kib = _proc_field("/proc/meminfo", "MemTotal")
    ram_gib = round(int(mem_kib.split()[0]) / 1024 / 1024, 1) if mem_kib else None
    try:
        from sqlcipher3 import dbapi2

        conn = dbapi2.connect(":memory:")
        sqlcipher = f"{conn.execute('PRAGMA cipher_version').fetchall()[0][0]} (SQLite {dbapi2.sqlite_version})"
        conn.close()
    except Exception:  # not installed, or not SQLCipher
        sqlcipher = None
    info = {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": ram_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite_apsw": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "sqlite_stdlib": sqlite3.sqlite_version,
        "sqlcipher": sqlcipher,
        "filesystem": _filesystem(workdir),
        "securepad_commit": _git_commit(),
        "cpu_parallel_scaling": _cpu_scaling(scaling_seconds),
        # Other work on the machine skews every figure; this shows whether there was any.
        "loadavg_start": _loadavg(),
    }
    info["summary"] = f"{info['nproc']} cores, {cpu}, {ram_gib} GiB, Python {info['python']}"
    return info


def _proc_field(path: str, name: str) -> str | None:
    return next((line.split(":", 1)[1].strip() for line in _lines(path) if line.startswith(name)), None)


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


_SPIN = "import sys, time\nt=time.perf_counter()\nn=0\nwhile time.perf_counter()-t<float(sys.argv[1]): n+=1\nprint(n)"


def _cpu_scaling(seconds: float) -> float | None:
    """Work of two CPU-bound processes at once over one alone, each spinning for
    ``seconds``: 2.0 on two free cores."""
    spin = [sys.executable, "-P", "-c", _SPIN, str(seconds)]
    try:
        alone = int(subprocess.run(spin, capture_output=True, text=True, check=True).stdout)
        pair = [subprocess.Popen(spin, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        together = sum(int(p.communicate()[0]) for p in pair)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return round(together / alone, 2)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _filesystem(path: Path) -> str | None:
    """ "<type> on <mount>" of the longest mount point that holds ``path``."""
    resolved = str(path.resolve())
    mounts = [line.split()[1:3] for line in _lines("/proc/mounts")]
    held = [(mount, fstype) for mount, fstype in mounts if resolved.startswith(mount)]
    longest = max(held, key=lambda m: len(m[0]), default=None)
    return f"{longest[1]} on {longest[0]}" if longest else None


def _git_commit() -> str | None:
    command = ["git", "rev-parse", "--short", "HEAD"]
    try:
        out = subprocess.run(command, cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
