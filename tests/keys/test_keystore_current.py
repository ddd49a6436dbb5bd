"""A write under the owner's current key (``Keystore.write_current``, run by
``CurrentWrite``): sealed again when a newer key version appeared or an id
was taken, never past its attempts, and a failure counts no wrap. The current
key itself (``Keystore.current``) is read again when a rotation retires the
version read as the newest before its key is read."""

from __future__ import annotations

from typing import Any

import pytest

from securepad import Principal, Scratchpad
from securepad.errors import IntegrityError, StoreBusyError
from securepad.keys.keystore import Keystore
from securepad.storage.base import Conn, DuplicateKeyError
from securepad.store import parts

OWNER = "alice"


def _sealer(log: list[int], before: Any = None) -> Any:
    def seal(version: int, wrapper: object) -> int:
        log.append(version)
        if before is not None:
            before(len(log))
        return version

    return seal


def _checked(keys: Keystore) -> Any:
    """A write that checks, inside its transaction, that it was sealed under the newest version."""

    def write(conn: Conn, sealed: int) -> str:
        Keystore.check_newest(keys.newest_in(conn, OWNER), sealed)
        return f"written under {sealed}"

    return write


def test_a_write_sealed_under_a_version_made_stale_meanwhile_is_sealed_again_under_the_newest(
    pad: Scratchpad,
) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    sealed: list[int] = []

    def rotate_once(call: int) -> None:
        if call == 1:  # another process adds a newer version while this one seals
            keys.add_version(OWNER, 2, admin=True)

    result = keys.write_current(OWNER, _sealer(sealed, rotate_once), _checked(keys), attempts=3, busy="busy")
    assert (result, sealed) == ("written under 2", [1, 2])
    assert keys.current(OWNER)[0] == 2


def test_a_taken_id_seals_again_and_gives_up_after_its_attempts(pad: Scratchpad) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    before = keys.pending_wraps()
    sealed: list[int] = []

    def taken(conn: Conn, row: int) -> None:
        raise DuplicateKeyError

    with pytest.raises(StoreBusyError, match=r"^every id was taken$"):
        keys.write_current(OWNER, _sealer(sealed), taken, attempts=3, busy="every id was taken")
    assert sealed == [1, 1, 1]
    assert keys.pending_wraps() == before  # nothing was written: no wrap counted


def test_another_failure_leaves_at_once_and_counts_no_wrap(pad: Scratchpad) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    before = keys.pending_wraps()
    sealed: list[int] = []

    def fails(conn: Conn, row: int) -> None:
        raise ValueError("the row is refused")

    with pytest.raises(ValueError, match="the row is refused"):
        keys.write_current(OWNER, _sealer(sealed), fails, attempts=3, busy="busy")
    assert sealed == [1]
    assert keys.pending_wraps() == before


def test_a_written_row_counts_its_wraps(pad: Scratchpad) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    before = keys.pending_wraps().get((OWNER, 1), 0)
    keys.write_current(OWNER, _sealer([]), _checked(keys), attempts=1, busy="busy", count=3)
    assert keys.pending_wraps().get((OWNER, 1), 0) == before + 3


def test_a_rotation_retiring_the_version_read_as_newest_before_its_key_is_read_gives_the_new_version(
    pad: Scratchpad, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    keys.forget(OWNER)
    original = Keystore.newest_version
    rotations: list[dict[str, Any]] = []

    def rotate_after_the_first_read(self: Keystore, owner: str) -> int | None:
        found = original(self, owner)
        if not rotations:
            rotations.append({})
            rotations[0] = pad.rotate_owner_key(OWNER)  # retires ``found`` and forgets the cached keys
        return found

    monkeypatch.setattr(Keystore, "newest_version", rotate_after_the_first_read)
    version, _ = keys.current(OWNER)
    assert (version, rotations[0]["retired_versions"]) == (2, [1])
    result = keys.write_current(OWNER, _sealer([]), _checked(keys), attempts=1, busy="busy")
    assert result == "written under 2"


def test_a_newest_key_that_does_not_unwrap_is_refused_not_replaced(pad: Scratchpad) -> None:
    keys = parts(pad).keys
    keys.current(OWNER)
    keys.current("bob")
    with parts(pad).db.transaction(OWNER, admin=True) as conn:
        conn.execute(
            "UPDATE owner_keys SET wrapped = (SELECT wrapped FROM owner_keys WHERE owner_user_id = 'bob')"
            " WHERE owner_user_id = 'alice'"
        )
    keys.forget(OWNER)
    with pytest.raises(IntegrityError):
        keys.current(OWNER)
    assert keys.newest_version(OWNER) == 1


def test_a_put_seals_with_the_newest_version_and_its_keys_after_a_rotation(pad: Scratchpad) -> None:
    """``current_sealing`` (a put's one lookup) is ``current`` with that version's
    ``sealing`` keys, and follows a rotation: the next put seals under the new version."""
    keys, alice = parts(pad).keys, Principal(OWNER, "agent", "web")
    pad.put(alice, "t", 1, "tool", "before")
    found = keys.current_sealing(OWNER)
    assert (found.version, found.wrapper) == keys.current(OWNER)
    assert (found.identity, found.listing) == keys.sealing(OWNER, found.version)
    pad.rotate_owner_key(OWNER)
    entry = pad.put(alice, "t", 2, "tool", "after")["scratchpad_id"]
    assert keys.current_sealing(OWNER).version == found.version + 1 == keys.current(OWNER)[0]
    row = parts(pad).db.query("SELECT key_version FROM entries WHERE id = ?", (entry,), admin=True)[0]
    assert row["key_version"] == found.version + 1
    assert pad.get(alice, entry).observation == "after"
