"""The parts of the suite that run in a fresh process: ``python -m securepad.bench.child
'<json spec>'`` runs one task and prints one JSON line. A fresh process is the only
honest place to measure a reader's peak memory: peak RSS (``VmHWM``, reset through
``/proc/self/clear_refs``, else one mode per process) minus the RSS before the reads.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from . import data
from .backends import BACKENDS, KNOWN, open_backend
from .stats import within


def command(spec: dict[str, Any]) -> list[str]:
    """The command that runs ``spec``; ``-P``: the child never imports from its working directory."""
    if spec.get("backend") not in BACKENDS:  # defined outside the suite's own run: the child imports its module
        module = KNOWN[spec["backend"]].__module__
        if module == "__main__":  # a script run with ``python -m``: the child imports it by its name
            module = getattr(sys.modules["__main__"].__spec__, "name", module)
        spec = {**spec, "module": module}
    return [sys.executable, "-P", "-m", __name__, json.dumps(spec)]


def environment(**extra: str) -> dict[str, str]:
    """This environment with this securepad's directory first on the path (not resolved: a
    checkout reached through a symlink keeps its own securepad)."""
    root = str(Path(__file__).absolute().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env | extra


def output(stdout: str, stderr: str) -> dict[str, Any]:
    """The JSON line a child printed last, or ``{"error": ...}`` when it printed none."""
    lines = stdout.strip().splitlines()
    return dict(json.loads(lines[-1])) if lines else {"error": stderr[-2000:]}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one task in a fresh process and return its JSON result; RuntimeError when it failed."""
    proc = subprocess.run(command(spec), capture_output=True, text=True, env=environment(), timeout=600, check=False)
    result = output(proc.stdout, proc.stderr)
    if proc.returncode != 0 or "error" in result:
        raise RuntimeError(f"child task {spec['task']} on {spec['backend']} failed:\n{result.get('error')}")
    return result


def _status_kib(field: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def reset_peak() -> bool:
    """Reset the peak RSS to the current RSS (Linux >= 4.0); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def _kib(field: str) -> int:
    found = _status_kib(field)
    return found if found is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def can_reset_peak() -> bool:
    return reset_peak() and _status_kib("VmHWM") is not None


def task_read(spec: dict[str, Any]) -> dict[str, Any]:
    """Time head/tail/range reads of one entry and measure the reader's peak memory."""
    backend = open_backend(spec["backend"], Path(spec["root"]), create=False)
    n, start = spec["n"], spec["start"]
    out: dict[str, Any] = {}
    for mode in spec["modes"]:
        # Warm up on a small entry: a freed large buffer could stay in the heap and hide the next peak.
        backend.read(spec["warm_id"], mode, n, 0)
        reset = reset_peak()
        base = _kib("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        samples: list[float] = []
        for _ in within(samples, spec["budget_s"], spec["min_ops"], spec["max_ops"]):
            t0 = time.perf_counter()
            got = backend.read(spec["entry_id"], mode, n, start)
            samples.append(time.perf_counter() - t0)
            if len(got) != n:
                raise AssertionError(f"{spec['backend']} {mode} returned {len(got)} characters, not {n}")
            del got
        out[mode] = {"samples": samples, "peak_rss_delta_kib": max(0, _kib("VmHWM") - base), "hwm_reset": reset}
    backend.close()
    return {"modes": out}


def task_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the store and resume a turn: history and tool list ready."""
    base = _kib("VmRSS")
    reset_peak()
    t0 = time.perf_counter()
    backend = open_backend(spec["backend"], Path(spec["root"]), create=False)
    history, tools = backend.resume(spec["turn_id"])
    seconds = time.perf_counter() - t0
    peak = _kib("VmHWM")
    if len(history) != spec["steps"] or not tools:
        raise AssertionError(f"resumed {len(history)} steps and {len(tools)} tools, expected {spec['steps']}")
    api = "pad.turn().history()/tools()" if spec["backend"] == "securepad" else None
    backend.close()
    return {"seconds": seconds, "peak_rss_delta_kib": max(0, peak - base), "api": api}


def _timed(call: Any, latencies: list[float], errors: Counter[str]) -> Any:
    t0 = time.perf_counter()
    try:
        result = call()
    except Exception as exc:
        errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
        return None
    latencies.append(time.perf_counter() - t0)
    return result


def _work(backend: Any, spec: dict[str, Any], index: int, start: threading.Barrier, window: dict[str, float]) -> Any:
    """One thread of a worker: 50/50 put/read from the go until the deadline."""
    rng = random.Random(spec["seed"] * 1000 + spec["proc"] * 100 + index)
    size, n, read_ids = spec["size"], spec["n"], spec["read_ids"]
    done: dict[str, Any] = {"put": [], "read": [], "errors": Counter(), "acked": []}
    turn = f"c{spec['proc']}-{index}"
    _timed(lambda: backend.read(rng.choice(read_ids), "head", n), [], done["errors"])  # the connection, unclocked
    start.wait()  # ready
    start.wait()  # go
    deadline = window["start"] + spec["seconds"]
    seq = 0
    while time.perf_counter() < deadline:
        if rng.random() < 0.5:
            salt = (spec["proc"] * 1000 + index) * 10_000_000 + seq
            text = data.text(size, salt)
            entry_id = _timed(functools.partial(backend.put, turn, seq, text), done["put"], done["errors"])
            if entry_id is not None:
                done["acked"].append((entry_id, salt))
            seq += 1
        else:
            _timed(functools.partial(backend.read, rng.choice(read_ids), "head", n), done["read"], done["errors"])
    return done


def task_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One process of the concurrent workload. Prints "ready", waits for "go" on stdin."""
    backend = open_backend(spec["backend"], Path(spec["root"]), create=False)
    threads = spec["threads"]
    start = threading.Barrier(threads + 1)
    results: list[dict[str, Any]] = [{} for _ in range(threads)]
    window: dict[str, float] = {}

    def work(index: int) -> None:
        results[index] = _work(backend, spec, index, start, window)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")
    window["start"] = time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - window["start"]
    backend.close()
    merged: dict[str, Any] = {"put": [], "read": [], "errors": Counter(), "acked": []}
    for result in results:
        for key in merged:
            merged[key] += result[key]
    return {**merged, "errors": dict(merged["errors"]), "seconds": seconds}


TASKS = {"read": task_read, "resume": task_resume, "worker": task_worker}


def main() -> int:
    spec = json.loads(sys.argv[1])
    importlib.import_module(".floor", __package__)  # the sealed floor: known to open_backend
    if spec.get("module"):  # registers the backends defined outside the suite
        importlib.import_module(spec["module"])
    if spec.get("backend") in KNOWN:
        KNOWN[spec["backend"]].preload()
    try:
        result = TASKS[spec["task"]](spec)
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
