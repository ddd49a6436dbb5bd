"""Turn records: compaction checkpoints and compaction marks, sealed like entries.

A record is a small JSON payload that belongs to one turn of one owner. It
gets a random item key, wrapped by the owner's current key (the AAD binds the
record id, owner and key version, so an owner-key rotation re-wraps it like an
entry's item key), and its payload is sealed with AES-256-GCM under that item
key (``crypto.seal_record``). The payload's AAD binds the table, record id,
owner, actor, channel, turn, sequence number and both times: a record moved to
another owner, turn, table or position, or given another expiry, fails
authentication.

In clear: the id, owner, actor and channel (the policy's scope is part of
the query, as for entries), turn id, sequence number, key version and the two
times. Everything the runtime wrote is in the sealed payload. Every fetch goes
through ``access.Access``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from ..crypto.formats import open_record, reseal_record, seal_record
from ..crypto.primitives import Wrapper
from ..errors import IntegrityError, StoreUnavailableError
from ..keys.keystore import IfUnknown, Keystore
from ..principal import Principal
from ..storage.base import Backend, Conn, Rows, check_write_bound
from .access import Access
from .heads.heads import RECORD_KINDS, Head, Heads, Room, expired_sql, record_item

__all__ = ["RECORD_ROW_OVERHEAD", "TABLES", "QuotaCheck", "Records", "Updates", "record_cost"]

TABLES = ("checkpoints", "compaction_marks")
# The blobs are read as blobs whatever was written there: a value of another
# type is then an authentication failure, not a decoding error.
_COLUMNS = (
    "id, turn_id, seq, key_version, created_at, expires_at,"
    " CAST(wrapped_key AS BLOB) AS wrapped_key, CAST(sealed AS BLOB) AS sealed"
)

# (expires_at, sealed, id, old sealed) per table: a compare-and-set update.
Updates = dict[str, list[tuple[float, bytes, str, bytes]]]

# What a record's row costs on disk besides its sealed bytes and clear
# identifiers (the other clear columns, its indexes' cells): counted against
# the owner's quota with them.
RECORD_ROW_OVERHEAD = 256
# A record's clear identifiers as UTF-8 bytes (up to 1 KiB each), the most
# either backend stores: each once in the row; again in the indexes: the id
# (the key), the owner and turn (the unique (owner_user_id, turn_id, seq)), and
# on PostgreSQL the owner once more (the key (id, owner_user_id)), counted one
# and a half times (pages split half full: ``entry_shape.identifier_cost``).
# Weights in halves. A record's cost is not kept (``used_sql`` counts the live
# records at each check), so existing records count by this rule at once;
# nothing sealed sums it.
_IDENTIFIER_WEIGHTS = (("id", 5), ("owner_user_id", 8), ("turn_id", 5), ("actor", 2), ("channel", 2))
_IDENTIFIERS_SQL = (
    "(" + " + ".join(f"octet_length({column}) * {weight}" for column, weight in _IDENTIFIER_WEIGHTS) + ") / 2"
)

# The quota check of the entries table, run inside the write transaction:
# (conn, owner, bytes added, now, what is added); raises QuotaExceededError.
# (conn, owner, key version sealed under, bytes added, now, what): checks the
# version is still the newest and the quota has room, in one statement.
QuotaCheck = Callable[[Conn, str, int, int, float, str], Room]


def _check_table(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"unknown record table {table!r}")
    return table


class Records:
    """The turn records of one store, built from its parts."""

    def __init__(
        self,
        db: Backend,
        keys: Keystore,
        access: Access,
        ttl: Callable[[int | None], int],
        now: Callable[[float | None], float],
        check_quota: QuotaCheck,
        heads: Heads,
        write_now: Callable[[float | None], float] | None = None,
    ) -> None:
        """``now`` gives a read's time, ``write_now`` (``now`` when absent) a new record's."""
        self._heads = heads
        self._db = db
        self._keys = keys
        self._access = access
        self._ttl = ttl
        self._now = now
        self._write_now = write_now or now
        self._check_quota = check_quota

    def save(
        self,
        table: str,
        principal: Principal,
        turn_id: str,
        payload: dict[str, Any],
        ttl_seconds: int | None,
        now: float | None,
    ) -> dict[str, Any]:
        """Seal ``payload`` (outside the transaction) and append it to the turn's records.

        Returns the record's ``seq``, ``created_at`` and ``expires_at``.

        ``seq`` numbers the record within the principal's scope (as ``load``
        does): the stored sequence runs over the whole turn, and would tell
        of records in other scopes.

        Raises:
            InvalidArgumentError: a bad ttl.
            QuotaExceededError: the record does not fit in the owner's quota,
                or is larger than one transaction may write (SQLite: half
                its ``wal_limit_bytes``), before anything is stored.
            StoreBusyError: the write lock was not obtained in time, or the
                sequence number kept being taken by other writers.
        """
        _check_table(table)
        ttl = self._ttl(ttl_seconds)
        created = self._write_now(now)
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        owner = principal.owner_user_id

        def seal(version: int, wrapper: Wrapper) -> dict[str, Any]:
            last = self._db.query(
                f"SELECT COALESCE(MAX(seq), 0) AS seq FROM {table} WHERE owner_user_id = ? AND turn_id = ?",
                (owner, turn_id),
                owner=owner,
            )[0]["seq"]
            row: dict[str, Any] = {
                "id": secrets.token_hex(8),
                "owner_user_id": owner,
                "actor": principal.actor,
                "channel": principal.channel,
                "turn_id": turn_id,
                "seq": int(last) + 1,
                "key_version": version,
                "created_at": created,
                "expires_at": created + ttl,
            }
            row["wrapped_key"], row["sealed"] = seal_record(wrapper, table, row, body)
            check_write_bound(record_cost(row), self._db.write_limit_bytes, "turn record")
            return row

        def write(conn: Conn, row: dict[str, Any]) -> dict[str, Any]:
            room = self._check_quota(conn, owner, row["key_version"], record_cost(row), created, "record")
            conn.execute(
                f"INSERT INTO {table}({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
            )
            section = RECORD_KINDS[table]
            self._heads.change(
                conn,
                owner,
                turn_id,
                lambda head: head.add(section, row["id"], record_item(row)),
                row["key_version"],
                room=room,
            )
            number = len(
                self._access.rows(principal, table, "seq", "turn_id = ? AND seq <= ?", (turn_id, row["seq"]), conn=conn)
            )
            return {"seq": number, "created_at": created, "expires_at": row["expires_at"]}

        # A DuplicateKeyError (another writer took this seq, or the id collided) seals again.
        return self._keys.write_current(
            owner,
            seal,
            write,
            attempts=8,
            busy="could not store the turn record: other writers kept taking its place; try again",
            prefetch=[Heads.select_sql(owner, turn_id)],
            unknown=IfUnknown(
                lambda conn, row: bool(
                    conn.query(f"SELECT id FROM {table} WHERE id = ? AND owner_user_id = ?", (row["id"], owner))
                ),
                lambda _, why: StoreUnavailableError(
                    f"{why.removesuffix('; try again')}; the record's COMMIT had been sent, so turn {turn_id!r} may"
                    f" hold it as its newest {table[:-1].replace('_', ' ')}: read that to know"
                ),
            ),
        )

    def load(
        self, table: str, principal: Principal, turn_id: str, now: float | None, *, latest: bool = False
    ) -> list[dict[str, Any]]:
        """The live records of a turn in the principal's scope, oldest first (only
        the newest with ``latest``), each as ``{"seq", "created_at", "expires_at", "payload"}``.

        ``seq`` numbers the records within the principal's scope (1, 2, ... in the
        order they were written, as ``save`` returned it): the stored sequence
        runs over the whole turn, and would tell of records in other scopes.

        Raises:
            IntegrityError: a record fails authentication.
        """
        _check_table(table)
        order = "ORDER BY seq DESC LIMIT 1" if latest else "ORDER BY seq"
        current = self._now(now)

        live = (principal, table, _COLUMNS, "turn_id = ? AND expires_at > ?", (turn_id, current), order)
        # Every record of the scope (expired ones not yet collected too) numbers the scope's sequence.
        numbered = (principal, table, "seq", "turn_id = ?", (turn_id,), "ORDER BY seq")

        def fetch() -> tuple[Rows, Rows]:
            return self._access.rows(*live), self._access.rows(*numbered)

        def check(head: Head, fetched: tuple[Rows, Rows]) -> None:
            self._heads.checks.check_records_in(head, principal, table, turn_id, fetched[0], current, latest)

        # The records, their numbering and the turn's head rows: one round trip on PostgreSQL.
        first_rows, first_stored, head_rows = self._db.queries(
            self._access.rows_sql(*live),
            self._access.rows_sql(*numbered),
            self._heads.read_sql(principal.owner_user_id, turn_id),
            owner=principal.owner_user_id,
        )
        for row in (*first_rows, *first_stored):
            self._access.policy.authorize_row(principal, row)
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
        return self._db.query(
            f"SELECT owner_user_id, actor, channel, {_COLUMNS} FROM {_check_table(table)}"
            " ORDER BY owner_user_id, turn_id, seq",
            admin=True,
        )

    def verify_row(self, table: str, row: dict[str, Any]) -> None:
        """Authenticate a record row (``verify``).

        Raises:
            IntegrityError: the record fails authentication.
        """
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
        """Re-sealed payloads (outside any transaction) for the turn's live records
        that expire before ``target``; ``apply_extend`` writes them.

        Raises:
            IntegrityError: a record fails authentication.
        """
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
    def used_sql(owner: str, now: float) -> tuple[str, tuple[Any, ...]]:
        """What the owner's live records cost on disk, as one SQL expression and
        its parameters (read inside the caller's write transaction, in the
        statement that reads the rest of the quota)."""
        parts = " UNION ALL ".join(
            f"SELECT length(sealed) + length(wrapped_key) + {_IDENTIFIERS_SQL} AS n FROM {table}"
            " WHERE owner_user_id = ? AND expires_at > ?"
            for table in TABLES
        )
        sql = f"(SELECT CAST(COALESCE(SUM(n + {RECORD_ROW_OVERHEAD}), 0) AS BIGINT) FROM ({parts}) AS records)"
        return sql, tuple(value for _ in TABLES for value in (owner, now))

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


def record_cost(row: dict[str, Any]) -> int:
    """What a record's row costs on disk: its sealed bytes, its clear
    identifiers (``_IDENTIFIER_WEIGHTS``) and a fixed overhead; ``used_sql``
    counts the same in SQL."""
    identifiers = sum(len(row[column].encode()) * weight for column, weight in _IDENTIFIER_WEIGHTS) // 2
    return len(row["sealed"]) + len(row["wrapped_key"]) + identifiers + RECORD_ROW_OVERHEAD
