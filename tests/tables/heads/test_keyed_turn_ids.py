"""The turns of LangGraph threads and OpenAI sessions have keyed names.

A turn id is a clear column of the file. It used to be the SHA-256 of the
thread or session id: anyone holding the file could hash guesses (``job-42``)
and find which threads exist. It is now an HMAC of the owner and the ids
under a key derived from the store's master key (``crypto.CounterSeal.turn_name``):
without the key no guess can be tested; the same id names another turn for
another owner or store; master and owner-key rotations keep the names. A
thread or session written before keyed names keeps its former turn while it
holds entries, so it reads and takes writes as before.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import pytest

from securepad import IntegrityError, Keyring, Policy, Principal, Scratchpad
from securepad._steps import put_next
from securepad.store import parts
from tests.support.paths import FIXTURES

if TYPE_CHECKING:
    from securepad.integrations.langgraph_saver import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

ALICE = Principal("alice", "graph", "api")
BOB = Principal("bob", "graph", "api")


def run(coroutine: Any) -> Any:
    import asyncio

    return asyncio.run(coroutine)


def _put(saver: SecurepadSaver, thread: str | dict[str, Any], n: int, parent: Any = None) -> Any:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    config = generate_config(thread) if isinstance(thread, str) else thread
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values={"n": n}, channel_versions={"n": str(n)})
    return saver.put(config, checkpoint, generate_metadata(), {"n": str(n)})


def _turns(pad: Scratchpad) -> set[str]:
    """Every turn id in the store's clear columns (entries and heads)."""
    db = parts(pad).db
    rows = db.query("SELECT turn_id FROM entries UNION SELECT turn_id FROM turn_heads", admin=True)
    return {str(row["turn_id"]) for row in rows}


def _hashed_guesses(guess: str) -> set[str]:
    """What an attacker computes from a guess of an id: the former names' hashes."""
    digests = {
        hashlib.sha256(json.dumps([kind, guess, *rest], separators=(",", ":")).encode()).hexdigest()
        for kind, rest in (("thread", ()), ("writes", ("",)), ("value", ("",)))
    }
    return digests | {hashlib.sha256(guess.encode()).hexdigest()}


def test_no_turn_in_the_file_is_the_hash_of_a_guessed_thread_or_session_id(pad: Scratchpad) -> None:
    """The docs' own ``job-42``, as a thread and as a session: no turn id of the
    file contains a digest an attacker computes from the guess."""
    from securepad.integrations.langgraph_saver import SecurepadSaver, turn_id
    from securepad.integrations.openai_session import SecurepadSession

    saver = SecurepadSaver(pad, ALICE)
    first = _put(saver, "job-42", 1)
    saver.put_writes(first, [("n", 2)], task_id="task-1")
    run(SecurepadSession("job-42", pad, ALICE).add_items([{"role": "user", "content": "hi"}]))
    turns = _turns(pad)
    assert any(":keyed:" in turn for turn in turns)
    assert not any(digest in turn for turn in turns for digest in _hashed_guesses("job-42"))
    assert turn_id("thread", "job-42") not in turns


def test_the_same_id_names_another_turn_for_another_owner_and_another_store(pad: Scratchpad, tmp_path: Path) -> None:
    from securepad.integrations.langgraph_saver import keyed_turn
    from securepad.integrations.openai_session import SecurepadSession

    alices = keyed_turn(pad, ALICE, "thread", "job-42")
    assert keyed_turn(pad, BOB, "thread", "job-42") != alices
    assert keyed_turn(pad, ALICE, "thread", "job-43") != alices
    assert keyed_turn(pad, ALICE, "writes", "job-42") != alices
    assert keyed_turn(pad, ALICE, "thread", "job-42") == alices  # a function of its inputs
    (tmp_path / "other").mkdir(mode=0o700)
    other_keys = Keyring.from_key_file(tmp_path / "other-key")
    with Scratchpad.open(tmp_path / "other" / "store.db", keyring=other_keys) as other:
        assert keyed_turn(other, ALICE, "thread", "job-42") != alices
    assert SecurepadSession("s", pad, ALICE).turn_id != SecurepadSession("s", pad, BOB).turn_id


def test_a_thread_and_a_session_survive_master_and_owner_key_rotations(db_path: Path, tmp_path: Path) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph_saver import SecurepadSaver, keyed_turn
    from securepad.integrations.openai_session import SecurepadSession

    keyring = Keyring.from_key_file(tmp_path / "key-1")
    with Scratchpad.open(db_path, keyring=keyring) as pad:
        saver = SecurepadSaver(pad, ALICE)
        latest = _put(saver, "job-42", 2, _put(saver, "job-42", 1))
        run(SecurepadSession("s1", pad, ALICE).add_items([{"role": "user", "content": "kept"}]))
        name = keyed_turn(pad, ALICE, "thread", "job-42")
        pad.rotate_owner_key("alice")
        new_keyring = Keyring.from_key_file(tmp_path / "key-2")
        pad.rotate_master_key(new_keyring)
    with Scratchpad.open(db_path, keyring=new_keyring) as pad:
        assert keyed_turn(pad, ALICE, "thread", "job-42") == name
        found = SecurepadSaver(pad, ALICE).get_tuple(generate_config("job-42"))
        assert (
            found is not None
            and found.config["configurable"]["checkpoint_id"] == (latest["configurable"]["checkpoint_id"])
        )
        assert run(SecurepadSession("s1", pad, ALICE).get_items()) == [{"role": "user", "content": "kept"}]


# -- stores written before keyed names ----------------------------------------------------------


@pytest.fixture
def old_thread(tmp_path: Path) -> tuple[Path, Keyring, dict[str, Any]]:
    """A store whose LangGraph thread was written with the former turn names."""
    old = json.loads((FIXTURES / "langgraph_thread_v7.json").read_text())
    shutil.copy(FIXTURES / "langgraph_thread_v7.db", tmp_path / "store.db")
    (tmp_path / "store.db").chmod(0o600)
    key = tmp_path / "key"
    key.write_bytes((FIXTURES / "store_v1.key").read_bytes())
    key.chmod(0o600)
    return tmp_path / "store.db", Keyring.from_key_file(key), old


def test_a_thread_written_before_keeps_its_turn_reads_back_and_takes_checkpoints(
    old_thread: tuple[Path, Keyring, dict[str, Any]],
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph_saver import SecurepadSaver, keyed_turn, turn_id

    path, keyring, old = old_thread
    now, thread_id = old["now"], old["thread_id"]
    principal = Principal("alice", "agent", "web")
    with Scratchpad.open(path, keyring=keyring, clock=lambda: now, adopt_anchor=True) as pad:
        saver = SecurepadSaver(pad, principal, ttl_seconds=3600, clock=lambda: now)
        before = len(list(saver.list(generate_config(thread_id))))
        stored = len(pad.list_for_turn(principal, turn_id("thread", thread_id)))  # every namespace's
        assert saver.records.turn(principal, "thread", thread_id) == turn_id("thread", thread_id)
        latest = saver.get_tuple(generate_config(thread_id))
        assert latest is not None
        _put(saver, thread_id, 99, latest.config)
        listed = list(saver.list(generate_config(thread_id)))
        assert len(listed) == before + 1  # the new checkpoint went where the thread is
        assert len(pad.list_for_turn(principal, turn_id("thread", thread_id))) == stored + 1
        assert pad.list_for_turn(principal, keyed_turn(pad, principal, "thread", thread_id)) == []
        # A new thread of the same store gets a keyed turn.
        _put(saver, "fresh", 1)
        assert saver.records.turn(principal, "thread", "fresh") == keyed_turn(pad, principal, "thread", "fresh")
        assert len(pad.list_for_turn(principal, keyed_turn(pad, principal, "thread", "fresh"))) == 1
        # Deleted, the old thread is written again under its keyed name.
        saver.delete_thread(thread_id)
        _put(saver, thread_id, 1)
        assert saver.records.turn(principal, "thread", thread_id) == keyed_turn(pad, principal, "thread", thread_id)
        assert len(list(saver.list(generate_config(thread_id)))) == 1


def test_a_thread_another_actor_writes_keyed_stays_where_each_actor_finds_it(
    old_thread: tuple[Path, Keyring, dict[str, Any]],
) -> None:
    """Under a scope that names the actor, another actor of the owner writing
    the same thread id finds nothing in the former turn (not its scope) and
    writes the keyed one; the saver remembers that for that actor's scope
    only: the first actor still reads (and extends) its thread in the former
    turn, through the same saver."""
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph_saver import SecurepadSaver, keyed_turn, turn_id

    path, keyring, old = old_thread
    now, thread_id = old["now"], old["thread_id"]
    first, other = Principal("alice", "agent", "web"), Principal("alice", "other", "web")
    policy = Policy.from_dict({"access": {"scope": "owner+channel+actor"}})
    with Scratchpad.open(path, keyring=keyring, clock=lambda: now, adopt_anchor=True, policy=policy) as pad:

        def who(config: Any) -> Principal:
            return other if config["configurable"].get("actor") == "other" else first

        saver = SecurepadSaver(pad, principal_from_config=who, ttl_seconds=3600, clock=lambda: now)
        mine = saver.get_tuple(generate_config(thread_id))
        assert mine is not None
        others = generate_config(thread_id)
        others["configurable"]["actor"] = "other"
        _put(saver, others, 1)
        assert saver.get_tuple(others) is not None  # the other actor's thread: keyed, remembered
        assert saver.records.turn(other, "thread", thread_id) == keyed_turn(pad, other, "thread", thread_id)
        assert saver.records.turn(first, "thread", thread_id) == turn_id("thread", thread_id)
        again = saver.get_tuple(generate_config(thread_id))
        assert again is not None and again.checkpoint["id"] == mine.checkpoint["id"]
        former = len(pad.list_for_turn(first, turn_id("thread", thread_id)))
        _put(saver, thread_id, 99, mine.config)
        assert len(pad.list_for_turn(first, turn_id("thread", thread_id))) == former + 1
        assert saver.get_tuple(generate_config(thread_id)).checkpoint["id"] != mine.checkpoint["id"]


@pytest.mark.parametrize("head", ["kept", "deleted"])
def test_a_keyed_thread_emptied_in_the_file_never_falls_back_to_a_former_turn_put_back(
    old_thread: tuple[Path, Keyring, dict[str, Any]], head: str
) -> None:
    """An attacker with the file and no key, holding a copy from when the
    thread was in its former turn (it was deleted and written again keyed
    since): deleting the keyed turn's rows (and its head), and putting the
    former turn's rows and head back, would serve the old history if an empty
    keyed turn sent the saver to the former one. The keyed turn's head (or the
    owner head, which lists the turn) refuses it: ``IntegrityError``."""
    from langgraph.checkpoint.conformance.test_utils import generate_config

    from securepad.integrations.langgraph_saver import SecurepadSaver, keyed_turn, turn_id

    path, keyring, old = old_thread
    now, thread_id = old["now"], old["thread_id"]
    principal = Principal("alice", "agent", "web")
    with Scratchpad.open(path, keyring=keyring, clock=lambda: now, adopt_anchor=True):
        pass
    shutil.copy(path, path.with_name("copy.db"))  # the attacker's copy, the thread in its former turn
    with Scratchpad.open(path, keyring=keyring, clock=lambda: now) as pad:
        saver = SecurepadSaver(pad, principal, ttl_seconds=3600, clock=lambda: now)
        saver.delete_thread(thread_id)
        _put(saver, thread_id, 2, _put(saver, thread_id, 1))
        keyed = keyed_turn(pad, principal, "thread", thread_id)
    former = turn_id("thread", thread_id)
    conn = apsw.Connection(str(path))
    with conn:
        conn.execute("ATTACH DATABASE ? AS copy", (str(path.with_name("copy.db")),))
        conn.execute("DELETE FROM segments WHERE entry_id IN (SELECT id FROM entries WHERE turn_id = ?)", (keyed,))
        conn.execute("DELETE FROM entries WHERE turn_id = ?", (keyed,))
        if head == "deleted":
            conn.execute("DELETE FROM turn_heads WHERE turn_id = ?", (keyed,))
        conn.execute("INSERT INTO entries SELECT * FROM copy.entries WHERE turn_id = ?", (former,))
        conn.execute(
            "INSERT OR IGNORE INTO segments SELECT * FROM copy.segments"
            " WHERE entry_id IN (SELECT id FROM copy.entries WHERE turn_id = ?)",
            (former,),
        )
        conn.execute("DELETE FROM turn_heads WHERE turn_id = ?", (former,))
        conn.execute("INSERT INTO turn_heads SELECT * FROM copy.turn_heads WHERE turn_id = ?", (former,))
    conn.close()
    with Scratchpad.open(path, keyring=keyring, clock=lambda: now) as pad:
        saver = SecurepadSaver(pad, principal, ttl_seconds=3600, clock=lambda: now)
        with pytest.raises(IntegrityError):
            saver.get_tuple(generate_config(thread_id))
        with pytest.raises(IntegrityError):
            _put(saver, thread_id, 3)


def _former_session_turn(session_id: str) -> str:
    return f"securepad.openai:session:{hashlib.sha256(session_id.encode()).hexdigest()}"


def test_a_session_written_before_keeps_its_turn_and_its_order(pad: Scratchpad, alice: Principal) -> None:
    """Items the former code put in the session's SHA-256 turn (the same
    observations, through the same ``put_next``): read back, and new items
    follow them there, in order."""
    from securepad.integrations.openai_session import SecurepadSession

    former = _former_session_turn("job-42")
    for n in (1, 2):
        text = json.dumps({"role": "user", "content": f"old {n}"})
        metadata = {"format": 1, "session_id": "job-42", "item": text}
        put_next(pad, alice, former, "openai.session_item", {"content": "", "metadata": metadata})
    session = SecurepadSession("job-42", pad, alice)
    assert session.turn_id == former
    run(session.add_items([{"role": "user", "content": "new"}]))
    assert [item["content"] for item in run(session.get_items())] == ["old 1", "old 2", "new"]
    assert len(pad.list_for_turn(alice, former)) == 3
    assert run(session.pop_item())["content"] == "new"
    run(session.clear_session())
    assert pad.list_for_turn(alice, former) == []
    # Empty, the session now takes its keyed turn.
    run(session.add_items([{"role": "user", "content": "keyed"}]))
    assert session.turn_id != former and ":keyed:" in session.turn_id
    assert [item["content"] for item in run(SecurepadSession("job-42", pad, alice).get_items())] == ["keyed"]


def test_a_thread_id_never_reaches_the_file_in_clear(pad: Scratchpad) -> None:
    from securepad.integrations.langgraph_saver import SecurepadSaver

    saver = SecurepadSaver(pad, ALICE)
    _put(saver, "a-very-recognizable-thread-name", 1)
    assert not any("recognizable" in turn for turn in _turns(pad))
