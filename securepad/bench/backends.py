"""The stores compared, behind one small interface. Every backend stores the same
view next to the content, so resuming a turn is the same job everywhere; reads at
byte offsets are exact because the benchmark text is ASCII.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import apsw

from securepad import Principal
from securepad.core.shaping import text_summary

from . import data

if TYPE_CHECKING:
    from securepad import Keyring, Policy

PRINCIPAL = Principal("bench-owner", "bench-agent", "bench")
BUSY_TIMEOUT_MS = 30_000
DEFAULT_TTL = 3600

# The tool schema a baseline's resumed turn hands the model when it has stored entries.
READ_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "scratchpad_read", "parameters": {"type": "object", "properties": {}}},
}


def view_of(step: int, text: str) -> dict[str, Any]:
    """The synthetic view every baseline stores with its content."""
    return {"step_num": step, "size_bytes": len(text), "kind": "text", "summary": text_summary(text)}


def offset_of(mode: str, size: int, n: int, start: int) -> int:
    """Where a head/tail/range read of ``n`` of ``size`` characters (or bytes) starts."""
    return 0 if mode == "head" else max(0, size - n) if mode == "tail" else min(start, size)


def slice_of(text: str, mode: str, n: int, start: int) -> str:
    """What a head/tail/range read of ``n`` characters returns."""
    first = offset_of(mode, len(text), n, start)
    return text[first : first + n]


T = TypeVar("T")


def apsw_connection(path: Path) -> apsw.Connection:
    """An apsw connection as securepad's: WAL, synchronous=NORMAL, a busy timeout."""
    conn = apsw.Connection(str(path))
    conn.setbusytimeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = NORMAL").fetchall()
    return conn


def transaction(conn: Any, body: Callable[[], T]) -> T:
    """``body()`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


# Every store class by name, registered by its definition: a child process finds any imported store.
KNOWN: dict[str, type[Backend]] = {}


class Backend:
    """One store under test, opened on a directory it owns."""

    name: ClassVar[str]
    description: ClassVar[str]
    requires: ClassVar[tuple[str, str] | None] = None  # an optional module it needs, and the package that has it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a store, not a shared base
            KNOWN[cls.name] = cls

    def __init__(self, root: Path, *, create: bool = True) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this backend cannot run here, or None."""
        if cls.requires is None:
            return None
        module, package = cls.requires
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{module} is not installed ({exc}); pip install {package}"
        return None

    @classmethod
    def preload(cls) -> None:
        """Import what opening this backend imports, before a measured process starts
        its clock (a fresh process's timings measure the store, not Python's imports)."""
        if cls.requires is not None:
            importlib.import_module(cls.requires[0])

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = DEFAULT_TTL, now: float | None = None) -> str:
        """Store one text observation; returns its id."""
        raise NotImplementedError

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        """head/tail/range of ``n`` characters."""
        raise NotImplementedError

    def get(self, entry_id: str) -> str:
        """The whole content (to check for lost writes)."""
        raise NotImplementedError

    def resume(self, turn_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The turn's history (one view per step, in order) and the model's tool list."""
        raise NotImplementedError

    def fill_expired(self, count: int, size: int, now: float) -> None:
        """Store ``count`` entries that have expired by ``now`` (gc's setup, not timed)."""
        start = now - 10 - count * 0.001
        for i in range(count):
            self.put("gc-turn", i, data.text(size, salt=i), ttl=1, now=start + i * 0.001)

    def gc(self, now: float) -> int:
        """Delete expired entries; returns how many."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def bench_policy(storage: dict[str, Any] | None = None) -> Policy:
    """The default policy with a quota large enough for the benchmark's gigabytes
    (``storage``: its ``[storage]`` options, say when the anchor syncs)."""
    from securepad import Policy  # the baselines' processes load no store layer

    data: dict[str, Any] = {"access": {"scope": "owner"}, "limits": {"owner_quota_bytes": 1 << 45}}
    if storage:
        data["storage"] = storage
    return Policy.from_dict(data, name="bench")


class SecurepadBackend(Backend):
    name = "securepad"
    description = "securepad Scratchpad: AES-256-GCM segments, authorized, WAL"

    @classmethod
    def preload(cls) -> None:
        from securepad import Keyring, Policy, Scratchpad  # noqa: F401

    def __init__(
        self, root: Path, *, create: bool = True, keyring: Keyring | None = None, policy: Policy | None = None
    ) -> None:
        from securepad import Keyring, Scratchpad  # the baselines' processes load no store layer

        super().__init__(root)
        self.keyring = keyring or Keyring.from_key_file(root / "config" / "key")
        self.pad = Scratchpad.open(root / "data" / "store.db", keyring=self.keyring, policy=policy or bench_policy())

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = DEFAULT_TTL, now: float | None = None) -> str:
        view = self.pad.put(PRINCIPAL, turn_id, step, "bench", text, ttl, now=now)
        return str(view["scratchpad_id"])

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        if mode == "range":
            result = self.pad.read(PRINCIPAL, entry_id, "range", start=start, end=start + n)
        else:
            result = self.pad.read(PRINCIPAL, entry_id, mode, n=n)
        return str(result["content"])

    def get(self, entry_id: str) -> str:
        return str(self.pad.get(PRINCIPAL, entry_id).observation)

    def resume(self, turn_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        resumed = self.pad.turn(PRINCIPAL, turn_id)
        return list(resumed.history()), list(resumed.tools())

    def gc(self, now: float) -> int:
        return self.pad.gc(now)

    def close(self) -> None:
        self.pad.close()


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries(id {id_type} PRIMARY KEY, turn_id TEXT NOT NULL, step_num INTEGER NOT NULL,"
    " created_at REAL NOT NULL, expires_at REAL NOT NULL, view TEXT NOT NULL, content BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS entries_turn ON entries(turn_id, step_num)",
    "CREATE INDEX IF NOT EXISTS entries_expires ON entries(expires_at)",
)
_INSERT = (
    "INSERT INTO entries(id, turn_id, step_num, created_at, expires_at, view, content) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class _SqlBackend(Backend):
    """The shared shape of the SQL baselines: one table, one connection per thread."""

    id_type = "TEXT"

    def __init__(self, root: Path, *, create: bool = True) -> None:
        super().__init__(root)
        self.path = root / "store.db"
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        conn = self.conn
        if create:
            self._write(lambda: [conn.execute(sql.format(id_type=self.id_type)) for sql in _SCHEMA])

    @property
    def conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = self._connect()
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._all.append(conn)
        return conn

    def _connect(self) -> Any:
        raise NotImplementedError

    def _write(self, body: Callable[[], T]) -> T:
        return transaction(self.conn, body)

    def _new_id(self) -> Any:
        return secrets.token_hex(8)

    def _row(self, turn_id: str, step: int, text: str, created: float, ttl: float) -> tuple[Any, ...]:
        view = json.dumps(view_of(step, text))
        return (self._new_id(), turn_id, step, created, created + ttl, view, text.encode("utf-8"))

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = DEFAULT_TTL, now: float | None = None) -> str:
        conn = self.conn
        row = self._row(turn_id, step, text, time.time() if now is None else now, ttl)

        def insert() -> Any:
            conn.execute(_INSERT, row)
            return row[0] if row[0] is not None else conn.last_insert_rowid()

        return str(self._write(insert))

    def get(self, entry_id: str) -> str:
        rows = self.conn.execute("SELECT content FROM entries WHERE id = ?", (self._key(entry_id),)).fetchall()
        if not rows:
            raise KeyError(entry_id)
        return bytes(rows[0][0]).decode("utf-8")

    def _key(self, entry_id: str) -> Any:
        return entry_id

    def resume(self, turn_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rows = self.conn.execute(
            "SELECT id, view FROM entries WHERE turn_id = ? AND expires_at > ? ORDER BY step_num",
            (turn_id, time.time()),
        ).fetchall()
        history = [{"scratchpad_id": str(entry_id), **json.loads(view)} for entry_id, view in rows]
        return history, [READ_TOOL] if history else []

    def fill_expired(self, count: int, size: int, now: float) -> None:
        rows = (self._row("gc-turn", i, data.text(size, salt=i), now - 10, 1) for i in range(count))
        self._write(lambda: self.conn.executemany(_INSERT, rows))

    def gc(self, now: float) -> int:
        conn = self.conn

        def delete() -> int:
            conn.execute("DELETE FROM entries WHERE expires_at <= ?", (now,))
            return int(conn.execute("SELECT changes()").fetchall()[0][0])

        return self._write(delete)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


class RawApswBackend(_SqlBackend):
    name = "raw-apsw"
    description = "plaintext apsw table, WAL + synchronous=NORMAL, incremental blob reads (the floor)"
    id_type = "INTEGER"

    def _connect(self) -> apsw.Connection:
        return apsw_connection(self.path)

    def _new_id(self) -> Any:
        return None  # the rowid

    def _key(self, entry_id: str) -> Any:
        return int(entry_id)

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        with self.conn.blob_open("main", "entries", "content", int(entry_id), False) as blob:
            blob.seek(offset_of(mode, blob.length(), n, start))
            return bytes(blob.read(n)).decode("utf-8")


class UnhardenedBackend(_SqlBackend):
    name = "unhardened"
    description = "stdlib sqlite3, default journal (DELETE, synchronous=FULL), whole-blob reads"

    def _connect(self) -> sqlite3.Connection:
        # Every default; check_same_thread off only so that close() can run anywhere.
        return sqlite3.connect(self.path, check_same_thread=False)

    def _write(self, body: Callable[[], T]) -> T:
        with self.conn:  # the unhardened design: implicit transaction, commit per put (rollback on error)
            return body()

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        return slice_of(self.get(entry_id), mode, n, start)


class SqlCipherBackend(_SqlBackend):
    name = "sqlcipher"
    description = "SQLCipher 4 (sqlcipher3-binary), raw key, WAL + NORMAL, substr() reads"
    requires = ("sqlcipher3", "sqlcipher3-binary")

    def __init__(self, root: Path, *, create: bool = True) -> None:
        key_file = root / "key.hex"
        root.mkdir(parents=True, exist_ok=True)
        if not key_file.exists():
            key_file.write_text(secrets.token_hex(32))
        self._hex_key = key_file.read_text().strip()
        super().__init__(root, create=create)

    def _connect(self) -> Any:
        from sqlcipher3 import dbapi2

        conn = dbapi2.connect(str(self.path), isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA key = \"x'{self._hex_key}'\"")
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        first = 1 if mode == "head" else -n if mode == "tail" else start + 1  # substr() counts from 1, or from the end
        found = self.conn.execute("SELECT substr(content, ?, ?) FROM entries WHERE id = ?", (first, n, entry_id))
        return bytes(found.fetchall()[0][0]).decode("utf-8")


class DiskcacheBackend(Backend):
    name = "diskcache"
    description = "diskcache.Cache (eviction off), file-backed values read with a seek"
    requires = ("diskcache", "diskcache")

    def __init__(self, root: Path, *, create: bool = True) -> None:
        super().__init__(root)
        import diskcache

        self.cache = diskcache.Cache(str(root / "cache"), size_limit=1 << 50, eviction_policy="none")

    @staticmethod
    def _id(turn_id: str, step: int) -> str:
        return f"{turn_id}/{step:08d}"

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = DEFAULT_TTL, now: float | None = None) -> str:
        # The view rides in the tag column, so one set() stores both, like one row elsewhere.
        key = self._id(turn_id, step)
        self.cache.set(key, text.encode("utf-8"), expire=ttl, tag=json.dumps(view_of(step, text)))
        return key

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        handle = self.cache.get(entry_id, read=True)
        if handle is None:
            raise KeyError(entry_id)
        if isinstance(handle, bytes):  # values under disk_min_file_size come back whole
            return slice_of(handle.decode("utf-8"), mode, n, start)
        with handle:
            handle.seek(offset_of(mode, handle.seek(0, os.SEEK_END), n, start))
            return bytes(handle.read(n)).decode("utf-8")

    def get(self, entry_id: str) -> str:
        value = self.cache.get(entry_id)
        if value is None:
            raise KeyError(entry_id)
        return bytes(value).decode("utf-8")

    def resume(self, turn_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        # A key-value store lists a turn by probing its step keys in order.
        history = []
        for step in itertools.count():
            key = self._id(turn_id, step)
            found = self.cache.get(key, read=True, tag=True)
            if found[0] is None:
                break
            if hasattr(found[0], "close"):
                found[0].close()
            history.append({"scratchpad_id": key, **json.loads(found[1])})
        return history, [READ_TOOL] if history else []

    # diskcache expires relative to its own clock and culls on set(): entries expire
    # an hour after the fill, and gc runs with its clock two hours ahead.
    _GC_TTL = 3600

    def fill_expired(self, count: int, size: int, now: float) -> None:
        for first in range(0, count, 1000):
            with self.cache.transact():
                for i in range(first, min(count, first + 1000)):
                    self.put("gc-turn", i, data.text(size, salt=i), ttl=self._GC_TTL)

    def gc(self, now: float) -> int:
        return int(self.cache.expire(now=max(now, time.time() + 2 * self._GC_TTL)))

    def close(self) -> None:
        self.cache.close()


# The suite's own run, in its order.
BACKENDS: dict[str, type[Backend]] = {
    b.name: b for b in (SecurepadBackend, RawApswBackend, UnhardenedBackend, DiskcacheBackend, SqlCipherBackend)
}


def open_backend(name: str, root: Path, *, create: bool = True) -> Backend:
    """Open backend ``name`` on ``root``; ``create`` also creates its tables if absent."""
    if name not in KNOWN:
        raise KeyError(f"unknown backend {name!r}")
    return KNOWN[name](root, create=create)
