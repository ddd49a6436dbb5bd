"""What a turn head holds: the sealed tally, its edits, and the turn's inventory as the reads check it.

A kind's digest is the sum, mod 2**256, of one HMAC-SHA256 per row (``term``)
under the store's anchor key: a write adds or subtracts its rows in O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...crypto.primitives import CounterSeal
from ...errors import IntegrityError

# Head sections of the turn records, by table.
RECORD_KINDS = {"checkpoints": "c", "compaction_marks": "m"}
KINDS = {"e": "entries", "c": "checkpoints", "m": "compaction_marks"}
# 3: with the turn's bytes and reservation (format 2 is converted at open, ``build``);
# a digest term keeps format 2's tag: the rows' terms did not change.
HEAD_FORMAT = 3
TERM_FORMAT = 2
MOD = 1 << 256


@dataclass
class Head:
    """What a turn holds, as its authenticated inventory: ``e`` entries ``{id:
    [step, expires_at, stored_bytes, actor, channel]}``; ``c``/``m`` records
    ``{id: [seq, expires_at, actor, channel]}``."""

    e: dict[str, list[Any]] = field(default_factory=dict)
    c: dict[str, list[Any]] = field(default_factory=dict)
    m: dict[str, list[Any]] = field(default_factory=dict)

    def section(self, kind: str) -> dict[str, list[Any]]:
        if kind == "e":  # every put's
            return self.e
        return {"c": self.c, "m": self.m}[kind]


@dataclass
class Tally:
    """The sealed body of a turn head: per kind a count and a digest, the highest
    step ever recorded, the newest entry (``[id, step, expires_at, actor,
    channel]``; None when not known since it left), the bytes of the entries
    counted (``b``) and the turn's reservation of the owner's quota (``r >= b``)."""

    n: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    d: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    last: int = 0
    newest: list[Any] | None = None
    b: int = 0
    r: int = 0
    # The owner's turn counter as this head last saw it (``owner``): an owner head or
    # usage head that counts fewer turns is older than this head.
    o: int = 0

    def dumps(self) -> bytes:
        """The sealed body: compact JSON, keys sorted (msgspec's encoder: the bytes
        ``json.dumps(..., separators=(",", ":"), sort_keys=True)`` gives, but that
        text outside ASCII is written as UTF-8 rather than escaped; either reads back)."""
        n, d = self.n, self.d
        if len(n) == len(d) == 3:
            try:
                c, e, m = d["c"], d["e"], d["m"]
                counts = _Kinds(n["c"], n["e"], n["m"])
            except KeyError:  # kinds of another set: written as they are, below
                pass
            else:
                # The sorted body as structs whose fields are declared in sorted order: encoded as
                # they are, with no dict built or sorted. Each digest as 64 hex digits
                # (``format(value, "064x")``, a quarter of its work; a kind without rows, as
                # a turn without checkpoints has, written as it is).
                digests = _Kinds(
                    c.to_bytes(32, "big").hex() if c else _ZERO_HEX,
                    e.to_bytes(32, "big").hex() if e else _ZERO_HEX,
                    m.to_bytes(32, "big").hex() if m else _ZERO_HEX,
                )
                return _JSON(_Body(self.b, digests, HEAD_FORMAT, self.last, counts, self.o, self.r, self.newest))
        body = {
            "f": HEAD_FORMAT,
            "n": n,
            "d": {k: format(v, "064x") for k, v in d.items()},
            "l": self.last,
            "w": self.newest,
            "b": self.b,
            "r": self.r,
            "o": self.o,
        }
        return _JSON_SORTED(body)

    def state(self) -> tuple[Any, ...]:
        """What the body holds, to tell whether an edit changed it without encoding it."""
        newest = None if self.newest is None else tuple(self.newest)
        return (*self.n.values(), *self.d.values(), self.last, newest, self.b, self.r, self.o)

    def check_found(self, found: Tally, turn_id: str) -> None:
        """Refuse the tally ``found`` of the turn's rows unless it is this one (counts,
        digests, the newest entry; the rows may stay below ``last``).

        Raises:
            IntegrityError: rows were removed, added, altered or replaced.
        """
        for kind, table in KINDS.items():
            if found.n[kind] != self.n[kind]:
                raise IntegrityError(
                    f"turn {turn_id!r} holds {found.n[kind]} {table}, its head {self.n[kind]}:"
                    " rows were removed or added (tampering)"
                )
            if found.d[kind] != self.d[kind]:
                raise IntegrityError(
                    f"turn {turn_id!r}'s {table} differ from its head (an id, step, expiry, stored bytes or scope"
                    " was altered, or a row replaced): tampering or a rolled-back row"
                )
        if found.last > self.last or (self.newest is not None and self.newest != found.newest):
            raise IntegrityError(f"turn {turn_id!r}'s newest step is not the one its head recorded: tampering")

    @classmethod
    def loads(cls, data: bytes, *, before: bool = False) -> Tally:
        """A tally of this format (with ``before``, of format 2 too: ``b``, ``r`` 0); raises IntegrityError."""
        try:
            body = _JSON_DECODE(data)
            old = before and body["f"] == 2
            if body["f"] != HEAD_FORMAT and not old:
                raise ValueError("format")
            n = {kind: _count(body["n"][kind]) for kind in KINDS}
            d = {kind: int(body["d"][kind], 16) for kind in KINDS}
            newest = body["w"]
            if newest is not None and (not isinstance(newest, list) or len(newest) != 5):
                raise ValueError("newest")
            used, reserved = (0, 0) if old else (_count(body["b"]), _count(body["r"]))
            if used > reserved:
                raise ValueError("reservation")
            return cls(n, d, _count(body["l"]), newest, used, reserved, _count(body.get("o", 0)))
        except (ValueError, KeyError, TypeError, msgspec.DecodeError):
            raise IntegrityError(
                "a turn head is malformed or from an older format (a head of before its conversion put back)"
            ) from None


class _Kinds(msgspec.Struct):
    """A per-kind part of ``Tally.dumps``'s body (``n`` or ``d``), its fields in sorted order."""

    c: Any
    e: Any
    m: Any


class _Body(msgspec.Struct):
    """``Tally.dumps``'s body, its fields in sorted order: encoded, the bytes of the sorted dict."""

    b: Any
    d: _Kinds
    f: Any
    l: Any  # noqa: E741 (the body's key)
    n: _Kinds
    o: Any
    r: Any
    w: Any


_JSON_SORTED = msgspec.json.Encoder(order="sorted").encode
_ZERO_HEX = "0" * 64
_JSON = msgspec.json.Encoder().encode


_JSON_DECODE = msgspec.json.Decoder().decode


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("count")
    return value


class HeadEdit:
    """One write's change to a turn's tally (rows added, removed, replaced), applied to
    ``head`` too: the turn's inventory taken out of the cache (``reading.HeadCache``), if any."""

    __slots__ = ("_term", "bytes", "head", "tally")  # one per write: no instance dict

    def __init__(
        self, tally: Tally, term: Callable[[str, str, tuple[Any, ...]], int], head: Head | None = None
    ) -> None:
        self.tally = tally
        self._term = term
        self.head = head
        self.bytes = 0  # the change of the entries' stored bytes (the owner's usage total)

    def add(self, kind: str, item_id: str, item: list[Any]) -> None:
        """A row ``item`` (``entry_item``/``record_item``) joins the turn."""
        tally = self.tally
        if kind == "e":
            # The newest stays known while entries come in; after the newest left,
            # an entry above every step ever recorded is the newest again.
            newest, step, size = tally.newest, int(item[0]), int(item[2])
            if (
                tally.n["e"] == 0
                or (newest is not None and (step, item_id) > (int(newest[1]), newest[0]))
                or (newest is None and step > tally.last)
            ):
                tally.newest = [item_id, item[0], item[1], item[3], item[4]]
            if step > tally.last:
                tally.last = step
            self.bytes += size
            tally.b += size
        tally.n[kind] += 1
        tally.d[kind] = (tally.d[kind] + self._term(kind, item_id, tuple(item))) % MOD
        head = self.head
        if head is not None:
            (head.e if kind == "e" else head.section(kind))[item_id] = list(item)

    def add_all(self, kind: str, items: Iterable[tuple[str, list[Any]]]) -> None:
        for item_id, item in items:
            self.add(kind, item_id, item)

    def remove(self, kind: str, item_id: str, item: list[Any]) -> None:
        """A row leaves the turn (delete, gc), as its clear columns were."""
        self.tally.n[kind] -= 1
        self.tally.d[kind] = (self.tally.d[kind] - self._term(kind, item_id, tuple(item))) % MOD
        if kind == "e":
            self.bytes -= int(item[2])
            self.tally.b -= int(item[2])
        if kind == "e" and self.tally.newest is not None and self.tally.newest[0] == item_id:
            self.tally.newest = None  # not known until an entry above every step comes in
        if self.head is not None:
            self.head.section(kind).pop(item_id, None)

    def replace(self, kind: str, item_id: str, old: list[Any], new: list[Any]) -> None:
        """A row's clear columns change (an extension): the newest stays the newest."""
        newest = self.tally.newest
        self.remove(kind, item_id, old)
        self.add(kind, item_id, new)
        if kind == "e" and newest is not None and newest[0] == item_id:
            self.tally.newest = [item_id, new[0], new[1], new[3], new[4]]


def term(seal: CounterSeal, owner: str, turn_id: str, kind: str, item_id: str, item: tuple[Any, ...]) -> int:
    """One row's term of its turn's digest: HMAC-SHA256 under the store's anchor key
    of (format, kind, owner, turn, id, clear item) as msgpack (typed and
    self-delimiting: a string cannot pass for a number, nor two fields for one)."""
    return seal.term(_PACK([TERM_FORMAT, kind, owner, turn_id, item_id, *_canonical(kind, item)]))


_PACK = msgspec.msgpack.Encoder().encode


_EXPIRY = (float, int)


def _canonical(kind: str, item: tuple[Any, ...]) -> list[Any]:
    """The item with its numbers in one form (the expiry may come back an int or a
    float); the integral columns must be integers, never rounded (``int(10.5)``
    would give an edited row the term of the genuine one)."""
    if kind == "e" and len(item) == 5:  # an entry's item of exactly the types it is written with
        step, expires, stored, actor, channel = item
        if (
            type(step) is int
            and type(stored) is int
            and type(expires) in _EXPIRY
            and type(actor) is type(channel) is str
        ):
            return [step, float(expires), stored, actor, channel]
    numbers, scope = (item[:3], item[3:]) if kind == "e" else (item[:2], item[2:])
    out: list[Any] = []
    for position, value in enumerate(numbers):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise IntegrityError("a clear column of a turn's row is not a number: tampering")
        if position != 1 and not isinstance(value, int):
            raise IntegrityError("an integral clear column of a turn's row is not an integer: tampering")
        out.append(float(value) if position == 1 else value)
    if not all(isinstance(value, str) for value in scope):
        raise IntegrityError("a clear scope column of a turn's row is not text: tampering")
    return out + list(scope)


def same_entry(head: Head, row: dict[str, Any]) -> None:
    """Raise IntegrityError unless ``head`` lists the entry ``row`` as it is."""
    sealed = head.e.get(row["id"])
    if sealed is None:
        raise IntegrityError(f"entry {row['id']} is not in the head of turn {row['turn_id']!r}: tampering")
    step, expires_at, stored_bytes = sealed[0], sealed[1], sealed[2]
    if (step, expires_at, stored_bytes) != (row["step_num"], row["expires_at"], row["stored_bytes"]):
        raise IntegrityError(
            f"entry {row['id']} of turn {row['turn_id']!r} differs from its head"
            " (step, expiry or stored bytes): tampering or a rolled-back row"
        )


def extend_head(
    edit: HeadEdit,
    before: dict[str, dict[str, list[Any]]],
    target: float,
    entry_ids: Iterable[str],
    record_ids: dict[str, list[str]],
) -> None:
    """Give the extended entries and records their new expiry in the tally (``before``:
    their items as they were, ``Heads.items``, read in the same transaction)."""
    changed = [("e", entry_id) for entry_id in entry_ids]
    changed += [(RECORD_KINDS[table], record_id) for table, ids in record_ids.items() for record_id in ids]
    for kind, item_id in changed:
        old = before[kind].get(item_id)
        if old is not None:
            new = list(old)
            new[1] = target
            edit.replace(kind, item_id, old, new)


def entry_item(row: dict[str, Any]) -> list[Any]:
    """The clear item of an entry row: step, expiry, stored bytes, actor, channel."""
    step = row["step_num"] if "step_num" in row else row.get("n")
    return [step, row["expires_at"], row["stored_bytes"], row["actor"], row["channel"]]


def record_item(row: dict[str, Any]) -> list[Any]:
    """The clear item of a turn record row: sequence number, expiry, actor, channel."""
    return [row.get("seq", row.get("n")), row["expires_at"], row["actor"], row["channel"]]
