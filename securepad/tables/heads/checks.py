"""A read's rows checked against the turn's authenticated inventory (``Inventories.checked`` hands it over)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import IntegrityError
from ...policy import Policy
from ...principal import Principal
from .tally import RECORD_KINDS, Head, same_entry

__all__ = ["HeadChecks"]


class HeadChecks:
    """What a read returned, against the turn's inventory, in the principal's scope."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    def in_scope(self, principal: Principal, actor: str, channel: str) -> bool:
        """Whether a row of ``actor`` and ``channel`` is in the principal's scope."""
        values = {"actor": actor, "channel": channel, "owner_user_id": principal.owner_user_id}
        return all(values[column] == value for column, value in self._policy.scope_columns(principal))

    def check_entries_in(
        self,
        head: Head,
        principal: Principal,
        turn_id: str,
        rows: Iterable[dict[str, Any]],
        now: float,
        complete: bool = True,
    ) -> None:
        """Refuse (IntegrityError) an entry ``rows`` holds that ``head`` does not list as it is and, with
        ``complete``, a live entry of the principal's scope that ``head`` lists and ``rows`` lack."""
        seen = set()
        listed = head.e
        for row in rows:
            sealed = listed.get(row["id"])
            if (
                sealed is None
                or sealed[0] != row["step_num"]
                or sealed[1] != row["expires_at"]
                or sealed[2] != row["stored_bytes"]
            ):
                same_entry(head, row)  # ``same_entry``'s check, inline: it raises, with the reason
            seen.add(row["id"])
        if complete:
            for entry_id, (step, expires_at, _, actor, channel) in head.e.items():
                if expires_at > now and entry_id not in seen and self.in_scope(principal, actor, channel):
                    raise IntegrityError(
                        f"turn {turn_id!r} lost step {step} (entry {entry_id}) before its expiry: tampering"
                    )

    def check_newest_first(
        self, head: Head, principal: Principal, turn_id: str, seen: list[dict[str, Any]], now: float, complete: bool
    ) -> None:
        """Check the first rows of a newest-first scan of the turn (``tools``,
        ``last_step``): they must be the head's live entries in the principal's
        scope, highest (step, id) first, and all of them with ``complete``.

        Raises:
            IntegrityError: a newest step is missing, altered or not the head's.
        """
        expected = sorted(
            (
                (item[0], entry_id)
                for entry_id, item in head.e.items()
                if item[1] > now and self.in_scope(principal, item[3], item[4])
            ),
            reverse=True,
        )
        got = [(row["step_num"], row["id"]) for row in seen]
        if got != expected[: len(got)] or (complete and len(got) != len(expected)):
            raise IntegrityError(f"turn {turn_id!r}'s newest steps are not the ones its head lists: tampering")

    def check_newest(
        self, head: Head, principal: Principal, turn_id: str, row: dict[str, Any] | None, now: float
    ) -> None:
        """Check the newest live row of the principal's scope that a read fetched
        alone (None: none): it must be listed by ``head`` as it is, in the scope,
        and no live entry of the scope that ``head`` lists may come after it in
        (step, id) order. The rest of the turn is the inventory's, which the
        head authenticated whole.

        Raises:
            IntegrityError: the row is not the head's newest live entry in the scope.
        """
        top = None
        if row is not None:
            same_entry(head, row)
            sealed = head.e[row["id"]]
            if sealed[1] <= now or not self.in_scope(principal, sealed[3], sealed[4]):
                raise IntegrityError(f"entry {row['id']} of turn {turn_id!r} is not a live entry of the scope")
            top = (row["step_num"], row["id"])
        for entry_id, item in head.e.items():
            if (top is None or (item[0], entry_id) > top) and item[1] > now and self.in_scope(principal, *item[3:5]):
                raise IntegrityError(f"turn {turn_id!r} lost step {item[0]} (entry {entry_id}) before its expiry")

    def check_expired_in(self, head: Head, row: dict[str, Any], now: float) -> None:
        """Refuse (IntegrityError) a row served as expired whose sealed expiry has not passed."""
        sealed = head.e.get(row["id"])
        if sealed is not None and sealed[1] > now:
            raise IntegrityError(f"entry {row['id']} expires later than its clear expiry says: tampering")

    def check_records_in(
        self,
        head: Head,
        principal: Principal,
        table: str,
        turn_id: str,
        rows: list[dict[str, Any]],
        now: float,
        latest: bool,
    ) -> None:
        """Refuse (IntegrityError) records of ``table`` that ``head`` does not list as they are, a live
        one of the principal's scope missing, or (``latest``) one older than the newest."""
        section, what = head.section(RECORD_KINDS[table]), table[:-1].replace("_", " ")
        for row in rows:
            sealed = section.get(row["id"])
            if sealed is None or sealed[0] != row["seq"] or sealed[1] != row["expires_at"]:
                raise IntegrityError(f"a {what} of turn {turn_id!r} is not the one its head lists")
        live = {
            key: value
            for key, value in section.items()
            if value[1] > now and self.in_scope(principal, value[2], value[3])
        }
        if latest:
            newest = max(live.items(), key=lambda item: item[1][0], default=None)
            if (newest is None) != (not rows) or (newest is not None and rows[0]["id"] != newest[0]):
                raise IntegrityError(f"turn {turn_id!r} serves an older {what} than its newest")
        elif set(live) - {row["id"] for row in rows}:
            raise IntegrityError(f"turn {turn_id!r} lost a {what} before its expiry")
