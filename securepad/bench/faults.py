"""The figures of the docs' reliability page: what faults do to a store.

    python -m securepad.bench.faults [--out FILE] [--quick] [--dsn DSN] [PART ...]

Parts: ``threads`` (descriptors and memory after many short-lived threads),
``damage`` (random damage of a store file: which error each gives),
``wal`` (the WAL under a long reader), ``vacuum`` (incremental vacuum's cost),
``caches`` (owner-key cache memory), ``postgres`` (a black hole, outages and a
restart through a local fault-injecting proxy; the server is ``--dsn``,
default ``SECUREPAD_BENCH_PG_DSN`` or ``postgresql://postgres@127.0.0.1:5432/postgres``).
Default: every part but ``postgres``. Prints one JSON object per part and
writes them all to ``--out`` (default ``securepad-bench-results/faults.json``).
``--quick`` shrinks the sizes (a smoke run; its figures mean nothing).
Nothing here is asserted: the test suite holds the behaviour, this measures it.

The fault tools (``damaged_copies``, ``exercise``, ``FaultyProxy``) are the
ones the test suite uses.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import random
import resource
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import apsw

from securepad import Keyring, NotFoundError, Policy, Principal, Scratchpad, SecurepadError, StoreBusyError

from .config import DEFAULT_OUT

ALICE = Principal("alice", "planner", "web")
SERVER_DSN = os.environ.get("SECUREPAD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PARTS = ("threads", "damage", "wal", "vacuum", "caches", "postgres")

# Small PostgreSQL limits, so that each fault shows within seconds (the tests' too).
LIMITS: dict[str, Any] = {
    "lock_timeout_ms": 1000,
    "statement_timeout_ms": 1500,
    "connect_timeout_s": 1,
    "pool_timeout_s": 1.5,
    "call_timeout_s": 2.5,
}


# -- the fault tools -------------------------------------------------------------------


def damaged_copies(source: Path, where: Path, trials: int, seed: int) -> Iterator[Path]:
    """Copies of a store file, each damaged at random: overwritten ranges, a
    truncation, zeroed pages, a flipped header."""
    rng = random.Random(seed)
    data = source.read_bytes()
    for trial in range(trials):
        damaged = bytearray(data)
        how = trial % 4
        if how == 0:
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(damaged))
                damaged[at : at + 64] = rng.randbytes(len(damaged[at : at + 64]))
        elif how == 1:
            damaged = damaged[: rng.randrange(100, len(damaged))]
        elif how == 2:
            page = rng.randrange(len(damaged) // 4096) * 4096
            damaged[page : page + 4096] = bytes(4096)
        else:
            damaged[rng.randrange(100)] ^= 0xFF
        path = where / f"damaged-{trial}.db"
        path.write_bytes(bytes(damaged))
        path.chmod(0o600)  # a store file others may read is refused at open (SECURITY.md)
        yield path


def exercise(path: Path, keyring: Keyring, ids: list[str]) -> str:
    """Open and use a (maybe damaged) store as ``ALICE``: read ``ids``, stats,
    list, put, gc. The typed error's class name, or "ok"; anything but a
    ``SecurepadError`` propagates. The copies share the store's id: no anchor
    (their writes would otherwise raise each other's floor)."""
    try:
        with Scratchpad.open(path, keyring=keyring, anchor=False) as pad:
            for sid in ids:
                with contextlib.suppress(NotFoundError):
                    pad.get(ALICE, sid)
            pad.stats()
            pad.list_for_turn(ALICE, "t")
            pad.put(ALICE, "t2", 1, "tool", "after damage")
            pad.gc()
    except SecurepadError as exc:
        return type(exc).__name__
    return "ok"


# What a message with the store's COMMIT holds: an unnamed Parse (empty name) of "COMMIT".
_COMMIT_PARSE = b"\x00COMMIT\x00"


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of a server, with faults on demand.

    ``black_hole`` keeps every connection open but forwards nothing either way
    (the kernel still acknowledges packets: TCP keepalives see nothing wrong);
    ``refuse`` drops every connection and refuses new ones; ``drop_all`` ends
    every connection (what a client sees of a server restart); ``heal`` undoes
    the faults.

    ``lose_commit`` ends the connection of every ``lose_every``-th message that
    carries a COMMIT (the store's: an unnamed Parse of ``COMMIT``): "reply"
    forwards the message and drops the server's answer (the transaction is
    applied, the client cannot know), "request" drops the message (the server
    sees the connection end and rolls back), at most ``lose_at_most`` times
    (None: no limit). ``commits`` counts the messages with a COMMIT seen,
    ``lost`` those whose connection was ended.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.black_hole = False
        self.lose_commit: str | None = None
        self.lose_every = 1
        self.lose_at_most: int | None = None
        self.commits = 0
        self.lost = 0
        self._down = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self.accept()

    def accept(self) -> None:
        """Listen (again, on the same port)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True).start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: refusing
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._down:  # accepted just before the listener closed
                    client.close()
                    upstream.close()
                    continue
                self._sockets += [client, upstream]
            answer_lost = threading.Event()  # this connection's next answer is dropped
            for src, dst, asking in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, asking, answer_lost), daemon=True).start()

    def _commit_lost(self, asking: bool, data: bytes, tail: bytes) -> str | None:
        """What ``lose_commit`` does to a message from the client, if anything."""
        if not asking or self.lose_commit is None or _COMMIT_PARSE not in tail + data:
            return None
        with self._lock:
            self.commits += 1
            if self.commits % self.lose_every or (self.lose_at_most is not None and self.lost >= self.lose_at_most):
                return None
            self.lost += 1
            return self.lose_commit

    def _pump(self, src: socket.socket, dst: socket.socket, asking: bool, answer_lost: threading.Event) -> None:
        tail = b""  # the end of the previous chunk: a COMMIT cut in two is still seen
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if self._down:
                break
            if self.black_hole:
                continue  # swallowed: neither side hears anything
            if not asking and answer_lost.is_set():
                break  # the answer to a COMMIT: dropped, and the connection ended
            lose = self._commit_lost(asking, data, tail)
            tail = data[-len(_COMMIT_PARSE) :]
            if lose == "request":
                break  # the COMMIT dropped, and the connection ended: the server rolls back
            if lose == "reply":
                answer_lost.set()  # before the server can answer
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def drop_all(self) -> None:
        """End every proxied connection, as a server restart does."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def refuse(self) -> None:
        """Drop every connection and refuse new ones (the server is down)."""
        self._down = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.drop_all()

    def heal(self) -> None:
        self.black_hole = False
        self.lose_commit = None
        if self._listener is None:
            self.accept()
        self._down = False

    def close(self) -> None:
        self.refuse()


def proxy_for(dsn: str) -> FaultyProxy:
    """A proxy in front of the server of ``dsn``."""
    server = urlsplit(dsn)
    return FaultyProxy((server.hostname or "127.0.0.1", server.port or 5432))


def through(dsn: str, proxy: FaultyProxy) -> str:
    """``dsn`` with the proxy as its server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}"))


# -- the measurements ------------------------------------------------------------------


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def threads(where: Path, count: int = 2000) -> dict[str, Any]:
    keyring = Keyring.from_key_file(where / "key")
    with Scratchpad.open(where / "threads.db", keyring=keyring) as pad:
        sid = pad.put(ALICE, "t", 1, "tool", "x" * 1000)["scratchpad_id"]
        gc.collect()
        fds, rss = _fds(), _rss_kb()
        for _ in range(count // 20):
            wave = [threading.Thread(target=pad.get, args=(ALICE, sid)) for _ in range(20)]
            for thread in wave:
                thread.start()
            for thread in wave:
                thread.join()
        time.sleep(0.1)
        gc.collect()
        return {
            "threads": count,
            "at_once": 20,
            "extra_fds": _fds() - fds,
            "extra_rss_mb": round((_rss_kb() - rss) / 1024, 1),
        }


def wal(where: Path, limit_mb: int = 64, size: int = 16 * 1024) -> dict[str, Any]:
    keyring = Keyring.from_key_file(where / "key")
    db = where / "wal.db"
    policy = Policy.from_dict({"storage": {"wal_limit_bytes": limit_mb * 1024 * 1024}})
    with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
        pad.put(ALICE, "t", 0, "tool", "first")
        reader = apsw.Connection(str(db))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM entries").fetchall()
        started, puts, refused, held_s, waited_s = time.perf_counter(), 0, 0, 0.0, 0.0
        while refused < 3:  # each refusal waits (WAL_WAIT_MS) for the reader first
            before = time.perf_counter()
            try:
                pad.put(ALICE, "t", puts + 1, "tool", random.randbytes(size))
                puts += 1
            except StoreBusyError:
                refused += 1
                held_s = held_s or before - started
                waited_s = time.perf_counter() - before
        peak = Path(f"{db}-wal").stat().st_size
        warning = pad.stats()["wal"]["warnings"]
        reader.execute("COMMIT")
        reader.close()
        pad.put(ALICE, "t", puts + 2, "tool", "after the reader")
        after = Path(f"{db}-wal").stat().st_size
    return {
        "limit_mb": limit_mb,
        "put_bytes": size,
        "puts_before_refusal": puts,
        "seconds_to_limit": round(held_s, 2),
        "refusal_waited_s": round(waited_s, 2),
        "wal_peak_mb": round(peak / 2**20, 1),
        "wal_after_reader_mb": round(after / 2**20, 2),
        "stats_warning": bool(warning),
    }


def vacuum(where: Path, entries: int = 2000, size: int = 20_000) -> dict[str, Any]:
    """gc with and without incremental vacuum: everything expired, and every
    other entry expired (live pages scattered through the file must move).
    The gc measured is the quick one a turn runs as it starts (``wait=False``,
    no scrub), where the option decides whether the file shrinks; then the
    ``scrub`` that a full gc (or forget-owner) ends with, which rebuilds the
    file whatever the option."""
    keyring = Keyring.from_key_file(where / "key")
    out: dict[str, Any] = {"entries": entries, "entry_bytes": size}
    for keep_every in (0, 2):
        for on in (False, True):
            db = where / f"vacuum-{on}-{keep_every}.db"
            policy = Policy.from_dict({"storage": {"incremental_vacuum": on}})
            with Scratchpad.open(db, keyring=keyring, policy=policy) as pad:
                started = time.perf_counter()
                for step in range(entries):
                    ttl = 3600 if keep_every and step % keep_every == 0 else 10
                    pad.put(ALICE, "t", step, "tool", random.randbytes(size), ttl_seconds=ttl)
                put_s = time.perf_counter() - started
                before = db.stat().st_size
                started = time.perf_counter()
                pad.gc(now=time.time() + 60, wait=False)
                gc_s = time.perf_counter() - started
                after_gc = db.stat().st_size
                started = time.perf_counter()
                pad.scrub()
                scrub_s = time.perf_counter() - started
                case = "all expired" if not keep_every else f"1 in {keep_every} kept"
                out[f"{case}, vacuum {'on' if on else 'off'}"] = {
                    "put_ms_each": round(put_s * 1000 / entries, 3),
                    "gc_s": round(gc_s, 3),
                    "file_mb_before_gc": round(before / 2**20, 1),
                    "file_mb_after_gc": round(after_gc / 2**20, 2),
                    "scrub_s": round(scrub_s, 3),
                    "file_mb_after_scrub": round(db.stat().st_size / 2**20, 2),
                }
    return out


def _populate_owners(db: Path, key: Path, owners: int) -> None:
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        for i in range(owners):
            pad.put(Principal(f"owner-{i}", "a", "c"), "t", 1, "tool", "x")


def caches(where: Path, owners: int = 8192) -> dict[str, Any]:
    """Memory of the owner-key caches: RSS after reading as many owners as the
    cache holds, and after as many again (it should stay flat). The owners are
    written by a child process, so that this one starts with empty caches."""
    from securepad.store import OWNER_KEY_CACHE_SIZE

    db, key = where / "caches.db", where / "key"
    child = multiprocessing.get_context("fork").Process(target=_populate_owners, args=(db, key, owners))
    child.start()
    child.join()
    people = [Principal(f"owner-{i}", "a", "c") for i in range(owners)]
    with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
        gc.collect()
        rss = [_rss_kb()]
        for lo, hi in ((0, OWNER_KEY_CACHE_SIZE), (OWNER_KEY_CACHE_SIZE, owners)):
            for p in people[lo:hi]:
                pad.list_for_turn(p, "t")  # opens the entry: caches the owner's AES-GCM key
            gc.collect()
            rss.append(_rss_kb())
    return {
        "cache_size": OWNER_KEY_CACHE_SIZE,
        "owners_read": owners,
        "rss_kb_growth_first_fill": rss[1] - rss[0],
        "bytes_per_cached_owner": round((rss[1] - rss[0]) * 1024 / OWNER_KEY_CACHE_SIZE),
        "rss_kb_growth_after_full": rss[2] - rss[1],
    }


def damage(where: Path, trials: int = 1000) -> dict[str, Any]:
    """Random damage of a store file (the test suite's 4 kinds): what each open-and-use gives."""
    keyring = Keyring.from_key_file(where / "key")
    source = where / "damage.db"
    with Scratchpad.open(source, keyring=keyring) as pad:
        ids = [pad.put(ALICE, "t", step, "tool", random.randbytes(3000))["scratchpad_id"] for step in range(40)]
        pad.gc()  # checkpoints: everything in the main file, none in the WAL
    (where / "copies").mkdir()
    outcomes: dict[str, int] = {}
    for path in damaged_copies(source, where / "copies", trials=trials, seed=18):
        try:
            name = exercise(path, keyring, ids)
        except Exception as exc:
            name = f"untyped {type(exc).__name__}"
        outcomes[name] = outcomes.get(name, 0) + 1
        path.unlink()
    return {"trials": trials, "outcomes": outcomes}


def postgres(dsn: str, where: Path | None = None) -> dict[str, Any]:
    """A black hole, two outages and a restart through a ``FaultyProxy`` in
    front of the server of ``dsn`` (the store in schema ``securepad_faults``,
    dropped afterwards; the key file in ``where``, default a temporary dir)."""
    if where is None:
        with tempfile.TemporaryDirectory() as tmp:
            return postgres(dsn, Path(tmp))
    from securepad.storage.postgres.database import PostgresDatabase

    proxy = proxy_for(dsn)
    keyring = Keyring.from_key_file(where / "key")
    out: dict[str, Any] = {"limits": LIMITS}
    db = PostgresDatabase(through(dsn, proxy), schema="securepad_faults", pool_size=4, **LIMITS)
    pad = Scratchpad(db, keyring, Policy.default(), time.time)
    try:
        sid = pad.put(ALICE, "t", 1, "tool", "x")["scratchpad_id"]
        proxy.black_hole = True
        started = time.perf_counter()
        try:
            pad.get(ALICE, sid)
        except SecurepadError as exc:
            out["black_hole"] = {"error": type(exc).__name__, "seconds": round(time.perf_counter() - started, 2)}
        proxy.black_hole = False
        for outage in (5.0, 15.0):
            proxy.refuse()
            until = time.monotonic() + outage
            while time.monotonic() < until:
                try:
                    pad.get(ALICE, sid)
                except SecurepadError:
                    time.sleep(0.05)
            proxy.heal()
            out[f"recovery_after_{outage:g}s_down"] = round(_until_it_works(lambda: pad.get(ALICE, sid)), 2)
        proxy.drop_all()
        started = time.perf_counter()
        pad.get(ALICE, sid)
        out["restart_then_call_s"] = round(time.perf_counter() - started, 3)
    finally:
        pad.close()
        proxy.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS securepad_faults CASCADE")
    return out


def _until_it_works(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    while True:
        try:
            call()
            return time.perf_counter() - started
        except SecurepadError:
            time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securepad.bench.faults", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "faults.json", help="where the JSON goes")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures")
    parser.add_argument("--dsn", default=SERVER_DSN, help="the PostgreSQL server of the postgres part")
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}: the parts are {', '.join(PARTS)}")
    parts = args.parts or [p for p in PARTS if p != "postgres"]
    quick: dict[str, dict[str, Any]] = {
        "threads": {"count": 200},
        "damage": {"trials": 20},
        "wal": {"limit_mb": 2},
        "vacuum": {"entries": 100},
        "caches": {},
    }
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    results: dict[str, Any] = {"args": {"parts": parts, "quick": args.quick}}
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            where = Path(tmp) / part
            where.mkdir()
            if part == "postgres":
                result = postgres(args.dsn, where)
            else:
                result = _MEASURES[part](where, **(quick[part] if args.quick else {}))
            results[part] = result
            print(json.dumps({part: result}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results: {args.out}")
    return 0


_MEASURES: dict[str, Callable[..., dict[str, Any]]] = {
    "threads": threads,
    "damage": damage,
    "wal": wal,
    "vacuum": vacuum,
    "caches": caches,
}


if __name__ == "__main__":
    raise SystemExit(main())
