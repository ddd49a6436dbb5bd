"""The sealed floor: the least work that keeps securepad's guarantees, with its own
crypto layer, written plainly. A yardstick, not a store: no quotas, policies, audit,
rotation or rollback anchor.
"""

from __future__ import annotations

import operator
import secrets
import time
from pathlib import Path
from typing import Any

import msgspec

from ..core.shaping import SEGMENT_BYTES, split_bytes
from ..crypto import formats
from ..crypto import primitives as crypto
from ..errors import IntegrityError
from .backends import DEFAULT_TTL, PRINCIPAL, READ_TOOL, Backend, apsw_connection, offset_of, transaction, view_of

STORE_ID = "sealed-floor"
_MOD = 1 << 256
_SEALED_SEGMENT = SEGMENT_BYTES + 16  # a full segment and its tag
_PACK, _UNPACK = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder().decode
# An entry's item in its turn head: what its term covers and a read compares.
_ITEM = operator.itemgetter("step_num", "expires_at", "size_bytes", "actor", "channel")
_LISTED = (
    "id, owner_user_id, turn_id, key_version, actor, channel, step_num, executor_name, content_kind,"
    " size_bytes, size_chars, segment_count, created_at, expires_at, commitment"
)
_NAMES = _LISTED.split(", ")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS owner_keys(owner TEXT, version INTEGER, wrapped BLOB, PRIMARY KEY (owner, version))",
    "CREATE TABLE IF NOT EXISTS heads(owner TEXT, turn TEXT, seq INTEGER, sealed BLOB, PRIMARY KEY (owner, turn))",
    f"CREATE TABLE IF NOT EXISTS entries({_LISTED}, wrapped_key, nonce_prefix, sealed_listing, content,"
    " PRIMARY KEY (id))",
    "CREATE INDEX IF NOT EXISTS entries_turn ON entries(owner_user_id, turn_id, step_num)",
)
_INSERT = f"INSERT INTO entries({_LISTED}, wrapped_key, nonce_prefix, sealed_listing, content) VALUES ({'?, ' * 18}?)"
# A head goes in only over the one its writer saw (``seq``), or where none was.
_UPSERT = (
    "INSERT INTO heads(owner, turn, seq, sealed) VALUES (?, ?, ?, ?) ON CONFLICT (owner, turn)"
    " DO UPDATE SET seq = excluded.seq, sealed = excluded.sealed WHERE heads.seq = ?"
)
_READ = (
    "SELECT e.step_num, e.expires_at, e.size_bytes, e.actor, e.channel, e.turn_id, e.size_chars, e.segment_count,"
    " e.key_version, e.wrapped_key, e.nonce_prefix, e.commitment, e.rowid,"
    " CASE WHEN e.segment_count = 1 THEN e.content END, h.sealed FROM entries e"
    " JOIN heads h ON h.owner = e.owner_user_id AND h.turn = e.turn_id WHERE e.id = ? AND e.owner_user_id = ?"
)
_LIST = (
    f"SELECT {_LISTED}, sealed_listing FROM entries WHERE owner_user_id = ? AND turn_id = ? AND expires_at > ?"
    " ORDER BY step_num"
)
_ROWS = (
    "SELECT id, step_num, expires_at, size_bytes, actor, channel FROM entries WHERE owner_user_id = ? AND turn_id = ?"
)


class _Head:
    """A turn head as sealed or opened here, and once its rows were recounted, its entries."""

    def __init__(self, sealed: bytes | None, tally: tuple[int, int, int], items: dict[str, Any] | None) -> None:
        self.sealed, (self.seq, self.count, self.digest), self.items = sealed, tally, items


class _Stale(Exception):
    """The stored head is not the one this process sealed or checked last."""


class SealedFloorBackend(Backend):
    name = "sealed-floor"
    description = "the sealed floor: securepad's formats and head, one INSERT + one UPSERT, nothing more"

    def __init__(self, root: Path, *, create: bool = True) -> None:
        super().__init__(root)
        key_file = root / "master.key"
        if not key_file.exists():
            key_file.write_bytes(secrets.token_bytes(32))
            key_file.chmod(0o600)
        master = crypto.KeyHandle(key_file.read_bytes())
        owner_wrap = crypto.Wrapper.for_master(master, STORE_ID)
        self._seal = crypto.CounterSeal(crypto.anchor_key(master, STORE_ID), STORE_ID)
        self.conn = apsw_connection(root / "floor.db")
        if create:
            transaction(self.conn, lambda: [self.conn.execute(sql) for sql in _SCHEMA])
        self._heads: dict[str, _Head] = {}  # by turn
        # The one owner's key, unwrapped once (created on first use): its wrapper and its listing key.
        owner, select = PRINCIPAL.owner_user_id, "SELECT version, wrapped FROM owner_keys WHERE owner = ?"
        if not self._query(select, (owner,)):
            wrapped = owner_wrap.wrap(crypto.KeyHandle.random(), crypto.owner_key_aad(STORE_ID, owner, 1))
            insert = "INSERT OR IGNORE INTO owner_keys VALUES (?, 1, ?)"
            transaction(self.conn, lambda: self.conn.execute(insert, (owner, wrapped)))
        ((self.version, blob),) = self._query(select, (owner,))
        key = owner_wrap.unwrap(blob, crypto.owner_key_aad(STORE_ID, owner, self.version))
        self.owner, self.wrapper = owner, crypto.Wrapper.of(key)
        self.listing = formats.ListingKey(key, STORE_ID, owner, self.version)

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def _term(self, turn: str, entry_id: str, item: tuple[Any, ...]) -> int:
        return self._seal.term(_PACK([self.owner, turn, entry_id, *item]))

    def _head(self, turn: str, sealed: bytes | None, *, inventory: bool = True) -> _Head:
        """The turn's head as stored, opened unless this process knows it; ``inventory``: its rows recounted once."""
        known = self._heads.get(turn)
        if known is not None and known.sealed == sealed and (known.items is not None or not inventory):
            return known
        aad = crypto.head_aad(self.owner, turn, self.version)
        seq, count, digest = _UNPACK(self.wrapper.open(sealed, aad)) if sealed else (0, 0, b"")
        if known is not None and seq < known.seq:
            raise IntegrityError(f"turn {turn!r}'s head is older than one this process saw: rolled back")
        head = self._heads[turn] = _Head(sealed, (seq, count, int.from_bytes(digest)), None)
        if inventory:
            items = {row[0]: tuple(row[1:]) for row in self._query(_ROWS, (self.owner, turn))}
            if len(items) != count or sum(self._term(turn, i, t) for i, t in items.items()) % _MOD != head.digest:
                raise IntegrityError(f"turn {turn!r} differs from its head: rows were added, removed or altered")
            head.items = items
        return head

    def _stored_head(self, turn: str, *, inventory: bool = True) -> _Head:
        found = self._query("SELECT sealed FROM heads WHERE owner = ? AND turn = ?", (self.owner, turn))
        return self._head(turn, found[0][0] if found else None, inventory=inventory)

    def _new_head(self, turn: str, head: _Head, added: dict[str, Any], gone: dict[str, Any]) -> None:
        """Write over ``head`` the head with the entries ``added`` and without those ``gone`` ({id: item})."""
        count, digest = head.count + len(added) - len(gone), head.digest
        digest += sum(self._term(turn, i, item) for i, item in added.items())
        digest -= sum(self._term(turn, i, item) for i, item in gone.items())
        seq, digest = head.seq + 1, digest % _MOD
        sealed = self.wrapper.seal(
            _PACK([seq, count, digest.to_bytes(32)]), crypto.head_aad(self.owner, turn, self.version)
        )
        self.conn.execute(_UPSERT, (self.owner, turn, seq, sealed, head.seq))
        if self.conn.changes() != 1:
            raise _Stale
        items = head.items  # updated in place: a failed transaction drops the cached head (``_with_head``)
        if items is not None:
            items.update(added)
            for entry_id in gone:
                del items[entry_id]
        self._heads[turn] = _Head(sealed, (seq, count, digest), items)

    def _with_head(self, turn: str, body: Any) -> None:
        """``body(head)`` in a write transaction with the head sealed here last, else the stored one."""
        try:
            try:
                transaction(self.conn, lambda: body(self._heads.get(turn) or _Head(None, (0, 0, 0), {})))
            except _Stale:
                transaction(self.conn, lambda: body(self._stored_head(turn, inventory=False)))
        except BaseException:
            self._heads.pop(turn, None)
            raise

    def put(self, turn_id: str, step: int, text: str, *, ttl: int = DEFAULT_TTL, now: float | None = None) -> str:
        entry_id, data, owner, version = secrets.token_hex(8), text.encode(), self.owner, self.version
        created, segments = time.time() if now is None else now, split_bytes(data)
        header = formats.Header(
            entry_id, owner, turn_id, "text", len(data), len(text), len(segments), version, formats.ENTRY_FORMAT
        )
        item_key, prefix = crypto.KeyHandle.random(), secrets.token_bytes(7)
        cipher = formats.EntryCipher.of(item_key, header, prefix)
        content = b"".join(cipher.seal_segment(i, part, i == len(segments) - 1) for i, part in enumerate(segments))
        row = {
            "id": entry_id, "owner_user_id": owner, "turn_id": turn_id, "key_version": version,
            "actor": PRINCIPAL.actor, "channel": PRINCIPAL.channel, "step_num": step, "executor_name": "bench",
            "content_kind": "text", "size_bytes": len(data), "size_chars": len(text), "segment_count": len(segments),
            "created_at": created, "expires_at": created + ttl, "commitment": cipher.commitment,
        }  # fmt: skip
        listing = self.listing.seal(row, _PACK(view_of(step, text)))
        wrapped = self.wrapper.wrap(item_key, crypto.item_key_aad(entry_id, owner, version))
        values, item = (*row.values(), wrapped, prefix, listing, content), _ITEM(row)

        def write(head: _Head) -> None:
            self.conn.execute(_INSERT, values)
            self._new_head(turn_id, head, {entry_id: item}, {})

        self._with_head(turn_id, write)
        return entry_id

    def read(self, entry_id: str, mode: str, n: int, start: int = 0) -> str:
        found = self._query(_READ, (entry_id, self.owner))
        if not found:
            raise KeyError(entry_id)
        row = found[0]
        turn, chars, count, version, wrapped, prefix, commitment, rowid, only, sealed = row[5:]
        if (self._head(turn, sealed).items or {}).get(entry_id) != row[:5]:
            raise IntegrityError(f"entry {entry_id} is not in its turn's head as its row says")
        if row[1] <= time.time():
            raise KeyError(entry_id)
        header = formats.Header(entry_id, self.owner, turn, "text", row[2], chars, count, version, formats.ENTRY_FORMAT)
        cipher = formats.open_entry(self.wrapper, header, wrapped, prefix, commitment)
        if count == 1:
            first = offset_of(mode, chars, n, start)
            return cipher.open_segment(0, only, True).decode()[first : first + n]
        first = offset_of(mode, row[2], n, start)
        low, high = first // SEGMENT_BYTES, min(count, -(-(first + n) // SEGMENT_BYTES))
        with self.conn.blob_open("main", "entries", "content", rowid, False) as blob:
            blob.seek(low * _SEALED_SEGMENT)
            data = blob.read((high - low) * _SEALED_SEGMENT)
        plain = b"".join(
            cipher.open_segment(i, data[(i - low) * _SEALED_SEGMENT :][:_SEALED_SEGMENT], i == count - 1)
            for i in range(low, high)
        )
        return plain[first - low * SEGMENT_BYTES :][:n].decode()

    def get(self, entry_id: str) -> str:
        return self.read(entry_id, "head", 1 << 62)

    def resume(self, turn_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        head, history = self._stored_head(turn_id), []
        items = head.items or {}
        now = time.time()
        for values in self._query(_LIST, (self.owner, turn_id, now)):
            row = dict(zip(_NAMES, values, strict=False))
            if items.get(row["id"]) != _ITEM(row):
                raise IntegrityError(f"entry {row['id']} is not in its turn's head as its row says")
            row["sealed_listing"] = values[-1]
            history.append({"scratchpad_id": row["id"], **_UNPACK(self.listing.open(row))})
        if len(history) != sum(1 for item in items.values() if item[1] > now):
            raise IntegrityError(f"turn {turn_id!r} lists fewer entries than its head counts live")
        return history, [READ_TOOL] if history else []

    def gc(self, now: float) -> int:
        def collect() -> int:
            turns: dict[str, list[str]] = {}
            select = "SELECT turn_id, id FROM entries WHERE owner_user_id = ? AND expires_at <= ?"
            for turn, entry_id in self._query(select, (self.owner, now)):
                turns.setdefault(turn, []).append(entry_id)
            for turn, gone in turns.items():
                head = self._stored_head(turn)
                self.conn.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in gone])
                self._new_head(turn, head, {}, {i: (head.items or {})[i] for i in gone})
            return sum(map(len, turns.values()))

        return int(transaction(self.conn, collect))

    def close(self) -> None:
        self.conn.close()
