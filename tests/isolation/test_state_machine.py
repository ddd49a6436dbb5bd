"""Isolation as a state machine: several owners, actors and channels put, read,
get, list, delete, gc and let time pass, while a model tracks what exists.

The invariant: a principal sees exactly the live entries its policy scope
allows; every other attempt (another owner's id, one outside the scope, an
expired one of another owner, a forged, guessed or malformed id) raises
exactly ``NotFoundError`` with the message an absent id gets. The owner's
own expired entry raises ``ExpiredError``. Run against every policy file in
``policies/``.

On PostgreSQL each policy's store lives in a schema of its own, made by the
first example and lent to the next ones while it proves pristine after each
(``tests.support.pristine``: the catalog, the identity rows and every
table's rows as when it was made, owners' tables emptied); else it is dropped
and the next example makes a new one.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from securepad import ExpiredError, InvalidArgumentError, Keyring, NotFoundError, Principal, Scratchpad
from securepad.core import read_modes
from securepad.policy import NOT_FOUND_MESSAGE
from tests.support.pristine import PristineStore

pytestmark = pytest.mark.slow

POLICIES = sorted((Path(__file__).resolve().parents[2] / "policies").glob("*.toml"))

# Owner ids include SQL fragments, a wildcard, a case variant and non-ASCII:
# each must be a tenant of its own, nothing more.
OWNERS = ("alice", "Alice", "bob", "x' OR '1'='1", "ünï")
ACTORS = ("planner", "coder")
CHANNELS = ("web", "slack")
TURNS = ("t1", "t2", "t1' OR '1'='1")
# The runtime surface (turn.py): its rules run when the store has it.
HAS_TURN = hasattr(Scratchpad, "turn")
SCOPE_FIELDS = {"owner": (), "owner+channel": ("channel",), "owner+channel+actor": ("channel", "actor")}

MALFORMED: tuple[object, ...] = (
    "",
    "x" * 100_000,
    "' OR '1'='1",
    "0123456789abcde' --",
    "%",
    "_" * 16,
    "\x00" * 16,
    "0123456789abcdef\x00",
    "0123456789ABCDEF",
    "\u0660" * 16,
    "\ud800" * 16,
    "\uff46" * 16,  # fullwidth f
    None,
    12345,
    b"0123456789abcdef",
    ["0123456789abcdef"],
)

principals = st.builds(Principal, st.sampled_from(OWNERS), st.sampled_from(ACTORS), st.sampled_from(CHANNELS))
observations = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=80),
    st.binary(max_size=120),
    st.dictionaries(st.sampled_from(["items", "total", "note"]), st.lists(st.integers(), max_size=4), max_size=3),
    st.builds(
        lambda s, n: {"content": s * n, "metadata": {"path": "/log"}},
        st.sampled_from(["ab\n", "é"]),
        st.integers(1, 40),
    ),
    # rarely, content over one 64 KiB segment
    st.just("0123456789\n" * 7_000),
)
guessed_ids = st.from_regex(r"[0-9a-f]{16}", fullmatch=True)
odd_ids = st.one_of(st.sampled_from(MALFORMED), st.text(max_size=24), guessed_ids)
steps = st.sampled_from([1.0, 10.0, 0.5, 120.0, 1_000.0])
# How a reader relates to the writer of the entry it asks for.
RELATIONS = ("writer", "writer", "another channel", "another actor", "another owner", "another owner", "anyone")


def other(values: tuple[str, ...], value: str, data: st.DataObject) -> str:
    return data.draw(st.sampled_from([v for v in values if v != value]))


@dataclass
class Stored:
    writer: Principal
    turn: str
    step: int
    observation: Any
    size: int
    expires_at: float


def visible(scope: str, reader: Principal, writer: Principal) -> bool:
    """The scope rule, written out independently of the library."""
    if reader.owner_user_id != writer.owner_user_id:
        return False
    return all(getattr(reader, f) == getattr(writer, f) for f in SCOPE_FIELDS[scope])


def readable_text(observation: Any) -> str | bytes | None:
    """What head/tail/range/full slice, when the test can say without the library."""
    if isinstance(observation, str | bytes):
        return observation
    if isinstance(observation, dict) and isinstance(observation.get("content"), str):
        content: str = observation["content"]
        return content
    return None


def reads_as_id(value: str) -> bool:
    return len(value) == 16 and all(c in "0123456789abcdef" for c in value)


def read_arguments(mode: str, data: st.DataObject) -> dict[str, Any]:
    """Arguments for ``mode``; modes this test does not know get none."""
    small = st.integers(0, 200)
    if mode in ("head", "tail"):
        return {"n": data.draw(small)}
    if mode in ("range", "lines"):
        start = data.draw(small if mode == "range" else st.integers(1, 20))
        return {"start": start, "end": start + data.draw(small)}
    if mode == "grep":
        return {"pattern": data.draw(st.sampled_from(["a", "^0", "é", "[0-9]+"]))}
    return {}


class IsolationMachine(RuleBasedStateMachine):
    policy_path: Path
    kept: PristineStore | None = None  # the store kept between examples on PostgreSQL, or None for SQLite

    ids = Bundle("ids")
    # Mostly ids that exist or existed (any owner's), sometimes odd ones.
    any_ids = st.one_of(ids, ids, ids, odd_ids)

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="securepad-isolation-"))
        self.now = 1_000_000.0
        # On PostgreSQL, the kept store, or a new one in its schema.
        key_file = self.dir / "config" / "key"
        lent = self.kept is not None and self.kept.place_key(key_file)
        where: Any = self.dir / "data" / "store.db" if self.kept is None else self.kept.dsn
        self.pad = Scratchpad.open(
            where,
            keyring=Keyring.from_key_file(key_file),
            policy=self.policy_path,
            clock=lambda: self.now,
            **({} if self.kept is None else {"schema": self.kept.schema}),
        )
        if self.kept is not None and not lent:
            self.kept.adopt(key_file)
        self.scope = self.pad.policy.scope
        self.model: dict[str, Stored] = {}
        self.step = 0
        # Whether the store may have changed since the invariant last held: a
        # read, get, listing or refused call changes nothing a count can see.
        self.changed = True

    def teardown(self) -> None:
        self.pad.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.kept is not None:
            self.kept.give_back()

    # -- expectations ---------------------------------------------------------------------

    def state(self, reader: Principal, entry_id: object) -> str:
        """``live``, ``expired`` (the reader's own, in scope) or ``absent`` (anything else)."""
        stored = self.model.get(entry_id) if isinstance(entry_id, str) else None
        if stored is None or not visible(self.scope, reader, stored.writer):
            return "absent"
        return "live" if stored.expires_at > self.now else "expired"

    def refused(self, state: str, call: Any, *args: Any, **kwargs: Any) -> None:
        """The call must fail as ``state`` says: ExpiredError, or exactly the absent id's NotFoundError."""
        if state == "expired":
            with pytest.raises(ExpiredError):
                call(*args, **kwargs)
            return
        with pytest.raises(NotFoundError) as caught:
            call(*args, **kwargs)
        assert type(caught.value) is NotFoundError, caught.value
        assert str(caught.value) == NOT_FOUND_MESSAGE

    def other_owner(self, reader: Principal, entry_id: object) -> bool:
        stored = self.model.get(entry_id) if isinstance(entry_id, str) else None
        return stored is not None and stored.writer.owner_user_id != reader.owner_user_id

    def reader_for(self, entry_id: object, data: st.DataObject) -> Principal:
        """A reader related to the entry's writer: itself, the same owner on another
        channel or as another actor, another owner with the same actor and channel, anyone."""
        stored = self.model.get(entry_id) if isinstance(entry_id, str) else None
        relation = data.draw(st.sampled_from(RELATIONS))
        if stored is None or relation == "anyone":
            return data.draw(principals)
        w = stored.writer
        if relation == "another channel":
            return Principal(w.owner_user_id, w.actor, other(CHANNELS, w.channel, data))
        if relation == "another actor":
            return Principal(w.owner_user_id, other(ACTORS, w.actor, data), w.channel)
        if relation == "another owner":
            return Principal(other(OWNERS, w.owner_user_id, data), w.actor, w.channel)
        return w

    def live_for(self, reader: Principal, turn: str | None = None) -> dict[str, Stored]:
        return {
            entry_id: stored
            for entry_id, stored in self.model.items()
            if self.state(reader, entry_id) == "live" and (turn is None or stored.turn == turn)
        }

    # -- rules ----------------------------------------------------------------------------

    @initialize(target=ids, writers=st.lists(principals, min_size=2, max_size=4), turn=st.sampled_from(TURNS))
    def first_entries(self, writers: list[Principal], turn: str) -> Any:
        """A few entries of different writers in one turn, so that every run has neighbours to attack."""
        return multiple(*(self.put(writer, turn, f"observation {i}", None) for i, writer in enumerate(writers)))

    @rule(
        target=ids,
        writer=principals,
        turn=st.sampled_from(TURNS),
        observation=observations,
        ttl=st.sampled_from([None, 600, 1, 60, 3_600]),
    )
    def put(self, writer: Principal, turn: str, observation: Any, ttl: int | None) -> str:
        self.step += 1
        self.changed = True
        view = self.pad.put(writer, turn, self.step, "tool", observation, ttl)
        entry_id: str = view["scratchpad_id"]
        lifetime = ttl if ttl is not None else self.pad.policy.default_ttl_seconds
        self.model[entry_id] = Stored(writer, turn, self.step, observation, view["size_bytes"], self.now + lifetime)
        return entry_id

    @rule(seconds=steps)
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.changed = True

    @rule(entry_id=any_ids, data=st.data())
    def get(self, entry_id: Any, data: st.DataObject) -> None:
        reader = self.reader_for(entry_id, data)
        state = self.state(reader, entry_id)
        event(f"get: {state}{' (another owner)' if self.other_owner(reader, entry_id) else ''}")
        if state == "live":
            entry = self.pad.get(reader, entry_id)
            assert entry.observation == self.model[entry_id].observation
            assert entry.owner_user_id == reader.owner_user_id
        else:
            self.refused(state, self.pad.get, reader, entry_id)

    @rule(entry_id=any_ids, mode=st.sampled_from(read_modes.MODES), data=st.data())
    def read(self, entry_id: Any, mode: str, data: st.DataObject) -> None:
        reader = self.reader_for(entry_id, data)
        args = read_arguments(mode, data)
        state = self.state(reader, entry_id)
        event(f"read: {state}{' (another owner)' if self.other_owner(reader, entry_id) else ''}")
        if state != "live":
            self.refused(state, self.pad.read, reader, entry_id, mode=mode, **args)
            return
        stored = self.model[entry_id]
        try:
            result = self.pad.read(reader, entry_id, mode=mode, **args)
        except InvalidArgumentError:
            # Line modes do not apply to binary content; nothing else may refuse these arguments.
            assert isinstance(stored.observation, bytes) and mode not in ("head", "tail", "range", "full")
            return
        assert result["ok"] is True
        assert result["metadata"]["size_returned"] <= self.pad.policy.max_read_chars
        whole = readable_text(stored.observation)
        if whole is None or mode not in ("head", "tail", "range", "full"):
            return
        cap = self.pad.policy.max_read_chars
        n = args.get("n", 0)
        expected = {
            "head": whole[:n],
            "tail": whole[max(0, len(whole) - n) :],
            "range": whole[args.get("start", 0) : args.get("end")],
            "full": whole,
        }[mode]
        if len(expected) > (cap // 4 * 3 if isinstance(whole, bytes) else cap):
            return  # capped: the cap itself is checked above
        content = base64.b64decode(result["content"]) if isinstance(whole, bytes) else result["content"]
        assert content == expected

    @rule(entry_id=ids, data=st.data())
    def list_turn(self, entry_id: str, data: st.DataObject) -> None:
        """List the turn of an entry (or a look-alike turn id) as a reader related to its writer."""
        reader = self.reader_for(entry_id, data)
        stored = self.model.get(entry_id)
        turn = data.draw(st.sampled_from((stored.turn if stored else "t1", "t2", "%", "T1", "t1' OR '1'='1")))
        listed = self.pad.list_for_turn(reader, turn)
        event(f"list: {'empty' if not listed else 'entries'}")
        assert {item["scratchpad_id"] for item in listed} == set(self.live_for(reader, turn))

    @rule(entry_id=any_ids, data=st.data())
    def delete(self, entry_id: Any, data: st.DataObject) -> None:
        reader = self.reader_for(entry_id, data)
        event(f"delete: {self.state(reader, entry_id)}")
        if self.state(reader, entry_id) == "absent":
            self.refused("absent", self.pad.delete, reader, entry_id)
            return
        self.pad.delete(reader, entry_id)
        self.changed = True
        del self.model[entry_id]

    @rule()
    def gc(self) -> None:
        assert self.pad.gc() == len(self.collect())

    def collect(self) -> list[str]:
        """What gc deletes, removed from the model."""
        expired = [entry_id for entry_id, stored in self.model.items() if stored.expires_at <= self.now]
        self.changed = self.changed or bool(expired)
        for entry_id in expired:
            del self.model[entry_id]
        return expired

    # -- the runtime surface --------------------------------------------------------------

    def turn_for(self, entry_id: object, data: st.DataObject) -> tuple[Principal, str, Any]:
        """A reader related to the entry's writer, a turn id (mostly the entry's), and
        that reader's turn; beginning a turn collects expired entries, as gc does."""
        reader = self.reader_for(entry_id, data)
        stored = self.model.get(entry_id) if isinstance(entry_id, str) else None
        turn_id = data.draw(st.sampled_from((stored.turn if stored else "t1", *TURNS)))
        self.collect()
        return reader, turn_id, self.pad.turn(reader, turn_id)  # type: ignore[attr-defined]

    @precondition(lambda self: HAS_TURN)
    @rule(entry_id=ids, data=st.data())
    def resolve(self, entry_id: str, data: st.DataObject) -> None:
        """{{stepN}} resolves exactly when step N is a live entry of this turn the reader may see."""
        stored = self.model.get(entry_id)
        step = stored.step if stored else data.draw(st.integers(0, self.step + 1))
        reader, turn_id, turn = self.turn_for(entry_id, data)
        found = [
            s for i, s in self.model.items() if s.step == step and s.turn == turn_id and self.state(reader, i) == "live"
        ]
        event(f"resolve: {'allowed' if found else 'refused'}")
        reference = data.draw(st.sampled_from([f"{{{{step{step}}}}}", f"${{step{step}}}", f"x {{{{step{step}}}}}"]))
        embedded = reference.startswith("x ")
        if found and not (embedded and isinstance(found[0].observation, bytes)):
            value = turn.resolve(reference)
            if embedded:
                assert isinstance(value, str) and value.startswith("x ")
            else:
                assert value == found[0].observation
            return
        with pytest.raises(InvalidArgumentError) as caught:
            turn.resolve(reference)
        if not found:
            assert f"unknown step {step} " in str(caught.value)

    @precondition(lambda self: HAS_TURN)
    @rule(entry_id=any_ids, mode=st.sampled_from(read_modes.MODES), data=st.data())
    def call_tool(self, entry_id: Any, mode: str, data: st.DataObject) -> None:
        """The scratchpad_read tool reads only live entries of its own turn and scope."""
        reader, turn_id, turn = self.turn_for(entry_id, data)
        stored = self.model.get(entry_id) if isinstance(entry_id, str) else None
        state = self.state(reader, entry_id)
        if stored is not None and stored.turn != turn_id:
            state = "absent"
        event(f"call_tool: {state}")
        arguments = {"scratchpad_id": entry_id, "mode": mode, **read_arguments(mode, data)}
        result = turn.call_tool("scratchpad_read", arguments)
        if state == "live":
            assert result["ok"] is True or (isinstance(stored.observation, bytes) and mode in ("lines", "grep"))
            return
        assert result["ok"] is False
        if state == "absent" and isinstance(entry_id, str) and reads_as_id(entry_id):
            ghost = turn.call_tool("scratchpad_read", {**arguments, "scratchpad_id": "0" * 16})
            assert result["error"].replace(entry_id, "<id>") == ghost["error"].replace("0" * 16, "<id>")

    # -- invariant ------------------------------------------------------------------------

    @invariant()
    def stats_count_exactly_the_scope(self) -> None:
        if not self.changed:
            return
        self.changed = False
        for owner in OWNERS:
            for actor in ACTORS:
                for channel in CHANNELS:
                    reader = Principal(owner, actor, channel)
                    live = self.live_for(reader)
                    stats = self.pad.stats(reader)
                    assert (stats["entries"], stats["bytes"]) == (len(live), sum(s.size for s in live.values()))


# Examples of 50 steps per policy and backend: the same rules and invariant on
# both; fewer on PostgreSQL, where every call and each of the invariant's 20
# stats is a round trip to the server. SECUREPAD_ISOLATION_EXAMPLES sets one
# figure for both, for a deeper run.
EXAMPLES = {"sqlite": 25, "postgresql": 12}
if os.environ.get("SECUREPAD_ISOLATION_EXAMPLES"):
    EXAMPLES = dict.fromkeys(EXAMPLES, int(os.environ["SECUREPAD_ISOLATION_EXAMPLES"]))


@pytest.mark.parametrize("policy_path", POLICIES, ids=lambda p: p.stem)
def test_isolation_state_machine(policy_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    kept = None
    if backend == "postgresql":
        schema = "isolation_" + re.sub(r"\W", "_", policy_path.stem.lower())
        kept = PristineStore(request.getfixturevalue("pg_database"), schema)
    machine = type(f"Isolation_{policy_path.stem}", (IsolationMachine,), {"policy_path": policy_path, "kept": kept})
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        if kept is not None:
            kept.close()


def test_every_policy_file_is_exercised() -> None:
    assert {p.stem for p in POLICIES} >= {"default", "channel", "strict"}
