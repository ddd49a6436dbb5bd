"""``AsyncScratchpad``/``AsyncTurn`` cannot drift from ``Scratchpad``/``Turn``:
every public method and attribute of the synchronous class has an async
counterpart of the same name, taking the same parameters (names, kinds,
defaults, annotations) and returning the same type."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from securepad import AsyncScratchpad, AsyncTurn, InvalidArgumentError, Keyring, Principal, Scratchpad, Turn
from securepad.aio import _derive, _Runner

# What the async classes add on purpose: the synchronous object underneath,
# the wrapper of a synchronous turn, record_next as a method, and the worker pool's size.
ASYNC_ONLY = {"sync", "wrap", "append", "max_workers"}
# Synchronous context-manager protocol: the async classes have __aenter__/__aexit__ instead.
SYNC_ONLY = {"__enter__", "__exit__"}


def _public(cls: type) -> dict[str, Any]:
    names = {name for name in dir(cls) if not name.startswith("_")}
    return {name: inspect.getattr_static(cls, name) for name in names}


def _instance_attributes(cls: type) -> set[str]:
    """Public attributes set in ``__init__`` (``self.x = ...``) or declared in ``__slots__``."""
    source = inspect.getsource(cls.__init__)
    found = {
        line.split("self.", 1)[1].split(" ", 1)[0] for line in source.splitlines() if "self." in line and " = " in line
    }
    found |= set(getattr(cls, "__slots__", ()))
    return {name.rstrip(":") for name in found if not name.startswith("_")}


def _parameters(func: Any, drop: set[str] = frozenset()) -> list[tuple[str, Any, Any, Any]]:
    signature = inspect.signature(func)
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in signature.parameters.values()
        if p.name != "self" and p.name not in drop and p.name != "cls"
    ]


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Scratchpad, AsyncScratchpad), (Turn, AsyncTurn)])
def test_every_public_name_has_its_async_counterpart(sync_cls: type, async_cls: type) -> None:
    sync_names = set(_public(sync_cls)) | _instance_attributes(sync_cls)
    async_names = set(_public(async_cls)) | _instance_attributes(async_cls)
    assert sync_names - SYNC_ONLY <= async_names, f"missing in {async_cls.__name__}: {sync_names - async_names}"
    assert async_names - sync_names <= ASYNC_ONLY, f"only in {async_cls.__name__}: {async_names - sync_names}"


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Scratchpad, AsyncScratchpad), (Turn, AsyncTurn)])
def test_every_method_takes_the_same_parameters(sync_cls: type, async_cls: type) -> None:
    for name, member in _public(sync_cls).items():
        if isinstance(member, property) or name in SYNC_ONLY:
            continue
        counterpart = inspect.getattr_static(async_cls, name)
        sync_func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        async_func = counterpart.__func__ if isinstance(counterpart, classmethod | staticmethod) else counterpart
        if not callable(sync_func):
            continue
        assert inspect.iscoroutinefunction(async_func), f"{async_cls.__name__}.{name} is not async"
        assert _parameters(sync_func) == _parameters(async_func, drop={"max_workers"}), name
        sync_return = inspect.signature(sync_func).return_annotation
        async_return = inspect.signature(async_func).return_annotation
        expected = {"Scratchpad": "AsyncScratchpad", "Turn": "AsyncTurn"}.get(sync_return, sync_return)
        assert async_return == expected, name


def test_properties_match() -> None:
    for sync_cls, async_cls in ((Scratchpad, AsyncScratchpad), (Turn, AsyncTurn)):
        for name, member in _public(sync_cls).items():
            if isinstance(member, property):
                counterpart = inspect.getattr_static(async_cls, name)
                assert isinstance(counterpart, property), f"{async_cls.__name__}.{name} is not a property"
                assert (
                    inspect.signature(member.fget).return_annotation  # type: ignore[arg-type]
                    == inspect.signature(counterpart.fget).return_annotation
                ), name


def test_the_key_lifecycle_and_the_location_work_from_asyncio(tmp_path: Path) -> None:
    alice = Principal("alice", "planner", "web")

    async def scenario() -> None:
        async with await AsyncScratchpad.open(tmp_path / "s.db", keyring=Keyring.from_key_file(tmp_path / "k")) as pad:
            assert pad.backend == "sqlite" and pad.location == str(pad.path) and len(pad.store_id) == 32
            entry = await pad.put(alice, "t", 1, "x", "text")
            rotated = await pad.rotate_owner_key("alice")
            assert rotated["complete"] and rotated["version"] == 2
            new = Keyring.from_key_file(tmp_path / "k2")
            assert (await pad.rotate_master_key(new))["owner_keys_rewrapped"] == 1
            assert pad.keyring is new
            assert (await pad.get(alice, entry["scratchpad_id"])).observation == "text"
            forgotten = await pad.forget_owner("alice")
            assert forgotten["entries"] == 1 and forgotten["owner_keys"] == 1
            with pytest.raises(InvalidArgumentError):
                await AsyncScratchpad.open(tmp_path / "o.db", keyring=new, schema="other")

    asyncio.run(scenario())


def test_a_method_added_to_a_sync_face_appears_on_its_async_face() -> None:
    class Sync:
        limit: int

        def __init__(self) -> None:
            self.limit = 3

        def scaled(self, value: int, *, twice: bool = False) -> int:
            """Value, doubled when asked."""
            return value * (2 if twice else 1)

        @staticmethod
        def name() -> str:
            return "sync"

    @_derive
    class Async:
        _sync_class = Sync

        def __init__(self) -> None:
            self._sync, self._run = Sync(), _Runner(None)

    derived = Async()
    assert inspect.signature(Async.scaled) == inspect.signature(Sync.scaled)
    assert Async.scaled.__doc__ == "Value, doubled when asked."
    assert inspect.iscoroutinefunction(Async.scaled)
    assert asyncio.run(derived.scaled(2, twice=True)) == 4  # type: ignore[attr-defined]
    assert asyncio.run(Async.name()) == "sync"  # type: ignore[attr-defined]
    assert derived.limit == 3  # type: ignore[attr-defined]
