"""The reference judge of an OpenAI Chat Completions stream (`openai.chat`), one choice or more.

Written from the README ("Vendor formats", "A stream ends once", "A malformed piece never
changes what is accepted", "`stream_corrupt` for what the adapter cannot place") and the
format as OpenAI streams it (the SDK's accumulator places deltas the same way):

- a chunk's `choices` each name their `index`: a choice seen before or the next one;
- a tool call opens with a delta at its choice's next `index` (0, 1, ...) carrying its `id` and
  `function.name`; later deltas at that index carry only `function.arguments` text, appended;
  its call id is its `id`, with `:k` for choice k > 0;
- a choice ends at its `finish_reason`; after it, only an empty delta of that choice can be
  placed; the stream ends once every choice seen has its finish reason or at the usage chunk
  (`choices: []`), and its calls are decided then (`[DONE]` ends the server-sent events, not the
  stream), each by its own choice's finish alone: `tool_calls` and `stop` release its calls to
  be judged, `length` makes them `incomplete` `max_tokens`, `content_filter` `content_filter`; a
  choice without a finish reason at the end `stream_ended`; the end of the input before the
  stream's end ends every call `stream_ended`;
- after the end, a chunk that carries nothing (the usage chunk, empty deltas) is dropped; any
  other is an event the stream cannot place;
- an event the stream cannot place (a choice out of order, a continuation of no open call, an
  opening out of order or without its id or name, a continuation naming an id or a name, a delta
  for a choice that finished) is a `malformed_record`, and every call the stream holds ends
  `incomplete` `stream_corrupt`; the stream's later events are dropped.

A released call is judged by the chain as an envelope call is (`envelope.verdict`): its tool
is the function's name, at its latest version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
from tests.reference.vendor import named_call

FINISHES = {"length": "max_tokens", "content_filter": "content_filter"}
RELEASES = ("tool_calls", "stop")


@dataclass
class _Choice:
    calls: list[Call] = field(default_factory=list)
    finish: str | None = None
    done: bool = False


def _empty(delta: Any) -> bool:
    """A delta the SDK takes nothing from."""
    return not delta or all(value in (None, "", []) for value in delta.values())


def _carries_nothing(chunk: Any) -> bool:
    choices = chunk.get("choices")
    if choices == []:
        return True
    return all(
        _empty(c.get("delta")) and c.get("finish_reason") is None for c in choices or [{"x": 1}]
    )


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one Chat Completions stream's records (a chunk, or `[DONE]`, each)."""
    events: list[Expected] = []
    choices: list[_Choice] = []
    ended = corrupt = False

    def malformed() -> None:
        nonlocal corrupt
        events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
        for choice in choices:  # none after the end: its calls have their verdicts
            for call in choice.calls:
                events.append(
                    Expected(stream_id, call.call_id, "incomplete", "assembly", "stream_corrupt")
                )
        choices.clear()
        corrupt = True  # the stream's later events are dropped

    def end() -> None:
        nonlocal ended
        ended = True
        for choice in choices:
            for call in choice.calls:
                if choice.finish in RELEASES:
                    events.append(verdict(call, contracts, limits))
                else:
                    reason = FINISHES.get(choice.finish or "", "stream_ended")
                    events.append(
                        Expected(stream_id, call.call_id, "incomplete", "assembly", reason)
                    )
        choices.clear()

    def place(raw: Any) -> bool:
        """Take one choice of a chunk; False when it cannot be placed."""
        index = raw.get("index")
        if not isinstance(index, Decimal) or exact.EXACT.remainder(index, 1) != 0:
            return False
        if index == len(choices):
            choices.append(_Choice())
        elif not 0 <= index < len(choices):
            return False
        choice = choices[int(index)]
        delta, finish = raw.get("delta") or {}, raw.get("finish_reason")
        if choice.done:
            return finish is None and _empty(delta)
        if not _place(delta, int(index), choice.calls, stream_id):
            return False
        if finish is not None:
            if finish not in (*RELEASES, *FINISHES):
                raise Unmodeled("a finish reason the README does not name for Chat")
            choice.finish, choice.done = finish, True
        return True

    for value in values:
        if corrupt:
            continue
        if value.strip() == b"[DONE]":
            continue  # the end of the server-sent events, no event of the stream
        chunk: Any = exact.read(value)
        if ended:
            if not _carries_nothing(chunk):
                malformed()
            continue
        if chunk.get("choices") == []:
            end()
            continue
        if not all(place(raw) for raw in chunk["choices"]):
            malformed()
            continue
        if all(choice.done for choice in choices):
            end()
    if not ended and not corrupt:  # the input ended before the stream: nothing is released
        for choice in choices:
            choice.finish = None
        end()
    return sorted(events, key=Expected.sort_key)


def _place(delta: dict[str, Any], choice: int, calls: list[Call], stream_id: str) -> bool:
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
            call_id = named_call(piece["id"], choice)
            call = Call(stream_id, call_id, "tool_call", function["name"], None)
            calls.append(call)
        elif index == len(calls) - 1 and index >= 0:
            if "id" in piece or "name" in function:
                return False
            call = calls[index]
        else:
            return False
        call.deltas.append(function.get("arguments") or "")
    return True
