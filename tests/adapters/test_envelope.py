"""The canonical envelope decoder: the bare-fragment fast path agrees with the general one."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.adapters.envelope import (
    bare_fragment,
    chunk_from_envelope,
    decode_envelope,
    parse_envelope,
)
from worker.errors import InputFormatError
from worker.model import Chunk, ChunkKind, Trace

MIDDLE = {
    "stream_id": "r1",
    "call_id": "c1",
    "seq": 3,
    "kind": "tool_call",
    "delta": '"Oslo"',
    "final": False,
}

# values valid and invalid for every field, so both paths meet every kind of field
ANY_VALUE = st.sampled_from(
    ["", "r1", "tool_call", "text", "end", 0, 1, -1, 2**70, 1.0, True, False, None, [], {}]
)


def test_a_middle_envelope_is_a_bare_fragment() -> None:
    assert bare_fragment(MIDDLE) == ("r1", "c1", 3, '"Oslo"', False)
    assert bare_fragment({**MIDDLE, "seq": None, "final": True}) == (
        "r1",
        "c1",
        None,
        '"Oslo"',
        True,
    )


@pytest.mark.parametrize(
    "obj",
    [
        {**MIDDLE, "tool": "get_weather"},  # a seventh field: the general path reads it
        {k: v for k, v in MIDDLE.items() if k != "final"},
        {**{k: v for k, v in MIDDLE.items() if k != "final"}, "tool": None},
        {**MIDDLE, "kind": "text"},
        {**MIDDLE, "seq": -1},
        {**MIDDLE, "seq": True},
        {**MIDDLE, "delta": None},
        {**MIDDLE, "final": 1},
        {**MIDDLE, "call_id": ""},
        {**MIDDLE, "stream_id": 7},
    ],
)
def test_anything_else_takes_the_general_path(obj: dict[str, Any]) -> None:
    assert bare_fragment(obj) is None


DROP = object()


@settings(max_examples=400, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from([*MIDDLE, "tool"]), ANY_VALUE | st.just(DROP), max_size=3
    )
)
def test_a_bare_fragment_is_what_the_general_path_decodes(changes: dict[str, Any]) -> None:
    obj = {**MIDDLE, **changes}
    obj = {name: value for name, value in obj.items() if value is not DROP}
    fragment = bare_fragment(obj)
    try:
        general = chunk_from_envelope(obj)
    except InputFormatError:
        assert fragment is None
        return
    if fragment is not None:
        stream_id, call_id, seq, delta, final = fragment
        assert general == Chunk(
            stream_id, ChunkKind.TOOL_CALL, call_id=call_id, seq=seq, delta=delta, final=final
        )


def test_decode_envelope_takes_the_fast_path_unless_a_traceparent_is_given() -> None:
    bare = Chunk("r1", ChunkKind.TOOL_CALL, call_id="c1", seq=3, delta='"Oslo"', final=False)
    assert decode_envelope(orjson.dumps(MIDDLE)) == bare
    traced = decode_envelope(orjson.dumps(MIDDLE), traceparent="tp")
    assert traced == Chunk(
        "r1",
        ChunkKind.TOOL_CALL,
        call_id="c1",
        seq=3,
        delta='"Oslo"',
        final=False,
        trace=Trace(traceparent="tp"),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"{not json", "record is not JSON"),
        (b"[1, 2]", "envelope must be a JSON object"),
        (b'"text"', "envelope must be a JSON object"),
    ],
)
def test_a_record_that_is_no_json_object_is_named(value: bytes, message: str) -> None:
    with pytest.raises(InputFormatError, match=message):
        parse_envelope(value)


def test_parse_envelope_returns_the_object() -> None:
    assert parse_envelope(orjson.dumps(MIDDLE)) == MIDDLE
