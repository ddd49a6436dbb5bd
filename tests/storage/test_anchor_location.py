"""Where the snapshot-rollback anchor may live: never inside the store's own
directory (a copy of the directory would carry the anchor back with the
store), and only where no one else could put an older anchor back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from securepad import Keyring, Policy, Scratchpad
from securepad.errors import InvalidArgumentError, SecurepadError
from tests.support.principals import ALICE

SHARED = Policy.from_dict({"access": {"allow_shared_files": True}})


def record(db_path: Path, keyring: Keyring, anchor: Path, step: int = 1, **options: object) -> None:
    with Scratchpad.open(db_path, keyring=keyring, anchor=anchor, **options) as pad:  # type: ignore[arg-type]
        pad.turn(ALICE, "t").record(step, "shell", f"step {step}")


@pytest.mark.parametrize("inside", ["anchor", "sub/anchor", "sub/deeper/anchor", "./sub/../anchor"])
def test_an_anchor_anywhere_under_the_stores_directory_is_refused(db_path: Path, keyring: Keyring, inside: str) -> None:
    db_path.parent.mkdir(parents=True)
    with pytest.raises(InvalidArgumentError, match="inside the store's own directory"):
        Scratchpad.open(db_path, keyring=keyring, anchor=db_path.parent / inside)


def test_an_anchor_reached_through_a_link_into_the_stores_directory_is_refused(
    db_path: Path, keyring: Keyring, tmp_path: Path
) -> None:
    (db_path.parent / "hidden").mkdir(parents=True)
    (tmp_path / "elsewhere").symlink_to(db_path.parent / "hidden")
    with pytest.raises(InvalidArgumentError, match="inside the store's own directory"):
        Scratchpad.open(db_path, keyring=keyring, anchor=tmp_path / "elsewhere" / "anchor")


def test_an_anchor_beside_the_stores_directory_is_accepted(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    # A sibling whose name starts like the store's directory is not inside it.
    anchor = tmp_path / f"{db_path.parent.name}-anchors" / "anchor"
    record(db_path, keyring, anchor)
    assert anchor.is_file() and anchor.stat().st_mode & 0o777 == 0o600


def test_an_anchor_in_a_directory_anyone_may_write_is_refused(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky, like /tmp: others still plant files
    with pytest.raises(SecurepadError, match=r"anchor's directory .* anyone may plant.*chmod o-w"):
        Scratchpad.open(db_path, keyring=keyring, anchor=shared / "anchor")
    assert not (shared / "anchor").exists()
    record(db_path, keyring, shared / "anchor", policy=SHARED)  # the documented override
    assert (shared / "anchor").is_file()


def test_a_directory_made_world_writable_later_is_refused_at_the_next_open(
    db_path: Path, keyring: Keyring, tmp_path: Path
) -> None:
    anchor = tmp_path / "state" / "anchor"
    record(db_path, keyring, anchor)
    anchor.parent.chmod(0o777)
    with pytest.raises(SecurepadError, match="chmod o-w"):
        Scratchpad.open(db_path, keyring=keyring, anchor=anchor)


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o606])
def test_an_anchor_file_others_may_read_or_write_is_refused(
    db_path: Path, keyring: Keyring, tmp_path: Path, mode: int
) -> None:
    anchor = tmp_path / "state" / "anchor"
    record(db_path, keyring, anchor)
    anchor.chmod(mode)
    with pytest.raises(SecurepadError, match=r"anchor .* has mode .*chmod 600"):
        Scratchpad.open(db_path, keyring=keyring, anchor=anchor)
    record(db_path, keyring, anchor, 2, policy=SHARED)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
def test_an_anchor_file_of_another_user_is_refused(db_path: Path, keyring: Keyring, tmp_path: Path) -> None:
    anchor = tmp_path / "state" / "anchor"
    record(db_path, keyring, anchor)
    os.chown(anchor, 4321, 4321)
    with pytest.raises(SecurepadError, match="belongs to uid 4321"):
        Scratchpad.open(db_path, keyring=keyring, anchor=anchor)


def test_the_default_anchor_beside_a_shared_key_file_follows_the_key_files_override(
    db_path: Path, tmp_path: Path
) -> None:
    key_file = tmp_path / "config" / "key"
    Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file)).close()
    key_file.parent.chmod(0o777)
    with pytest.raises(SecurepadError, match="chmod o-w"):
        Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file))
    with Scratchpad.open(db_path, keyring=Keyring.from_key_file(key_file, allow_shared=True)) as pad:
        assert pad.stats()["anchor"]["path"].startswith(str(key_file.parent))


def test_an_anchor_reached_through_a_link_into_a_directory_anyone_may_write_is_refused(
    db_path: Path, keyring: Keyring, tmp_path: Path
) -> None:
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    shared.chmod(0o777)
    record(db_path, keyring, shared / "anchor", policy=SHARED)  # a genuine anchor, the user's, mode 0600
    private.mkdir(mode=0o700)
    (private / "anchor").symlink_to(shared / "anchor")
    with pytest.raises(SecurepadError, match=r"anchor's directory .*shared .* anyone may plant"):
        Scratchpad.open(db_path, keyring=keyring, anchor=private / "anchor")
    record(db_path, keyring, private / "anchor", step=2, policy=SHARED)  # the documented override
