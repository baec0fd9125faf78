"""The reference judge of an OpenAI Chat Completions stream (`openai.chat`), one choice.

Written from the README ("Vendor formats", "A stream ends once", "A malformed piece never
changes what is accepted", "`stream_corrupt` for what the adapter cannot place") and the
format as OpenAI streams it (the SDK's accumulator places deltas the same way):

- a tool call opens with a delta at the next `index` (0, 1, ...) carrying its `id` and
  `function.name`; later deltas at that index carry only `function.arguments` text, appended;
- the stream ends at the choice's `finish_reason`, at the usage chunk (`choices: []`) or at
  `[DONE]`; `tool_calls` and `stop` release its calls to be judged, `length` makes them
  `incomplete` `max_tokens`, `content_filter` `content_filter`; an end without a finish reason,
  or the end of the input, `stream_ended`;
- after the end, a chunk that carries nothing (the usage chunk, empty deltas, `[DONE]`) is
  dropped; any other is an event the stream cannot place;
- an event the stream cannot place (a continuation of no open call, an opening out of order or
  without its id or name, a continuation naming an id or a name) is a `malformed_record`, and
  every call the stream holds ends `incomplete` `stream_corrupt`; the stream's later events
  are dropped.

A released call is judged by the chain as an envelope call is (`envelope.verdict`): its tool
is the function's name, at its latest version.
"""

from __future__ import annotations

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

FINISHES = {"length": "max_tokens", "content_filter": "content_filter"}
RELEASES = ("tool_calls", "stop")


def _carries_nothing(chunk: Any) -> bool:
    if chunk == "[DONE]":
        return True
    choices = chunk.get("choices")
    if choices == []:
        return True
    return all(not c.get("delta") and c.get("finish_reason") is None for c in choices or [{"x": 1}])


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one Chat Completions stream's records (a chunk, or `[DONE]`, each)."""
    events: list[Expected] = []
    calls: list[Call] = []
    ended = corrupt = False

    def malformed() -> None:
        nonlocal corrupt
        events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
        for call in calls:  # none after the end: its calls have their verdicts
            events.append(
                Expected(stream_id, call.call_id, "incomplete", "assembly", "stream_corrupt")
            )
        calls.clear()
        corrupt = True  # the stream's later events are dropped

    def end(finish: str | None) -> None:
        nonlocal ended
        ended = True
        for call in calls:
            if finish in RELEASES:
                events.append(verdict(call, contracts, limits))
            else:
                reason = FINISHES.get(finish or "", "stream_ended")
                events.append(Expected(stream_id, call.call_id, "incomplete", "assembly", reason))
        calls.clear()

    for value in values:
        if corrupt:
            continue
        chunk: Any = "[DONE]" if value.strip() == b"[DONE]" else exact.read(value)
        if ended:
            if not _carries_nothing(chunk):
                malformed()
            continue
        if chunk == "[DONE]" or chunk.get("choices") == []:
            end(None)
            continue
        (choice,) = chunk["choices"]
        if not _place(choice.get("delta") or {}, calls, stream_id):
            malformed()
            continue
        if choice.get("finish_reason") is not None:
            if choice["finish_reason"] not in (*RELEASES, *FINISHES):
                raise Unmodeled("a finish reason the README does not name for Chat")
            end(choice["finish_reason"])
    if not ended and not corrupt:
        end(None)
    return sorted(events, key=Expected.sort_key)


def _place(delta: dict[str, Any], calls: list[Call], stream_id: str) -> bool:
    """Take a delta's tool call pieces; False when one cannot be placed."""
    for piece in delta.get("tool_calls") or []:
        function = piece.get("function") or {}
        index = piece.get("index")
        if not isinstance(index, Decimal) or exact.EXACT.remainder(index, 1) != 0:
            return False
        index = int(index)
        if index == len(calls):  # the next call opens
            if not piece.get("id") or not function.get("name"):
                return False
            call = Call(stream_id, piece["id"], "tool_call", function["name"], None)
            calls.append(call)
        elif index == len(calls) - 1 and index >= 0:
            if "id" in piece or "name" in function:
                return False
            call = calls[index]
        else:
            return False
        call.deltas.append(function.get("arguments") or "")
    return True
