"""The reference judge of an Anthropic Messages stream (`anthropic.messages`).

Written from the README ("Vendor formats", "A stream ends once", "A malformed piece never
changes what is accepted", "`stream_corrupt` for what the adapter cannot place", "A tool
without parameters") and the format as Anthropic streams it (the SDK places events alike):

- `message_start` opens the message, once; content blocks follow one at a time: a
  `content_block_start` at the next index, its deltas (`input_json_delta` text for a
  `tool_use` block, `text_delta` for a text block), its `content_block_stop`; `ping` may come
  anywhere before the end; a `message_delta` names the stop reason (or none: then nothing is
  released, every call `stream_ended`), after which only more `message_delta`s (without a stop
  reason or with the same: the first one stands, another cannot be placed), `ping`s and
  `message_stop` come;
- `message_stop` ends the stream: a tool block that was stopped is released to be judged (its
  tool the block's name, at its latest version; a block that streamed no text is a call
  without arguments, `{}`) unless the stop reason is `refusal` (a rejected `refusal` of the
  stream, its calls `stream_ended`); a block still open is `incomplete`, `max_tokens` under a
  token-limit stop, else `stream_ended`, and so is the message's last block under a token-limit
  stop when it is a call (the limit may have cut it), stopped or not, with text or none; the end
  of the input before `message_stop` ends every call `stream_ended`;
- anything else (an event out of that order, a delta of the wrong kind, any event after
  `message_stop`) cannot be placed: a `malformed_record`, every call the stream holds
  `incomplete` `stream_corrupt`, the stream's later events dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from tests.reference.vendor import named_call, refusal_call

RELEASES = (
    "tool_use",
    "end_turn",
    "stop_sequence",
    "max_tokens",
    "pause_turn",
    "model_context_window_exceeded",
)
_DELTAS = {"tool_use": "input_json_delta", "text": "text_delta"}
#: the stop reasons of the token limit
LENGTH = ("max_tokens", "model_context_window_exceeded")


@dataclass
class _Block:
    kind: str
    call: Call | None
    stopped: bool = False


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one Messages stream's records (one server-sent event each)."""
    events: list[Expected] = []
    blocks: list[_Block] = []
    started = ended = corrupt = False
    stop_reason: str | None = None
    delta_seen = False  # a message_delta came, with a stop reason or none

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

    def place(event: dict[str, Any]) -> bool:
        """Take one event before the end; False when it cannot be placed."""
        nonlocal started, stop_reason, delta_seen
        kind = event.get("type")
        if kind == "ping":
            return True
        if kind == "message_start":
            started, was = True, started
            return not was
        if not started:
            return False
        current = blocks[-1] if blocks and not blocks[-1].stopped else None
        if kind == "message_delta":
            given = (event.get("delta") or {}).get("stop_reason")
            if given is not None and stop_reason is not None and given != stop_reason:
                return False  # the first stop reason stands; another cannot be placed
            stop_reason = given or stop_reason
            delta_seen = True
            return True
        if delta_seen:
            return False
        index = event.get("index")
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if current is not None or index != len(blocks) or block.get("type") not in _DELTAS:
                return False
            call = None
            if block["type"] == "tool_use":
                call_id = named_call(block["id"])
                call = Call(stream_id, call_id, "tool_call", block["name"], None)
            blocks.append(_Block(block["type"], call))
            return True
        if current is None or index != len(blocks) - 1:
            return False
        if kind == "content_block_stop":
            current.stopped = True
            return True
        delta = event.get("delta") or {}
        if kind != "content_block_delta" or delta.get("type") != _DELTAS[current.kind]:
            return False
        if current.call is not None:
            current.call.deltas.append(delta["partial_json"])
        return True

    def end() -> None:
        nonlocal ended
        ended = True
        if stop_reason == "refusal":
            events.append(
                Expected(
                    stream_id,
                    refusal_call(stream_id),
                    "rejected",
                    "response_classification",
                    "refusal",
                )
            )
            for call in calls():
                incomplete(call, "stream_ended")
            return
        if stop_reason is None:  # the message stopped without saying why: nothing released
            for call in calls():
                incomplete(call, "stream_ended")
            return
        if stop_reason not in RELEASES:
            raise Unmodeled(f"a stop reason the README does not name: {stop_reason!r}")
        for index, block in enumerate(blocks):
            if block.call is None:
                continue
            if not block.stopped or (stop_reason in LENGTH and index == len(blocks) - 1):
                incomplete(block.call, "max_tokens" if stop_reason in LENGTH else "stream_ended")
                continue
            if not "".join(block.call.deltas):
                block.call.deltas = ["{}"]
            events.append(verdict(block.call, contracts, limits))

    for value in values:
        if corrupt:
            continue
        event = exact.read(value)
        if ended:
            malformed()
        elif event.get("type") == "message_stop":
            if not delta_seen:
                malformed()
            else:
                end()
        elif not place(event):
            malformed()
    if not ended and not corrupt:
        for call in calls():
            incomplete(call, "stream_ended")
    return sorted(events, key=Expected.sort_key)
