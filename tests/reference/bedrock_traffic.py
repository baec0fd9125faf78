"""Hostile Amazon Bedrock `ConverseStream` traffic for the reference judge (Hypothesis).

A message as Bedrock streams it (boto3's form: each event an object of one member naming
it): `messageStart`, perhaps a text block, one to three `toolUse` blocks whose input comes in
pieces (arguments drawn as for the other formats, numbers in every spelling; no text at all
now and then; an id or a name past the identifier bound), then `messageStop` with a stop
reason, or an exception event, and perhaps the `metadata` that follows. Then the transport
is made hostile (`traffic.vendor_faults`: events deleted, repeated, swapped, their input or
their shape changed, events sent after the end), and perhaps a record that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.reference import traffic

STOP_REASONS = [
    "tool_use",
    "end_turn",
    "stop_sequence",
    "max_tokens",
    "model_context_window_exceeded",
    "guardrail_intervened",
    "content_filtered",
    "malformed_tool_use",
    "malformed_model_output",
    "an_unknown_reason",
]
_METADATA = {
    "metadata": {
        "usage": {"inputTokens": 9, "outputTokens": 9, "totalTokens": 18},
        "metrics": {"latencyMs": 99},
    }
}
#: past the default identifier bound (`CALLGATE_LIMITS__MAX_ID_BYTES`, 256 bytes)
_LONG = "x" * 257


def _start(index: int, call_id: str, name: str) -> dict[str, Any]:
    tool = {"toolUseId": call_id, "name": name}
    return {"contentBlockStart": {"start": {"toolUse": tool}, "contentBlockIndex": index}}


def _input(index: int, text: str) -> dict[str, Any]:
    delta = {"toolUse": {"input": text}}
    return {"contentBlockDelta": {"delta": delta, "contentBlockIndex": index}}


def _stop(index: int) -> dict[str, Any]:
    return {"contentBlockStop": {"contentBlockIndex": index}}


@st.composite
def bedrock_stream(draw: st.DrawFn) -> list[bytes]:
    """One ConverseStream's records, made hostile."""
    events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    index = 0
    if draw(st.booleans()):
        for piece in traffic._cut(draw, draw(traffic._TEXT)) or [""]:
            delta = {"delta": {"text": piece}, "contentBlockIndex": 0}
            events.append({"contentBlockDelta": delta})
        events.append(_stop(0))
        index = 1
    for n in range(draw(st.integers(1, 3))):
        tool, _, text = draw(traffic.arguments_text())
        call_id = f"tooluse_{n}"
        long = draw(st.integers(0, 12))
        if long == 0:
            call_id = _LONG
        elif long == 1:
            tool = _LONG
        events.append(_start(index, call_id, tool))
        if draw(st.integers(0, 4)) > 0:  # else: a call without arguments streams no text
            pieces = traffic._cut(draw, text)
            if draw(st.integers(0, 5)) == 0:
                pieces.insert(draw(st.integers(0, len(pieces))), "")
            events += [_input(index, piece) for piece in pieces]
        events.append(_stop(index))
        index += 1
    ending = draw(st.sampled_from(["stop"] * 8 + ["exception", "cut"]))
    if ending == "exception":
        events.append({"throttlingException": {"message": "Too many requests"}})
    elif ending == "stop":  # else: the stream is cut before its end
        # the reasons that release calls half the time, then any
        reasons = st.sampled_from(STOP_REASONS[:3]) | st.sampled_from(STOP_REASONS)
        stop: dict[str, Any] = {"stopReason": draw(reasons)}
        events.append({"messageStop": stop})
        if draw(st.booleans()):
            events.append(_METADATA)

    def changed(event: dict[str, Any]) -> dict[str, Any] | None:
        copy: Any = json.loads(json.dumps(event))
        ((kind, body),) = copy.items()
        how = draw(st.integers(0, 3))
        if kind == "contentBlockDelta" and "toolUse" in body["delta"] and how < 2:
            body["delta"]["toolUse"]["input"] = draw(traffic._CHANGED_TEXT)
        elif kind == "contentBlockDelta" and how == 2:
            body["delta"] = {"text": "x"}  # a text delta for a tool block, perhaps
        elif kind.startswith("contentBlock") and how == 3:
            body["contentBlockIndex"] = draw(st.sampled_from([str(body["contentBlockIndex"]), 7]))
        elif kind == "contentBlockStart" and how < 2:
            body["start"]["toolUse"].pop(draw(st.sampled_from(["toolUseId", "name"])), None)
        elif kind == "messageStop":
            body["stopReason"] = draw(st.sampled_from([None, *STOP_REASONS]))
        else:
            return None
        return copy

    late = [
        [_METADATA],  # before the end, or again
        [_start(index, "tooluse_late", "note"), _input(index, "{}"), _stop(index)],
        [_input(index - 1, "}")],  # more input for the last block
        [{"messageStart": {"role": "assistant"}}, _start(0, "tooluse_again", "note"), _stop(0)],
        [{"messageStop": {"stopReason": draw(st.sampled_from(STOP_REASONS))}}],
        [{"modelStreamErrorException": {"message": "the model failed", "originalStatusCode": 500}}],
    ]
    events = draw(traffic.vendor_faults(events, changed, late))
    records = [json.dumps(e, ensure_ascii=False).encode() for e in events]
    if draw(st.integers(0, 7)) == 0:  # a record that is not JSON, anywhere
        records.insert(draw(st.integers(0, len(records))), b"not json")
    return records
