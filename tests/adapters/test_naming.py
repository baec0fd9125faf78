"""One naming of the calls of a vendor stream (`worker.adapters.naming`, README "How a vendor
stream's calls are named"): injective, whatever ids the vendor sends.

A vendor's ids are its own text: one may equal an id callgate derives (`<stream>#refusal`, a
choice's `x#1`, an id-less call's `<stream>#0#0`, or the `:`-forms these once had). The class
test streams every vendor format with ids drawn from that namespace, mixed with refusals, a
vendor error and several choices or candidates, and finds each call ended exactly as it ends in
the same stream under ids that name nothing else: never merged with another, never
`stream_corrupt` because of its name, every call id of the stream distinct.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.oracles import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    RESPONSES,
    assemble,
    encode,
)
from tests.reference.vendor import (
    approval_call,
    error_call,
    named_call,
    refusal_call,
    unnamed_call,
)
from worker._native import AssembledCall
from worker.adapters import naming

Event = dict[str, Any]

# -- the rule -----------------------------------------------------------------------------------

_TEXT = st.text(alphabet="ab#:01", max_size=6)
_OUTPUT = st.integers(min_value=0, max_value=12)
#: what a call id names: (kind, the vendor's id or the stream's, output, position)
_NAMED = st.one_of(
    st.tuples(st.just("vendor"), _TEXT.filter(bool), _OUTPUT, st.just(0)),
    st.tuples(st.just("unnamed"), _TEXT, _OUTPUT, _OUTPUT),
    st.tuples(st.just("refusal"), _TEXT, _OUTPUT, st.just(0)),
    st.tuples(st.just("error"), _TEXT, st.just(0), st.just(0)),
    st.tuples(st.just("approval"), _TEXT.filter(bool), st.just(0), st.just(0)),
)


def _name(named: tuple[str, str, int, int]) -> str:
    kind, base, output, position = named
    if kind == "vendor":
        return naming.vendor_call(base, output)
    if kind == "unnamed":
        return naming.unnamed_call(base, output, position)
    if kind == "refusal":
        return naming.refusal(base, output)
    if kind == "approval":
        return naming.approval_request(base)
    return naming.error(base)


def _readme(named: tuple[str, str, int, int]) -> str:
    """The same, as the README states it (the reference judge's reading)."""
    kind, base, output, position = named
    if kind == "vendor":
        return named_call(base, output)
    if kind == "unnamed":
        return unnamed_call(base, output, position)
    if kind == "refusal":
        return refusal_call(base, output)
    if kind == "approval":
        return approval_call(base)
    return error_call(base)


@given(_NAMED, _NAMED)
def test_two_things_get_one_id_only_when_they_are_one(
    a: tuple[str, str, int, int], b: tuple[str, str, int, int]
) -> None:
    assert (_name(a) == _name(b)) == (a == b)
    assert (_name(a), _name(b)) == (_readme(a), _readme(b))


@given(st.text(min_size=1).filter(lambda text: naming.MARK not in text))
def test_a_vendor_id_without_the_mark_is_the_call_id(vendor_id: str) -> None:
    assert naming.vendor_call(vendor_id) == vendor_id


# -- the class: streams whose vendor ids are chosen from the derived namespace ------------------

#: ids callgate derives, or once derived, for a stream `{s}`, and ids holding the separators
_TRAPS = (
    "{s}:refusal",
    "{s}#refusal",
    "{s}##refusal",
    "{s}#refusal#1",
    "{s}:refusal:1",
    "{s}:error",
    "{s}#error",
    "{s}:0:0",
    "{s}#0#0",
    "{s}#0#1",
    "{s}:1:0",
    "{s}#1#0",
    "{s}:0:0:1",
    "x",
    "x:1",
    "x#1",
    "x##1",
    "x:2",
    "x#2",
    "x#",
    "#",
    "##",
    "#1",
)
_STREAMS = ("s", "x", "s#", "s:0", "#", "x#1")


@dataclass(frozen=True)
class Shape:
    """A stream to build: per output (choice, candidate), its calls, each named or not, and
    whether it refuses; whether a vendor error ends the stream."""

    outputs: tuple[tuple[tuple[bool, ...], bool], ...]
    error: bool


@dataclass(frozen=True)
class Format:
    fmt: str
    outputs: int  # at most this many outputs
    unnamed: bool  # a call may have no vendor id
    refusal: bool  # an output may refuse
    per_output: bool  # vendor ids must differ only within an output (else within the stream)
    refusal_ends: bool  # a refusal is the stream's end (so a vendor error comes instead of it)
    build: Callable[[str, Shape, list[list[str | None]], random.Random], list[Event]]


def _args(n: int) -> str:
    return orjson.dumps({"n": n}).decode()


def _chat(
    stream_id: str, shape: Shape, ids: list[list[str | None]], _: random.Random
) -> list[Event]:
    def chunk(k: int, delta: Event, reason: str | None = None) -> Event:
        choice = {"index": k, "delta": delta, "finish_reason": reason}
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}

    events = [chunk(k, {"role": "assistant", "content": None}) for k in range(len(ids))]
    for k, ((_, refuses), names) in enumerate(zip(shape.outputs, ids, strict=True)):
        for t, vendor_id in enumerate(names):
            call: Event = {"index": t, "type": "function"}
            call["function"] = {"name": "t", "arguments": _args(t)}
            if vendor_id is not None:
                call["id"] = vendor_id
            events.append(chunk(k, {"tool_calls": [call]}))
        if refuses:
            events.append(chunk(k, {"refusal": "No."}))
    if shape.error:
        return [*events, {"error": {"code": "server_error", "message": "down"}}]
    events += [chunk(k, {}, "tool_calls") for k in range(len(ids))]
    return [*events, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []}]


def _gemini(
    stream_id: str, shape: Shape, ids: list[list[str | None]], _: random.Random
) -> list[Event]:
    def chunk(k: int, parts: list[Event], finish: str | None = None) -> Event:
        body: Event = {"content": {"role": "model", "parts": parts}, "index": k}
        if finish is not None:
            body["finishReason"] = finish
        return {"candidates": [body], "responseId": "r1"}

    events = [chunk(k, [{"text": "Looking."}]) for k in range(len(ids))]
    for k, names in enumerate(ids):
        for t, vendor_id in enumerate(names):
            call: Event = {"name": "t", "args": {"n": t}}
            if vendor_id is not None:
                call["id"] = vendor_id
            events.append(chunk(k, [{"functionCall": call}]))
    if shape.error:
        return [*events, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "down"}}]
    return events + [chunk(k, [{"text": ""}], "STOP") for k in range(len(ids))]


def _vendor_calls(ids: list[list[str | None]]) -> list[streamgen.Call]:
    return [(str(vendor_id), "t", _args(t)) for t, vendor_id in enumerate(ids[0])]


def _anthropic(
    stream_id: str, shape: Shape, ids: list[list[str | None]], rng: random.Random
) -> list[Event]:
    refuses = shape.outputs[0][1]
    stop = "refusal" if refuses else "tool_use"
    events = streamgen.anthropic_stream("msg_1", _vendor_calls(ids), rng, stop_reason=stop)
    if refuses:
        events[-2]["delta"]["stop_details"] = {"type": "refusal", "explanation": "No."}
    if shape.error:
        events[-2:] = [{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}]
    return events


def _responses(
    stream_id: str, shape: Shape, ids: list[list[str | None]], rng: random.Random
) -> list[Event]:
    events = streamgen.responses_stream("resp_1", _vendor_calls(ids), rng, numbered=False)
    if shape.outputs[0][1]:
        events[-1:-1] = [
            {"type": "response.refusal.delta", "delta": "No."},
            {"type": "response.refusal.done", "refusal": "No."},
        ]
    if shape.error:
        events[-1:] = [{"type": "error", "code": "server_error", "message": "down"}]
    return events


def _bedrock(
    stream_id: str, shape: Shape, ids: list[list[str | None]], rng: random.Random
) -> list[Event]:
    events = streamgen.bedrock_stream(_vendor_calls(ids), rng)
    if shape.error:
        events[-2:] = [{"throttlingException": {"message": "slow down"}}]
    return events


FORMATS = (
    Format(CHAT, 3, True, True, True, False, _chat),
    Format(GEMINI, 3, True, False, True, False, _gemini),
    Format(ANTHROPIC, 1, False, True, False, True, _anthropic),
    Format(RESPONSES, 1, False, True, False, False, _responses),
    Format(BEDROCK, 1, False, False, False, False, _bedrock),
)


@st.composite
def shapes(draw: st.DrawFn, form: Format) -> Shape:
    """A stream of `form` to build: its outputs, their calls, refusals, a vendor error."""
    count = draw(st.integers(min_value=1, max_value=form.outputs))
    error = draw(st.booleans())
    refuses = form.refusal and not (error and form.refusal_ends)
    outputs = tuple(
        (
            tuple(draw(st.lists(st.booleans() if form.unnamed else st.just(True), max_size=3))),
            draw(st.booleans()) if refuses else False,
        )
        for _ in range(count)
    )
    return Shape(outputs, error)


@st.composite
def _traps(draw: st.DrawFn, form: Format, shape: Shape, stream_id: str) -> list[list[str | None]]:
    """Vendor ids for the shape's named calls, from the derived namespace of `stream_id`: each
    distinct within an output (or the stream), as the vendor's are."""
    pool = st.one_of(
        st.sampled_from([trap.format(s=stream_id) for trap in _TRAPS]),
        st.text(alphabet="x#:01", min_size=1, max_size=4),
        st.just(stream_id),
    )
    used: set[str] = set()
    out: list[list[str | None]] = []
    for calls, _ in shape.outputs:
        if form.per_output:
            used = set()
        names: list[str | None] = []
        for named in calls:
            vendor_id = draw(_fresh(pool, used)) if named else None
            if vendor_id is not None:
                used.add(vendor_id)
            names.append(vendor_id)
        out.append(names)
    return out


def _fresh(pool: st.SearchStrategy[str], used: set[str]) -> st.SearchStrategy[str]:
    return pool.filter(lambda vendor_id: vendor_id not in used)


def _expected_ids(stream_id: str, shape: Shape, ids: list[list[str | None]]) -> list[str]:
    """The README's name of every call the stream makes, in one order for any ids."""
    out: list[str] = []
    for k, ((_, refuses), names) in enumerate(zip(shape.outputs, ids, strict=True)):
        for t, vendor_id in enumerate(names):
            out.append(
                unnamed_call(stream_id, k, t) if vendor_id is None else named_call(vendor_id, k)
            )
        if refuses:
            out.append(refusal_call(stream_id, k))
    return [*out, error_call(stream_id)] if shape.error else out


def _ended(calls: Sequence[AssembledCall]) -> dict[str, tuple[Any, ...]]:
    ids = [call.call_id for call in calls]
    assert len(ids) == len(set(ids)), f"one call id for two calls: {ids}"
    return {
        call.call_id: (
            call.channel,
            call.tool,
            call.arguments,
            call.incomplete,
            call.assembly_error,
        )
        for call in calls
    }


@pytest.mark.parametrize("form", FORMATS, ids=[form.fmt for form in FORMATS])
@settings(max_examples=150)
@given(data=st.data(), rng=st.randoms(use_true_random=False))
def test_a_vendor_id_from_the_derived_namespace_names_its_own_call(
    form: Format, data: st.DataObject, rng: random.Random
) -> None:
    shape = data.draw(shapes(form))
    stream_id = data.draw(st.sampled_from(_STREAMS))
    ids = data.draw(_traps(form, shape, stream_id))
    # the same stream under ids that name nothing else: each call alone
    plain = [
        [None if vendor_id is None else f"call_{k}_{t}" for t, vendor_id in enumerate(names)]
        for k, names in enumerate(ids)
    ]
    seed = rng.random()
    alone = _ended(
        assemble(form.fmt, encode(form.build("plain", shape, plain, random.Random(seed))), "plain")
    )
    assert not [o for o in alone.values() if "stream_corrupt" in o or o[4] is not None]
    trapped = _ended(
        assemble(
            form.fmt, encode(form.build(stream_id, shape, ids, random.Random(seed))), stream_id
        )
    )
    names, plain_names = _expected_ids(stream_id, shape, ids), _expected_ids("plain", shape, plain)
    assert set(trapped) == set(names)  # no call merged, none made up
    assert {name: trapped[name] for name in names} == {
        name: alone[plain_name] for name, plain_name in zip(names, plain_names, strict=True)
    }


# -- OpenAI Responses: a function call's `call_id` and an approval request's item `id` -----------

#: ids a function call and an approval request may both carry (no item id of a function call's)
_SHARED = ("x", "y", "x#approval", "x##approval", "#", "#approval", "mcpr_1", "call_1")


@st.composite
def _calls_and_approvals(draw: st.DrawFn) -> list[tuple[bool, str]]:
    """A response's client calls in output order: (an approval request?, its vendor id), the
    function calls' ids distinct, the requests' ids distinct, the two sharing any."""
    out: list[tuple[bool, str]] = []
    for approval in draw(st.lists(st.booleans(), min_size=1, max_size=6)):
        used = {vendor_id for kind, vendor_id in out if kind == approval}
        out.append((approval, draw(_fresh(st.sampled_from(_SHARED), used))))
    return out


def _responses_with_approvals(calls: list[tuple[bool, str]]) -> list[Event]:
    """The stream of `calls`, each finished, the response completed with all of them."""

    def item(index: int, approval: bool, vendor_id: str, status: str) -> Event:
        if approval:
            return {
                "id": vendor_id,
                "type": "mcp_approval_request",
                "arguments": _args(index),
                "name": f"tool{index}",
                "server_label": "srv",
            }
        return {
            "id": f"fc_{index}",
            "type": "function_call",
            "status": status,
            "arguments": _args(index) if status == "completed" else "",
            "call_id": vendor_id,
            "name": f"tool{index}",
        }

    def response(status: str, output: list[Event]) -> Event:
        return {"id": "resp_1", "object": "response", "status": status, "output": output}

    events: list[Event] = [
        {"type": "response.created", "response": response("in_progress", [])},
    ]
    for index, (approval, vendor_id) in enumerate(calls):
        added = item(index, approval, vendor_id, "in_progress")
        events.append({"type": "response.output_item.added", "output_index": index, "item": added})
        if not approval:
            text = {"output_index": index, "item_id": f"fc_{index}"}
            events.append(
                {"type": "response.function_call_arguments.delta", **text, "delta": _args(index)}
            )
            events.append(
                {"type": "response.function_call_arguments.done", **text, "arguments": _args(index)}
            )
        done = item(index, approval, vendor_id, "completed")
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
    output = [
        item(i, approval, vendor_id, "completed") for i, (approval, vendor_id) in enumerate(calls)
    ]
    return [*events, {"type": "response.completed", "response": response("completed", output)}]


@settings(max_examples=150)
@given(calls=_calls_and_approvals())
def test_a_function_call_and_an_approval_request_of_one_id_are_two_calls(
    calls: list[tuple[bool, str]],
) -> None:
    apart = [
        (approval, f"mcpr_{i}" if approval else f"call_{i}")
        for i, (approval, _) in enumerate(calls)
    ]

    def names(of: list[tuple[bool, str]]) -> list[str]:
        return [approval_call(v) if approval else named_call(v) for approval, v in of]

    alone = _ended(assemble(RESPONSES, encode(_responses_with_approvals(apart))))
    assert not [o for o in alone.values() if o[3] is not None or o[4] is not None]
    shared = _ended(assemble(RESPONSES, encode(_responses_with_approvals(calls))))
    assert set(shared) == set(names(calls))  # none merged, none lost, none made up
    assert [shared[name] for name in names(calls)] == [alone[name] for name in names(apart)]
