"""Bringing a store's turn heads to this format at open: building them for a store from
before heads, converting older formats, and the sealed flag that says it is done."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from typing import Any

from ...errors import IntegrityError
from ...keys.keystore import Keystore
from ...storage.base import Backend, Conn
from . import reading
from .heads import Heads, add_rows
from .owner import NO_TURNS, usage_body
from .reading import ITEMS_SQL, OWNER_HEAD, USAGE_HEAD
from .tally import HEAD_FORMAT, KINDS, Head, Tally

__all__ = ["HeadBuilder"]


class HeadBuilder:
    """Builds or converts the heads of one store, once."""

    def __init__(self, heads: Heads, db: Backend, keys: Keystore) -> None:
        self._heads = heads
        self._db = db
        self._keys = keys

    def _token(self, purpose: str = "turn-heads-era") -> str:
        """``store_meta.turn_heads`` once done: a tag under the store's anchor key, which cannot be
        forged (``turn-heads``: the heads built before the heads era, keys not yet marked)."""
        return self._token_of(HEAD_FORMAT, purpose)

    def _token_of(self, head_format: int, purpose: str) -> str:
        return f"{head_format}:{self._keys.counter_seal.tag(purpose, head_format)}"

    def build_if_needed(
        self, now: Callable[[float | None], float], writes: int = 0, meta: dict[str, str] | None = None
    ) -> int:
        """Bring the store's heads to this format; a no-op once done (one query, none
        when ``meta``, the store's metadata read at open, says so). Returns the turns
        built or converted.

        ``store_meta.turn_heads`` says what is asked; what allows it is sealed or
        derived, never that clear value: the sealed token (done); ``pending`` (a
        store from before heads) builds every turn's tally, refused when the store
        has heads or its authenticated write counter (``writes``) shows a
        heads-aware version wrote it; ``convert`` or ``built`` turn each format-1
        head into a tally, refused when a usage head or a later head exists; a
        format-2 token gives each tally its bytes and an equal reservation. The
        first three are refused too when an owner key carries the heads era
        (``Keystore.mark_owner_keys``); in the same transaction every owner key is
        wrapped in the heads era, and owners without a usage head get one.

        Raises:
            IntegrityError: the flag is none of these, or asks for heads to be
                built or converted on a store that had heads.
        """
        token = self._token()
        if meta is None:
            rows = self._db.query(reading.META_SQL.format(key="turn_heads"))
            meta = {"turn_heads": rows[0]["value"]} if rows else {}
        if meta.get("turn_heads") == token:
            return 0
        with self._db.transaction(admin=True) as conn:
            again = conn.query(reading.META_SQL.format(key="turn_heads"))
            state = again[0]["value"] if again else "pending"
            if state == token:
                return 0
            done = self._bring(conn, state, now, writes)
            if state not in ("pending", "built", "convert"):
                self._keys.mark_owner_keys(conn, refuse_marked=False)
            self._seed_usage(conn)
            conn.execute(reading.SET_META_SQL, (token,))
        return done

    def _bring(self, conn: Conn, state: str, now: Callable[[float | None], float], writes: int) -> int:
        """``build_if_needed``'s work for the flag ``state``; the turns built or converted."""
        if state == "pending":
            if writes > 0 or conn.query(reading.ANY_HEAD_SQL):
                raise IntegrityError(
                    "store_meta.turn_heads was reset to 'pending' on a store that has turn heads: the file"
                    " was edited to make the heads rebuilt from it; refused (SECURITY.md, 'turn heads')"
                )
            self._keys.mark_owner_keys(conn, refuse_marked=True)
            self._owner_heads_for_keys(conn)
            return self._build(conn)
        if state in ("built", "convert"):
            self._refuse_later(conn, state, (2, HEAD_FORMAT), usage=True)
            self._keys.mark_owner_keys(conn, refuse_marked=True)  # before anything is written
            done = self._convert(conn, now(None))  # the clock is read only to convert
            self._owner_heads_for_keys(conn)
            return done
        if state == self._token("turn-heads"):
            return 0
        if state in (self._token_of(2, "turn-heads-era"), self._token_of(2, "turn-heads")):
            self._refuse_later(conn, "a format-2 token", (HEAD_FORMAT,), usage=False)
            return self._reserve(conn)
        raise IntegrityError("store_meta.turn_heads does not authenticate: the file was edited")

    def _refuse_later(self, conn: Conn, state: str, formats: tuple[int, ...], *, usage: bool) -> None:
        """Refuse to convert a store holding a head of one of ``formats`` (or, with ``usage``, a
        usage head): a later version wrote it, so the flag ``state`` was set back.

        Raises:
            IntegrityError: such a head exists.
        """
        later = usage and bool(conn.query(reading.ANY_USAGE_HEAD_SQL, (USAGE_HEAD,)))
        if not later:
            for row in conn.query(reading.TURN_HEADS_SQL, (OWNER_HEAD, USAGE_HEAD)):
                try:
                    body = json.loads(self._heads.owners.open_body(row, row["owner_user_id"], row["turn_id"]))
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
        """Each format-1 head (a listing of rows) as a tally of what it lists; a listed row gone
        is kept out only when its sealed expiry has passed, so earlier tampering stays visible."""
        converted = 0
        for row in conn.query(reading.ALL_HEADS_SQL):
            owner, turn_id = row["owner_user_id"], row["turn_id"]
            if turn_id == OWNER_HEAD:
                continue
            try:
                body = json.loads(self._heads.owners.open_body(row, owner, turn_id))
                if body.get("f") == HEAD_FORMAT:
                    continue
                present = self._heads.items(conn, owner, turn_id)
                edit = self._heads.tally_of(owner, turn_id)
                for kind in KINDS:
                    for item_id, item in dict(body.get(kind, {})).items():
                        if item_id in present[kind] or item[1] > now:
                            edit.add(kind, item_id, item)
            except (IntegrityError, ValueError, TypeError, AttributeError, IndexError):
                # A head that was tampered with stays as it is: its turn's reads
                # refuse it ("older format") and verify names it; the store opens.
                continue
            edit.tally.r = edit.tally.b
            self._heads.owners.write_body(conn, owner, turn_id, edit.tally.dumps(), int(row["key_version"]))
            converted += 1
        return converted

    def _reserve(self, conn: Conn) -> int:
        """Each format-2 tally with its bytes and an equal reservation (so the usage heads hold their sum)."""
        converted = 0
        for row in conn.query(reading.ALL_HEADS_SQL):
            if row["turn_id"] in (OWNER_HEAD, USAGE_HEAD):
                continue
            body = self._converted(conn, row)
            if body is not None:
                self._heads.owners.write_body(conn, row["owner_user_id"], row["turn_id"], body, int(row["key_version"]))
                converted += 1
        return converted

    def _owner_heads_for_keys(self, conn: Conn) -> None:
        """Give every owner with a key and no owner head an empty one (the invariant ``change`` relies on)."""
        for row in conn.query(reading.KEYS_WITHOUT_HEADS_SQL, (OWNER_HEAD,)):
            self._heads.owners.write_body(conn, row["owner_user_id"], OWNER_HEAD, NO_TURNS, int(row["v"]))

    def _converted(self, conn: Conn, row: dict[str, Any]) -> bytes | None:
        """A format-2 turn head's tally (``row``) in this format, with ``b`` and ``r`` its
        authenticated inventory's bytes; None when it is not of format 2, or fails
        authentication (it stays: its reads refuse it, ``verify`` names it)."""
        owner, turn_id = row["owner_user_id"], row["turn_id"]
        heads = self._heads
        try:
            body = heads.owners.open_body(row, owner, turn_id)
            if json.loads(body).get("f") != 2:
                return None
            tally = Tally.loads(body, before=True)
            head = Head()
            rows = conn.query(*heads.reads.sql("?", turn_id, owner, kept=False))
            tally.check_found(heads.inventories.recount(head, rows, owner, turn_id), turn_id)
        except (IntegrityError, ValueError, AttributeError):
            return None
        tally.b = tally.r = sum(int(item[2]) for item in head.e.values())
        return tally.dumps()

    def _seed_usage(self, conn: Conn) -> int:
        """Give every owner with an owner head and no usage head one holding the sum of
        its turns' reservations, in the transaction that builds or converts the heads
        (the one moment the clear ``store_meta.owner_usage`` flag is heeded; it is then
        deleted). A turn head that fails to open counts nothing. The usage heads written."""
        if not conn.query(reading.META_SQL.format(key="owner_usage")):
            return 0
        totals: dict[str, int] = {}
        for row in conn.query(reading.UNSEEDED_SQL, (USAGE_HEAD, OWNER_HEAD, USAGE_HEAD)):
            owner = row["owner_user_id"]
            totals.setdefault(owner, 0)
            if row["turn_id"] != OWNER_HEAD:
                with contextlib.suppress(IntegrityError):
                    totals[owner] += self._heads.owners.tally(row, owner, row["turn_id"]).r
        for owner, total in totals.items():
            self._heads.owners.write_body(conn, owner, USAGE_HEAD, usage_body(total))
        conn.execute(reading.DELETE_USAGE_META_SQL)
        return len(totals)
