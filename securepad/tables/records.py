"""Turn records: compaction checkpoints and compaction marks, sealed like entries.

A record is a small JSON payload of one turn of one owner, sealed under its own
item key (wrapped by the owner's current key) with an AAD that binds its table,
id, owner, actor, channel, turn, sequence number and both times
(``crypto.seal_record``). In clear: those identifiers, the key version and the
times. Every read goes through ``access``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from ..crypto.formats import open_record, reseal_record, seal_record
from ..crypto.primitives import Wrapper
from ..errors import IntegrityError, StoreUnavailableError
from ..keys.keystore import IfUnknown
from ..principal import Principal
from ..storage.base import Conn, Rows
from . import access
from .entries.open import EntryParts
from .entries.prepare import check_write_bound
from .heads.heads import RECORD_KINDS, Head, Heads, expired_sql, record_item
from .quota import record_cost, room

__all__ = ["TABLES", "Records", "Updates"]

TABLES = ("checkpoints", "compaction_marks")
# The blobs are read as blobs whatever was written there: a value of another
# type is then an authentication failure, not a decoding error.
_COLUMNS = (
    "id, turn_id, seq, key_version, created_at, expires_at,"
    " CAST(wrapped_key AS BLOB) AS wrapped_key, CAST(sealed AS BLOB) AS sealed"
)

# (expires_at, sealed, id, old sealed) per table: a compare-and-set update.
Updates = dict[str, list[tuple[float, bytes, str, bytes]]]


def _check_table(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"unknown record table {table!r}")
    return table


class Records:
    """The turn records of one store, built from its parts."""

    def __init__(self, parts: EntryParts) -> None:
        self._parts = parts
        self._db, self._keys, self._access, self._heads = parts.db, parts.keys, parts.access, parts.heads

    def save(
        self,
        table: str,
        principal: Principal,
        turn_id: str,
        payload: dict[str, Any],
        ttl_seconds: int | None,
        now: float | None,
    ) -> dict[str, Any]:
        """Seal ``payload`` (outside the transaction) and append it to the turn's
        records; its ``seq`` (numbered within the principal's scope, as ``load``
        numbers it), ``created_at`` and ``expires_at``.

        Raises:
            InvalidArgumentError: a bad ttl.
            QuotaExceededError: over the owner's quota, or more than one
                transaction may write, before anything is stored.
            StoreBusyError: the write lock was not obtained in time, or the
                sequence number kept being taken by other writers.
        """
        _check_table(table)
        ttl = self._parts.ttl(ttl_seconds)
        created = self._parts.timeline.write_time(now)
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        owner = principal.owner_user_id

        def seal(version: int, wrapper: Wrapper) -> dict[str, Any]:
            row: dict[str, Any] = {
                "id": secrets.token_hex(8),
                "owner_user_id": owner,
                "actor": principal.actor,
                "channel": principal.channel,
                "turn_id": turn_id,
                "seq": access.last_record_seq(self._db, table, owner, turn_id) + 1,
                "key_version": version,
                "created_at": created,
                "expires_at": created + ttl,
            }
            row["wrapped_key"], row["sealed"] = seal_record(wrapper, table, row, body)
            check_write_bound(record_cost(row), self._db.write_limit_bytes, "turn record")
            return row

        # A DuplicateKeyError (another writer took this seq, or the id collided) seals again.
        return self._keys.write_current(
            owner,
            seal,
            lambda conn, row: self._write(conn, principal, table, row),
            attempts=8,
            busy="could not store the turn record: other writers kept taking its place; try again",
            prefetch=[Heads.select_sql(owner, turn_id)],
            unknown=IfUnknown(
                lambda conn, row: bool(conn.query(*access.stored_sql(table, owner, row["id"]))),
                lambda _, why: StoreUnavailableError(
                    f"{why.removesuffix('; try again')}; the record's COMMIT had been sent, so turn {turn_id!r} may"
                    f" hold it as its newest {table[:-1].replace('_', ' ')}: read that to know"
                ),
            ),
        )

    def _write(self, conn: Conn, principal: Principal, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """``save``'s write transaction: the quota, the insert, the head; the record's number in the scope."""
        owner, turn_id, version = row["owner_user_id"], row["turn_id"], row["key_version"]
        cost = record_cost(row)
        space = room(conn, self._parts.policy, owner, version, row["created_at"], "record", records_adding=cost)
        conn.execute(f"INSERT INTO {table}({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
        item = (RECORD_KINDS[table], row["id"], record_item(row))
        self._heads.change(conn, owner, turn_id, lambda head: head.add(*item), version, room=space)
        mine = self._access.rows(principal, table, "seq", "turn_id = ? AND seq <= ?", (turn_id, row["seq"]), conn=conn)
        return {"seq": len(mine), "created_at": row["created_at"], "expires_at": row["expires_at"]}

    def load(
        self, table: str, principal: Principal, turn_id: str, now: float | None, *, latest: bool = False
    ) -> list[dict[str, Any]]:
        """The live records of a turn in the principal's scope, oldest first (only
        the newest with ``latest``): ``seq`` (numbered within the scope, as
        ``save`` returned it), ``created_at``, ``expires_at``, ``payload``.

        Raises:
            IntegrityError: a record fails authentication.
        """
        _check_table(table)
        order = "ORDER BY seq DESC LIMIT 1" if latest else "ORDER BY seq"
        current = self._parts.timeline.read_time(now)
        live: access.Query = (table, _COLUMNS, "turn_id = ? AND expires_at > ?", (turn_id, current), order)
        # Every record of the scope (expired ones not yet collected too) numbers the scope's sequence.
        numbered: access.Query = (table, "seq", "turn_id = ?", (turn_id,), "ORDER BY seq")

        def fetch() -> tuple[Rows, Rows]:
            return self._access.rows(principal, *live), self._access.rows(principal, *numbered)

        def check(head: Head, fetched: tuple[Rows, Rows]) -> None:
            self._heads.checks.check_records_in(head, principal, table, turn_id, fetched[0], current, latest)

        head_sql = self._heads.read_sql(principal.owner_user_id, turn_id)
        (first_rows, first_stored), head_rows = self._access.rows_beside(principal, head_sql, live, numbered)
        rows, stored = self._heads.inventories.checked(
            principal.owner_user_id, turn_id, fetch, check, first=((first_rows, first_stored), head_rows)
        )
        numbers = {row["seq"]: index for index, row in enumerate(stored, 1)}
        return [
            {
                "seq": numbers.get(row["seq"], len(numbers) + 1),
                "created_at": row["created_at"],
                "expires_at": row["expires_at"],
                "payload": payload,
            }
            for row, _, payload in self._access.open_each(principal, table, _COLUMNS, rows, self._opener(table))
        ]

    def all_rows(self, table: str) -> Rows:
        """Every row of a record table (housekeeping: ``verify``)."""
        return access.every_row(self._db, _check_table(table), _COLUMNS, "owner_user_id, turn_id, seq")

    def verify_row(self, table: str, row: dict[str, Any]) -> None:
        """Authenticate a record row (``verify``); raises IntegrityError when it fails."""
        self._opener(table)(row)

    def _opener(self, table: str) -> Callable[[dict[str, Any]], tuple[dict[str, Any], Any, Any]]:
        def opened(row: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
            """(row, item key, payload) of a record.

            Raises:
                IntegrityError: malformed clear fields, or the wrapped key or payload fails authentication.
            """
            numbers = (row["seq"], row["key_version"], row["created_at"], row["expires_at"])
            if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in numbers):
                raise IntegrityError("a turn record's clear fields are malformed")
            if not all(isinstance(value, int) for value in numbers[:2]):  # integral: refused, never rounded
                raise IntegrityError("a turn record's clear seq or key_version is not an integer")
            wrapper = self._keys.owner_wrapper(row["owner_user_id"], row["key_version"])
            item_key, body = open_record(wrapper, table, row)
            return row, item_key, json.loads(body)

        return opened

    def prepare_extend(self, principal: Principal, turn_id: str, target: float, now: float) -> Updates:
        """The turn's live records that expire before ``target``, sealed again for
        it (outside any transaction); raises IntegrityError when one fails authentication."""
        updates: Updates = {}
        for table in TABLES:
            rows = self._access.rows(
                principal, table, _COLUMNS, "turn_id = ? AND expires_at > ? AND expires_at < ?", (turn_id, now, target)
            )
            for row, item_key, payload in self._access.open_each(principal, table, _COLUMNS, rows, self._opener(table)):
                body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
                sealed = reseal_record(item_key, table, {**row, "expires_at": target}, body)
                updates.setdefault(table, []).append((target, sealed, row["id"], row["sealed"]))
        return updates

    @staticmethod
    def apply_extend(conn: Conn, updates: Updates) -> dict[str, list[str]]:
        """Write ``prepare_extend``'s updates inside the caller's transaction; a
        record changed meanwhile is left as it is. Returns the ids extended, per table."""
        changed: dict[str, list[str]] = {}
        for table, rows in updates.items():
            for update in rows:
                if conn.execute(
                    f"UPDATE {_check_table(table)} SET expires_at = ?, sealed = ? WHERE id = ? AND sealed = ?", update
                ):
                    changed.setdefault(table, []).append(update[2])
        return changed

    @staticmethod
    def rewrap(conn: Conn, table: str, updates: list[tuple[Any, ...]]) -> None:
        """Rotation's compare-and-set of records' item keys: each update is (wrapped
        key, version, id, old version, old wrapped key); a changed row is left."""
        conn.executemany(
            f"UPDATE {_check_table(table)} SET wrapped_key = ?, key_version = ?"
            " WHERE id = ? AND key_version = ? AND wrapped_key = ?",
            updates,
        )

    @staticmethod
    def delete_expired(conn: Conn, cutoff: float, kept: list[tuple[str, str]]) -> int:
        """Delete expired records inside the caller's (gc) transaction, except
        those of the turns in ``kept`` (``Heads.prune``)."""
        where, params = expired_sql(cutoff, kept)
        return sum(conn.execute(f"DELETE FROM {table} WHERE {where}", params) for table in TABLES)

    @staticmethod
    def delete_turn(conn: Conn, owner: str, turn_id: str) -> dict[str, int]:
        """Delete every record of an owner's turn inside the caller's transaction (``lifecycle.drop_turn``)."""
        where = "owner_user_id = ? AND turn_id = ?"
        return {table: conn.execute(f"DELETE FROM {table} WHERE {where}", (owner, turn_id)) for table in TABLES}

    @staticmethod
    def delete_owner(conn: Conn, owner: str) -> dict[str, int]:
        """Delete every record of an owner inside the caller's transaction."""
        return {table: conn.execute(f"DELETE FROM {table} WHERE owner_user_id = ?", (owner,)) for table in TABLES}
