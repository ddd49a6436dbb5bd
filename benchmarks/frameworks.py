"""securepad as the frameworks' own store, beside the frameworks' stores.

    python -m benchmarks.frameworks [--quick] [--no-postgresql] [--out FILE.json]

LangGraph checkpointers: ``SecurepadSaver`` (SQLite file, PostgreSQL) beside
``SqliteSaver`` and ``PostgresSaver``, each also with LangGraph's
``EncryptedSerializer`` (AES, ``from_pycryptodome_aes``). Per state size
(1 KiB, 64 KiB, 1 MiB of one channel that changes every step, plus a small
counter): ``put`` of the next checkpoint and ``get_tuple`` of the latest, in
a thread of 20 checkpoints, and the mean of all the thread's puts; ``get_tuple``
of the latest 1 KiB checkpoint in threads of 1 and 50 (its cost should not
grow with the thread). Then a 100-step graph run end to end (each step
appends ~200 bytes to a list channel and bumps a counter), on every saver.

OpenAI Agents sessions: ``SecurepadSession`` (SQLite, PostgreSQL) beside
``SQLiteSession`` (file) and ``EncryptedSession`` over it: ``add_items`` of
one item of each size to a session of 20 items, and ``get_items()`` of all.

A SQLite saver checkpoints its WAL at the commit that takes it past 1,000 frames,
copying the frames into the database and syncing both files: with 1 MiB
states that is every fourth put, so a thread of 20 ends on the same point of
that cycle at every repetition, and its last put either pays a checkpoint
each time or never. The thread's mean put carries each saver's checkpoints
and syncs in proportion, whatever its durability setting: one that syncs
the WAL only at checkpoints (securepad's ``normal``) pays those syncs in
the checkpointing put, one that syncs it at every commit (``SqliteSaver``)
in every put.

Each repetition runs every store in turn (interleaved), so that a figure and
its baseline share whatever else the machine was doing; the ratios between
rows of one run are what to compare. Medians in milliseconds; nothing here is asserted (``.ci/run`` runs
``--quick --no-postgresql`` as a smoke run). PostgreSQL is ``SECUREPAD_BENCH_PG_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``); each run uses a scratch
database, dropped at the end. The module needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import operator
import os
import platform
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph

from securepad import Keyring, Principal, Scratchpad
from securepad.integrations.langgraph import SecurepadSaver
from securepad.integrations.openai_agents import SecurepadSession

SERVER_DSN = os.environ.get("SECUREPAD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SIZES = {"1 KiB": 1024, "64 KiB": 64 * 1024, "1 MiB": 1024 * 1024}
PRINCIPAL = Principal("bench-owner", "agent", "bench")
THREAD_LENGTH = 20
# get_tuple of the latest 1 KiB checkpoint in threads of these lengths.
LENGTHS = (1, 50)
GRAPH_STEPS = 100


def _repeats(size: int, quick: bool) -> int:
    base = 3 if quick else 40
    return max(2, base if size <= 64 * 1024 else base // 4)


# -- the stores ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch_database() -> Iterator[str]:
    import psycopg

    name = f"securepad_frameworks_{secrets.token_hex(4)}"
    with psycopg.connect(SERVER_DSN, autocommit=True) as server:
        server.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(SERVER_DSN)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(SERVER_DSN, autocommit=True) as server:
            server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _encrypted() -> EncryptedSerializer:
    return EncryptedSerializer.from_pycryptodome_aes(key=secrets.token_bytes(32))


SaverFactory = Callable[[], contextlib.AbstractContextManager[BaseCheckpointSaver[Any]]]


def _savers(workdir: Path, dsn: str | None) -> dict[str, SaverFactory]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    keyring = Keyring.from_key_file(workdir / "key")

    def securepad_sqlite() -> Any:
        @contextlib.contextmanager
        def opened() -> Iterator[BaseCheckpointSaver[Any]]:
            with Scratchpad.open(workdir / f"securepad-{secrets.token_hex(4)}.db", keyring=keyring) as pad:
                yield SecurepadSaver(pad, PRINCIPAL)

        return opened()

    def sqlite_saver(encrypted: bool) -> SaverFactory:
        @contextlib.contextmanager
        def opened() -> Iterator[BaseCheckpointSaver[Any]]:
            path = workdir / f"langgraph-{secrets.token_hex(4)}.db"
            with SqliteSaver.from_conn_string(str(path)) as saver:
                if encrypted:
                    saver = SqliteSaver(saver.conn, serde=_encrypted())
                saver.setup()
                yield saver

        return opened

    factories: dict[str, SaverFactory] = {
        "SecurepadSaver (SQLite)": securepad_sqlite,
        "SqliteSaver": sqlite_saver(False),
        "SqliteSaver + EncryptedSerializer": sqlite_saver(True),
    }
    if dsn is not None:
        from langgraph.checkpoint.postgres import PostgresSaver

        def securepad_pg() -> Any:
            @contextlib.contextmanager
            def opened() -> Iterator[BaseCheckpointSaver[Any]]:
                with Scratchpad.open(dsn, keyring=keyring, schema=f"sp_{secrets.token_hex(4)}") as pad:
                    yield SecurepadSaver(pad, PRINCIPAL)

            return opened()

        def postgres_saver(encrypted: bool) -> SaverFactory:
            @contextlib.contextmanager
            def opened() -> Iterator[BaseCheckpointSaver[Any]]:
                import psycopg

                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(
                        "DROP TABLE IF EXISTS checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations"
                    )
                with PostgresSaver.from_conn_string(dsn) as saver:
                    if encrypted:
                        saver = PostgresSaver(saver.conn, serde=_encrypted())
                    saver.setup()
                    yield saver

            return opened

        factories["SecurepadSaver (PostgreSQL)"] = securepad_pg
        factories["PostgresSaver"] = postgres_saver(False)
        factories["PostgresSaver + EncryptedSerializer"] = postgres_saver(True)
    return factories


# -- checkpoints ------------------------------------------------------------------------------


def _database_file(saver: BaseCheckpointSaver[Any]) -> Path | None:
    """The SQLite database file a saver writes (None on PostgreSQL)."""
    if isinstance(saver, SecurepadSaver):
        return saver.pad.path if saver.pad.backend == "sqlite" else None
    conn = getattr(saver, "conn", None)
    if isinstance(conn, sqlite3.Connection):
        return Path(conn.execute("PRAGMA database_list").fetchall()[0][2])
    return None


def _checkpoint_sample(
    saver: BaseCheckpointSaver[Any], thread_id: str, size: int, length: int
) -> tuple[float, float, float, bool | None]:
    """put of the last checkpoint (one channel changed, ``size`` bytes) of a thread
    of ``length``, the mean of all its puts, and get_tuple of the latest, in seconds;
    whether that last put checkpointed the WAL (it wrote the database file: in WAL
    mode only a checkpoint does; None on PostgreSQL)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    version = None
    put = puts = 0.0
    database = _database_file(saver)
    written = None
    for step in range(length):
        version = saver.get_next_version(version, None)
        payload = base64.b64encode(os.urandom(size * 3 // 4 + 1)).decode()[:size]
        checkpoint = {
            **checkpoint,
            "id": str(_uuid6()),
            "channel_values": {"data": payload, "step": step},
            "channel_versions": {"data": version, "step": version},
        }
        if database is not None and step == length - 1:
            written = database.stat().st_mtime_ns
        started = time.perf_counter()
        config = saver.put(config, checkpoint, {"source": "loop", "step": step}, {"data": version, "step": version})
        put = time.perf_counter() - started
        puts += put
    checkpointed = None if database is None else database.stat().st_mtime_ns != written
    started = time.perf_counter()
    found = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    get = time.perf_counter() - started
    assert found is not None and found.checkpoint["channel_values"]["data"] == payload
    return put, puts / length, get, checkpointed


def _checkpoint_figures(
    factories: dict[str, SaverFactory], size: int, repeats: int, length: int = THREAD_LENGTH
) -> dict[str, dict[str, Any]]:
    """Per saver, median put of the next checkpoint, median mean put of a whole thread
    and get_tuple of the latest on threads of ``length`` (``_checkpoint_sample``), and
    how many of those puts of the next checkpoint checkpointed the WAL (SQLite); each
    repetition runs every saver in turn (a store each)."""
    samples: dict[str, tuple[list[float], list[float], list[float]]] = {name: ([], [], []) for name in factories}
    checkpointed: dict[str, int | None] = dict.fromkeys(factories, 0)
    with contextlib.ExitStack() as stack:
        savers = {name: stack.enter_context(factory()) for name, factory in factories.items()}
        for run in range(repeats):
            for name, saver in savers.items():
                *figures, wrote = _checkpoint_sample(saver, f"t{run}", size, length)
                for found, figure in zip(samples[name], figures, strict=True):
                    found.append(figure)
                count = checkpointed[name]
                checkpointed[name] = None if wrote is None or count is None else count + wrote
    return {
        name: {
            "put_ms": _ms(puts),
            "thread_put_ms": _ms(means),
            "get_ms": _ms(gets),
            "puts_checkpointed": checkpointed[name],
            "repeats": repeats,
        }
        for name, (puts, means, gets) in samples.items()
    }


def _uuid6() -> str:
    from langgraph.checkpoint.base.id import uuid6

    return str(uuid6(clock_seq=-1))


class _Chat(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    count: int


def _note(state: _Chat) -> dict[str, Any]:
    count = state.get("count", 0) + 1
    return {"notes": [f"step {count}: " + "n" * 190], "count": count}


def graph_builder(nodes: int) -> StateGraph[Any]:
    """The measured graph: ``nodes`` in a row, each appending ~200 bytes and bumping a counter."""
    builder = StateGraph(_Chat)
    names = [f"n{i}" for i in range(nodes)]
    for name in names:
        builder.add_node(name, _note)
    builder.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder


def _graph_runs(factories: dict[str, SaverFactory], repeats: int) -> dict[str, dict[str, float]]:
    """Per saver, the median 100-step run; each repetition runs every saver in turn."""
    builder = graph_builder(GRAPH_STEPS)
    times: dict[str, list[float]] = {name: [] for name in factories}
    with contextlib.ExitStack() as stack:
        graphs = {name: builder.compile(checkpointer=stack.enter_context(f())) for name, f in factories.items()}
        for run in range(repeats):
            for name, graph in graphs.items():
                config: RunnableConfig = {"configurable": {"thread_id": f"g{run}"}, "recursion_limit": 1000}
                started = time.perf_counter()
                result = graph.invoke({"count": 0}, config)
                times[name].append(time.perf_counter() - started)
                assert result["count"] == GRAPH_STEPS
    return {name: {"run_ms": _ms(samples)} for name, samples in times.items()}


# -- sessions --------------------------------------------------------------------------------


def _sessions(workdir: Path, dsn: str | None, stack: contextlib.ExitStack) -> dict[str, Callable[[str], Any]]:
    from agents import SQLiteSession
    from agents.extensions.memory import EncryptedSession

    keyring = Keyring.from_key_file(workdir / "key")
    pads = {"SecurepadSession (SQLite)": stack.enter_context(Scratchpad.open(workdir / "sessions.db", keyring=keyring))}
    if dsn is not None:
        pads["SecurepadSession (PostgreSQL)"] = stack.enter_context(
            Scratchpad.open(dsn, keyring=keyring, schema="sp_sessions")
        )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    plain_path = str(workdir / "agents-sessions.db")
    factories: dict[str, Callable[[str], Any]] = {name: _securepad_session(pad) for name, pad in pads.items()}
    factories["SQLiteSession"] = lambda sid: SQLiteSession(sid, plain_path)
    factories["EncryptedSession (over SQLiteSession)"] = lambda sid: EncryptedSession(
        sid, SQLiteSession(sid, plain_path), key
    )
    return factories


def _securepad_session(pad: Scratchpad) -> Callable[[str], Any]:
    return lambda session_id: SecurepadSession(session_id, pad, PRINCIPAL)


def _session_figures(makers: dict[str, Callable[[str], Any]], size: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per session kind, median add_items of one item to a session of 19 and
    get_items of all 20; each repetition runs every kind in turn."""
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in makers}

    async def one(name: str, run: int) -> None:
        session = makers[name](f"s{size}-{run}-{secrets.token_hex(3)}")
        text = "m" * size
        await session.add_items([{"role": "user", "content": f"{i}: {text}"} for i in range(THREAD_LENGTH - 1)])
        started = time.perf_counter()
        await session.add_items([{"role": "assistant", "content": text}])
        samples[name][0].append(time.perf_counter() - started)
        started = time.perf_counter()
        items = await session.get_items()
        samples[name][1].append(time.perf_counter() - started)
        assert len(items) == THREAD_LENGTH

    for run in range(repeats):
        for name in makers:
            asyncio.run(one(name, run))
    return {name: {"add_ms": _ms(adds), "get_ms": _ms(gets)} for name, (adds, gets) in samples.items()}


# -- the run and the report ------------------------------------------------------------------------


def _load() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def run(*, quick: bool, postgresql: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            # The 1-minute load average at the start and the end: the machine may be shared.
            "load_average": {"start": _load()},
        },
        "quick": quick,
        "checkpoints": {},
        "get_tuple_by_thread_length": {},
        "graph_100_steps": {},
        "sessions": {},
    }
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        dsn = stack.enter_context(_scratch_database()) if postgresql else None
        savers = _savers(workdir, dsn)
        by_size = {label: _checkpoint_figures(savers, size, _repeats(size, quick)) for label, size in SIZES.items()}
        results["checkpoints"] = {name: {label: by_size[label][name] for label in SIZES} for name in savers}
        by_length = {n: _checkpoint_figures(savers, 1024, 3 if quick else 20, n) for n in LENGTHS}
        results["get_tuple_by_thread_length"] = {
            name: {str(n): by_length[n][name]["get_ms"] for n in LENGTHS} for name in savers
        }
        results["graph_100_steps"] = _graph_runs(savers, 2 if quick else 5)
        print("  checkpointers: done", flush=True)
        sessions = _sessions(workdir, dsn, stack)
        by_size = {label: _session_figures(sessions, size, _repeats(size, quick)) for label, size in SIZES.items()}
        results["sessions"] = {name: {label: by_size[label][name] for label in SIZES} for name in sessions}
        print("  sessions: done", flush=True)
    results["machine"]["load_average"]["end"] = _load()
    return results


def markdown(results: dict[str, Any]) -> str:
    sizes = list(SIZES)
    lines = ["Checkpoints (median ms: put of the next / get_tuple of the latest, thread of 20):", ""]
    lines.append("| saver | " + " | ".join(f"{s} put | {s} get" for s in sizes) + " | 100-step graph run |")
    lines.append("|---|" + "---:|" * (2 * len(sizes) + 1))
    for name, figures in results["checkpoints"].items():
        cells = [f"{figures[s]['put_ms']:.2f} | {figures[s]['get_ms']:.2f}" for s in sizes]
        run_ms = results["graph_100_steps"][name]["run_ms"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {run_ms:.0f} |")
    lines += ["", "Every put of a thread of 20, the mean (median ms over the repetitions); in brackets, the"]
    lines += ["repetitions whose put of the next checkpoint (above) checkpointed the WAL:", ""]
    lines.append("| saver | " + " | ".join(sizes) + " |")
    lines.append("|---|" + "---:|" * len(sizes))
    for name, figures in results["checkpoints"].items():
        cells = [_thread_cell(figures[s]) for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lengths = [str(length) for length in LENGTHS]
    lines += ["", "get_tuple of the latest 1 KiB checkpoint by thread length (median ms):", ""]
    lines.append("| saver | " + " | ".join(f"{n} checkpoint{'s' * (n != '1')}" for n in lengths) + " |")
    lines.append("|---|" + "---:|" * len(lengths))
    for name, figures in results["get_tuple_by_thread_length"].items():
        lines.append(f"| {name} | " + " | ".join(f"{figures[n]:.2f}" for n in lengths) + " |")
    lines += ["", "Sessions (median ms: add_items of one item / get_items of all 20):", ""]
    lines.append("| session | " + " | ".join(f"{s} add | {s} get" for s in sizes) + " |")
    lines.append("|---|" + "---:|" * (2 * len(sizes)))
    for name, figures in results["sessions"].items():
        cells = [f"{figures[s]['add_ms']:.2f} | {figures[s]['get_ms']:.2f}" for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _thread_cell(figures: dict[str, Any]) -> str:
    """A size's mean put of a thread, with the repetitions whose last put checkpointed (SQLite)."""
    cell = f"{figures['thread_put_ms']:.2f}"
    if figures.get("puts_checkpointed") is None:
        return cell
    return f"{cell} ({figures['puts_checkpointed']}/{figures['repeats']})"


# (securepad's store, the peer it is judged against, the ratio it may reach at most)
SAVER_PEERS = (
    ("SecurepadSaver (SQLite)", "SqliteSaver + EncryptedSerializer", "SqliteSaver"),
    ("SecurepadSaver (PostgreSQL)", "PostgresSaver + EncryptedSerializer", "PostgresSaver"),
)
SESSION_PEER = ("SecurepadSession (SQLite)", "EncryptedSession (over SQLiteSession)")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its figure from this run: every cell of a securepad saver
    at most 1.0x the same backend's saver with ``EncryptedSerializer``, its 100-step
    graph at most 1.5x the plain saver's, every cell of ``SecurepadSession`` at
    most 1.0x ``EncryptedSession``'s. A store not in the run has no target."""
    found: list[tuple[str, float, float]] = []
    cells = results["checkpoints"]
    for ours, encrypted, plain in SAVER_PEERS:
        if ours not in cells:
            continue
        for size, figures in cells[ours].items():
            for op in ("put", "get"):
                found.append((f"{ours} {op} {size}", figures[f"{op}_ms"] / cells[encrypted][size][f"{op}_ms"], 1.0))
        lengths = results["get_tuple_by_thread_length"]
        for length, ms in lengths[ours].items():
            found.append((f"{ours} get_tuple, thread of {length}", ms / lengths[encrypted][length], 1.0))
        graph = results["graph_100_steps"]
        found.append((f"{ours} 100-step graph against {plain}", graph[ours]["run_ms"] / graph[plain]["run_ms"], 1.5))
    ours, encrypted = SESSION_PEER
    for size, figures in results["sessions"].get(ours, {}).items():
        for op in ("add", "get"):
            peer = results["sessions"][encrypted][size][f"{op}_ms"]
            found.append((f"{ours} {op} {size}", figures[f"{op}_ms"] / peer, 1.0))
    return [{"target": name, "ratio": ratio, "at_most": most, "met": ratio <= most} for name, ratio, most in found]


def targets_text(found: list[dict[str, Any]]) -> str:
    lines = ["Targets (a ratio of medians from this run; at most the figure in brackets):", ""]
    for t in found:
        verdict = "met" if t["met"] else "missed"
        lines.append(f"{verdict:<7} {t['target']}: {t['ratio']:.2f}x (<= {t['at_most']:.1f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.frameworks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (a smoke run)")
    parser.add_argument("--no-postgresql", action="store_true", help="SQLite only")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    results = run(quick=args.quick, postgresql=not args.no_postgresql)
    results["targets"] = targets(results)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    print()
    print(targets_text(results["targets"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
