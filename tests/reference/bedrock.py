"""The reference judge of an Amazon Bedrock `ConverseStream` (`bedrock.converse`).

Written from the README ("Vendor formats", "A stream ends once", "A malformed piece never
changes what is accepted", "`stream_corrupt` for what the adapter cannot place") and the
format as Bedrock streams it (boto3 yields each event as an object of one member naming it):

- `messageStart` opens the message, once; content blocks follow one at a time, each at the
  next `contentBlockIndex` (0, 1, ...): a `toolUse` block opens with its `contentBlockStart`
  (a non-empty `toolUseId` and `name`, each within `CALLGATE_LIMITS__MAX_ID_BYTES`), takes
  `delta.toolUse.input` text pieces and ends at its `contentBlockStop`; a text block begins
  with its first `delta.text` (Bedrock sends no start for it) and ends at its stop;
- `messageStop` ends the stream: `tool_use`, `end_turn` and `stop_sequence` release the
  stopped tool blocks to be judged (the tool the block's name, at its latest version; a block
  with no input text at all is a call without arguments, `{}`); `max_tokens` and
  `model_context_window_exceeded` release them too except the message's last block when it is
  a call (`incomplete` `max_tokens`); a block still open is never released (`max_tokens` under
  those two, else `stream_ended`); `guardrail_intervened` and `content_filtered` end every call
  `incomplete` `content_filter`; `malformed_tool_use` and `malformed_model_output` are a
  rejected record (`response_classification`, `malformed_tool_call`) and release nothing; any
  other reason releases nothing; a call released nothing is `stream_ended`;
- an exception event (`throttlingException`, ...) before the end ends the stream as a vendor
  error: a rejected `model_error` (`response_classification`) under the call id
  `<stream id>:error`, its calls `stream_ended`;
- the `metadata` event after `messageStop` is dropped (it carries nothing); any other event
  after the end, and any event out of the order above (a block started twice or while another
  is open, at another index, a delta of the wrong kind, a stop for no open block, `metadata`
  before the end, an unknown event), cannot be placed: a `malformed_record`, every call the
  stream holds `incomplete` `stream_corrupt`, the stream's later events dropped; the end of
  the input before `messageStop` ends every call `stream_ended`;
- a stream whose first record cannot be read (not JSON, not an object) gives each `toolUse`
  start among its later records (ids readable and within the bound) an `incomplete`
  `stream_corrupt`, once per id.

Unmodeled (the README does not settle them, and the traffic does not make them on purpose):
a `toolUseId` another block of the message has, a `contentBlockIndex` that is a number but no
integer spelled plainly, server tools and reasoning blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tests.reference import exact
from tests.reference.envelope import (
    MALFORMED,
    Call,
    Contracts,
    Expected,
    Limits,
    Unmodeled,
    verdict,
)
from tests.reference.vendor import named_call, rejected_record, vendor_error

RELEASES = ("tool_use", "end_turn", "stop_sequence")
#: the stop reasons of the token limit
LENGTH = ("max_tokens", "model_context_window_exceeded")
FILTERED = ("guardrail_intervened", "content_filtered")
MALFORMED_STOPS = ("malformed_tool_use", "malformed_model_output")


@dataclass
class _Block:
    call: Call | None  # None: a text block
    stopped: bool = False


class _Unplaceable(Exception):
    """An event the stream cannot place."""


def _index(body: dict[str, Any]) -> int:
    index = body.get("contentBlockIndex")
    if not isinstance(index, Decimal):
        raise _Unplaceable
    if exact.EXACT.remainder(index, 1) != 0 or not str(index).lstrip("-").isdigit():
        raise Unmodeled("a block index that is a number but not an integer spelled plainly")
    return int(index)


def _tool_start(body: Any, limits: Limits) -> tuple[str, str] | None:
    """A `contentBlockStart` body's (toolUseId, name), or None when it is no tool's start."""
    if not isinstance(body, dict) or not isinstance(body.get("start"), dict):
        return None
    tool = body["start"].get("toolUse")
    if not isinstance(tool, dict):
        return None
    ids = tool.get("toolUseId"), tool.get("name")
    if all(isinstance(i, str) and i and len(i.encode()) <= limits.max_id_bytes for i in ids):
        return named_call(ids[0]), ids[1]
    return None


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one ConverseStream's records (one event each)."""
    events: list[Expected] = []
    blocks: list[_Block] = []
    ids: set[str] = set()
    started = ended = corrupt = False

    def calls() -> list[Call]:
        return [b.call for b in blocks if b.call is not None]

    def incomplete(call: Call, reason: str) -> None:
        events.append(Expected(stream_id, call.call_id, "incomplete", "assembly", reason))

    def malformed() -> None:
        nonlocal corrupt
        events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
        if not ended:
            for call in calls():
                incomplete(call, "stream_corrupt")
        corrupt = True

    def place(event: dict[str, Any]) -> None:
        nonlocal started
        if len(event) != 1:
            raise _Unplaceable
        ((kind, body),) = event.items()
        if not isinstance(body, dict):
            raise _Unplaceable
        if kind == "messageStart":
            if started or body.get("role") != "assistant":
                raise _Unplaceable
            started = True
            return
        if not started or kind not in (
            "contentBlockStart",
            "contentBlockDelta",
            "contentBlockStop",
        ):
            raise _Unplaceable  # metadata before the end, an unknown event
        index = _index(body)
        current = blocks[-1] if blocks and not blocks[-1].stopped else None
        if kind == "contentBlockStart":
            start = body.get("start")
            if current is not None or index != len(blocks) or not isinstance(start, dict):
                raise _Unplaceable
            named = _tool_start(body, limits)
            if named is None or set(start) != {"toolUse"}:
                raise _Unplaceable  # the traffic starts no other block
            if named[0] in ids:
                raise Unmodeled("a toolUseId another block of the message has")
            ids.add(named[0])
            blocks.append(_Block(Call(stream_id, named[0], "tool_call", named[1], None)))
            return
        if kind == "contentBlockDelta":
            delta = body.get("delta")
            if not isinstance(delta, dict):
                raise _Unplaceable
            if current is None and index == len(blocks) and set(delta) == {"text"}:
                current = _Block(None)  # a text block begins with its first delta
                blocks.append(current)
            if current is None or index != len(blocks) - 1:
                raise _Unplaceable
            if current.call is None:
                if set(delta) != {"text"} or not isinstance(delta["text"], str):
                    raise _Unplaceable
                return
            tool = delta.get("toolUse")
            if set(delta) != {"toolUse"} or not isinstance(tool, dict):
                raise _Unplaceable
            if not isinstance(tool.get("input"), str):
                raise _Unplaceable
            current.call.deltas.append(tool["input"])
            return
        if current is None or index != len(blocks) - 1:
            raise _Unplaceable
        current.stopped = True

    def end(reason: Any) -> None:
        nonlocal ended
        ended = True
        if reason in MALFORMED_STOPS:
            events.append(rejected_record(stream_id, "malformed_tool_call"))
        for index, block in enumerate(blocks):
            if block.call is None:
                continue
            if reason in FILTERED:
                incomplete(block.call, "content_filter")
            elif reason in LENGTH and (not block.stopped or index == len(blocks) - 1):
                incomplete(block.call, "max_tokens")
            elif reason in (*RELEASES, *LENGTH) and block.stopped:
                if not "".join(block.call.deltas):
                    block.call.deltas = ["{}"]
                events.append(verdict(block.call, contracts, limits))
            else:
                incomplete(block.call, "stream_ended")

    first = True
    for value in values:
        was_first, first = first, False
        try:
            event = exact.read(value)
        except exact.Fault:
            event = None
        if not isinstance(event, dict):
            if was_first:
                _unreadable_first(values[1:], stream_id, limits, events)
                return sorted(events, key=Expected.sort_key)
            if not corrupt:
                malformed()
            continue
        if corrupt:
            continue
        if ended:
            if not (len(event) == 1 and isinstance(event.get("metadata"), dict)):
                malformed()
            continue
        ((kind, body),) = event.items() if len(event) == 1 else (("", None),)
        if kind.endswith("Exception"):
            events.append(vendor_error(stream_id))
            for call in calls():
                incomplete(call, "stream_ended")
            ended = True
            continue
        if kind == "messageStop" and started:
            if not isinstance(body, dict) or not isinstance(body.get("stopReason"), str):
                malformed()
            else:
                end(body["stopReason"])
            continue
        try:
            place(event)
        except _Unplaceable:
            malformed()
    if not ended and not corrupt:
        for call in calls():
            incomplete(call, "stream_ended")
    return sorted(events, key=Expected.sort_key)


def _unreadable_first(
    later: list[bytes], stream_id: str, limits: Limits, events: list[Expected]
) -> None:
    """A stream whose first record cannot be read: a `malformed_record`, and each tool call
    one of its later records can be seen to open `incomplete` `stream_corrupt`, once."""
    events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
    seen: set[str] = set()
    for value in later:
        try:
            event = exact.read(value)
        except exact.Fault:
            continue
        if isinstance(event, dict) and len(event) == 1:
            named = _tool_start(event.get("contentBlockStart"), limits)
            if named is not None and named[0] not in seen:
                seen.add(named[0])
                events.append(
                    Expected(stream_id, named[0], "incomplete", "assembly", "stream_corrupt")
                )
