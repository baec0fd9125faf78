"""Anthropic Messages API stream events to internal chunks.

A client tool call is a `tool_use` content block: `content_block_start` carries its id and name,
`input_json_delta.partial_json` its argument text (the first is often `""`), `content_block_stop`
ends it. A block whose deltas hold no text at all (a tool without parameters) has the input it
started with, `{}`, as in the SDK. `server_tool_use` blocks (tools the API runs itself) and text or
thinking blocks are not client calls and yield nothing. `message_delta.stop_reason` is the finish
signal; `message_stop`, the stream's last event, releases the calls whose blocks stopped (see
`_base`: held until the END) when the message stopped normally or at the token limit, and ends the
stream. A block still open then ends incomplete, and so does the message's last block under a
token-limit stop (`max_tokens`, `model_context_window_exceeded`) when it is a call, stopped or
not, with text or none: the limit may have cut it, and the API may hold a parameter back until it
is whole, so a cut block can stream no text at all and must not pass as a call without input.

`content_block_stop` carries no final text, so the structure is what is checked, against what the
SDK's accumulator (`accumulate_event`) does with it: it appends each started block to a list and
reads every later event's `index` as a position in that list. An event is refused when:

- the stream does not start with `message_start` (whose `content` must be empty and `usage` an
  object), or has a second one;
- a block starts with an `index` other than the next position, while another is open, or after
  the `message_delta`; a `tool_use` start without a non-empty `id` and `name`, with an id
  another block has, or with a non-empty `input`; a text (thinking) block without its `text`
  (`thinking`) string;
- a delta or stop names a block that is not the open one (never started, stopped, another);
- a delta's type does not belong to its block (a `text_delta` in a `tool_use` block, an
  `input_json_delta` in a text block, ...), or its text field (`partial_json`, `text`,
  `thinking`, `signature`) is not a string; a client call takes no delta but `input_json_delta`;
- `message_delta` without an object `delta`, or a `usage` object with an integer
  `output_tokens` (the SDK reads both); one whose `stop_reason` differs from the one an earlier
  `message_delta` gave (the first stop reason stands: a later one without a reason, or with the
  same, only updates the usage; one that changes it, e.g. `max_tokens` to `tool_use`, would turn
  a cut call into a whole one); `message_stop` before any `message_delta`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker._native import Chunk
from worker.adapters import fields as f
from worker.adapters import naming
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason

FORMAT = "anthropic.messages"

_STOP = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "pause_turn": FinishReason.STOP,
    "tool_use": FinishReason.TOOL_CALLS,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "refusal": FinishReason.REFUSAL,
}
#: stops after which the calls whose blocks stopped are released
_RELEASE = frozenset({FinishReason.STOP, FinishReason.TOOL_CALLS, FinishReason.LENGTH})
#: the text field of each delta type the SDK reads, and the block types that take it
_DELTAS = {
    "input_json_delta": "partial_json",
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
    "citations_delta": None,
}
_TAKES = {
    "text": frozenset({"text_delta", "citations_delta"}),
    "thinking": frozenset({"thinking_delta", "signature_delta"}),
}
#: the text a block starts with, which the SDK extends with each delta
_STARTS = {"text": "text", "thinking": "thinking"}
_TOOL = "tool_use"
#: the input of a tool_use block that streams no argument text (a tool without parameters)
_NO_INPUT = "{}"


def _takes(block: str, delta: str) -> bool:
    """Whether a block of type `block` takes a delta of the known type `delta`."""
    if block.endswith(_TOOL):  # tool_use, server_tool_use, mcp_tool_use: the input only
        return delta == "input_json_delta"
    return delta in _TAKES.get(block, ())


class AnthropicAdapter(VendorAdapter):
    """Incremental decoder of one Messages API stream (one `StreamAdapter`)."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        self._started = False  # message_start seen
        self._blocks = 0  # how many blocks started
        self._last = ""  # the type of the last one
        self._calls: dict[int, str] = {}  # the tool_use blocks' call ids, by index
        self._texts: set[int] = set()  # the tool_use blocks that took argument text
        self._open = False  # the last block is started and not stopped
        self._delta_seen = False  # a message_delta came: no block events after it
        self._reason: str | None = None  # the stop reason as the first message_delta gave it
        self._stop: FinishReason | None = None
        self._refusal: str | None = None
        if state is not None:
            self._restore_base(state)
            self._started = state["started"]
            self._blocks, self._last = state["blocks"]
            self._calls = {int(i): call for i, call in state["calls"].items()}
            self._texts = set(state["texts"])
            self._open = state["open"]
            self._delta_seen = state["delta_seen"]
            self._reason = state.get("reason")  # absent in a state written before it was kept
            self._stop = FinishReason(state["stop"]) if state["stop"] is not None else None
            self._refusal = state["refusal"]
        self._ids = set(self._calls.values())

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "started": self._started,
            "blocks": [self._blocks, self._last],
            "calls": {str(i): call for i, call in self._calls.items()},
            "texts": sorted(self._texts),
            "open": self._open,
            "delta_seen": self._delta_seen,
            "reason": self._reason,
            "stop": self._stop,
            "refusal": self._refusal,
        }

    @property
    def held(self) -> int:
        return 0 if self._finished else len(self._calls)

    def open_calls(self) -> list[str]:
        """Every tool_use block of the message: none is released before the END."""
        return [] if self._finished else list(self._calls.values())

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A `tool_use` block's start."""
        block = event.get("content_block")
        if event.get("type") != "content_block_start" or not isinstance(block, dict):
            return []
        call_id, name = block.get("id"), block.get("name")
        if block.get("type") == "tool_use" and isinstance(call_id, str) and isinstance(name, str):
            return [(naming.vendor_call(call_id), name)] if call_id and name else []
        return []

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        kind = f.string(event, "type", "anthropic.messages event")
        if kind == "ping":
            return []
        if kind == "error":
            return self._error_event(event)
        if kind == "message_start":
            self._message_start(event, kind)
            return []
        if not self._started:
            raise InputFormatError(f"{kind}: the stream must start with message_start")
        if kind == "content_block_start":
            return self._start(event, kind)
        if kind == "content_block_delta":
            return self._delta(event, kind)
        if kind == "content_block_stop":
            self._current(event, kind)
            self._open = False
            return []
        if kind == "message_delta":
            self._message_delta(event, kind)
            return []
        if kind == "message_stop":
            return self._message_stop(kind)
        return []  # an event type the SDK does not accumulate either

    def _message_start(self, event: Mapping[str, Any], kind: str) -> None:
        if self._started:
            raise InputFormatError(f"{kind}: the message already started")
        message = f.obj(event, "message", kind)
        if message.get("content") != []:
            raise InputFormatError(f"{kind}: field 'message.content' must be an empty array")
        f.obj(message, "usage", f"{kind}.message")
        self._started = True

    def _start(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(event, "index", kind)
        if self._delta_seen:
            raise InputFormatError(f"{kind}: block {index} starts after the message_delta")
        if self._open:
            raise InputFormatError(
                f"{kind}: block {index} starts while block {self._blocks - 1} is open"
            )
        if index != self._blocks:
            raise InputFormatError(f"{kind}: the next block is {self._blocks}, not {index}")
        block = f.obj(event, "content_block", kind)
        where = f"{kind}.content_block"
        block_type = f.string(block, "type", where)
        out: list[Chunk] = []
        if block_type == _TOOL:
            call_id = naming.vendor_call(f.string(block, "id", where))
            name = f.string(block, "name", where)
            if block.get("input", {}) != {}:
                raise InputFormatError(f"{where}: a streamed tool_use starts with an empty input")
            if call_id in self._ids:
                raise InputFormatError(f"{kind}: tool_use id repeats another block's id")
            self._admit(len(self._calls) + 1, kind)
            self._calls[index] = call_id
            self._ids.add(call_id)
            out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name))
        text = _STARTS.get(block_type)
        if text is not None and not isinstance(block.get(text), str):
            raise InputFormatError(f"{where}: field {text!r} must be a string")
        self._blocks += 1
        self._last = block_type
        self._open = True
        return out

    def _current(self, event: Mapping[str, Any], kind: str) -> int:
        """The index of the open block, which `event` must name."""
        index = f.integer(event, "index", kind)
        if self._delta_seen or not self._open or index != self._blocks - 1:
            raise InputFormatError(f"{kind}: block {index} is not the open block")
        return index

    def _delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = self._current(event, kind)
        delta = f.obj(event, "delta", kind)
        delta_type = f.string(delta, "type", f"{kind}.delta")
        block_type = self._last
        call_id = self._calls.get(index)
        if delta_type not in _DELTAS:
            if call_id is not None:
                raise InputFormatError(f"{kind}: a tool_use block takes no {delta_type}")
            return []  # a delta type this adapter does not know, for a block that is no call
        if not _takes(block_type, delta_type):
            raise InputFormatError(f"{kind}: a {block_type} block takes no {delta_type}")
        field = _DELTAS[delta_type]
        if field is not None:
            text = delta.get(field)
            if not isinstance(text, str):
                raise InputFormatError(f"{kind}: field 'delta.{field}' must be a string")
            if call_id is not None and text:
                self._texts.add(index)
                return [self._chunk(ChunkKind.TOOL_CALL, call_id, delta=text)]
        return []

    def _message_delta(self, event: Mapping[str, Any], kind: str) -> None:
        delta = f.obj(event, "delta", kind)
        usage = f.obj(event, "usage", kind)
        f.integer(usage, "output_tokens", f"{kind}.usage")
        reason = f.opt_str(delta, "stop_reason", f"{kind}.delta")
        f.opt_str(delta, "stop_sequence", f"{kind}.delta")
        details = f.opt_obj(delta, "stop_details", f"{kind}.delta")
        self._delta_seen = True
        if reason is None or reason == self._reason:
            return  # a usage update: the stop reason given stands
        # (a state restored from before the reason was kept has only its `_stop`: then any
        # later reason counts as another)
        if self._reason is not None or self._stop is not None:
            raise InputFormatError(
                f"{kind}: stop_reason {reason!r} after the message stopped for {self._reason!r}"
            )
        self._reason = reason
        self._stop = _STOP.get(reason)
        if self._stop is FinishReason.REFUSAL:
            explanation = (details or {}).get("explanation")
            self._refusal = explanation if isinstance(explanation, str) else ""

    def _message_stop(self, kind: str) -> list[Chunk]:
        if not self._delta_seen:
            raise InputFormatError(f"{kind}: the message stops without a message_delta")
        out: list[Chunk] = []
        if self._stop in _RELEASE:
            # the last block, if the limit may have cut it: still open, or stopped by the limit
            length = self._stop is FinishReason.LENGTH
            cut = self._blocks - 1 if self._open or length else None
            for index, call_id in self._calls.items():
                if index != cut:
                    # a block that took no text has the input it started with, `{}` (the SDK's)
                    text = "" if index in self._texts else _NO_INPUT
                    out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, delta=text, final=True))
        if self._refusal is not None:
            refusal_id = naming.refusal(self._stream)
            out.append(self._chunk(ChunkKind.REFUSAL, refusal_id, delta=self._refusal, final=True))
        out.append(self._end(self._stop))
        return out

    def _error_event(self, event: Mapping[str, Any]) -> list[Chunk]:
        error = event.get("error")
        code = f.short_code(error.get("type"), "error") if isinstance(error, dict) else "error"
        return self._error(code)
