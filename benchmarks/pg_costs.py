"""CPU and round trips per operation, securepad on PostgreSQL beside SQLite.

On a machine where the server competes with the clients for the same cores,
throughput follows CPU per operation: this measures it, one process, one
store, ``count`` puts of ``size`` bytes then ``count`` head reads of
``read_chars`` characters, on each backend. PostgreSQL's store is opened as the
README and the guide open it, from a DSN (``Scratchpad.open("postgresql://...")``:
the store makes its own pool and keeps the connection its last call gave back);
with ``pool=True`` also on a pool passed in (``Scratchpad.open(pool)``: every
connection goes back to the pool at the end of each call), the slower path.

* client CPU: ``resource.getrusage(RUSAGE_SELF)`` (user + system) around the calls;
* server CPU (PostgreSQL): the time on CPU of every server process serving the
  store, from ``/proc/<pid>/schedstat`` (nanoseconds; ``/proc/<pid>/stat``
  counts 10 ms ticks, 10 us per operation over 1,000). The server is local; its
  processes are the ones whose ``application_name`` (set in the DSN, unique to
  the run) ``pg_stat_activity`` shows, read from a separate admin connection;
* round trips: waits for the server (``psycopg.Connection.wait``, as
  tests/storage/postgres/test_round_trips.py counts them) of every connection but the admin
  one, counted by a wrapper installed on the class for the run and removed after.
"""

from __future__ import annotations

import resource
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from securepad import Keyring, Scratchpad
from securepad.bench import data
from securepad.bench.backends import PRINCIPAL, bench_policy

__all__ = ["MODES", "cpu_per_op", "cpu_table"]

#: The result's key for each way of opening the PostgreSQL store, and its label.
MODES = {
    "securepad-postgresql": "from a DSN",
    "securepad-postgresql-pool": "on a pool passed in",
}


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu_s(pid: int) -> float | None:
    """A local process's seconds on CPU (None when it cannot be read: it ended)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _Server:
    """The CPU of the server processes whose ``application_name`` is ``name``.

    Looked up at each reading, not once: the store's pool may replace or add
    connections between readings. A process found at the end but not at the
    start counts from its start (its whole life is within the block); one that
    ended within the block is lost (its CPU can no longer be read)."""

    def __init__(self, admin: Any, name: str) -> None:
        self._admin = admin
        self._name = name

    def reading(self) -> dict[int, float]:
        rows = self._admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self._name,)
        ).fetchall()
        return {pid: cpu for (pid,) in rows if (cpu := _process_cpu_s(int(pid))) is not None}

    @staticmethod
    def spent(start: dict[int, float], end: dict[int, float]) -> float:
        return sum(cpu - start.get(pid, 0.0) for pid, cpu in end.items())


class _Meter:
    """Client CPU, server CPU and round trips across a block of calls."""

    def __init__(self, server: _Server | None, waits: Callable[[], int]) -> None:
        self._server = server
        self._waits = waits

    def measure(self, calls: Callable[[], None], count: int) -> dict[str, float]:
        # The server's readings outside the client's: the admin connection's
        # queries are not the store's CPU, time or round trips.
        server = self._server.reading() if self._server is not None else {}
        client, waits, start = _client_cpu_s(), self._waits(), time.perf_counter()
        calls()
        end, waits2, client2 = time.perf_counter(), self._waits(), _client_cpu_s()
        server2 = self._server.reading() if self._server is not None else {}
        server_s = _Server.spent(server, server2)
        return {
            "ops_per_s": count / (end - start),
            "client_cpu_us": (client2 - client) / count * 1e6,
            "server_cpu_us": server_s / count * 1e6,
            "cpu_us": (client2 - client + server_s) / count * 1e6,
            "round_trips": (waits2 - waits) / count,
            "server_processes": len(server2),
        }


def _run(pad: Scratchpad, meter: _Meter, count: int, size: int, read_chars: int) -> dict[str, Any]:
    texts = [data.text(size, salt=i) for i in range(count)]
    ids: list[str] = []
    for i in range(20):  # warm: the owner's key, the caches, the server's plans
        ids.append(str(pad.put(PRINCIPAL, "warm", i, "bench", texts[i % count])["scratchpad_id"]))
        pad.read(PRINCIPAL, ids[-1], "head", n=read_chars)

    def puts() -> None:
        for i, text in enumerate(texts):
            ids.append(str(pad.put(PRINCIPAL, "cpu", i, "bench", text)["scratchpad_id"]))

    def reads() -> None:
        for entry in ids[-count:]:
            pad.read(PRINCIPAL, entry, "head", n=read_chars)

    return {"put": meter.measure(puts, count), "read": meter.measure(reads, count)}


def _sqlite(keyring: Keyring, workdir: Path, count: int, size: int, read_chars: int) -> dict[str, Any]:
    with Scratchpad.open(workdir / "cpu.db", keyring=keyring, policy=bench_policy()) as pad:
        return _run(pad, _Meter(None, lambda: 0), count, size, read_chars)


def _named(dsn: str, application_name: str) -> str:
    """``dsn`` (a ``postgresql://`` URL, as ``Scratchpad.open`` takes) with its
    connections' ``application_name`` set, so the server's processes serving it can be found."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "application_name"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("application_name", application_name)])))


@contextmanager
def _counting_waits(admin: Any) -> Iterator[Callable[[], int]]:
    """Counts ``psycopg.Connection.wait`` calls of every connection but ``admin``
    while open: the store's connections are made by its own pool, of its own
    class, so the count is taken on the class they all derive from."""
    import psycopg

    original = psycopg.Connection.wait
    count = 0

    def wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal count
        if self is not admin:
            count += 1
        return original(self, gen, *args, **kwargs)

    psycopg.Connection.wait = wait  # type: ignore[method-assign]
    try:
        yield lambda: count
    finally:
        psycopg.Connection.wait = original  # type: ignore[method-assign]


def _postgres(keyring: Keyring, dsn: str, count: int, size: int, read_chars: int, *, on_pool: bool) -> dict[str, Any]:
    import psycopg
    from psycopg_pool import ConnectionPool

    token = secrets.token_hex(4)
    schema = f"bench_cpu_{token}"
    name = f"securepad-bench-cpu-{token}"
    named = _named(dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin, _counting_waits(admin) as waits:
            meter = _Meter(_Server(admin, name), waits)
            if on_pool:
                kwargs = {"autocommit": True}
                with (
                    ConnectionPool(named, min_size=1, max_size=1, kwargs=kwargs) as pool,
                    Scratchpad.open(pool, keyring=keyring, policy=bench_policy(), schema=schema) as pad,
                ):
                    return _run(pad, meter, count, size, read_chars)
            with Scratchpad.open(named, keyring=keyring, policy=bench_policy(), schema=schema) as pad:
                return _run(pad, meter, count, size, read_chars)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def cpu_per_op(
    dsn: str, *, count: int = 1000, size: int = 4096, read_chars: int = 2000, pool: bool = False
) -> dict[str, Any]:
    """Per put and per read on each backend: ops/s of one client, client and
    server CPU microseconds, round trips; and PostgreSQL's CPU as a multiple of SQLite's.

    ``"securepad-postgresql"`` and ``"ratio"`` are the store opened from ``dsn``
    (a ``postgresql://`` URL); with ``pool``, ``"securepad-postgresql-pool"`` and
    ``"ratio_pool"`` are the same on a ``ConnectionPool`` of one connection passed in.
    """
    with tempfile.TemporaryDirectory(prefix="securepad-bench-cpu-") as tmp:
        workdir = Path(tmp)
        keyring = Keyring.from_key_file(workdir / "config" / "key")
        result: dict[str, Any] = {
            "securepad": _sqlite(keyring, workdir, count, size, read_chars),
            "securepad-postgresql": _postgres(keyring, dsn, count, size, read_chars, on_pool=False),
        }
        if pool:
            result["securepad-postgresql-pool"] = _postgres(keyring, dsn, count, size, read_chars, on_pool=True)
    sqlite = result["securepad"]
    for key, ratio in (("securepad-postgresql", "ratio"), ("securepad-postgresql-pool", "ratio_pool")):
        if key in result:
            result[ratio] = {op: result[key][op]["cpu_us"] / max(sqlite[op]["cpu_us"], 1e-9) for op in ("put", "read")}
    return result


def cpu_table(result: dict[str, Any]) -> list[str]:
    """``cpu_per_op``'s result as a Markdown table and its ratios, one row per
    store and operation, each PostgreSQL store labelled by how it was opened."""
    lines = [
        "| backend | store opened | op | ops/s | client CPU us | server CPU us | total CPU us | round trips |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = [("securepad", "SQLite file"), *((key, label) for key, label in MODES.items() if key in result)]
    for key, label in rows:
        for op in ("put", "read"):
            m = result[key][op]
            lines.append(
                f"| {key} | {label} | {op} | {m['ops_per_s']:.0f} | {m['client_cpu_us']:.0f}"
                f" | {m['server_cpu_us']:.0f} | {m['cpu_us']:.0f} | {m['round_trips']:.1f} |"
            )
    lines.append("")
    for key, ratio in (("securepad-postgresql", "ratio"), ("securepad-postgresql-pool", "ratio_pool")):
        if ratio in result:
            lines.append(
                f"PostgreSQL {MODES[key]}: CPU per put {result[ratio]['put']:.2f}x SQLite's,"
                f" per read {result[ratio]['read']:.2f}x"
            )
    return lines
