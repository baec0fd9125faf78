"""The reference judge of an OpenAI Responses stream (`openai.responses`), and its traffic.

Written from the README ("Vendor formats": the `openai.responses` bullet and its table of item
kinds, "Contract kinds", "A stream ends once", "A malformed piece never changes what is
accepted", "`stream_corrupt` for what the adapter cannot place") and the events as OpenAI
streams them (the SDK's `ResponseStreamState` places them alike: an item is appended to the
response's output at `response.output_item.added`, later events find it by `output_index`):

- `response.created` opens the stream, once (a repeat of it, or `response.in_progress`, for
  the same response and without output, carries nothing); every other event comes after it;
- `response.output_item.added` appends an item at the next `output_index`; an item at an index
  already taken cannot be placed. A `function_call` (its `name`, its `arguments`) and a
  `custom_tool_call` (its `name`, its free-form `input`) are calls: their call id and name are
  identifiers within `CALLGATE_LIMITS__MAX_ID_BYTES`, their text the item's own text then the
  deltas (`response.function_call_arguments.delta`, `response.custom_tool_call_input.delta`)
  at their index, naming their item's `item_id`;
- a call is finished by its final text: its `.done` (`arguments` / `input`) or its
  `output_item.done` with status `completed`; an `output_item.done` with status `incomplete`
  cuts it. A delta for a call that is finished or cut, a text event for an index that is no
  call of its kind, or that names another item's id, an `output_item.done` naming another type,
  id, call id or name than its item's, cannot be placed;
- a `computer_call` (a call the client runs that no contract kind judges) is rejected
  `unsupported_call_kind` in phase `response_classification` when first seen, under the item's
  call id (the README's table); hosted items (`web_search_call`, messages) and their own
  events are not judged;
- `response.completed` releases each finished call: its streamed text must equal its final text
  (else `incomplete` `stream_corrupt`, "a final text that differs from the vendor's own"),
  unless the streamed text passed its bound: the bound decides first (rejected `too_large` /
  `too_many_chunks`, whatever its final text), and it is judged by the chain
  (`envelope.verdict`: its tool the call's name, at its latest version; a `custom_tool_call` as
  `{"input": <text>}`, whose contract must be of its kind: none here, so `unsupported_call_kind`
  in `schema_validation` after the bytes bound);
- `response.incomplete` releases the finished calls alike; a call not finished is
  `incomplete`, `max_tokens` for `max_output_tokens`, `content_filter` for `content_filter`;
- `response.failed` and an `error` event are a vendor error: a rejected `model_error` of the
  stream (call id `<stream>:error`), every call it holds `incomplete` `stream_ended`;
- the end of the input before the response's end ends every call `stream_ended`;
- after the end any event cannot be placed ("A stream ends once": Responses sends nothing
  after it that carries nothing);
- an event that cannot be placed is a `malformed_record`, every call the stream holds ends
  `incomplete` `stream_corrupt`, and the stream's later events are dropped.

`Unmodeled` (the README does not settle them): `sequence_number` (the README names no rule for
it, so the traffic has none), an item added past the next index or finished without being
added (the SDK would place it elsewhere), a call id used twice, the vendor's own final texts
disagreeing among themselves or with the final response, a final response naming a call never
streamed or lacking a finished one, `response.completed` while a call is unfinished, other
incomplete reasons, and item or event kinds the traffic does not generate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from tests.reference import exact, traffic
from tests.reference.envelope import (
    MALFORMED,
    Call,
    Contracts,
    Expected,
    Limits,
    Unmodeled,
    _overflow,
    verdict,
)
from tests.reference.vendor import named_call, vendor_error

#: the calls a contract kind judges: item type -> (the field of its text, its text events)
CALLS = {
    "function_call": ("arguments", "response.function_call_arguments"),
    "custom_tool_call": ("input", "response.custom_tool_call_input"),
}
#: the calls the client runs that no contract kind judges (as generated)
UNSUPPORTED = ("computer_call",)
#: items OpenAI runs itself, or no calls (as generated), and their own events
HOSTED = ("web_search_call", "message")
HOSTED_EVENTS = ("response.web_search_call.searching", "response.output_text.delta")
INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "content_filter"}


@dataclass
class _Item:
    kind: str
    item_id: str
    call: Call | None = None
    name: str | None = None
    status: str = "open"  # open, done (a final text came), cut (its item ended incomplete)
    final: str | None = None
    deltas: list[str] = field(default_factory=list)


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one Responses stream's records (one server-sent event each)."""
    events: list[Expected] = []
    items: dict[int, _Item] = {}
    call_ids: set[str] = set()
    response_id: str | None = None
    ended = corrupt = False

    def held() -> list[_Item]:
        return [item for _, item in sorted(items.items()) if item.call is not None]

    def incomplete(item: _Item, reason: str) -> None:
        assert item.call is not None
        events.append(Expected(stream_id, item.call.call_id, "incomplete", "assembly", reason))

    def malformed() -> None:
        nonlocal corrupt
        events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
        if not ended:
            for item in held():
                incomplete(item, "stream_corrupt")
        corrupt = True

    def identifier(value: Any) -> bool:
        return isinstance(value, str) and 0 < len(value.encode()) <= limits.max_id_bytes

    def finish(item: _Item, text: Any) -> bool:
        if not isinstance(text, str) or item.status == "cut":
            return False
        if item.final is not None and text != item.final:
            raise Unmodeled("the vendor's own final texts of a call disagree")
        item.status, item.final = "done", text
        return True

    def place(event: dict[str, Any]) -> bool:
        """Take one event before the end; False when it cannot be placed."""
        nonlocal response_id
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            response = event.get("response") or {}
            if response_id is None and kind == "response.in_progress":
                return False
            if response.get("output"):
                raise Unmodeled("output items before the end of the response")
            if response_id not in (None, response.get("id")):
                raise Unmodeled("another response's id")
            response_id = response.get("id")
            return True
        if response_id is None:
            return False
        index = event.get("output_index")
        if not isinstance(index, Decimal) or exact.EXACT.remainder(index, 1) != 0:
            raise Unmodeled(f"an event the traffic does not generate: {kind}")
        index = int(index)
        if kind == "response.output_item.added":
            return add(index, event.get("item") or {})
        item = items.get(index)
        if kind == "response.output_item.done":
            if item is None:
                raise Unmodeled("an item finished without being added")
            return item_done(item, event.get("item") or {})
        if kind in HOSTED_EVENTS:
            return item is not None and item.kind in HOSTED
        for call_kind, (text_field, prefix) in CALLS.items():
            if kind in (f"{prefix}.delta", f"{prefix}.done"):
                if item is None or item.kind != call_kind or event.get("item_id") != item.item_id:
                    return False
                if kind.endswith(".done"):
                    return finish(item, event.get(text_field))
                if item.status != "open" or not isinstance(event.get("delta"), str):
                    return False
                item.deltas.append(event["delta"])
                return True
        raise Unmodeled(f"an event the traffic does not generate: {kind}")

    def add(index: int, body: dict[str, Any]) -> bool:
        if index in items:
            return False
        if index != len(items):
            raise Unmodeled("an item added past the next output_index")
        kind = body.get("type")
        item = _Item(kind, body.get("id"))
        if kind in CALLS:
            call_id, name = body.get("call_id"), body.get("name")
            if not identifier(call_id) or not identifier(name):
                return False
            if call_id in call_ids:
                raise Unmodeled("a call id used twice")
            call_ids.add(call_id)
            item.name = name
            item.call = Call(stream_id, named_call(call_id), "tool_call", name, None)
            opening = body.get(CALLS[kind][0])
            if not isinstance(opening, str):
                return False
            item.deltas.append(opening)
        elif kind in UNSUPPORTED:
            events.append(
                Expected(
                    stream_id,
                    named_call(body["call_id"]),
                    "rejected",
                    "response_classification",
                    "unsupported_call_kind",
                )
            )
        elif kind not in HOSTED:
            raise Unmodeled(f"an item the traffic does not generate: {kind}")
        items[index] = item
        return True

    def item_done(item: _Item, body: dict[str, Any]) -> bool:
        if body.get("type") != item.kind or body.get("id") != item.item_id:
            return False
        if item.call is None:
            return True
        if _named(body.get("call_id")) != item.call.call_id or body.get("name") != item.name:
            return False
        status = body.get("status")
        if status == "incomplete":
            if item.status == "done":
                raise Unmodeled("a finished call's item ends incomplete")
            item.status = "cut"
            return True
        if status != "completed":
            raise Unmodeled(f"an item status the traffic does not generate: {status}")
        return finish(item, body.get(CALLS[item.kind][0]))

    def release(item: _Item, final: dict[str, Any]) -> None:
        assert item.call is not None
        if final.get(CALLS[item.kind][0]) != item.final:
            raise Unmodeled("the final response's text of a call differs from its .done")
        if "".join(item.deltas) != item.final and not _overflow(item.deltas, limits):
            incomplete(item, "stream_corrupt")  # past its bound, the bound decides (below)
            return
        item.call.deltas = list(item.deltas)
        if item.kind == "function_call":
            events.append(verdict(item.call, contracts, limits))
            return
        # a custom tool's text is judged as {"input": text} by a contract of its kind: none here
        overflow = _overflow(item.call.deltas, limits)
        phase, code = (
            ("limits", overflow) if overflow else ("schema_validation", "unsupported_call_kind")
        )
        events.append(Expected(stream_id, item.call.call_id, "rejected", phase, code))

    def end(event: dict[str, Any]) -> None:
        nonlocal ended
        ended = True
        kind = event["type"]
        if kind in ("error", "response.failed"):
            events.append(vendor_error(stream_id))
            for item in held():
                incomplete(item, "stream_ended")
            return
        response = event.get("response") or {}
        if response.get("id") != response_id:
            raise Unmodeled("another response's id")
        finals = {
            _named(body.get("call_id")): body
            for body in response.get("output") or []
            if body.get("type") in CALLS
        }
        if set(finals) - {item.call.call_id for item in held() if item.call}:
            raise Unmodeled("a final response naming a call never streamed")
        reason = None
        if kind == "response.incomplete":
            reason = INCOMPLETE.get((response.get("incomplete_details") or {}).get("reason"))
            if reason is None:
                raise Unmodeled("an incomplete reason the README does not name")
        for item in held():
            assert item.call is not None
            if item.status != "done":
                if reason is None:
                    raise Unmodeled("a response completed while a call had not finished")
                incomplete(item, reason)
            elif item.call.call_id not in finals:
                raise Unmodeled("a final response lacking a finished call")
            else:
                release(item, finals[item.call.call_id])

    for value in values:
        if corrupt:
            continue
        event = exact.read(value)
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            malformed()
        elif "sequence_number" in event:
            raise Unmodeled("sequence_number: the README names no rule for it")
        elif ended:
            malformed()
        elif event["type"] == "error" or (
            response_id is not None
            and event["type"] in ("response.completed", "response.incomplete", "response.failed")
        ):
            end(event)
        elif not place(event):
            malformed()
    if not ended and not corrupt:
        for item in held():
            incomplete(item, "stream_ended")
    return sorted(events, key=Expected.sort_key)


# -- the traffic ---------------------------------------------------------------------------

_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-test",
    "status": "in_progress",
    "output": [],
}
#: a custom tool's free-form text: plain, odd or numeric, never nested
_CUSTOM_TEXT = st.one_of(
    st.text(st.characters(blacklist_characters="[]{}", blacklist_categories=["Cs"]), max_size=60),
    traffic.HOSTILE_NUMBERS.map(str),
)


def _lifecycle(kind: str, **response: Any) -> dict[str, Any]:
    return {"type": kind, "response": {**_RESPONSE, **response}}


@st.composite
def _call_events(
    draw: st.DrawFn, index: int, kind: str, finished: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One call's events at `index` (added, its deltas, perhaps its `.done` and item done)
    and its item as the final response holds it."""
    text_field, prefix = CALLS[kind]
    if kind == "function_call":
        name, _, text = draw(traffic.arguments_text())
    else:
        name, text = draw(st.sampled_from(["pay", "note", "nope"])), draw(_CUSTOM_TEXT)
    call_id, item_id = f"call_{index}", f"fc_{index}"
    if draw(st.integers(0, 12)) == 0:  # an identifier past the bound (256 bytes by default)
        if draw(st.booleans()):
            call_id = "c" * 300
        else:
            name = "\u00e9" * 200
    pieces = traffic._cut(draw, text)
    first = pieces.pop(0) if draw(st.integers(0, 3)) == 0 else ""
    item = {"type": kind, "id": item_id, "call_id": call_id, "name": name, text_field: first}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": item}
    ]
    if not finished:  # the limit or a filter cut it: part of its text
        pieces = pieces[: draw(st.integers(0, len(pieces)))]
    for piece in pieces:
        events.append(
            {"type": f"{prefix}.delta", "item_id": item_id, "output_index": index, "delta": piece}
        )
    status = "completed" if finished else "incomplete"
    done_item = {
        **item,
        text_field: text if finished else first + "".join(pieces),
        "status": status,
    }
    if finished:
        done = {"type": f"{prefix}.done", "item_id": item_id, "output_index": index}
        events.append({**done, text_field: text})
    if finished or draw(st.booleans()):
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": done_item}
        )
    return events, done_item


def _hosted_events(index: int, kind: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if kind == "web_search_call":
        item: dict[str, Any] = {"type": kind, "id": f"ws_{index}", "status": "in_progress"}
        during = {"type": "response.web_search_call.searching", "item_id": f"ws_{index}"}
        done = {**item, "status": "completed", "action": {"type": "search", "query": "x"}}
    elif kind == "message":
        item = {
            "type": kind,
            "id": f"msg_{index}",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        during = {
            "type": "response.output_text.delta",
            "item_id": f"msg_{index}",
            "content_index": 0,
            "delta": "Sure.",
        }
        done = {
            **item,
            "status": "completed",
            "content": [{"type": "output_text", "text": "Sure.", "annotations": []}],
        }
    else:  # a computer_call: the client would run it
        action = {"type": "click", "x": 1, "y": 2, "button": "left"}
        item = {
            "type": kind,
            "id": f"cu_{index}",
            "call_id": f"call_cu{index}",
            "action": action,
            "pending_safety_checks": [],
            "status": "in_progress",
        }
        done = {**item, "status": "completed"}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.output_item.done", "output_index": index, "item": done},
        ], done
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {**during, "output_index": index},
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ], done


@st.composite
def _in_order(draw: st.DrawFn, groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The items' events interleaved by output_index, each item's own order kept and the items
    added in index order (as the SDK appends them)."""
    queues = [list(g) for g in groups]
    started, out = 0, []
    while any(queues):
        live = [i for i in range(started) if queues[i]]
        if started < len(queues):
            live.append(started)
        pick = live[draw(st.integers(0, len(live) - 1))]
        started = max(started, pick + 1)
        out.append(queues[pick].pop(0))
    return out


@st.composite
def responses_stream(draw: st.DrawFn) -> list[bytes]:
    """One Responses stream: `response.created` (and `in_progress`), perhaps a message or a
    web search, one to three calls (function calls mostly, a custom tool call now and then, a
    computer call) whose text comes in deltas, interleaved by output_index; the response's end
    (completed, incomplete with the last call cut, failed, an error event, or none); then up to
    four transport faults (`traffic.vendor_faults`: deleted, repeated later, swapped, a delta
    changed, or late events: a new call, a delta, a second end, a `response.created`)."""
    kinds: list[str] = []
    if draw(st.booleans()):
        kinds.append(draw(st.sampled_from(HOSTED)))
    for _ in range(draw(st.integers(1, 3))):
        kinds.append(
            draw(st.sampled_from(["function_call"] * 5 + ["custom_tool_call", "computer_call"]))
        )
    ending = draw(
        st.sampled_from(
            ["completed"] * 4 + ["max_output_tokens", "content_filter", "failed", "error", "none"]
        )
    )
    groups, finals = [], []
    for index, kind in enumerate(kinds):
        if kind in CALLS:
            cut = ending in INCOMPLETE and index == len(kinds) - 1 and draw(st.booleans())
            events, final = draw(_call_events(index, kind, finished=not cut))
        else:
            events, final = _hosted_events(index, kind)
        groups.append(events)
        finals.append(final)
    stream: list[dict[str, Any]] = [_lifecycle("response.created")]
    if draw(st.booleans()):
        stream.append(_lifecycle("response.in_progress"))
    stream += draw(_in_order(groups))
    end = _ending(ending, finals)
    if end is not None:
        stream.append(end)

    def changed(event: dict[str, Any]) -> dict[str, Any] | None:
        if not str(event.get("type")).endswith(".delta") or "item_id" not in event:
            return None
        return {**event, "delta": draw(traffic._CHANGED_TEXT)}

    late_call = {
        "type": "function_call",
        "id": "fc_late",
        "call_id": "call_late",
        "name": "note",
        "arguments": "{}",
    }
    late: list[list[dict[str, Any]]] = [
        [{"type": "response.output_item.added", "output_index": len(kinds), "item": late_call}],
        [
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_0",
                "output_index": 0,
                "delta": "}",
            }
        ],
        [_ending("completed", finals)],
        [_lifecycle("response.created")],
        [{"type": "error", "code": "server_error", "message": "x", "param": None}],
    ]
    stream = draw(traffic.vendor_faults(stream, changed, late))
    return [json.dumps(e, ensure_ascii=False).encode() for e in stream]


def _ending(ending: str, finals: list[dict[str, Any]]) -> dict[str, Any] | None:
    if ending == "none":
        return None
    if ending == "error":
        return {
            "type": "error",
            "code": "server_error",
            "message": "The server had an error.",
            "param": None,
        }
    if ending == "failed":
        error = {"code": "server_error", "message": "The server had an error."}
        return _lifecycle("response.failed", status="failed", error=error)
    if ending == "completed":
        return _lifecycle("response.completed", status="completed", output=finals)
    details = {"reason": ending}
    return _lifecycle(
        "response.incomplete", status="incomplete", incomplete_details=details, output=finals
    )


def _named(vendor_id: Any) -> str | None:
    """The call id of a vendor's id as an item carries it (None: it carries none)."""
    return named_call(vendor_id) if isinstance(vendor_id, str) else None
