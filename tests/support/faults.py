"""Faults on demand, for the tests and the reliability benchmark: damaged
copies of a store file, a store exercised after damage, and a TCP proxy in
front of a PostgreSQL server that black-holes, refuses, drops or loses a
COMMIT's message or answer."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from securepad import Keyring, NotFoundError, Scratchpad, SecurepadError
from tests.support.principals import ALICE

__all__ = ["ALICE", "LIMITS", "FaultyProxy", "damaged_copies", "exercise", "proxy_for", "through"]

# Small PostgreSQL limits, so that each fault shows within seconds (the tests' too).
LIMITS: dict[str, Any] = {
    "lock_timeout_ms": 1000,
    "statement_timeout_ms": 1500,
    "connect_timeout_s": 1,
    "pool_timeout_s": 1.5,
    "call_timeout_s": 2.5,
}


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

    ``black_hole`` forwards nothing either way while keeping connections open
    (keepalives see nothing wrong); ``refuse`` drops every connection and
    refuses new ones; ``drop_all`` ends every connection (a server restart);
    ``heal`` undoes the faults.

    ``lose_commit`` ends the connection of every ``lose_every``-th message with
    a COMMIT, at most ``lose_at_most`` times: "reply" forwards it and drops the
    answer (applied, the client cannot know), "request" drops it (rolled
    back). ``commits`` counts such messages, ``lost`` those cut.
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
            if not data or self._down:
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
