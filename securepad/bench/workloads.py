"""The workloads: each a generator over one backend that yields every case's records
(latencies in seconds), so the runner interleaves the backends case by case."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from securepad import Keyring

from . import data
from .backends import PRINCIPAL, SecurepadBackend, open_backend, slice_of
from .child import can_reset_peak, command, environment, output, run
from .config import Config, KiB, size_label
from .hotpath import run_hotpath
from .stats import summarize, within

READ_MODES = ("head", "tail", "range")
Record = dict[str, Any]
Cases = Iterator[list[Record]]
Step = Callable[[str], None]


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def run_put(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    backend = open_backend(name, _fresh(workdir / "put" / name))
    try:
        for size in cfg.put_sizes:
            step(f"put {size_label(size)}")
            samples: list[float] = []
            for salt in within(samples, cfg.put_budget_s, cfg.put_min_ops, cfg.put_max_ops):
                text = data.text(size, salt=size + salt)
                t0 = time.perf_counter()
                backend.put(f"put-{size}", salt, text)
                samples.append(time.perf_counter() - t0)
            stats = summarize(samples, nbytes=size)
            yield [{"backend": name, "case": size_label(size), "size_bytes": size, "stats": stats}]
    finally:
        backend.close()
        shutil.rmtree(workdir / "put" / name, ignore_errors=True)


def run_read(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    """Check every read mode once here, then time them and measure peak memory in a
    fresh process per entry (per mode where the peak cannot be reset)."""
    root = _fresh(workdir / "read" / name)
    n = cfg.read_chars
    step(f"store {', '.join(size_label(s) for s in cfg.read_sizes)} entries")
    ids: dict[int, str] = {}
    with closing(open_backend(name, root)) as backend:
        warm_id = backend.put("read-turn", 0, data.text(4 * KiB, salt=1))
        for index, size in enumerate(cfg.read_sizes, start=1):
            text = data.text(size, salt=size)
            ids[size] = backend.put("read-turn", index, text)
            for mode in READ_MODES:
                got = backend.read(ids[size], mode, n, size // 2)
                if got != slice_of(text, mode, n, size // 2):
                    raise AssertionError(f"{name}: {mode} of {size_label(size)} returned the wrong characters")
            del text
    yield []
    per_process = [list(READ_MODES)] if can_reset_peak() else [[mode] for mode in READ_MODES]
    spec = {"task": "read", "backend": name, "root": str(root), "warm_id": warm_id, "n": n}
    spec |= {"budget_s": cfg.read_budget_s, "max_ops": cfg.read_max_ops, "min_ops": cfg.read_min_ops}
    for size in cfg.read_sizes:
        step(f"read {size_label(size)}")
        records = []
        for modes in per_process:
            result = run({**spec, "entry_id": ids[size], "modes": modes, "start": size // 2})
            for mode, got in result["modes"].items():
                case = {"backend": name, "case": f"{mode} {n} of {size_label(size)}", "mode": mode, "entry_bytes": size}
                stats = summarize(got["samples"], nbytes=n)
                peak = {"peak_rss_delta_kib": got["peak_rss_delta_kib"], "peak_reset": got["hwm_reset"]}
                records.append(case | {"chars": n, "stats": stats} | peak)
        yield records
    shutil.rmtree(root, ignore_errors=True)


def run_concurrent(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    for processes, threads in cfg.concurrency:
        case = f"{processes}x{threads}"
        step(f"{case} for {cfg.concurrency_seconds:g} s")
        root = _fresh(workdir / "concurrent" / name / case)
        with closing(open_backend(name, root)) as backend:
            read_ids = [backend.put("seed", i, data.text(cfg.concurrent_bytes, salt=i)) for i in range(50)]
        outputs = _run_workers(cfg, name, root, processes, threads, read_ids)
        put_lat = [x for o in outputs for x in o["put"]]
        read_lat = [x for o in outputs for x in o["read"]]
        errors = sum((Counter(o["errors"]) for o in outputs), Counter[str]())
        seconds = max(o["seconds"] for o in outputs)
        acked = [tuple(a) for o in outputs for a in o["acked"]]
        record = {"backend": name, "case": case, "processes": processes, "threads": threads, "seconds": seconds}
        record |= {
            "put": summarize(put_lat, nbytes=cfg.concurrent_bytes, wall_s=seconds),
            "read": summarize(read_lat, nbytes=cfg.read_chars, wall_s=seconds),
            "stats": summarize(put_lat + read_lat, wall_s=seconds),
            "errors": dict(errors),
            "error_count": sum(errors.values()),
            "acked_puts": len(acked),
            "lost_writes": _lost_writes(name, root, acked, cfg.concurrent_bytes),
        }
        shutil.rmtree(root, ignore_errors=True)
        yield [record]


def _run_workers(cfg: Config, name: str, root: Path, processes: int, threads: int, read_ids: list[str]) -> list[Any]:
    common = {"task": "worker", "backend": name, "root": str(root), "threads": threads, "read_ids": read_ids}
    common |= {"seconds": cfg.concurrency_seconds, "seed": cfg.seed, "size": cfg.concurrent_bytes, "n": cfg.read_chars}
    pipe = subprocess.PIPE
    children = [
        subprocess.Popen(
            command({**common, "proc": p}), stdin=pipe, stdout=pipe, stderr=pipe, text=True, env=environment()
        )
        for p in range(processes)
    ]
    outputs: list[dict[str, Any]] = []
    try:
        for child in children:  # a barrier: every process has its connections open
            line = child.stdout.readline().strip() if child.stdout else ""
            if line != "ready":
                raise RuntimeError(
                    f"a {name} worker did not start: {line} {child.stderr.read() if child.stderr else ''}"
                )
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            got = output(*child.communicate(timeout=cfg.concurrency_seconds + 120))
            if "error" in got:
                raise RuntimeError(f"a {name} worker failed:\n{got['error']}")
            outputs.append(got)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    return outputs


def _lost_writes(name: str, root: Path, acked: list[tuple[Any, ...]], size: int) -> int:
    lost = 0
    with closing(open_backend(name, root, create=False)) as backend:
        for entry_id, salt in acked:
            try:
                lost += backend.get(entry_id) != data.text(size, salt)
            except Exception:
                lost += 1
    return lost


def run_resume(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    root = _fresh(workdir / "resume" / name)
    step(f"record turns of {', '.join(map(str, cfg.resume_steps))} steps")
    with closing(open_backend(name, root)) as backend:
        for steps in cfg.resume_steps:
            for i in range(steps):
                backend.put(f"turn-{steps}", i, data.text(cfg.resume_entry_bytes, salt=steps * 100_000 + i))
    yield []
    for steps in cfg.resume_steps:
        step(f"resume {steps} steps")
        spec = {"task": "resume", "backend": name, "root": str(root), "turn_id": f"turn-{steps}", "steps": steps}
        runs = [run(spec) for _ in range(cfg.resume_processes)]
        stats, peak = summarize([r["seconds"] for r in runs]), max(r["peak_rss_delta_kib"] for r in runs)
        case = {"backend": name, "case": f"{steps} steps", "steps": steps}
        yield [case | {"stats": stats, "peak_rss_delta_kib": peak, "api": runs[0]["api"]}]
    shutil.rmtree(root, ignore_errors=True)


def run_gc(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    root = _fresh(workdir / "gc" / name)
    backend = open_backend(name, root)
    try:
        now = time.time()
        step(f"store {cfg.gc_entries} expiring entries")
        backend.fill_expired(cfg.gc_entries, cfg.gc_entry_bytes, now)
        live = [backend.put("live", i, data.text(cfg.gc_entry_bytes, salt=i), ttl=86400) for i in range(10)]
        yield []
        step(f"gc {cfg.gc_entries}")
        t0 = time.perf_counter()
        deleted = backend.gc(time.time())
        seconds = time.perf_counter() - t0
        if deleted != cfg.gc_entries:
            raise AssertionError(f"{name}: gc deleted {deleted} entries, not {cfg.gc_entries}")
        for entry_id in live:
            backend.get(entry_id)
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
    stats = summarize([seconds])
    stats["ops_per_s"] = cfg.gc_entries / seconds  # entries deleted per second
    yield [{"backend": name, "case": f"{cfg.gc_entries} expired", "entries": cfg.gc_entries, "stats": stats}]


PASSPHRASE = "correct horse battery staple"


def run_open(cfg: Config, name: str, workdir: Path, step: Step) -> Cases:
    root = _fresh(workdir / "open" / name)
    step("open")
    cases = _open_cases(name, root)
    if name != "securepad":  # securepad's openers create their stores on first use
        with closing(open_backend(name, root / "raw" if name == "sqlcipher" else root)) as seeded:
            seeded.put("open-turn", 0, data.text(4 * KiB))
    records = []
    try:
        for case, opener in cases.items():
            opener()()  # create the store (and, for a passphrase, its salt) and warm the OS cache
            samples = []
            for _ in range(cfg.open_reps):
                t0 = time.perf_counter()
                close = opener()
                samples.append(time.perf_counter() - t0)
                close()
            records.append({"backend": name, "case": case, "stats": summarize(samples)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    yield records


def _open_cases(name: str, root: Path) -> dict[str, Callable[[], Callable[[], None]]]:
    """case -> a function that opens the store, ready to serve, and returns its close."""
    if name == "securepad":

        def securepad(path: Path, keyring: Callable[[], Keyring]) -> Callable[[], None]:
            backend = SecurepadBackend(path, keyring=keyring())
            backend.pad.stats(PRINCIPAL)
            return backend.close

        return {
            "key file": lambda: securepad(root / "file", lambda: Keyring.from_key_file(root / "file" / "key")),
            "passphrase (Argon2id t=3 m=64MiB p=4)": lambda: securepad(
                root / "pass", lambda: Keyring.from_passphrase(PASSPHRASE)
            ),
        }

    def plain(path: Path) -> Callable[[], None]:
        backend = open_backend(name, path, create=False)
        backend.resume("none")  # one query: the store is really open
        return backend.close

    if name == "sqlcipher":
        return {
            "raw key": lambda: plain(root / "raw"),
            "passphrase (PBKDF2-SHA512 256k)": lambda: _sqlcipher_passphrase(root / "pass", PASSPHRASE),
        }
    return {"no key (plaintext)": lambda: plain(root)}


def _sqlcipher_passphrase(path: Path, passphrase: str) -> Callable[[], None]:
    from sqlcipher3 import dbapi2

    path.mkdir(parents=True, exist_ok=True)
    conn = dbapi2.connect(str(path / "store.db"))
    conn.execute(f"PRAGMA key = '{passphrase}'")  # SQLCipher 4 defaults: PBKDF2-HMAC-SHA512, 256,000 iterations
    conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
    conn.execute("SELECT count(*) FROM t").fetchall()
    close: Callable[[], None] = conn.close
    return close


# workload -> (its generator, how many steps it reports on one backend)
WORKLOADS: dict[str, tuple[Callable[[Config, str, Path, Step], Cases], Callable[[Config], int]]] = {
    "put": (run_put, lambda cfg: len(cfg.put_sizes)),
    "read": (run_read, lambda cfg: len(cfg.read_sizes) + 1),
    "concurrent": (run_concurrent, lambda cfg: len(cfg.concurrency)),
    "resume": (run_resume, lambda cfg: 1 + len(cfg.resume_steps)),
    "gc": (run_gc, lambda cfg: 2),
    "open": (run_open, lambda cfg: 1),
    "hotpath": (run_hotpath, lambda cfg: 5),
}
