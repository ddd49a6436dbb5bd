"""A write in two messages whose COMMIT's answer is lost (PostgreSQL).

A put, a batch, a step the library takes (``record_next``, ``put_next``,
``Turn.record_many``, the LangGraph saver's puts) sends its reads with BEGIN,
then its writes with COMMIT, unless it takes the one-message put (the turn's
head sealed last by this process; the tests make another process write
first). When the connection is lost after the COMMIT was sent, the client
cannot know whether it was applied. The write then runs
again under the same locks (so after that COMMIT, if it ran): it looks its
rows up by id and returns them if they are stored, or writes the same rows
once if not. When even that fails, the error is ``StoreUnavailableError``
naming the entries that may be stored. Faults come from
``tests.support.faults.FaultyProxy`` on 127.0.0.1, which drops the answer
to a COMMIT (the transaction applied) or the COMMIT itself (rolled back).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from securepad import Keyring, Scratchpad, StoreUnavailableError

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')")
if importlib.util.find_spec("langgraph") is None:  # found, not imported: the saver's tests import it
    pytest.skip("the saver's puts need langgraph", allow_module_level=True)

from securepad._steps import put_next  # noqa: E402
from securepad.store import parts  # noqa: E402
from securepad.turn import record_next  # noqa: E402
from tests.support.faults import FaultyProxy  # noqa: E402
from tests.support.principals import ALICE  # noqa: E402

if TYPE_CHECKING:
    from securepad.integrations.langgraph import SecurepadSaver

pytestmark = pytest.mark.xdist_group("langgraph")

TEXT = "".join(f"line {i}: {'x' * 60}\n" for i in range(60))  # ~4 KiB: one segment
LONG = TEXT * 40  # several segments: never one message
NAMED = re.compile(r"may be stored as entr(?:y|ies) ((?:'[^']+'(?:, )?)+)")


@pytest.fixture
def direct(pg_dsn: str, keyring: Keyring, faulty_pad: Scratchpad) -> Iterator[Scratchpad]:
    """The same store without the proxy: what is stored, as another process sees it."""
    with Scratchpad.open(pg_dsn, keyring=keyring) as pad:
        yield pad


def _named(exc: StoreUnavailableError) -> list[str]:
    """The entry ids an unknown outcome names ([] for none), in its message and in ``maybe_stored``."""
    found = NAMED.search(str(exc))
    named = re.findall(r"'([^']+)'", found.group(1)) if found else []
    assert list(exc.maybe_stored) == named, (exc.maybe_stored, str(exc))
    return named


def _observations(pad: Scratchpad, turn: str) -> list[Any]:
    return [pad.get(ALICE, e["scratchpad_id"]).observation for e in pad.list_for_turn(ALICE, turn)]


def _lose(proxy: FaultyProxy, how: str, *, every: int = 1, at_most: int | None = None) -> None:
    proxy.commits = proxy.lost = 0
    proxy.lose_commit, proxy.lose_every, proxy.lose_at_most = how, every, at_most


@pytest.mark.parametrize("how", ["reply", "request"])
def test_a_put_whose_commit_is_lost_is_stored_once_and_returned(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy, how: str
) -> None:
    """The answer lost (the put applied) or the COMMIT lost (rolled back): the
    put finds out by itself and returns its one entry."""
    _lose(proxy, how, at_most=1)
    view = faulty_pad.put(ALICE, "t", 1, "tool", "once")
    assert proxy.lost == 1
    listed = direct.list_for_turn(ALICE, "t")
    assert [e["scratchpad_id"] for e in listed] == [view["scratchpad_id"]]
    assert direct.verify()["ok"]


@pytest.mark.parametrize("how", ["reply", "request"])
def test_steps_the_library_takes_are_taken_once_when_a_commit_is_lost(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy, how: str
) -> None:
    """``record_next``, ``put_next`` and ``record_many`` each lose one COMMIT:
    each observation is stored once, at the step returned."""
    turn = faulty_pad.turn(ALICE, "t")  # (its start collects expired entries: a COMMIT of its own)
    _lose(proxy, how, at_most=1)
    first, _ = record_next(turn, "tool", "a")
    _lose(proxy, how, at_most=1)
    second = put_next(faulty_pad, ALICE, "t", "tool", "b")
    _lose(proxy, how, at_most=1)
    rest = turn.record_many([("tool", "c"), ("tool", "d")])
    assert (first, second["step_num"]) == (1, 2)
    assert rest == ["c", "d"]  # what the model is shown of each
    assert _observations(direct, "t") == ["a", "b", "c", "d"]


def test_every_commit_lost_names_the_entries_that_may_be_stored(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy
) -> None:
    """No COMMIT's answer ever arrives: the batch (steps the library takes)
    raises StoreUnavailableError naming its entries, which are stored once."""
    faulty_pad.put(ALICE, "first", 1, "tool", "the owner's key is made")  # (its own COMMIT would be lost too)
    turn = faulty_pad.turn(ALICE, "t")
    _lose(proxy, "reply")
    with pytest.raises(StoreUnavailableError) as exc:
        turn.record_many([("tool", "c"), ("tool", "d")])
    assert "a second write would store it twice" in str(exc.value)
    named = _named(exc.value)
    assert len(named) == 2
    proxy.heal()
    assert sorted(e["scratchpad_id"] for e in direct.list_for_turn(ALICE, "t")) == sorted(named)

    _lose(proxy, "reply")
    with pytest.raises(StoreUnavailableError) as exc:
        faulty_pad.put(ALICE, "p", 1, "tool", "given step")
    assert "putting the same step again is refused" in str(exc.value)
    (entry,) = _named(exc.value)
    proxy.heal()
    assert direct.get(ALICE, entry).observation == "given step"


def test_a_dropped_commit_that_cannot_be_looked_up_names_entries_none_of_which_is_stored(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy
) -> None:
    """Every COMMIT dropped before the server sees it: the error names the
    entry that may be stored; it is not, and a retry stores it once."""
    faulty_pad.put(ALICE, "first", 1, "tool", "the owner's key is made")
    _lose(proxy, "request")
    with pytest.raises(StoreUnavailableError) as exc:
        put_next(faulty_pad, ALICE, "t", "tool", "x")
    assert len(_named(exc.value)) == 1
    proxy.heal()
    assert direct.list_for_turn(ALICE, "t") == []
    assert direct.get(ALICE, put_next(faulty_pad, ALICE, "t", "tool", "x")["scratchpad_id"]).observation == "x"


def _thread_turn(saver: SecurepadSaver) -> str:
    """The turn that holds thread "th"'s checkpoints (its keyed name)."""
    return saver.records.turn(ALICE, "thread", "th")


def _writes(pad: Scratchpad, saver: SecurepadSaver) -> Iterator[tuple[str, Callable[[], list[str]], list[str]]]:
    """Logical writes of every kind that takes two messages: (turn, the write
    returning its entries' ids, the markers of its observations)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    many, following = pad.turn(ALICE, "rm"), pad.turn(ALICE, "rn")
    for n in range(4):

        def saver_put(n: int = n) -> list[str]:
            saver.put({"configurable": {"thread_id": "th", "checkpoint_ns": ""}}, generate_checkpoint(), {}, {})
            return []

        yield f"p{n}", lambda n=n: [pad.put(ALICE, f"p{n}", 1, "tool", f"put {n}")["scratchpad_id"]], [f"put {n}"]
        yield (
            "long",
            lambda n=n: [pad.put(ALICE, "long", 10 + n, "tool", f"long {n}" + LONG)["scratchpad_id"]],
            [f"long {n}"],
        )
        yield (
            f"m{n}",
            lambda n=n: [
                v["scratchpad_id"] for v in pad.put_many(ALICE, f"m{n}", [(1, "t", f"m{n}a"), (2, "t", f"m{n}b")])
            ],
            [f"m{n}a", f"m{n}b"],
        )
        yield (
            "rm",
            lambda n=n: many.record_many([("t", f"rm{n}a"), ("t", f"rm{n}b")]) and [],
            [f"rm{n}a", f"rm{n}b"],
        )
        yield "rn", lambda n=n: record_next(following, "tool", f"rn{n}") and [], [f"rn{n}"]
        yield "pn", lambda n=n: [put_next(pad, ALICE, "pn", "tool", f"pn{n}")["scratchpad_id"]], [f"pn{n}"]
        yield _thread_turn(saver), saver_put, [f"checkpoint {n}"]


@pytest.mark.parametrize("how", ["reply", "request"])
def test_writes_with_every_third_commit_lost_are_each_stored_once(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy, how: str
) -> None:
    """Every third COMMIT lost, over writes of every kind, each retried as a
    caller would (only when none of the entries its error names is stored):
    every unknown outcome is named, and no observation is stored twice."""
    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(faulty_pad, ALICE)
    writes = _writes(faulty_pad, saver)
    first = next(writes)  # the turns the writes use are started before the faults
    _lose(proxy, how, every=3)
    turns: dict[str, list[str]] = {}
    unknown = 0
    for turn, write, markers in itertools.chain([first], writes):
        turns.setdefault(turn, []).extend(markers)
        for _ in range(10):
            try:
                write()
                break
            except StoreUnavailableError as exc:
                unknown += 1
                named = _named(exc)
                assert named, exc  # an unknown outcome names its entries
                if _stored(direct, named):
                    break  # it was stored: a caller that looked does not write it again
        else:
            raise AssertionError(f"{markers} never stored")
    proxy.heal()
    assert proxy.lost >= 10
    for turn, markers in turns.items():
        found = _observations(direct, turn)
        if turn == _thread_turn(saver):
            assert len(found) == len(markers), (turn, len(found))  # one checkpoint entry per put
            continue
        for marker in markers:
            assert sum(text in (marker, marker + LONG) for text in found) == 1, (marker, len(found))
    assert direct.verify()["ok"]
    assert unknown <= proxy.lost


def _stored(pad: Scratchpad, ids: list[str]) -> bool:
    """Whether any of ``ids`` is stored."""
    for entry in ids:
        try:
            pad.get(ALICE, entry)
            return True
        except Exception:
            continue
    return False


@pytest.mark.parametrize("how", ["reply", "request"])
def test_a_checkpoint_whose_commit_is_lost_is_stored_once(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy, pg_dsn: str, how: str
) -> None:
    """A turn record (checkpoint) goes through the same look-up: stored once, returned."""
    turn = faulty_pad.turn(ALICE, "t")
    turn.checkpoint(facts=["first"])
    _lose(proxy, how, at_most=1)
    saved = turn.checkpoint(facts=["second"])
    assert proxy.lost == 1
    assert _checkpoints(pg_dsn) == 2
    assert saved == direct.turn(ALICE, "t").latest_checkpoint()


def test_a_checkpoint_whose_every_commit_is_lost_says_it_may_be_stored(
    faulty_pad: Scratchpad, proxy: FaultyProxy, pg_dsn: str
) -> None:
    turn = faulty_pad.turn(ALICE, "t")
    turn.checkpoint(facts=["first"])
    _lose(proxy, "reply")
    with pytest.raises(StoreUnavailableError, match="may hold it as its newest checkpoint"):
        turn.checkpoint(facts=["second"])
    proxy.heal()
    assert _checkpoints(pg_dsn) == 2


def _checkpoints(dsn: str) -> int:
    """The checkpoint rows stored (as the server's superuser: every owner's)."""
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM securepad.checkpoints").fetchone()[0])


@pytest.mark.parametrize("how", ["reply", "request"])
def test_the_langgraph_savers_put_whose_commit_is_lost_stores_its_checkpoint_once(
    faulty_pad: Scratchpad, direct: Scratchpad, proxy: FaultyProxy, how: str
) -> None:
    """The saver's ``put`` (an entry at the thread's next step) loses its
    COMMIT: it returns, and the thread holds that checkpoint once."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    from securepad.integrations.langgraph import SecurepadSaver

    saver = SecurepadSaver(faulty_pad, ALICE)
    config = {"configurable": {"thread_id": "th", "checkpoint_ns": ""}}
    saver.put(config, generate_checkpoint(), {}, {})  # the owner's key and the thread's turn exist
    # Another process writes the turn: the next put reads its head, in two messages (one would have no COMMIT).
    SecurepadSaver(direct, ALICE).put(config, generate_checkpoint(), {}, {})
    _lose(proxy, how, at_most=1)
    checkpoint = generate_checkpoint()
    stored = saver.put(config, checkpoint, {}, {})
    assert proxy.lost == 1
    assert stored["configurable"]["checkpoint_id"] == checkpoint["id"]
    assert len(direct.list_for_turn(ALICE, _thread_turn(saver))) == 3
    listed = [c.config["configurable"]["checkpoint_id"] for c in SecurepadSaver(direct, ALICE).list(config)]
    assert listed.count(checkpoint["id"]) == 1


def _wrap_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT COALESCE(sum(wrap_count), 0) FROM securepad.owner_keys").fetchone()[0])


def test_a_message_with_commit_whose_answer_is_lost_is_never_sent_again(
    faulty_pad: Scratchpad, proxy: FaultyProxy, pg_dsn: str
) -> None:
    """A transaction that only writes goes as one message, COMMIT included
    (the key-use counts at close): its answer lost, it is not run again on
    another connection, which would apply it twice."""
    faulty_pad.put(ALICE, "t", 1, "tool", "a")
    keys = parts(faulty_pad).keys
    pending = sum(keys.pending_wraps().values())
    before = _wrap_count(pg_dsn)
    _lose(proxy, "reply", at_most=1)
    with pytest.raises(StoreUnavailableError, match="may or may not have been applied"):
        keys.flush_wraps()
    assert proxy.lost == 1
    assert _wrap_count(pg_dsn) == before + pending  # applied once


def test_a_connection_that_died_while_idle_is_replaced_before_a_message_with_commit(
    faulty_pad: Scratchpad, proxy: FaultyProxy, pg_dsn: str
) -> None:
    """Every session ended while idle (a restart): the one message with
    COMMIT goes out on a live connection, once."""
    faulty_pad.put(ALICE, "t", 1, "tool", "a")
    keys = parts(faulty_pad).keys
    pending = sum(keys.pending_wraps().values())
    before = _wrap_count(pg_dsn)
    proxy.drop_all()
    keys.flush_wraps()
    assert _wrap_count(pg_dsn) == before + pending
