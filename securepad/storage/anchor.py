"""The snapshot-rollback anchor: a write counter in the store, and its floor outside it.

Every write transaction advances a store-wide counter kept in ``store_meta``
(``write_counter``), authenticated under the anchor key (``crypto.CounterSeal``;
the key is derived from the master key and kept wrapped under it). The anchor
is a small file outside the store's directory (beside the key file by
default) holding the highest counter known to be durable, authenticated under
the same key. A store whose counter is below its anchor is an older copy put
back in place of the current one: opening it, or writing to it, raises
``IntegrityError``.

The anchor never gets ahead of a durable commit: it is written after the
COMMIT, after an fsync of the store file and its WAL (``Database.sync``), so
neither a crash between the commit and the anchor write nor a power cut under
``synchronous = NORMAL`` leaves an anchor above the store. Writers in several
processes take an exclusive ``fcntl`` lock on ``<anchor>.lock`` and only ever
raise the anchor. The file itself (its format, checks, atomic replacement
and lock) is ``anchor_file.AnchorFile``; this module decides when it is
read and written.

``anchor_sync`` (policy, ``[storage]``) chooses when the anchor follows the
counter: ``commit`` (every write transaction advances the counter, and the
anchor follows after its commit), ``interval`` (at most every
``anchor_interval_seconds``: the write transaction that crosses the interval
advances the counter, as every one does with ``commit``, and wakes a background
thread, which makes the commits durable and raises the anchor to that
counter), ``close`` (at open and close only: ``close`` advances the counter in
a transaction of its own). SECURITY.md states the window each leaves.

A store that is never closed still ends cleanly: the background thread holds
only a weak reference to its anchor and ends when the anchor is garbage
collected, and at a normal interpreter exit every anchor still open is
closed (``atexit``), as ``close`` would: the store's last writes are
anchored. A store dropped without ``close`` before the exit keeps the anchor
of its last sync: its writes since then are committed but unanchored, as
after a kill (never a false alarm).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from ..crypto.primitives import CounterSeal
from ..errors import IntegrityError, InvalidArgumentError, SecurepadError
from .anchor_file import FIX, AnchorFile
from .base import Conn
from .sqlite import Database

__all__ = ["SYNC_CHOICES", "Anchor", "default_path"]

SYNC_CHOICES = ("commit", "interval", "close")
_ROW = "write_counter"


def default_path(key_file: Path | None, store_id: str) -> Path | None:
    """Beside the key file: ``anchor-<store id>`` in its directory (so a new
    key file in the same directory, after a master rotation, finds it); None
    without a key file."""
    if key_file is None:
        return None
    return key_file.parent / f"anchor-{store_id}"


class Anchor:
    """The anchor of one open SQLite store; installed as the database's commit hooks."""

    def __init__(
        self,
        db: Database,
        seal: CounterSeal,
        path: Path,
        *,
        sync: str,
        interval_s: float,
        default: bool = False,
        allow_shared: bool = False,
    ) -> None:
        if sync not in SYNC_CHOICES:
            raise InvalidArgumentError(f"anchor_sync must be one of {', '.join(SYNC_CHOICES)}, not {sync!r}")
        store_directory = db.path.resolve().parent
        if not default and path.resolve().is_relative_to(store_directory):
            raise InvalidArgumentError(
                f"the anchor {path} is inside the store's own directory {store_directory}: a copy of that"
                " directory would carry it back with the store; put it elsewhere (beside the key file by default)"
            )
        self.db = db
        self.path = path
        self.default = default  # beside the key file (it follows a master rotation)
        # Others may write the anchor's directory or file (a deliberate shared setup).
        self.allow_shared = allow_shared
        self.file = AnchorFile(path, seal, allow_shared=allow_shared)
        self.sync = sync
        self.interval_s = interval_s
        self._seal = seal
        # ``commit``: every write transaction advances the counter (``before_commit``);
        # ``interval``: the one that begins its commit at or after ``advance_at`` does. Any
        # other write only marks the store as written since (``advance`` and ``close``
        # advance the counter after it, in a transaction of their own).
        self.every_commit = sync == "commit"
        self.advance_at = time.monotonic() + interval_s if sync == "interval" else math.inf
        self._mutex = threading.Lock()
        self._local = threading.local()
        self.floor = 0  # the highest anchor this process has read or written
        self._committed = 0  # the highest counter this process committed
        self._last_value: str | None = None  # the store row as last written here
        # Written without advancing the counter since the last ``advance``: set after such a
        # commit (by the database itself, ``CommitHooks.written``: all ``after_commit`` does then).
        self.written = False
        # ``interval``: the syncs run in a background thread, off the put path.
        self._syncer: threading.Thread | None = None
        self._syncer_pid = 0
        self._due = threading.Event()
        self._stop = threading.Event()
        self.failed: IntegrityError | None = None  # what the syncer found, raised by the next write
        # Collected without close: the syncer (which holds only a weak reference) is told to end.
        weakref.finalize(self, _end_syncer, self._stop, self._due).atexit = False

    # -- open ----------------------------------------------------------------------------

    def open(self, *, adopt: bool = False) -> None:
        """Check the store against its anchor, raise the anchor to the store's
        counter, and hook into every write.

        Raises:
            IntegrityError: the store is below its anchor (snapshot rollback),
                the anchor is missing for a store that had one, or the anchor
                or the store's counter was altered or made under another key.
            SecurepadError: the anchor cannot be read or written.
        """
        with self.file.locked():
            self.file.remove_stale_temporaries()
            anchored = None if adopt else self._read_anchor()
            rows = self.db.query("SELECT value FROM store_meta WHERE key = ?", (_ROW,))
            counter = 0 if not rows else self._parse_row(rows[0]["value"], repair=adopt)
            if anchored is None and counter > 0 and not adopt:
                raise IntegrityError(
                    f"snapshot rollback cannot be ruled out: the anchor {self.path} is missing, and this store"
                    f" (write counter {counter}) had one." + FIX
                )
            if anchored is not None and counter < anchored:
                raise IntegrityError(
                    f"snapshot rollback: the store {self.db.path} is at write {counter}, below its anchor"
                    f" ({anchored}, {self.path}): this is an older copy put back in place of the current"
                    " store." + FIX
                )
            # The row as checked now: the first advance updates it in one statement.
            self._last_value = str(rows[0]["value"]) if rows else None
            if not rows or adopt:
                self._last_value = self._row(counter)
                with self.db.transaction(admin=True) as conn:
                    conn.execute(
                        "INSERT OR REPLACE INTO store_meta(key, value) VALUES (?, ?)", (_ROW, self._last_value)
                    )
            self.db.sync()
            self._write_anchor(counter, -1 if anchored is None else anchored)
        self._committed = counter
        self.db.hooks = self
        _OPEN.add(self)
        # Registered (again) now, after the store's connections and their
        # finalizers: exit handlers run last-registered first, and weakref's
        # (which closes those connections at exit) must run after this one.
        atexit.unregister(_close_at_exit)
        atexit.register(_close_at_exit)

    # -- the write path --------------------------------------------------------------------

    def before_commit(self, conn: Conn) -> None:
        """Advance the store's counter inside the transaction (``anchor_sync = "commit"``:
        every write transaction; ``interval``: the one that crosses the interval). The
        counter is recorded as committed by ``after_commit`` only: a transaction that
        rolls back after this leaves it pending, and the next one replaces it.

        Raises:
            IntegrityError: the counter is below the anchor or was altered.
        """
        self._local.pending = self._advance_counter(conn)

    def _advance_counter(self, conn: Conn) -> tuple[int, str]:
        """The counter advanced by one in ``conn``'s transaction: (counter, its row).
        Raises IntegrityError: the counter is below the anchor or was altered."""
        last = self._last_value
        if last is not None:
            counter = int(last.split(":", 1)[0]) + 1
            value = self._row(counter)
            if conn.execute("UPDATE store_meta SET value = ? WHERE key = ? AND value = ?", (value, _ROW, last)):
                return counter, value
        rows = conn.query("SELECT value FROM store_meta WHERE key = ?", (_ROW,))
        current = self._parse_row(rows[0]["value"]) if rows else -1
        if current < self.floor:
            raise IntegrityError(
                f"snapshot rollback: the store {self.db.path} is at write {current}, below its anchor"
                f" ({self.floor}, {self.path}): an older copy was put back while the store was open." + FIX
            )
        value = self._row(current + 1)
        conn.execute("UPDATE store_meta SET value = ? WHERE key = ?", (value, _ROW))
        return current + 1, value

    def after_commit(self, advanced: bool) -> None:
        """Record the commit; ``advanced``: its transaction advanced the counter
        (``before_commit``), which the anchor now follows: at once with ``commit``;
        with ``interval`` in the background thread (``_sync_loop``), which the
        write only wakes: it pays no fsync. A commit that did not advance it only marks
        ``written``: the database does that itself, unless ``failed`` holds what to raise.

        Raises:
            IntegrityError: the background sync since the last write found the
                anchor altered or unreadable under this store's key.
            SecurepadError: the anchor cannot be written (the write itself is
                committed; the anchor catches up at the next sync or close).
        """
        if not advanced:
            # No lock: ``advance`` takes and clears the mark under it, and a mark set just
            # after that clear stays for the next one (the commit it marks is done before).
            self.written = True
        else:
            pending: tuple[int, str] | None = getattr(self._local, "pending", None)
            self._local.pending = None
            with self._mutex:
                if pending is not None:
                    self._last_value = pending[1]
                    self._committed = max(self._committed, pending[0])
                if self.sync == "interval":
                    self.advance_at = time.monotonic() + self.interval_s
        failed = self.failed
        if failed is not None:
            self.failed = None
            raise failed
        if not advanced:
            return
        if self.every_commit:
            self._raise_anchor()
        else:
            self._wake()

    def _wake(self) -> None:
        """Start the background syncer if this process has none, and wake it."""
        with self._mutex:
            if self._syncer is None or not self._syncer.is_alive() or self._syncer_pid != os.getpid():
                self._stop.clear()
                self._syncer = threading.Thread(
                    target=_sync_loop,
                    args=(weakref.ref(self), self._due, self._stop),
                    name="securepad-anchor",
                    daemon=True,
                )
                self._syncer_pid = os.getpid()
                self._syncer.start()
        self._due.set()

    def _stop_syncer(self) -> None:
        syncer = self._syncer
        if syncer is not None and syncer.is_alive() and self._syncer_pid == os.getpid():
            self._stop.set()
            self._due.set()
            syncer.join()
        self._syncer = None

    def advance(self) -> None:
        """Anchor every write so far: advance the counter in a transaction of its
        own when a write since the last one did not (``close``, and a caller that
        wants the writes anchored now), then ``_raise_anchor``.

        Raises:
            IntegrityError: the store is below its anchor (checked by the advance).
            SecurepadError: the store or the anchor cannot be written or synced.
        """
        with self._mutex:
            dirty, self.written = self.written, False
            if self.sync == "interval":
                self.advance_at = time.monotonic() + self.interval_s
        if dirty and not self.every_commit:
            try:
                # Its own transaction, without the commit hooks: it does what they would.
                with self.db.transaction(admin=True, hooks=False) as conn:
                    pending = self._advance_counter(conn)
            except BaseException:
                with self._mutex:
                    self.written = True  # not anchored: the next sync tries again
                raise
            with self._mutex:
                self._last_value = pending[1]
                self._committed = max(self._committed, pending[0])
        self._raise_anchor()

    def _raise_anchor(self) -> None:
        """Make the commits durable (fsync), then raise the anchor to the highest
        counter this process committed; nothing when the anchor already holds it.

        Raises:
            IntegrityError: the anchor was altered or made under another key.
            SecurepadError: the store or the anchor cannot be synced or written.
        """
        counter = self._committed
        if counter <= self.floor:
            return
        self.db.sync()
        with self.file.locked():
            current = self._read_anchor()
            self._write_anchor(counter, current if current is not None else -1)

    def close(self) -> None:
        """Anchor this process's last writes (every sync policy), after the
        background syncer stopped.

        Raises:
            IntegrityError: the store is below its anchor (found now, or by the syncer).
            SecurepadError: as for ``advance``.
        """
        if self.db.hooks is self:
            try:
                self._stop_syncer()
                failed, self.failed = self.failed, None
                if failed is not None:
                    raise failed
                self.advance()
            finally:
                self.db.hooks = None
                _OPEN.discard(self)

    def status(self) -> dict[str, Any]:
        """The anchor's path, sync policy, and the counters (for ``stats``)."""
        return {"path": str(self.path), "sync": self.sync, "anchored": self.floor, "committed": self._committed}

    # -- the counter and the anchor ----------------------------------------------------------

    def _row(self, counter: int) -> str:
        return f"{counter}:{self._seal.tag('store', counter)}"

    def _parse_row(self, value: object, *, repair: bool = False) -> int:
        counter_text, _, tag = str(value).partition(":")
        if counter_text.isdigit() and self._seal.check("store", int(counter_text), tag):
            return int(counter_text)
        if repair:
            return 0
        raise IntegrityError(
            f"the store {self.db.path}'s write counter was altered (it does not authenticate under this"
            " store's anchor key): the file was edited"
        )

    def _read_anchor(self) -> int | None:
        """The anchor file's counter (None without one), which raises this process's floor.

        Raises:
            IntegrityError, SecurepadError: as for ``AnchorFile.read``.
        """
        counter = self.file.read()
        if counter is not None:
            self.floor = max(self.floor, counter)
        return counter

    def _write_anchor(self, counter: int, current: int) -> None:
        """Replace the anchor when ``counter`` is above ``current`` (under the file's lock)."""
        self.floor = max(self.floor, current, counter)
        if counter > current:
            self.file.write(counter)


# -- the background syncer and the exit ---------------------------------------------------------

# The anchors of this process whose stores are open (and not yet collected).
_OPEN: weakref.WeakSet[Anchor] = weakref.WeakSet()


def _sync_loop(anchor_ref: weakref.ref[Anchor], due: threading.Event, stop: threading.Event) -> None:
    """The ``interval`` syncs of one anchor, one at a time: the counter a write
    advanced, made durable and written to the anchor (no transaction of its
    own). It holds the anchor only while a sync runs, so an anchor whose
    store was dropped without ``close`` is collected, and its finalizer ends
    this loop. An altered anchor it finds is raised by the next write (or
    close); an fsync or anchor write that fails is done by the next sync
    (the next crossing write's, or close's)."""
    while True:
        due.wait()
        due.clear()
        if stop.is_set():
            return
        anchor = anchor_ref()
        if anchor is None:
            return
        try:
            anchor._raise_anchor()
        except IntegrityError as exc:
            anchor.failed = exc
        except SecurepadError:
            pass
        del anchor


def _end_syncer(stop: threading.Event, due: threading.Event) -> None:
    stop.set()
    due.set()


def _close_at_exit() -> None:
    """At a normal interpreter exit, anchor the last writes of every store still
    open, as ``close`` would (the thread is a daemon: it would die mid-wait, and
    the writes since its last sync would stay unanchored). What cannot be done
    now (a busy or full store, a rollback found) is left to the next open, which
    checks the store against its anchor as always."""
    for anchor in list(_OPEN):
        with contextlib.suppress(SecurepadError):
            anchor.close()
