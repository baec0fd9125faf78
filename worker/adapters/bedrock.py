"""Amazon Bedrock `ConverseStream` events to internal chunks.

A record is one event, in either of the forms a producer has at hand: the JSON object boto3
yields (`{"contentBlockDelta": {...}}`, one member naming the event), or the event's JSON
payload as the AWS event stream carries it, with the message's `:event-type` (for an exception,
its `:exception-type`) in the record header `event-type` (the decoder wraps it into the first
form). A recorded HTTP body in the AWS event-stream framing is read into the first form by
`callgate check` (`worker.adapters.input`).

A client call is a `toolUse` block: `contentBlockStart` carries its `toolUseId` and `name`,
`contentBlockDelta` pieces of its input text (`delta.toolUse.input`), `contentBlockStop` ends
it. A block with no input text at all is a call without arguments, `{}` (what Converse's whole
message has for it). A `toolUse` whose `type` is `server_tool_use` is a tool Bedrock runs
itself (Nova's code interpreter), and its `toolResult` block too: neither is a client call,
and text and reasoning blocks (which start with their first delta) yield nothing.

`messageStop` ends the stream (one END); the `metadata` event (usage) that follows it carries
nothing (`after_end`).
Every call is held until the END and released according to `stopReason`: `tool_use`,
`end_turn` and `stop_sequence` release the stopped tool blocks; `max_tokens` and
`model_context_window_exceeded` release them too except the message's last block when it is a
call (the limit may have cut it: `incomplete` `max_tokens`), never a block still open;
`guardrail_intervened` and `content_filtered` are `incomplete` `content_filter`;
`malformed_tool_use` and `malformed_model_output` release nothing and are a rejected record of
code `malformed_tool_call`; any other reason releases nothing (`stream_ended`). An exception
event (`throttlingException`, `modelStreamErrorException`, ...) ends the stream as a vendor
error with its name as the code.

An event is refused (the stream breaks, see `_base`) when it cannot be placed the way the API
streams: not one object member naming a known event, a stream that does not start with
`messageStart` or has a second one, a `contentBlockIndex` that is neither the open block nor
the next one, a block started twice or while another is open, a `toolUse` start without a
non-empty `toolUseId` and `name` or with an id another block has, a tool delta for a block that
is no tool call or a text delta for one that is, an input piece that is not a string, a stop
for a block that is not open, a block event after `messageStop`, or `messageStop` without a
string `stopReason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker._native import Chunk
from worker.adapters import fields as f
from worker.adapters import naming
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code, FinishReason

FORMAT = "bedrock.converse"
#: the record header naming a bare payload's event type (the event stream's `:event-type`)
EVENT_TYPE_HEADER = "event-type"

_STOP = {
    "tool_use": FinishReason.TOOL_CALLS,
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "guardrail_intervened": FinishReason.CONTENT_FILTER,
    "content_filtered": FinishReason.CONTENT_FILTER,
}
_MALFORMED = frozenset({"malformed_tool_use", "malformed_model_output"})
EVENTS = frozenset(
    {
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    }
)
#: what a block is: a client call, a server tool's use or result, or content (text, reasoning)
_CALL, _SERVER, _CONTENT = "call", "server", "content"


class BedrockAdapter(VendorAdapter):
    """Incremental decoder of one ConverseStream (one `StreamAdapter`)."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        self._started = False  # messageStart seen
        self._blocks = 0  # blocks begun (by their start or their first delta)
        self._kind = ""  # the last block's kind
        self._open = False  # the last block has not stopped
        self._calls: dict[int, str] = {}  # the call blocks' ids, by index
        self._empty: list[int] = []  # call blocks with no input text yet
        self._server: list[str] = []  # the ids of the server tools' blocks
        if state is not None:
            self._restore_base(state)
            self._started = state["started"]
            self._blocks, self._kind, self._open = state["blocks"]
            self._calls = {int(i): call for i, call in state["calls"].items()}
            self._empty = list(state["empty"])
            self._server = list(state["server"])
        self._ids = {*self._calls.values(), *self._server}

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "started": self._started,
            "blocks": [self._blocks, self._kind, self._open],
            "calls": {str(i): call for i, call in self._calls.items()},
            "empty": self._empty,
            "server": self._server,
        }

    @property
    def held(self) -> int:
        return 0 if self._finished else len(self._calls)

    def open_calls(self) -> list[str]:
        """Every tool block of the message: none is released before the END."""
        return [] if self._finished else list(self._calls.values())

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A `toolUse` block's start."""
        start = event.get("contentBlockStart")
        start = start.get("start") if isinstance(start, dict) else None
        tool = start.get("toolUse") if isinstance(start, dict) else None
        if not isinstance(tool, dict) or tool.get("type") == "server_tool_use":
            return []
        call_id, name = tool.get("toolUseId"), tool.get("name")
        if isinstance(call_id, str) and call_id and isinstance(name, str) and name:
            return [(naming.vendor_call(call_id), name)]
        return []

    @classmethod
    def after_end(cls, event: Mapping[str, Any]) -> bool:
        """The `metadata` event (usage, metrics) follows the stream's `messageStop`."""
        return len(event) == 1 and isinstance(event.get("metadata"), dict)

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if len(event) != 1:
            raise InputFormatError("bedrock.converse: an event is an object of one member")
        ((kind, body),) = event.items()
        if kind.endswith("Exception"):
            return self._error(f.short_code(kind, "exception"))
        if kind not in EVENTS:
            raise InputFormatError("bedrock.converse: not a ConverseStream event")
        if not isinstance(body, dict):
            raise InputFormatError(f"{kind}: must be an object")
        if kind == "metadata":
            raise InputFormatError(f"{kind}: comes after messageStop")
        if kind == "messageStart":
            if self._started:
                raise InputFormatError(f"{kind}: the message already started")
            if f.string(body, "role", kind) != "assistant":
                raise InputFormatError(f"{kind}: field 'role' must be 'assistant'")
            self._started = True
            return []
        if not self._started:
            raise InputFormatError(f"{kind}: the stream must start with messageStart")
        if kind == "contentBlockStart":
            return self._start(body, kind)
        if kind == "contentBlockDelta":
            return self._delta(body, kind)
        if kind == "contentBlockStop":
            self._current(body, kind)
            self._open = False
            return []
        return self._stop(body, kind)

    def _start(self, body: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(body, "contentBlockIndex", kind)
        if self._open:
            raise InputFormatError(
                f"{kind}: block {index} starts while block {self._blocks - 1} is open"
            )
        if index != self._blocks:
            raise InputFormatError(f"{kind}: the next block is {self._blocks}, not {index}")
        start = f.obj(body, "start", kind)
        tool = f.opt_obj(start, "toolUse", f"{kind}.start")
        self._blocks += 1
        self._open = True
        if tool is None:
            self._kind = _SERVER if "toolResult" in start else _CONTENT
            return []
        where = f"{kind}.start.toolUse"
        call_id = naming.vendor_call(f.string(tool, "toolUseId", where))
        name = f.string(tool, "name", where)
        tool_type = f.opt_str(tool, "type", where)
        if tool_type not in (None, "tool_use", "server_tool_use"):
            raise InputFormatError(f"{where}: field 'type' is not a tool use")
        if call_id in self._ids:
            raise InputFormatError(f"{where}: toolUseId repeats another block's id")
        if tool_type == "server_tool_use":
            self._admit(len(self._server) + 1, kind)
            self._kind = _SERVER
            self._server.append(call_id)
            self._ids.add(call_id)
            return []
        self._admit(len(self._calls) + 1, kind)
        self._kind = _CALL
        self._calls[index] = call_id
        self._ids.add(call_id)
        self._empty.append(index)
        return [self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name)]

    def _current(self, body: Mapping[str, Any], kind: str) -> int:
        index = f.integer(body, "contentBlockIndex", kind)
        if not self._open or index != self._blocks - 1:
            raise InputFormatError(f"{kind}: block {index} is not the open block")
        return index

    def _delta(self, body: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(body, "contentBlockIndex", kind)
        delta = f.obj(body, "delta", kind)
        if not self._open and index == self._blocks:  # a text or reasoning block begins
            self._blocks += 1
            self._open = True
            self._kind = _CONTENT
        index = self._current(body, kind)
        tool = f.opt_obj(delta, "toolUse", f"{kind}.delta")
        if self._kind == _CALL and (tool is None or len(delta) != 1):
            raise InputFormatError(f"{kind}: a tool call's block takes only toolUse input")
        if self._kind == _CONTENT and tool is not None:
            raise InputFormatError(f"{kind}: block {index} is no tool call and takes no input")
        if tool is None:
            # the text an accumulator joins (strands-agents' does) must be text
            f.opt_str(delta, "text", f"{kind}.delta")
            reasoning = f.opt_obj(delta, "reasoningContent", f"{kind}.delta")
            for name in ("text", "signature"):
                f.opt_str(reasoning or {}, name, f"{kind}.delta.reasoningContent")
            return []
        text = f.text(tool, "input", f"{kind}.delta.toolUse")
        call_id = self._calls.get(index)
        if call_id is None or not text:
            return []
        if index in self._empty:
            self._empty.remove(index)
        return [self._chunk(ChunkKind.TOOL_CALL, call_id, delta=text)]

    def _stop(self, body: Mapping[str, Any], kind: str) -> list[Chunk]:
        reason = f.string(body, "stopReason", kind)
        out: list[Chunk] = []
        finish = _STOP.get(reason)
        if reason in _MALFORMED:
            detail = f"bedrock.converse: the message stopped {reason}"
            out.append(
                Chunk(
                    self._stream,
                    ChunkKind.MALFORMED,
                    delta=detail,
                    error=Code.MALFORMED_TOOL_CALL.value,
                )
            )
            finish = FinishReason.ERROR
        if finish in (FinishReason.STOP, FinishReason.TOOL_CALLS, FinishReason.LENGTH):
            last = self._blocks - 1
            for index, call_id in self._calls.items():
                if index == last and (self._open or finish is FinishReason.LENGTH):
                    continue  # still open, or the limit may have cut it
                delta = "{}" if index in self._empty else ""
                out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, delta=delta, final=True))
        out.append(self._end(finish))
        return out
