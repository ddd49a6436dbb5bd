"""``securepad bench --costs``: instructions per operation for securepad, the
sealed floor and raw apsw, beside the load-independent counts (``costs``).

A measured process runs per operation a warm-up call, ``N`` and ``2N`` calls,
each run closed by a truncating checkpoint and a marker call at which callgrind
dumps; a figure is (Ir(2N) - Ir(N)) / N, so one-off costs cancel out. Without
valgrind it is the mean CPU time of the 3N calls, in microseconds.

securepad's measured store syncs its anchor only when the harness says
(``anchor_sync = "close"``): under callgrind a second is a few dozen calls,
so the default background sync, once a second, would land in the writes'
runs and count as a share of each. A sync's own cost is the line
``anchor_sync``: a put followed by a sync, less the put.
"""

from __future__ import annotations

import functools
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

from . import costs
from .backends import PRINCIPAL, Backend, RawApswBackend, SecurepadBackend, bench_policy, open_backend
from .child import environment, output
from .data import text

if TYPE_CHECKING:
    from .. import Scratchpad
    from ..storage.anchor import Anchor

# The sealed floor (``floor.SealedFloorBackend``), imported only by the processes that
# open it: a measured process loads its own backend's modules alone.
FLOOR = "sealed-floor"

ENTRY_BYTES = 4 * 1024
LISTED = 1000
LISTED_BYTES = 100
BATCH = 8
OPERATIONS = ("put", "read", "put_many", "listing", "anchor_sync")
# What each backend runs, in this order (the writes last: they leave the others' rows as they were).
BACKENDS: dict[str, tuple[str, ...]] = {
    "securepad": ("listing", "read", "put_many", "put", "anchor_sync"),
    FLOOR: ("listing", "read", "put"),
    RawApswBackend.name: ("listing", "read", "put"),
}
# N per operation (a put_many call stores BATCH observations): a callgrind process stays near a minute.
COUNTS = {"put": 20, "read": 40, "put_many": 4, "listing": 2, "anchor_sync": 10}
TINY_COUNTS = dict.fromkeys(COUNTS, 1)
TINY_LISTED = 20
# (operation, the figure it is held to: (backend, operation), at most this many times it)
TARGETS = (
    ("put", (FLOOR, "put"), 2.0),
    ("read", (FLOOR, "read"), 2.0),
    ("put_many", (FLOOR, "put"), 1.0),
    ("listing", (RawApswBackend.name, "listing"), 3.0),
)
# What ``work`` reports of a call's counts.
_WORK = ("statements", "key_derivations", "key_unwraps", "header_digests", "wal_frames")
# The marker: a function that nothing else calls while the operations run.
_MARKER = "sys_getswitchinterval"
# The measured securepad store's anchor syncs at open, at close and when the harness calls it.
MEASURED_ANCHOR_SYNC = "close"


def _backend(name: str, root: Path, *, create: bool = True) -> Backend:
    """Backend ``name`` on ``root`` (the sealed floor's module imported when it is the one)."""
    if name == FLOOR:
        importlib.import_module(".floor", __package__)  # registers it with open_backend
    return open_backend(name, root, create=create)


def _open(name: str, root: Path) -> Backend:
    """Backend ``name`` on a copy of its prepared store, as it is measured."""
    if name == SecurepadBackend.name:
        return SecurepadBackend(root, create=False, policy=bench_policy({"anchor_sync": MEASURED_ANCHOR_SYNC}))
    return _backend(name, root, create=False)


def _target(backend: Backend) -> Scratchpad | apsw.Connection:
    """What ``costs`` measures of a backend: securepad's store, or the backend's connection."""
    return backend.pad if isinstance(backend, SecurepadBackend) else backend.conn  # type: ignore[attr-defined]


def _anchor(backend: SecurepadBackend) -> Anchor:
    """The anchor of securepad's store (the commit hooks of its database).
    Raises RuntimeError: the store has no anchor."""
    from ..storage.anchor import Anchor
    from ..store import sqlite_of

    hooks = sqlite_of(backend.pad).hooks
    if not isinstance(hooks, Anchor):
        raise RuntimeError("the measured store has no anchor: its sync cannot be measured")
    return hooks


def prepare(name: str, root: Path, listed: int = LISTED) -> dict[str, Any]:
    """Build the store every measured process of backend ``name`` starts from."""
    with closing(_backend(name, root)) as backend:
        read_id = backend.put("costs-read", 0, text(ENTRY_BYTES, salt=1))
        for step in range(3):
            backend.put("costs-put", step, text(ENTRY_BYTES, salt=10 + step))
        for step in range(listed):
            backend.put("costs-list", step, text(LISTED_BYTES, salt=1000 + step))
        if isinstance(backend, SecurepadBackend):
            items = [(step, "bench", text(ENTRY_BYTES, salt=step)) for step in range(BATCH)]
            backend.pad.put_many(PRINCIPAL, "costs-many", items)
    return {"read_id": read_id, "listed": listed}


@functools.cache
def _content(salt: int) -> str:
    """An observation a put stores, made (and kept) before it is measured."""
    return text(ENTRY_BYTES, salt=salt)


def _operations(backend: Backend, prepared: dict[str, Any]) -> dict[str, Callable[[int], object]]:
    """Each operation, called with a serial number (unique in the process: steps never repeat)."""
    read_id = prepared["read_id"]
    ops: dict[str, Callable[[int], object]] = {
        "put": lambda i: backend.put("costs-put", 1000 + i, _content(20_000 + i)),
        "read": lambda i: backend.read(read_id, "tail", 2000),
        "listing": lambda i: backend.resume("costs-list"),
    }
    if isinstance(backend, SecurepadBackend):
        pad = backend.pad

        def put_many(i: int) -> object:
            first = 1000 + i * BATCH
            items = [(first + j, "bench", _content(50_000 + first + j)) for j in range(BATCH)]
            return pad.put_many(PRINCIPAL, "costs-many", items)

        ops["put_many"] = put_many
        ops["listing"] = lambda i: pad.list_for_turn(PRINCIPAL, "costs-list")
        anchor, put = _anchor(backend), ops["put"]

        def anchor_sync(i: int) -> object:
            put(i)  # a write the anchor is behind (its figure is taken off)
            anchor.advance()
            return None

        ops["anchor_sync"] = anchor_sync
    return ops


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """The measured process (see the module's docstring); returns the runs and their CPU seconds."""
    backend = _open(spec["backend"], Path(spec["root"]))
    ops = _operations(backend, spec["prepared"])
    chosen = spec["ops"]
    calls = sum(1 + 3 * spec["counts"][op] for op in chosen)
    for salt in range(calls):  # the puts' observations (put_many's from step 1000 on)
        _content(20_000 + salt)
        for j in range(BATCH if "put_many" in ops else 0):
            _content(51_000 + salt * BATCH + j)
    marker = sys.getswitchinterval
    runs: list[list[Any]] = []
    serial = 0
    marker()
    for op in chosen:
        call, n = ops[op], spec["counts"][op]
        for label, calls in (("warm", 1), ("N", n), ("2N", 2 * n)):
            started = time.process_time()
            for _ in range(calls):
                call(serial)
                serial += 1
            costs.empty_wal(_target(backend))
            seconds = time.process_time() - started
            marker()
            runs.append([op, label, seconds])
    backend.close()
    return {"runs": runs}


def _measured(spec: dict[str, Any], workdir: Path, callgrind: bool) -> dict[tuple[str, str], tuple[float, int | None]]:
    """Run one measured process on a fresh copy of the prepared store: {(op, run): (CPU s, Ir or None)}."""
    root = workdir / "run"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(workdir / "prepared" / spec["backend"], root)
    out = workdir / f"callgrind.{spec['backend']}"
    for old in workdir.glob(f"{out.name}*"):
        old.unlink()
    command = [sys.executable, "-P", "-m", __name__, json.dumps({**spec, "root": str(root)})]
    if callgrind:
        command = ["valgrind", "--tool=callgrind", f"--dump-before={_MARKER}", f"--callgrind-out-file={out}", *command]
    # The same dict and set layouts in every process; bytecode compiled once, outside the source
    # tree (in the caller's bytecode cache when it names one).
    env = environment(PYTHONHASHSEED="0")
    env.setdefault("PYTHONPYCACHEPREFIX", str(workdir / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measured process of {spec['backend']} failed: {done.stderr[-2000:]}")
    return marked_runs(output(done.stdout, done.stderr)["runs"], out, _MARKER, callgrind=callgrind)


def marked_runs(
    runs: Sequence[Sequence[Any]], out: Path, marker: str, *, callgrind: bool
) -> dict[tuple[str, str], tuple[float, int | None]]:
    """Each run's ``(op, label)``: its seconds and (``callgrind``) its instructions, read from the
    dumps callgrind wrote to ``out`` at each call of ``marker`` (the first dump holds what ran
    before the first marker; run k ends at marker k + 2).

    Raises:
        RuntimeError: a dump holds no total, or ``marker`` was called once more than the runs.
    """
    found: dict[tuple[str, str], tuple[float, int | None]] = {}
    for k, (op, label, seconds) in enumerate(runs):
        found[(op, label)] = (seconds, _total(out.with_name(f"{out.name}.{k + 2}")) if callgrind else None)
    if callgrind and out.with_name(f"{out.name}.{len(runs) + 2}").exists():
        raise RuntimeError(f"something else called {marker}: the runs cannot be told apart")
    return found


def _total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no total in {dump}")


def measure(
    workdir: Path,
    *,
    method: str | None = None,
    tiny: bool = False,
    backends: Sequence[str] = tuple(BACKENDS),
    ops: Sequence[str] = OPERATIONS,
) -> dict[str, Any]:
    """Prepare, measure and count ``ops`` of ``backends``; ``method``: ``callgrind`` or ``cpu``
    (default: callgrind when valgrind is installed)."""
    valgrind = shutil.which("valgrind") is not None
    method = method or ("callgrind" if valgrind else "cpu")
    if method not in ("callgrind", "cpu"):
        raise ValueError(f"unknown method {method!r} (callgrind, cpu)")
    unknown = [op for op in ops if op not in OPERATIONS]
    if unknown:
        raise ValueError(f"unknown operations: {', '.join(unknown)} (known: {', '.join(OPERATIONS)})")
    if method == "callgrind" and not valgrind:
        raise RuntimeError("valgrind is not installed: measure with the cpu method")
    counts, listed = (TINY_COUNTS, TINY_LISTED) if tiny else (COUNTS, LISTED)
    results: dict[str, Any] = {
        "method": method,
        "unit": "instructions" if method == "callgrind" else "microseconds (CPU)",
        "valgrind": valgrind,
        "anchor_sync": MEASURED_ANCHOR_SYNC,
        "counts": counts,
        "operations": labels(listed),
        "figures": {},
        "work": {},
    }
    for name in backends:
        # An anchor sync is measured after a put, less the put: the put is measured too.
        asked = {*ops, "put"} if "anchor_sync" in ops and "anchor_sync" in BACKENDS[name] else set(ops)
        chosen = [op for op in BACKENDS[name] if op in asked]
        if not chosen:
            continue
        prepared = prepare(name, workdir / "prepared" / name, listed)
        spec = {"backend": name, "prepared": prepared, "counts": counts, "ops": chosen}
        if method == "callgrind":
            _measured(spec, workdir, callgrind=False)  # compiles the bytecode once, natively
        found = _measured(spec, workdir, callgrind=method == "callgrind")
        figures = results["figures"][name] = {}
        for op in chosen:
            (seconds_n, ir_n), (seconds_2n, ir_2n) = found[(op, "N")], found[(op, "2N")]
            if ir_n is not None and ir_2n is not None:
                per = (ir_2n - ir_n) / counts[op]
            else:
                per = (seconds_n + seconds_2n) / (3 * counts[op]) * 1e6
            figures[op] = per / BATCH if op == "put_many" else per
        if "anchor_sync" in figures:
            figures["anchor_sync"] -= figures["put"]
        results["work"][name] = work(name, workdir, prepared, chosen)
    results["targets"] = targets(results)
    return results


def labels(listed: int) -> dict[str, str]:
    """What each operation is, in words."""
    return {
        "put": f"put {ENTRY_BYTES // 1024} KiB into a turn",
        "read": f"warm read(tail, 2000) of a {ENTRY_BYTES // 1024} KiB entry",
        "put_many": f"put_many {BATCH} x {ENTRY_BYTES // 1024} KiB, per observation",
        "listing": f"list_for_turn of a {listed:,}-entry turn ({LISTED_BYTES} B entries)",
        "anchor_sync": "one anchor sync (not in the writes above)",
    }


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its figure, its yardstick's and their ratio (None when either was not measured)."""
    figures = results["figures"]
    out = []
    for op, (base, base_op), most in TARGETS:
        value = figures.get("securepad", {}).get(op)
        against = figures.get(base, {}).get(base_op)
        ratio = value / against if value is not None and against else None
        met = None if ratio is None else ratio <= most
        out.append({"operation": op, "against": f"{base} {base_op}", "at_most": most, "ratio": ratio, "met": met})
    return out


def work(name: str, workdir: Path, prepared: dict[str, Any], chosen: Sequence[str]) -> dict[str, dict[str, int]]:
    """One warm call of each operation of ``chosen``, counted: statements, WAL frames, key work."""
    root = workdir / "counted"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(workdir / "prepared" / name, root)
    backend = _open(name, root)
    try:
        ops = _operations(backend, prepared)
        found = {}
        for serial, op in enumerate(chosen):
            ops[op](10_000 + 2 * serial)  # warm
            call: Callable[[], object] = functools.partial(ops[op], 10_001 + 2 * serial)
            if op == "anchor_sync" and isinstance(backend, SecurepadBackend):
                ops["put"](10_001 + 2 * serial)  # the sync alone is counted, after a put
                call = _anchor(backend).advance
            counted = costs.measure(_target(backend), call)
            found[op] = {key: counted[key] for key in _WORK}
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
    return found


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _counted(c: dict[str, int] | None) -> str:
    if c is None:
        return "-"
    return f"{c['statements']}/{c['wal_frames']}/{c['key_derivations']},{c['key_unwraps']},{c['header_digests']}"


def report(results: dict[str, Any]) -> str:
    """The figures, the counts and the targets, as text in 100 columns."""
    names = list(results["figures"])
    method = results["method"]
    if method == "callgrind":
        how = "callgrind, (Ir(2N) - Ir(N)) / N: instructions of one warm call"
    else:
        why = "chosen" if results.get("valgrind") else "valgrind is not installed"
        how = f"CPU time, mean of 3N warm calls, in microseconds: {why}"
    ops = results["operations"]
    counts = ", ".join(f"{op} {n}" for op, n in results["counts"].items())
    lines = [f"costs per operation ({how}; N: {counts})", ""]
    lines.append(f"{'operation':<52}" + "".join(f"{name:>16}" for name in names))
    for op, label in ops.items():
        row = "".join(f"{_figure(results['figures'][name].get(op)):>16}" for name in names)
        lines.append(f"{label:<52}{row}")
    if "anchor_sync" in results["figures"].get("securepad", {}):
        lines.append(
            f"  (securepad's anchor syncs only as the harness calls it, anchor_sync = {results['anchor_sync']}:"
            " by default, once a second)"
        )
    lines += ["", "one warm call: SQL statements / WAL frames / key derivations, unwraps, header digests"]
    for op, label in ops.items():
        label = label.replace(", per observation", f" (one call: {BATCH} observations)")
        cells = (_counted(results["work"].get(name, {}).get(op)) for name in names)
        lines.append(f"{label:<52}" + "".join(f"{cell:>16}" for cell in cells))
    lines += ["", "targets (securepad against its yardstick)"]
    for target in results["targets"]:
        ratio = target["ratio"]
        verdict = "not measured" if ratio is None else "met" if target["met"] else "missed"
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(
            f"  {ops[target['operation']]:<50} {shown:>8} {target['against']:<22}"
            f" (at most {target['at_most']:g}x) {verdict}"
        )
    if method == "cpu":
        lines.append("  (ratios of CPU times: they move with the machine's load; callgrind's do not)")
    return "\n".join(lines) + "\n"


def main(
    *,
    out: Path,
    workdir: Path | None = None,
    method: str | None = None,
    tiny: bool = False,
    ops: Sequence[str] | None = None,
) -> int:
    """Measure the operations ``ops`` (default all), print the report and write ``<out>/costs.json``."""
    scratch = Path(tempfile.mkdtemp(prefix="securepad-costs-", dir=workdir))
    try:
        results = measure(scratch, method=method, tiny=tiny, ops=ops or OPERATIONS)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(report(results), end="")
    print(f"written: {out / 'costs.json'}")
    return 0


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))))
