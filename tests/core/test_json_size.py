"""``core.json_size`` measures and checks as json does: ``item_size`` is
``len(json.dumps(value, ensure_ascii=False))``, ``classify``'s size of a dict's other
fields is ``len(shaping.dumps(rest))`` (or the same refusal), and
``checked_structure`` refuses what the plain walk of every item refuses, with
the same message, whatever mix of plain and other values a value holds."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from securepad import InvalidArgumentError
from securepad.core import shaping
from securepad.core.json_size import checked_structure, item_size, json_copy, plain_json


class Text(str):
    pass


class Number(int):
    pass


def walked(value: Any, max_depth: int) -> None:
    """The plain check: a stack of every item, each container's keys checked when it is popped."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > max_depth:
            raise InvalidArgumentError(
                f"the observation nests deeper than {max_depth} levels (the policy's limits.max_json_depth)"
            )
        if isinstance(item, dict):
            if any(not isinstance(k, str) for k in item):
                raise InvalidArgumentError("structured observations need string keys at every level")
            pending.extend((v, depth + 1) for v in item.values())
        else:
            pending.extend((v, depth + 1) for v in item)


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.text(alphabet='"\\\n\t\x00\x1f\x7f\u2028é😀,: ', max_size=12),
    st.builds(Text, st.text(max_size=4)),
    st.builds(Number, st.integers()),
)
keys = st.text(max_size=6) | st.builds(Text, st.text(max_size=3))
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=4)
        | st.dictionaries(keys, inner, max_size=3).map(collections.OrderedDict)
    ),
    max_leaves=20,
)
# Values the check refuses or json refuses: other keys, NaN, objects, lone surrogates.
odd = st.one_of(
    st.just(float("nan")),
    st.just(object()),
    st.just("\ud800"),
    st.dictionaries(st.integers() | st.none(), st.integers(), min_size=1, max_size=2),
)
any_values = st.recursive(
    leaves | odd,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys | st.integers(), inner, max_size=3),
    max_leaves=12,
)


@given(value=json_values)
def test_a_value_is_measured_as_json_writes_it(value: Any) -> None:
    assert item_size(value) == len(json.dumps(value, ensure_ascii=False))


@given(value=any_values, max_depth=st.integers(1, 5))
def test_the_check_refuses_what_the_plain_walk_refuses(value: Any, max_depth: int) -> None:
    try:
        walked(value, max_depth)
    except InvalidArgumentError as exc:
        with pytest.raises(InvalidArgumentError) as raised:
            checked_structure(value, max_depth)
        assert str(raised.value) == str(exc)
    else:
        checked_structure(value, max_depth)


@given(rest=st.dictionaries(keys, any_values, min_size=1, max_size=4))
def test_the_other_fields_are_sized_as_dumps_writes_them_or_refused_alike(rest: dict[str, Any]) -> None:
    observation = {"content": b"\x00", **rest}
    try:
        walked(rest, 64)
        expected: Any = len(shaping.dumps(rest))
    except (InvalidArgumentError, UnicodeEncodeError) as exc:
        with pytest.raises(type(exc)):
            shaping.classify(observation, 64)
        return
    assert shaping.classify(observation, 64)[4] == expected


@given(metadata=st.dictionaries(keys, json_values, max_size=4), other=st.none() | leaves)
def test_the_metadata_measured_with_the_other_fields_is_what_json_writes(metadata: Any, other: Any) -> None:
    observation = {"content": b"", "metadata": metadata}
    if other is not None:
        observation["status"] = other
    try:
        measured = shaping.classify(observation, 64)[5]
    except (InvalidArgumentError, UnicodeEncodeError):
        return
    if measured is not None:
        assert measured == len(json.dumps(metadata, ensure_ascii=False))
    else:  # measured by the view itself: another field beside it, or not plain
        assert other is not None or plain_json(metadata, checked_structure(metadata, 64)) is None


@given(
    metadata=st.dictionaries(keys, json_values, max_size=5),
    content=st.sampled_from([b"", b"\x01", "", "a text", "é" * 600]),
    limit=st.integers(40, 400),
)
def test_a_view_of_measured_metadata_is_the_view_measured_anew(metadata: Any, content: Any, limit: int) -> None:
    observation = {"content": content, "metadata": metadata}
    try:
        kind, _, content, rest, _, measured = shaping.classify(observation, 64)
    except (InvalidArgumentError, UnicodeEncodeError):
        return
    anew = shaping.view(kind, 3, 1, content, rest, observation, limit)
    assert shaping.view(kind, 3, 1, content, rest, observation, limit, metadata_size=measured) == anew
    fitted = {"ok": True, "scratchpad_id": "0" * 16, **anew}
    assert "view_cut" in anew or len(json.dumps(fitted, ensure_ascii=False)) <= limit


@given(value=any_values.filter(lambda v: "nan" not in repr(v)))
def test_a_value_is_copied_as_json_stores_it(value: Any) -> None:
    try:
        expected = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            json_copy(value)
        return
    copied = json_copy(value)
    assert copied == expected
    assert json.dumps(copied) == json.dumps(expected)  # the same types (a list stays a list, True stays True)
