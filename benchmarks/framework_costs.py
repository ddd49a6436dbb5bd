"""Instructions of one warm call of the LangGraph checkpointers, side by side.

    python -m benchmarks.framework_costs [--cpu | --misses] [--big] [--savers NAMES] [--ops NAMES] [--out FILE.json]

``SecurepadSaver`` (SQLite) beside ``SqliteSaver`` with LangGraph's
``EncryptedSerializer`` and plain ``SqliteSaver``, on the calls
``benchmarks.frameworks`` times: ``put`` of the next checkpoint (one channel
of 1 KiB, 64 KiB or, with ``--big``, 1 MiB changed, plus a counter) in a
thread of 20, ``get_tuple`` of the latest, ``get_tuple`` of the latest 1 KiB
checkpoint in threads of 1 and 50, and a step of a graph of nodes in a row
(each appends ~200 bytes to a list channel and bumps a counter).

Each saver runs in a process of its own under callgrind: per operation a
warm-up call, then ``N`` and ``2N`` calls, each run ending with a truncating
WAL checkpoint (what the run wrote goes back to the database) and a marker
call at which callgrind dumps; a figure is (Ir(2N) - Ir(N)) / N, so one-off
costs cancel. A graph step is the difference of a run of ``2N`` nodes and one
of ``N`` (fresh threads), over ``N``: the steps of the second half of a run of
``2N``, the half whose list channel outgrows the saver's inline values; the
whole run of ``2N`` nodes is given too. ``--cpu`` (or no valgrind): the mean
CPU time of the 3N calls in microseconds instead, which moves with the machine's load.
``--misses``: the misses of a simulated 1 MiB last-level cache instead
(callgrind's cache simulation; instruction and data lines): instructions
weigh alike whether their code and data are cached or not, and a call whose
work spreads over more code and data than a core's cache holds (or than
other processes leave of it) runs fewer instructions per second. Like
instructions, these do not depend on the load.

Not shipped with the package: run from a checkout with the ``bench`` and
``langgraph`` extras. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from securepad.bench.instructions import marked_runs

SAVERS = ("SecurepadSaver", "SqliteSaver + EncryptedSerializer", "SqliteSaver")
# op -> (what it is, N): N calls (a graph: nodes) per run, 2N in the second.
OPS: dict[str, tuple[str, int]] = {
    "put 1 KiB": ("put of the next checkpoint, 1 KiB channel, thread of 20+", 10),
    "get 1 KiB": ("get_tuple of the latest, 1 KiB channel, thread of 20+", 10),
    "put 64 KiB": ("put of the next checkpoint, 64 KiB channel", 6),
    "get 64 KiB": ("get_tuple of the latest, 64 KiB channel", 6),
    "put 1 MiB": ("put of the next checkpoint, 1 MiB channel", 2),
    "get 1 MiB": ("get_tuple of the latest, 1 MiB channel", 2),
    "get thread of 1": ("get_tuple of the latest 1 KiB, thread of 1", 10),
    "get thread of 50": ("get_tuple of the latest 1 KiB, thread of 50", 10),
    "graph step": ("one step of a graph's invoke (nodes N+1..2N of 2N)", 50),
}
BIG = ("put 1 MiB", "get 1 MiB")
SIZES = {"1 KiB": 1024, "64 KiB": 64 * 1024, "1 MiB": 1024 * 1024}
THREAD_LENGTH = 20
# The marker: a function that nothing else calls while the operations run.
MARKER = "sys_getswitchinterval"
# ``--misses``: callgrind's cache simulation, its last level 1 MiB (16-way, 64-byte lines).
CACHE_SIMULATION = ("--cache-sim=yes", "--LL=1048576,16,64")
# The events that count a simulated last-level miss: instruction reads, data reads and writes.
MISS_EVENTS = ("ILmr", "DLmr", "DLmw")


# -- the measured process -----------------------------------------------------------------------


@contextlib.contextmanager
def _saver(name: str, workdir: Path) -> Iterator[tuple[Any, Callable[[], None]]]:
    """The saver ``name`` on a fresh file in ``workdir``, and the call that empties its WAL."""
    import secrets

    if name == "SecurepadSaver":
        from securepad import Keyring, Policy, Scratchpad
        from securepad.bench.costs import empty_wal
        from securepad.integrations.langgraph import SecurepadSaver
        from securepad.principal import Principal

        # The anchor syncs at close only: under callgrind a second is a few dozen calls, and the
        # default sync, once a second, would land in the runs (as ``securepad bench --costs`` does).
        policy = Policy.from_dict({"storage": {"anchor_sync": "close"}}, name="framework-costs")
        keyring = Keyring.from_key_file(workdir / "key")
        with Scratchpad.open(workdir / "securepad.db", keyring=keyring, policy=policy) as pad:

            def empty() -> None:
                empty_wal(pad)

            yield SecurepadSaver(pad, Principal("bench-owner", "agent", "bench")), empty
        return
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(workdir / "langgraph.db")) as saver:
        if name == "SqliteSaver + EncryptedSerializer":
            serde = EncryptedSerializer.from_pycryptodome_aes(key=secrets.token_bytes(32))
            saver = SqliteSaver(saver.conn, serde=serde)
        saver.setup()
        conn = saver.conn

        def empty() -> None:
            with saver.lock:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        yield saver, empty


def _payload(size: int) -> str:
    """A channel value of ``size`` characters (random, as ``benchmarks.frameworks`` puts)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


class _Thread:
    """Puts of the next checkpoint into one thread, and get_tuple of its latest."""

    def __init__(self, saver: Any, thread_id: str, size: int) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.saver, self.size = saver, size
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.latest: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.checkpoint = empty_checkpoint()
        self.version: Any = None
        self.step = 0
        self.payload = _payload(size)

    def put(self) -> None:
        from langgraph.checkpoint.base.id import uuid6

        self.version = version = self.saver.get_next_version(self.version, None)
        self.checkpoint = {
            **self.checkpoint,
            "id": str(uuid6(clock_seq=-1)),
            "channel_values": {"data": self.payload, "step": self.step},
            "channel_versions": {"data": version, "step": version},
        }
        metadata = {"source": "loop", "step": self.step}
        self.config = self.saver.put(self.config, self.checkpoint, metadata, {"data": version, "step": version})
        self.step += 1

    def get(self) -> None:
        found = self.saver.get_tuple(self.latest)
        if found is None or found.checkpoint["channel_values"]["step"] != self.step - 1:
            raise AssertionError("get_tuple did not return the latest checkpoint")


def _graph(nodes: int) -> Any:
    """A graph of ``nodes`` in a row, as ``benchmarks.frameworks`` runs it."""
    from .frameworks import graph_builder

    return graph_builder(nodes)


def _repeated(call: Callable[[], None]) -> Callable[[int], None]:
    """``call`` made ``n`` times."""

    def run(n: int) -> None:
        for _ in range(n):
            call()

    return run


def _operations(saver: Any, chosen: list[str]) -> dict[str, Callable[[int], None]]:
    """Each chosen operation as a call of ``n`` (calls, or a graph's nodes), its state prepared here."""
    ops: dict[str, Callable[[int], None]] = {}
    for op in chosen:
        kind, _, rest = op.partition(" ")
        if kind in ("put", "get") and rest in SIZES:
            thread = _Thread(saver, op, SIZES[rest])
            for _ in range(THREAD_LENGTH - 1):
                thread.put()
            call = thread.put if kind == "put" else thread.get
            if kind == "get":
                thread.put()
            ops[op] = _repeated(call)
        elif kind == "get":  # get thread of <length>
            thread = _Thread(saver, op, 1024)
            for _ in range(int(rest.rsplit(" ", 1)[1])):
                thread.put()
            ops[op] = _repeated(thread.get)
        else:
            ops[op] = _graph_op(saver, OPS[op][1])
    return ops


def _graph_op(saver: Any, n: int) -> Callable[[int], None]:
    """Invoke a graph of ``n`` nodes (warm-up: 2 nodes) on a fresh thread."""
    graphs = {size: _graph(size).compile(checkpointer=saver) for size in (2, n, 2 * n)}
    serial = iter(range(1_000_000))

    def invoke(nodes: int) -> None:
        config = {"configurable": {"thread_id": f"g{next(serial)}"}, "recursion_limit": 10 * nodes}
        result = graphs[nodes].invoke({"count": 0}, config)
        if result["count"] != nodes:
            raise AssertionError("the graph did not run every node")

    return invoke


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """The measured process: each operation's warm, N and 2N runs; their CPU seconds."""
    marker = sys.getswitchinterval
    runs: list[list[Any]] = []
    with _saver(spec["saver"], Path(spec["workdir"])) as (saver, empty_wal):
        ops = _operations(saver, spec["ops"])
        empty_wal()
        marker()
        for op in spec["ops"]:
            n = OPS[op][1]
            warm = 2 if op == "graph step" else 1
            for label, count in (("warm", warm), ("N", n), ("2N", 2 * n)):
                started = time.process_time()
                ops[op](count)
                empty_wal()
                runs.append([op, label, time.process_time() - started])
                marker()
    return {"runs": runs}


# -- the parent ------------------------------------------------------------------------------


def _environment(workdir: Path) -> dict[str, str]:
    """This checkout first on the path, the same hash seed everywhere, bytecode cached once."""
    root = str(Path(__file__).absolute().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("PYTHONPYCACHEPREFIX", str(workdir / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _measured(
    name: str, ops: list[str], workdir: Path, callgrind: bool, misses: bool = False
) -> dict[tuple[str, str], tuple[float, Any]]:
    """One measured process of saver ``name``: {(op, run): (CPU seconds, Ir, or with
    ``misses`` the simulated last-level misses, or None)}."""
    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    out = workdir / "callgrind.out"
    for old in workdir.glob(f"{out.name}*"):
        old.unlink()
    spec = {"saver": name, "ops": ops, "workdir": str(run_dir)}
    command = [sys.executable, "-m", "benchmarks.framework_costs", "--child", json.dumps(spec)]
    if callgrind:
        simulated = CACHE_SIMULATION if misses else ()
        marked = [f"--dump-before={MARKER}", f"--callgrind-out-file={out}"]
        command = ["valgrind", "--tool=callgrind", *simulated, *marked, *command]
    done = subprocess.run(command, capture_output=True, text=True, env=_environment(workdir), check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the measured process of {name} failed: {done.stderr[-3000:]}")
    runs = json.loads(lines[-1])["runs"]
    found = marked_runs(runs, out, MARKER, callgrind=callgrind)
    if callgrind and misses:  # run k ends at marker k + 2 (``marked_runs``)
        for k, (op, label, seconds) in enumerate(runs):
            found[(op, label)] = (seconds, _misses(out.with_name(f"{out.name}.{k + 2}")))
    return found


def _misses(dump: Path) -> int:
    """The simulated last-level misses (``MISS_EVENTS``) of one callgrind dump."""
    events: list[str] = []
    for line in dump.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            totals = dict(zip(events, (int(x) for x in line.split()[1:]), strict=False))
            return sum(totals.get(event, 0) for event in MISS_EVENTS)
    raise RuntimeError(f"callgrind wrote no total in {dump}")


def measure(savers: list[str], ops: list[str], *, callgrind: bool, misses: bool = False) -> dict[str, Any]:
    """Per saver and operation: one warm call's instructions (``misses``: simulated
    last-level misses; or CPU microseconds)."""
    unit = "CPU microseconds"
    if callgrind:
        unit = "misses of a simulated 1 MiB last-level cache" if misses else "instructions"
    results: dict[str, Any] = {"unit": unit, "figures": {}}
    with tempfile.TemporaryDirectory(prefix="framework-costs-") as scratch:
        workdir = Path(scratch)
        for name in savers:
            if callgrind:
                _measured(name, ops, workdir, callgrind=False)  # bytecode compiled once, natively
            found = _measured(name, ops, workdir, callgrind=callgrind, misses=misses)
            figures = results["figures"][name] = {}
            for op in ops:
                n = OPS[op][1]
                (seconds_n, ir_n), (seconds_2n, ir_2n) = found[(op, "N")], found[(op, "2N")]
                if ir_n is not None and ir_2n is not None:
                    figures[op] = (ir_2n - ir_n) / n
                    if op == "graph step":
                        figures[f"graph run of {2 * n}"] = ir_2n
                else:
                    figures[op] = (seconds_2n - seconds_n) / n * 1e6
                    if op == "graph step":
                        figures[f"graph run of {2 * n}"] = seconds_2n * 1e6
    return results


def report(results: dict[str, Any]) -> str:
    names = list(results["figures"])
    rows = list(next(iter(results["figures"].values()), {}))
    lines = [f"one warm call, {results['unit']} ((2N run - N run) / N)", ""]
    lines.append(f"{'operation':<22}" + "".join(f"{name:>34}" for name in names))
    for op in rows:
        cells = "".join(f"{results['figures'][name][op]:>34,.0f}" for name in names)
        lines.append(f"{op:<22}{cells}")
    if names and names[0] == "SecurepadSaver":
        lines += ["", "ratios: SecurepadSaver / each"]
        for other in names[1:]:
            cells = ", ".join(
                f"{op} {results['figures'][names[0]][op] / results['figures'][other][op]:.2f}x" for op in rows
            )
            lines.append(f"  {other}: {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.framework_costs", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU time instead of callgrind's instructions")
    parser.add_argument("--misses", action="store_true", help="simulated 1 MiB last-level cache misses (callgrind)")
    parser.add_argument("--big", action="store_true", help="also the 1 MiB put and get_tuple (slow under callgrind)")
    parser.add_argument("--savers", help=f"comma-separated, of: {', '.join(SAVERS)}")
    parser.add_argument("--ops", help=f"comma-separated, of: {', '.join(OPS)}")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    savers = args.savers.split(",") if args.savers else list(SAVERS)
    ops = args.ops.split(",") if args.ops else [op for op in OPS if args.big or op not in BIG]
    unknown = [s for s in savers if s not in SAVERS] + [op for op in ops if op not in OPS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    callgrind = not args.cpu and shutil.which("valgrind") is not None
    if args.misses and not callgrind:
        parser.error("--misses needs valgrind (and not --cpu)")
    results = measure(savers, ops, callgrind=callgrind, misses=args.misses)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
