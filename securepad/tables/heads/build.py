"""Bringing a store's turn heads to this format at open (``HeadBuilder.build_if_needed``, run by ``_assembly``):
building them for a store from before heads, converting format-1 heads, and the
sealed flag that says it is done."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from ...errors import IntegrityError
from ...keys.keystore import Keystore
from ...storage.base import Backend, Conn
from .heads import ITEMS_SQL, NO_TURNS, OWNER_HEAD, USAGE_HEAD, Heads, add_rows
from .tally import HEAD_FORMAT, KINDS, HeadEdit, Tally

__all__ = ["HeadBuilder"]


class HeadBuilder:
    """Builds or converts the heads of one store, once."""

    def __init__(self, heads: Heads, db: Backend, keys: Keystore) -> None:
        self._heads = heads
        self._db = db
        self._keys = keys

    def _token(self, purpose: str = "turn-heads-era") -> str:
        """``store_meta.turn_heads`` once the heads are built in this format and every
        owner key is wrapped in the heads era: a tag under the store's anchor
        key, so the flag cannot be forged. ``turn-heads`` is the
        token of the heads built before the era (keys not yet marked)."""
        return self._token_of(HEAD_FORMAT, purpose)

    def _token_of(self, head_format: int, purpose: str) -> str:
        return f"{head_format}:{self._keys.counter_seal.tag(purpose, head_format)}"

    def build_if_needed(
        self, now: Callable[[float | None], float], writes: int = 0, meta: dict[str, str] | None = None
    ) -> int:
        """Bring the store's heads to this format; a no-op (one query, none when
        ``meta``, the store's metadata read at open, says it is done) once done.

        ``store_meta.turn_heads`` says what is asked; what allows it is sealed
        or derived, never that clear value (nor the schema version, which
        the file's owner can set back so that a migration writes the value
        again): the sealed token (done); ``pending`` (migration 7: a store
        from before heads) builds every turn's tally from what the store
        holds then, refused when the store has heads or its authenticated
        write counter (``writes``, the anchor's) shows a heads-aware version
        wrote it; ``convert`` (SQLite migration 10, PostgreSQL 7) or
        ``built`` turn each head of format 1 (authenticated: it lists each
        row) into a tally, refused when the store holds a usage head or a turn
        head of a later format; the token of heads built before the era needs
        the keys marked only; a token of format 2 (before per-turn
        reservations) gives each format-2 tally its bytes and an
        equal reservation (``Heads.converted``: from its authenticated
        inventory), refused when a head of this format exists.

        ``pending``, ``built`` and ``convert`` are refused as well when an owner
        key carries the heads era (``Keystore.mark_owner_keys``): every key made
        or kept once a store has heads is wrapped in it, which only the master
        key can do, so an owner with such a key never gets an owner head here
        (where it would hide its deleted turns), only in its first key's
        transaction. In the same transaction every owner key wrapped before
        heads is wrapped again in the heads era, and a store from before usage
        heads gets them (``seed_usage``, ``store_meta.owner_usage``): the one
        moment that clear flag is heeded. Returns the turns built or converted.

        Raises:
            IntegrityError: the flag is none of these, or asks for heads to be
                built or converted on a store that had heads.
        """
        token = self._token()
        if meta is None:
            rows = self._db.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
            meta = {"turn_heads": rows[0]["value"]} if rows else {}
        if meta.get("turn_heads") == token:
            return 0
        with self._db.transaction(admin=True) as conn:
            again = conn.query("SELECT value FROM store_meta WHERE key = 'turn_heads'")
            state = again[0]["value"] if again else "pending"
            if state == token:
                return 0
            if state == "pending":
                if writes > 0 or conn.query("SELECT 1 FROM turn_heads LIMIT 1"):
                    raise IntegrityError(
                        "store_meta.turn_heads was reset to 'pending' on a store that has turn heads: the file"
                        " was edited to make the heads rebuilt from it; refused (SECURITY.md, 'turn heads')"
                    )
                self._keys.mark_owner_keys(conn, refuse_marked=True)
                self._owner_heads_for_keys(conn)
                done = self._build(conn)
            elif state in ("built", "convert"):
                self._refuse_later(conn, state, (2, HEAD_FORMAT), usage=True)
                self._keys.mark_owner_keys(conn, refuse_marked=True)  # before anything is written
                done = self._convert(conn, now(None))  # the clock is read only to convert
                self._owner_heads_for_keys(conn)
            elif state == self._token("turn-heads"):
                done = 0
            elif state in (self._token_of(2, "turn-heads-era"), self._token_of(2, "turn-heads")):
                self._refuse_later(conn, "a format-2 token", (HEAD_FORMAT,), usage=False)
                done = self._reserve(conn)
            else:
                raise IntegrityError("store_meta.turn_heads does not authenticate: the file was edited")
            if state not in ("pending", "built", "convert"):
                self._keys.mark_owner_keys(conn, refuse_marked=False)
            self._heads.seed_usage(conn)
            conn.execute(
                "INSERT INTO store_meta(key, value) VALUES ('turn_heads', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (token,),
            )
        return done

    def _refuse_later(self, conn: Conn, state: str, formats: tuple[int, ...], *, usage: bool) -> None:
        """Refuse to convert a store that holds a turn head of one of ``formats``
        (or, with ``usage``, a usage head): written by a later version than the
        flag ``state`` says, so the flag was set back. A head that fails to open
        is left to its reads and ``verify``.

        Raises:
            IntegrityError: such a head exists.
        """
        later = usage and bool(conn.query("SELECT 1 FROM turn_heads WHERE turn_id = ? LIMIT 1", (USAGE_HEAD,)))
        if not later:
            for row in conn.query(
                "SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads WHERE turn_id NOT IN (?, ?)",
                (OWNER_HEAD, USAGE_HEAD),
            ):
                try:
                    body = json.loads(self._heads.open_body(row, row["owner_user_id"], row["turn_id"]))
                except (IntegrityError, ValueError):
                    continue
                if isinstance(body, dict) and body.get("f") in formats:
                    later = True
                    break
        if later:
            raise IntegrityError(
                f"store_meta.turn_heads says {state!r} (heads of an older format to convert) but the store holds"
                " heads of a later format: the flag was set back to have the heads rebuilt from an edited store;"
                " refused (SECURITY.md, 'turn heads')"
            )

    def _build(self, conn: Conn) -> int:
        """Every turn's tally from the rows as they are (a store from before heads)."""
        by_turn: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in conn.query(ITEMS_SQL.format(where="1 = 1")):
            by_turn.setdefault((row["owner_user_id"], row["turn_id"]), []).append(row)
        built = 0
        for (owner, turn_id), rows in sorted(by_turn.items()):
            if self._keys.newest_in(conn, owner) is None:
                continue
            self._heads.change(conn, owner, turn_id, functools.partial(add_rows, rows=rows))
            built += 1
        return built

    def _convert(self, conn: Conn, now: float) -> int:
        """Each format-1 head (a listing of the turn's rows) as a tally of what it
        lists: a listed row already gone is kept out only when its sealed
        expiry has passed (gc'd), so tampering done before stays visible."""
        converted = 0
        for row in conn.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            if turn_id == OWNER_HEAD:
                continue
            try:
                body = json.loads(self._heads.open_body(row, owner, turn_id))
                if body.get("f") == HEAD_FORMAT:
                    continue
                present = self._heads.items(conn, owner, turn_id)
                edit = HeadEdit(Tally(), self._heads.terms(owner, turn_id))
                for kind in KINDS:
                    for item_id, item in dict(body.get(kind, {})).items():
                        if item_id in present[kind] or item[1] > now:
                            edit.add(kind, item_id, item)
            except (IntegrityError, ValueError, TypeError, AttributeError, IndexError):
                # A head that was tampered with stays as it is: its turn's reads
                # refuse it ("older format") and verify names it; the store opens.
                continue
            edit.tally.r = edit.tally.b
            self._heads.write_body(conn, owner, turn_id, edit.tally.dumps(), int(row["key_version"]))
            converted += 1
        return converted

    def _reserve(self, conn: Conn) -> int:
        """Each format-2 tally with its bytes and an equal reservation; the usage
        heads held the sum of the bytes, now the sum of the reservations."""
        converted = 0
        for row in conn.query("SELECT owner_user_id, turn_id, key_version, sealed FROM turn_heads"):
            if row["turn_id"] in (OWNER_HEAD, USAGE_HEAD):
                continue
            body = self._heads.converted(conn, row)
            if body is not None:
                self._heads.write_body(conn, row["owner_user_id"], row["turn_id"], body, int(row["key_version"]))
                converted += 1
        return converted

    def _owner_heads_for_keys(self, conn: Conn) -> None:
        """Give every owner with a key and no owner head an empty one (building or
        converting a store's heads, which sets the invariant ``change`` relies on)."""
        for row in conn.query(
            "SELECT owner_user_id, MAX(version) AS v FROM owner_keys WHERE owner_user_id NOT IN"
            " (SELECT owner_user_id FROM turn_heads WHERE turn_id = ?) GROUP BY owner_user_id",
            (OWNER_HEAD,),
        ):
            self._heads.write_body(conn, row["owner_user_id"], OWNER_HEAD, NO_TURNS, int(row["v"]))
