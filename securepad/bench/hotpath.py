"""The ``hotpath`` workload of ``securepad bench``: records whose ``"section"`` is
``costs`` (statements and WAL frames per put), ``write`` (4 KiB write rates),
``tail`` (2,000 characters of 1 MiB, in process) or ``listing``, securepad beside
the framework stores (optional: a missing one is a record with ``"skipped"``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import importlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from securepad import Keyring, Scratchpad

from . import data
from .backends import PRINCIPAL, RawApswBackend, UnhardenedBackend, bench_policy
from .config import Config, KiB, MiB, size_label
from .costs import measure, put_costs
from .stats import summarize, timed

Record = dict[str, Any]
Step = Callable[[str], None]
WRITE_BYTES = 4 * KiB
BATCHES = (8, 64)
DURABILITIES = ("normal", "full")
TAIL_ENTRY = 1 * MiB
TAIL_CHARS = 2000


def run_hotpath(cfg: Config, name: str, workdir: Path, step: Step) -> Iterator[list[Record]]:
    """The hot-path sections, once per run, on the securepad backend (the peers are measured beside it)."""
    if name != "securepad":
        return
    root = workdir / "hotpath"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    keyring = Keyring.from_key_file(root / "key")
    try:
        step("WAL frames and statements per put")
        yield [_tag("costs", r) for r in _costs(cfg, root, keyring)]
        step("4 KiB write rate, single puts and put_many, normal/full")
        yield [_tag("write", r) for r in _securepad_writes(cfg, root, keyring)]
        step("framework stores: 4 KiB write rate")
        yield [_tag("write", r) for r in _peer_writes(cfg, root)]
        step("tail 2000 of 1 MiB, securepad and the framework stores")
        yield [_tag("tail", r) for r in _tails(cfg, root, keyring)]
        step("list_for_turn beside the unhardened listing")
        yield [_tag("listing", r) for r in _listing(cfg, root, keyring)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _tag(section: str, record: Record) -> Record:
    return {"backend": "securepad", "section": section, **record}


def _record(store: str, durability: str, mode: str, per_call: int, stats: dict[str, Any]) -> Record:
    case = f"{store} {durability} {mode}" if store == "securepad" else f"{store} {mode}"
    return {"store": store, "durability": durability, "mode": mode, "batch": per_call, "case": case, "stats": stats}


def _costs(cfg: Config, root: Path, keyring: Keyring) -> list[Record]:
    sizes = [s for s in cfg.put_sizes if s <= MiB]
    records = []
    with Scratchpad.open(root / "costs.db", keyring=keyring, policy=bench_policy()) as pad:
        pad.put(PRINCIPAL, "warm", 0, "bench", data.text(WRITE_BYTES, salt=1))
        for size in sizes:
            found = put_costs(pad, PRINCIPAL, size)
            counts = {"statements": int(found.pop("statements")), "wal_frames": int(found.pop("wal_frames"))}
            record = {"store": "securepad", "case": f"costs {size_label(size)}", "size_bytes": size, **counts}
            records.append(record | {"detail": found, "raw_wal_frames": _raw_frames(root / "raw-costs", size)})
    return records


def _raw_frames(root: Path, size: int) -> int:
    """WAL frames of one put of ``size`` bytes into the raw-apsw floor (after a warm-up put)."""
    text = data.text(size, salt=size)
    with closing(RawApswBackend(root)) as raw:
        raw.put("warm", 0, "warm-up")
        return measure(raw.conn, lambda: raw.put("costs", 1, text))["wal_frames"]


def _timed(cfg: Config, operation: Callable[[int], None], per_call: int) -> dict[str, Any]:
    """Run ``operation(i)`` within the put budget; stats per call, plus observations per second."""
    samples = timed(operation, cfg.put_budget_s, cfg.put_min_ops, max(cfg.put_min_ops, cfg.put_max_ops // per_call))
    stats = summarize(samples, nbytes=WRITE_BYTES * per_call)
    stats["obs_per_s"] = stats["ops_per_s"] * per_call
    return stats


Modes = list[tuple[str, int, Callable[[int], None]]]


def _securepad_modes(pad: Scratchpad, texts: list[str]) -> Modes:
    counter = iter(range(1 << 40))

    def single(i: int) -> None:
        pad.put(PRINCIPAL, "single", next(counter), "bench", texts[i % 64])

    def batch_of(size: int) -> Callable[[int], None]:
        def batch(i: int) -> None:
            items = [(next(counter), "bench", texts[j]) for j in range(size)]
            pad.put_many(PRINCIPAL, f"batch-{size}", items)

        return batch

    return [("single", 1, single), *((f"put_many {size}", size, batch_of(size)) for size in BATCHES)]


def _securepad_writes(cfg: Config, root: Path, keyring: Keyring) -> list[Record]:
    records: list[Record] = []
    texts = [data.text(WRITE_BYTES, salt=i) for i in range(64)]
    for setting in DURABILITIES:
        path = root / f"write-{setting}.db"
        policy = dataclasses.replace(bench_policy(), durability=setting)
        with Scratchpad.open(path, keyring=keyring, policy=policy) as pad:
            for mode, per_call, operation in _securepad_modes(pad, texts):
                records.append(_record("securepad", setting, mode, per_call, _timed(cfg, operation, per_call)))
        path.unlink(missing_ok=True)
    return records


PEERS = ("SQLiteSession", "EncryptedSession", "SqliteSaver + EncryptedSerializer")
PEER_DURABILITY = "theirs: WAL, synchronous=FULL"
_PEER_MODULES = {
    "SQLiteSession": ("agents",),
    "EncryptedSession": ("agents.extensions.memory",),
    "SqliteSaver + EncryptedSerializer": ("langgraph.checkpoint.sqlite", "Crypto"),
}


def peer_missing(peer: str) -> str | None:
    """Why a framework store cannot run here, or None."""
    for module in _PEER_MODULES[peer]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{peer}: not installed ({exc}); pip install 'securepad[bench]'"
    return None


class _SessionPeer:
    """An OpenAI Agents session on a file, driven from one event loop."""

    def __init__(self, path: Path, encrypted: bool) -> None:
        from agents import SQLiteSession

        self.loop = asyncio.new_event_loop()
        self.path = str(path)
        self.encrypted = encrypted
        self.key = base64.urlsafe_b64encode(os.urandom(32)).decode()
        self.plain = SQLiteSession

    def session(self, session_id: str) -> Any:
        underlying = self.plain(session_id, self.path)
        if not self.encrypted:
            return underlying
        from agents.extensions.memory import EncryptedSession

        return EncryptedSession(session_id, underlying, self.key)

    def write(self, session: Any, texts: list[str]) -> None:
        self.loop.run_until_complete(session.add_items([{"role": "user", "content": t} for t in texts]))

    def modes(self, texts: list[str]) -> Modes:
        session = self.session("writes")

        def batch_of(size: int) -> Callable[[int], None]:
            return lambda i: self.write(session, [texts[i % 64]] if size == 1 else texts[:size])

        return [("single", 1, batch_of(1)), *((f"add_items {n}", n, batch_of(n)) for n in BATCHES)]

    def tail_reader(self, text: str) -> Callable[[], str]:
        session = self.session("tail")
        self.write(session, [text])
        return lambda: str(self.loop.run_until_complete(session.get_items(limit=1))[-1]["content"])[-TAIL_CHARS:]

    def close(self) -> None:
        self.loop.close()


class _SaverPeer:
    """LangGraph's SqliteSaver with EncryptedSerializer (AES) on a file."""

    def __init__(self, path: Path) -> None:
        import sqlite3

        from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.conn = sqlite3.connect(str(path), check_same_thread=False)
        self.saver = SqliteSaver(self.conn, serde=EncryptedSerializer.from_pycryptodome_aes(key=os.urandom(32)))
        self.saver.setup()
        self.version: Any = None

    def put(self, thread: str, text: str) -> dict[str, Any]:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = {
            **empty_checkpoint(),
            "id": str(uuid6(clock_seq=-1)),
            "channel_values": {"data": text},
            "channel_versions": {"data": self.version},
        }
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        metadata: Any = {"source": "loop", "step": 0}
        return dict(self.saver.put(config, checkpoint, metadata, {"data": self.version}))  # type: ignore[arg-type]

    def put_writes(self, config: dict[str, Any], texts: list[str]) -> None:
        self.saver.put_writes(config, [("data", t) for t in texts], task_id=secrets.token_hex(8))  # type: ignore[arg-type]

    def modes(self, texts: list[str]) -> Modes:
        config = self.put("batches", "x")

        def single(i: int) -> None:
            self.put(f"t{i % 8}", texts[i % 64])

        def batch_of(size: int) -> Callable[[int], None]:
            return lambda i: self.put_writes(config, texts[:size])

        return [("single", 1, single), *((f"put_writes {n}", n, batch_of(n)) for n in BATCHES)]

    def tail_reader(self, text: str) -> Callable[[], str]:
        self.put("tail", text)
        return functools.partial(self.tail, "tail")

    def tail(self, thread: str) -> str:
        found = self.saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        assert found is not None
        return str(found.checkpoint["channel_values"]["data"])[-TAIL_CHARS:]

    def close(self) -> None:
        self.conn.close()


def _open_peer(peer: str, path: Path) -> _SaverPeer | _SessionPeer:
    if peer == "SqliteSaver + EncryptedSerializer":
        return _SaverPeer(path)
    return _SessionPeer(path, encrypted=peer == "EncryptedSession")


def _peer_writes(cfg: Config, root: Path) -> list[Record]:
    records: list[Record] = []
    texts = [data.text(WRITE_BYTES, salt=i) for i in range(64)]
    for peer in PEERS:
        reason = peer_missing(peer)
        if reason:
            modes = ("single", *(f"batch {b}" for b in BATCHES))
            common = {"store": peer, "durability": PEER_DURABILITY}
            records += [common | {"mode": m, "case": f"{peer} {m}", "skipped": reason} for m in modes]
            continue
        with closing(_open_peer(peer, root / f"{peer}-write.db")) as store:
            for mode, per_call, operation in store.modes(texts):
                records.append(_record(peer, PEER_DURABILITY, mode, per_call, _timed(cfg, operation, per_call)))
    return records


def _read_stats(cfg: Config, read: Callable[[], str], expected: str) -> dict[str, Any]:
    if read() != expected:
        raise AssertionError("the tail read returned the wrong characters")
    return summarize(timed(lambda _: read(), cfg.read_budget_s, cfg.read_min_ops, cfg.read_max_ops))


def _tails(cfg: Config, root: Path, keyring: Keyring) -> list[Record]:
    text = data.text(TAIL_ENTRY, salt=TAIL_ENTRY)
    expected = text[-TAIL_CHARS:]
    records: list[Record] = []
    with Scratchpad.open(root / "tail.db", keyring=keyring, policy=bench_policy()) as pad:
        entry = pad.put(PRINCIPAL, "tail", 0, "bench", text)["scratchpad_id"]

        def securepad_tail() -> str:
            return str(pad.read(PRINCIPAL, entry, "tail", n=TAIL_CHARS)["content"])

        records.append({"store": "securepad", "case": "securepad", "stats": _read_stats(cfg, securepad_tail, expected)})
    for peer in PEERS:
        reason = peer_missing(peer)
        if reason:
            records.append({"store": peer, "case": peer, "skipped": reason})
            continue
        with closing(_open_peer(peer, root / f"{peer}-tail.db")) as store:
            records.append({"store": peer, "case": peer, "stats": _read_stats(cfg, store.tail_reader(text), expected)})
    return records


def _listing(cfg: Config, root: Path, keyring: Keyring) -> list[Record]:
    steps = max(cfg.resume_steps)
    texts = [data.text(cfg.resume_entry_bytes, salt=i) for i in range(min(steps, 50))]
    records: list[Record] = []
    with Scratchpad.open(root / "listing.db", keyring=keyring, policy=bench_policy()) as pad:
        for i in range(steps):
            pad.put(PRINCIPAL, "listed", i, "bench", texts[i % len(texts)])

        stats = _read_stats(cfg, lambda: str(len(pad.list_for_turn(PRINCIPAL, "listed"))), str(steps))
        records.append({"store": "securepad", "case": f"list_for_turn {steps}", "steps": steps, "stats": stats})
    with closing(UnhardenedBackend(root / "unhardened")) as plain:
        for i in range(steps):
            plain.put("listed", i, texts[i % len(texts)])
        stats = _read_stats(cfg, lambda: str(len(plain.resume("listed")[0])), str(steps))
        records.append({"store": "unhardened", "case": f"SELECT by turn {steps}", "steps": steps, "stats": stats})
    return records
