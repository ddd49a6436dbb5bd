"""CPU and round trips per operation, securepad on PostgreSQL beside SQLite.

On a machine where the server competes with the clients for the same cores,
throughput follows CPU per operation: this measures it, one process, one
connection, ``count`` puts of ``size`` bytes then ``count`` head reads of
``read_chars`` characters, on each backend:

* client CPU: ``resource.getrusage(RUSAGE_SELF)`` (user + system) around the calls;
* server CPU (PostgreSQL): the serving backend process's ``utime + stime``
  from ``/proc/<pid>/stat`` (the server is local; its pid is ``pg_backend_pid()``
  of the one pooled connection);
* round trips: the connection's waits for the server (as tests/test_pg_round_trips.py counts them).
"""

from __future__ import annotations

import os
import resource
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from securepad import Keyring, Scratchpad

from . import data
from .backends import PRINCIPAL, bench_policy

__all__ = ["cpu_per_op"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu_s(pid: int) -> float:
    """A local process's user + system CPU seconds (0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14 and 15 of stat)


class _Meter:
    """Client CPU, server CPU and round trips across a block of calls."""

    def __init__(self, server_pid: int | None, waits: Callable[[], int]) -> None:
        self._pid = server_pid
        self._waits = waits

    def measure(self, calls: Callable[[], None], count: int) -> dict[str, float]:
        client, server, waits, start = self._snapshot()
        calls()
        client2, server2, waits2, end = self._snapshot()
        return {
            "ops_per_s": count / (end - start),
            "client_cpu_us": (client2 - client) / count * 1e6,
            "server_cpu_us": (server2 - server) / count * 1e6,
            "cpu_us": (client2 - client + server2 - server) / count * 1e6,
            "round_trips": (waits2 - waits) / count,
        }

    def _snapshot(self) -> tuple[float, float, int, float]:
        server = _process_cpu_s(self._pid) if self._pid is not None else 0.0
        return _client_cpu_s(), server, self._waits(), time.perf_counter()


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


def _postgres(keyring: Keyring, dsn: str, count: int, size: int, read_chars: int) -> dict[str, Any]:
    import psycopg
    from psycopg_pool import ConnectionPool

    class Counting(psycopg.Connection[Any]):
        waits = 0

        def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
            Counting.waits += 1
            return super().wait(gen, *args, **kwargs)

    schema = f"bench_cpu_{secrets.token_hex(4)}"
    kwargs = {"autocommit": True}
    try:
        with (
            ConnectionPool(dsn, min_size=1, max_size=1, kwargs=kwargs, connection_class=Counting) as pool,
            Scratchpad.open(pool, keyring=keyring, policy=bench_policy(), schema=schema) as pad,
        ):
            with pool.connection() as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
            pid = int(row[0]) if row is not None else None
            return _run(pad, _Meter(pid, lambda: Counting.waits), count, size, read_chars)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def cpu_per_op(dsn: str, *, count: int = 1000, size: int = 4096, read_chars: int = 2000) -> dict[str, Any]:
    """Per put and per read on each backend: ops/s of one client, client and
    server CPU microseconds, round trips; and PostgreSQL's CPU as a multiple of SQLite's."""
    with tempfile.TemporaryDirectory(prefix="securepad-bench-cpu-") as tmp:
        workdir = Path(tmp)
        keyring = Keyring.from_key_file(workdir / "config" / "key")
        result = {
            "securepad": _sqlite(keyring, workdir, count, size, read_chars),
            "securepad-postgresql": _postgres(keyring, dsn, count, size, read_chars),
        }
    result["ratio"] = {
        op: result["securepad-postgresql"][op]["cpu_us"] / max(result["securepad"][op]["cpu_us"], 1e-9)
        for op in ("put", "read")
    }
    return result
