"""``SecurepadSession``: the OpenAI Agents SDK's session protocol on the store,
on both backends: the SDK's semantics, a scripted ``Runner.run`` over several
turns, owner isolation, and what an edit of the file does."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import IntegrityError, InvalidArgumentError, Keyring, Principal, Scratchpad
from tests.support.tamper_edits import edit_file

if TYPE_CHECKING:
    from agents.testing import ModelCall, ModelStep

    from securepad.integrations.openai_agents import SecurepadSession

pytestmark = pytest.mark.xdist_group("openai_agents")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def message(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"message {n}"}


# -- the SDK's session semantics --------------------------------------------------------


def test_items_come_back_in_order_with_the_sdk_limit_semantics(pad: Scratchpad, alice: Principal) -> None:
    from agents.memory import SessionSettings

    from securepad.integrations.openai_agents import SecurepadSession

    session = SecurepadSession("chat-1", pad, alice)
    assert run(session.get_items()) == []
    run(session.add_items([message(1), message(2)]))
    run(session.add_items([message(3)]))
    run(session.add_items([]))
    assert run(session.get_items()) == [message(1), message(2), message(3)]
    assert run(session.get_items(limit=2)) == [message(2), message(3)]  # the latest, oldest first
    assert run(session.get_items(limit=10)) == [message(1), message(2), message(3)]
    assert run(session.get_items(limit=0)) == []
    limited = SecurepadSession("chat-1", pad, alice, session_settings=SessionSettings(limit=1))
    assert run(limited.get_items()) == [message(3)]
    assert run(limited.get_items(limit=2)) == [message(2), message(3)]


def test_items_whose_view_was_cut_to_the_inline_limit_come_back_whole(tmp_path: Path, alice: Principal) -> None:
    """The listing's view fits inline_max_chars and may leave out the
    metadata an item travels in: the session then reads it from the entry."""
    from securepad import Policy
    from securepad.integrations.openai_agents import SecurepadSession

    policy = Policy.from_dict({"limits": {"inline_max_chars": 200}})
    keyring = Keyring.create_key_file(tmp_path / "key")
    with Scratchpad.open(tmp_path / "s.db", keyring=keyring, policy=policy) as small:
        session = SecurepadSession("chat-1", small, alice)
        items = [{"role": "user", "content": "x" * 900}, message(2)]
        run(session.add_items(items))
        listed = small.list_for_turn(alice, session.turn_id)
        assert any("metadata" in entry["view"].get("view_cut", ()) for entry in listed)
        assert run(session.get_items()) == items
        assert run(session.pop_item()) == message(2)
        assert run(session.get_items()) == items[:1]


def test_pop_takes_the_newest_and_clear_takes_everything(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    session = SecurepadSession("chat-1", pad, alice)
    assert run(session.pop_item()) is None
    run(session.add_items([message(1), message(2), message(3)]))
    assert run(session.pop_item()) == message(3)
    run(session.add_items([message(4)]))
    assert run(session.get_items()) == [message(1), message(2), message(4)]
    # A second object on the same session (another process, later) continues after the last item.
    again = SecurepadSession("chat-1", pad, alice)
    run(again.add_items([message(5)]))
    assert run(session.get_items()) == [message(1), message(2), message(4), message(5)]
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert run(again.pop_item()) is None
    run(session.add_items([message(6)]))
    assert run(again.get_items()) == [message(6)]
    assert pad.stats(alice)["entries"] == 1


def test_sessions_of_one_owner_are_apart(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    one, two = SecurepadSession("a", pad, alice), SecurepadSession("b", pad, alice)
    run(one.add_items([message(1)]))
    run(two.add_items([message(2)]))
    assert run(one.get_items()) == [message(1)]
    run(two.clear_session())
    assert run(one.get_items()) == [message(1)]


def test_bad_arguments_are_refused_and_store_nothing(pad: Scratchpad, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    with pytest.raises(InvalidArgumentError):
        SecurepadSession("", pad, alice)
    with pytest.raises(InvalidArgumentError):
        SecurepadSession("s", "not a pad", alice)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SecurepadSession("s", pad, "alice")  # type: ignore[arg-type]
    session = SecurepadSession("s", pad, alice)
    with pytest.raises(InvalidArgumentError):
        run(session.get_items(limit=-1))
    with pytest.raises(InvalidArgumentError):
        run(session.add_items([message(1), {"role": "user", "content": object()}]))  # type: ignore[list-item]
    assert run(session.get_items()) == []  # the batch is checked before anything is stored
    with pytest.raises(InvalidArgumentError):
        run(SecurepadSession("s", pad, alice, ttl_seconds=pad.policy.max_ttl_seconds + 1).add_items([message(1)]))


# -- owner isolation ------------------------------------------------------------------------


@given(
    session_id=st.text(min_size=1, max_size=40),
    contents=st.lists(st.text(max_size=30), min_size=1, max_size=4),
)
def test_another_owner_never_sees_or_changes_a_session(
    pad: Scratchpad, alice: Principal, bob: Principal, session_id: str, contents: list[str]
) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    mine = SecurepadSession(session_id, pad, alice)
    theirs = SecurepadSession(session_id, pad, bob)
    items = [{"role": "user", "content": text} for text in contents]
    run(mine.add_items(items))
    assert run(theirs.get_items()) == []
    assert run(theirs.pop_item()) is None
    run(theirs.clear_session())
    run(theirs.add_items([{"role": "user", "content": "bob's"}]))
    assert run(mine.get_items()) == items
    assert run(theirs.get_items()) == [{"role": "user", "content": "bob's"}]
    run(mine.clear_session())
    run(theirs.clear_session())


# -- a scripted agent over several turns ------------------------------------------------------


def test_a_scripted_agent_remembers_earlier_turns(pad: Scratchpad, alice: Principal) -> None:
    from agents import Agent, RunConfig, Runner
    from agents.testing import ModelStep, ScriptedModel, assistant_message

    from securepad.integrations.openai_agents import SecurepadSession

    def echo_history(call: ModelCall) -> ModelStep:
        said = [item["content"] for item in call.input if isinstance(item, dict) and item.get("role") == "user"]
        return ModelStep(output=[assistant_message(" | ".join(str(s) for s in said))])

    model = ScriptedModel([ModelStep(responder=echo_history) for _ in range(3)])
    agent = Agent(name="echo", instructions="Repeat what the user said so far.", model=model)
    session = SecurepadSession("conversation", pad, alice)
    config = RunConfig(tracing_disabled=True)
    answers = [
        run(Runner.run(agent, text, session=session, run_config=config)).final_output
        for text in ("my name is Ada", "I live in Paris", "where do I live?")
    ]
    assert answers == [
        "my name is Ada",
        "my name is Ada | I live in Paris",
        "my name is Ada | I live in Paris | where do I live?",
    ]
    items = run(SecurepadSession("conversation", pad, alice).get_items())
    assert [item.get("role") for item in items] == ["user", "assistant"] * 3
    # Nothing of the conversation is on disk in clear.
    if pad.backend == "sqlite":
        assert b"Paris" not in pad.path.read_bytes()


# -- edits of the file -----------------------------------------------------------------------


@pytest.fixture
def stored(db_path: Path, keyring: Keyring, alice: Principal) -> Path:
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        run(SecurepadSession("s1", pad, alice).add_items([message(1), message(2), message(3)]))
        run(SecurepadSession("s2", pad, alice).add_items([message(9)]))
    return db_path


def _items(db_path: Path, keyring: Keyring, alice: Principal, session_id: str = "s1") -> Any:
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(db_path, keyring=keyring) as pad:
        return run(SecurepadSession(session_id, pad, alice).get_items())


def test_an_edited_small_item_is_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    """Small items live in the entry's listing part (its sealed metadata in rows written before it)."""
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(stored, keyring=keyring) as pad:
        s1 = SecurepadSession("s1", pad, alice).turn_id
    conn = apsw.Connection(str(stored))
    try:
        sql = "SELECT id, sealed_listing FROM entries WHERE turn_id = ? LIMIT 1"
        entry_id, sealed = next(conn.execute(sql, (s1,)))
    finally:
        conn.close()
    changed = bytearray(sealed)
    changed[len(changed) // 2] ^= 1
    assert edit_file(stored, "UPDATE entries SET sealed_listing = ? WHERE id = ?", bytes(changed), entry_id) == 1
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s1")


def test_an_edited_large_item_is_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    """Large items are the entry's content."""
    from securepad.integrations.openai_agents import SecurepadSession

    large = {"role": "user", "content": "L" * 10_000}
    with Scratchpad.open(stored, keyring=keyring) as pad:
        session = SecurepadSession("s3", pad, alice)
        run(session.add_items([large]))
        assert run(session.get_items()) == [large]
    # One segment: kept in the entry's row (migration 8).
    sql = "UPDATE entries SET only_segment = zeroblob(length(only_segment)) WHERE turn_id = ?"
    assert edit_file(stored, sql, session.turn_id) == 1
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s3")


def test_an_item_moved_to_another_session_is_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(stored, keyring=keyring) as pad:
        s2 = SecurepadSession("s2", pad, alice).turn_id
        s1 = SecurepadSession("s1", pad, alice).turn_id
    assert (
        edit_file(stored, "UPDATE entries SET turn_id = ?, step_num = 7 WHERE turn_id = ? AND step_num = 1", s2, s1)
        == 1
    )
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s2")


def test_reordered_items_are_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    edit_file(stored, "UPDATE entries SET step_num = CASE step_num WHEN 1 THEN 3 WHEN 3 THEN 1 ELSE step_num END")
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s1")


def test_an_item_given_to_another_owner_is_refused(
    stored: Path, keyring: Keyring, alice: Principal, bob: Principal
) -> None:
    """Turn names are keyed with the owner: alice's items relabelled to bob sit
    in turns that name none of bob's sessions (his "s1" is another turn);
    alice's session is refused and verify finds the rows."""
    from securepad.integrations.openai_agents import SecurepadSession

    edit_file(stored, "UPDATE entries SET owner_user_id = 'bob'")
    with Scratchpad.open(stored, keyring=keyring) as pad:
        assert run(SecurepadSession("s1", pad, bob).get_items()) == []
        with pytest.raises(IntegrityError):  # alice's session head still lists them
            run(SecurepadSession("s1", pad, alice).get_items())
        assert pad.verify()["ok"] is False


def test_a_deleted_newest_item_is_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    """Session truncation: the session's turn head lists every item,
    so an item deleted from the end of the file ends the read in IntegrityError."""
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(stored, keyring=keyring) as pad:
        s1 = SecurepadSession("s1", pad, alice).turn_id
    edit_file(stored, "DELETE FROM entries WHERE turn_id = ? AND step_num = 3", s1)
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s1")


def test_a_deleted_middle_item_is_refused(stored: Path, keyring: Keyring, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(stored, keyring=keyring) as pad:
        s1 = SecurepadSession("s1", pad, alice).turn_id
    assert edit_file(stored, "DELETE FROM entries WHERE turn_id = ? AND step_num = 2", s1) == 1
    with pytest.raises(IntegrityError):
        _items(stored, keyring, alice, "s1")


def test_rolling_the_file_back_is_refused(stored: Path, keyring: Keyring, alice: Principal, tmp_path: Path) -> None:
    """A popped item brought back by copying an older file over the store: the
    store's anchor (beside the key file) is above the copy's write counter."""
    from securepad.integrations.openai_agents import SecurepadSession

    with Scratchpad.open(stored, keyring=keyring) as pad:
        pad.gc()  # the WAL into the file, so that the copy is whole
    copy = tmp_path / "before.db"
    shutil.copy(stored, copy)
    with Scratchpad.open(stored, keyring=keyring) as pad:
        assert run(SecurepadSession("s1", pad, alice).pop_item()) == message(3)
    for suffix in ("-wal", "-shm"):
        Path(f"{stored}{suffix}").unlink(missing_ok=True)
    shutil.copy(copy, stored)
    with pytest.raises(IntegrityError, match="snapshot rollback"):
        _items(stored, keyring, alice, "s1")


def test_objects_on_one_session_never_share_a_position(store_location: Any, keyring: Keyring, alice: Principal) -> None:
    from securepad.integrations.openai_agents import SecurepadSession

    with (
        Scratchpad.open(store_location, keyring=keyring) as one,
        Scratchpad.open(store_location, keyring=keyring) as two,
    ):
        first, second = SecurepadSession("chat", one, alice), SecurepadSession("chat", two, alice)
        run(first.add_items([message(1)]))
        run(second.add_items([message(2)]))
        run(first.add_items([message(3)]))  # after the other object's item, not on it
        assert run(second.get_items()) == [message(1), message(2), message(3)]
        errors: list[Exception] = []

        def add(session: SecurepadSession, base: int) -> None:
            try:
                for n in range(base, base + 5):
                    run(session.add_items([message(n)]))
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=add, args=(s, base)) for s, base in ((first, 10), (second, 20))]
        for each in threads:
            each.start()
        for each in threads:
            each.join()
        assert errors == []
        items = [item["content"] for item in run(first.get_items())]
        assert sorted(items) == sorted(f"message {n}" for n in (1, 2, 3, *range(10, 15), *range(20, 25)))
        for base in (10, 20):  # each writer's items in its order
            assert [i for i in items if i[-2:].isdigit() and int(i[-2:]) // 10 == base // 10] == [
                f"message {n}" for n in range(base, base + 5)
            ]
        steps = [item["step_num"] for item in one.list_for_turn(alice, first.turn_id)]
        assert steps == list(range(1, 14))
