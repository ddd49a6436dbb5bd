"""The anchor's file (``storage/anchor_file.py``): what it holds authenticates
under the store's anchor key, a damaged, forged or loosely kept file is
refused, and a write replaces it whole, leaving no temporary file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from securepad import Keyring, Scratchpad
from securepad.crypto.primitives import CounterSeal
from securepad.errors import IntegrityError, SecurepadError
from securepad.storage.anchor_file import AnchorFile
from securepad.store import parts


def _seal(tmp_path: Path, name: str) -> CounterSeal:
    """The anchor key of a new store (a store of its own per ``name``)."""
    keyring = Keyring.from_key_file(tmp_path / f"{name}-key")
    with Scratchpad.open(tmp_path / f"{name}.db", keyring=keyring, anchor=False) as pad:
        return parts(pad).keys.counter_seal


@pytest.fixture
def seal(tmp_path: Path) -> CounterSeal:
    return _seal(tmp_path, "store")


@pytest.fixture
def anchor(tmp_path: Path, seal: CounterSeal) -> AnchorFile:
    where = tmp_path / "anchors"
    where.mkdir(mode=0o700)
    return AnchorFile(where / "anchor-x", seal)


def test_a_written_counter_reads_back_from_a_private_file_and_no_temporary_is_left(anchor: AnchorFile) -> None:
    assert anchor.read() is None
    with anchor.locked():
        anchor.write(7)
        anchor.write(9)
    assert anchor.read() == 9
    assert (anchor.path.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in anchor.path.parent.iterdir()) == ["anchor-x", "anchor-x.lock"]


@pytest.mark.parametrize(
    "body",
    ["not json", json.dumps({"counter": -1, "tag": "00"}), json.dumps({"counter": True, "tag": "00"}), "{}"],
)
def test_a_damaged_anchor_is_refused(anchor: AnchorFile, body: str) -> None:
    anchor.path.write_text(body)
    anchor.path.chmod(0o600)
    with pytest.raises(IntegrityError, match="is damaged"):
        anchor.read()


def test_another_stores_anchor_is_refused_as_forged(tmp_path: Path, anchor: AnchorFile) -> None:
    other = AnchorFile(anchor.path, _seal(tmp_path, "other"))
    other.write(5)
    with pytest.raises(IntegrityError, match="forged or belongs to another store"):
        anchor.read()


def test_an_anchor_others_may_write_is_refused_unless_sharing_is_allowed(anchor: AnchorFile, seal: CounterSeal) -> None:
    anchor.write(3)
    anchor.path.chmod(0o666)
    with pytest.raises(SecurepadError, match="others may read or write it"):
        anchor.read()
    assert AnchorFile(anchor.path, seal, allow_shared=True).read() == 3


def test_only_a_dead_writers_temporary_files_are_removed(anchor: AnchorFile) -> None:
    left = anchor.path.parent / f".{anchor.path.name}.abcd_123"
    unrelated = anchor.path.parent / f".{anchor.path.name}.notrandom-suffix"
    for path in (left, unrelated):
        path.write_text("{}")
    with anchor.locked():
        anchor.remove_stale_temporaries()
    assert not left.exists() and unrelated.exists()


def test_an_unwritable_directory_is_a_securepad_error(tmp_path: Path, seal: CounterSeal) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    anchor = AnchorFile(blocker / "anchor-x", seal)
    with pytest.raises(SecurepadError, match="cannot open the anchor's lock"), anchor.locked():
        pass
    assert not os.path.exists(blocker / "anchor-x")
