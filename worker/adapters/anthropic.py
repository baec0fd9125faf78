"""Anthropic Messages API stream events to internal chunks.

A client tool call is a `tool_use` content block: `content_block_start` carries its id and name,
`input_json_delta.partial_json` its argument text (the first is often `""`), `content_block_stop`
closes it. On `max_tokens` the open block gets no stop, so it stays open and the END (LENGTH)
makes it incomplete. `server_tool_use` blocks (tools the API runs itself) and text or thinking
blocks are not client calls and yield nothing. `message_delta.stop_reason` is the finish signal;
the END is emitted at `message_stop`, the stream's last event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.adapters import fields as f
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import Chunk, ChunkKind, FinishReason

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
_OTHER = ""  # a block that is not a client tool call
_CLOSED = None  # a client tool call's block after its stop


class AnthropicAdapter(VendorAdapter):
    """Incremental decoder of one Messages API stream (one `StreamAdapter`)."""

    def __init__(
        self, stream_id: str, headers: Mapping[str, str], state: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(stream_id, headers)
        self._blocks: dict[int, str | None] = {}  # index -> open call id, _OTHER or _CLOSED
        self._stop: FinishReason | None = None
        self._refusal: str | None = None
        if state is not None:
            self._restore_base(state)
            self._blocks = {int(i): block for i, block in state["blocks"].items()}
            self._stop = FinishReason(state["stop"]) if state["stop"] is not None else None
            self._refusal = state["refusal"]

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "blocks": {str(i): block for i, block in self._blocks.items()},
            "stop": self._stop,
            "refusal": self._refusal,
        }

    def open_calls(self) -> list[str]:
        """The tool_use blocks started and not stopped."""
        return [block for block in self._blocks.values() if block]

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if self._finished:
            raise InputFormatError("anthropic.messages: event after the end of the stream")
        kind = f.string(event, "type", "anthropic.messages event")
        if kind == "content_block_start":
            return self._start(event, kind)
        if kind == "content_block_delta":
            return self._delta(event, kind)
        if kind == "content_block_stop":
            return self._block_stop(event, kind)
        if kind == "message_delta":
            self._message_delta(event, kind)
        elif kind == "message_stop":
            return self._message_stop()
        elif kind == "error":
            return self._error_event(event)
        return []

    def _start(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(event, "index", kind)
        if index in self._blocks:
            raise InputFormatError(f"{kind}: block {index} was already started")
        block = f.obj(event, "content_block", kind)
        if block.get("type") != "tool_use":
            self._blocks[index] = _OTHER
            return []
        where = f"{kind}.content_block"
        call_id = f.string(block, "id", where)
        name = f.string(block, "name", where)
        if call_id in self._blocks.values():
            raise InputFormatError(f"{kind}: tool_use id repeats an open block's id")
        self._blocks[index] = call_id
        return [self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name)]

    def _block(self, event: Mapping[str, Any], kind: str) -> tuple[int, str | None]:
        index = f.integer(event, "index", kind)
        if index not in self._blocks:
            raise InputFormatError(f"{kind}: block {index} was never started")
        return index, self._blocks[index]

    def _delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index, call_id = self._block(event, kind)
        delta = f.obj(event, "delta", kind)
        if delta.get("type") != "input_json_delta" or call_id == _OTHER:
            return []
        if call_id is _CLOSED:
            raise InputFormatError(f"{kind}: delta for block {index} after its stop")
        partial = delta.get("partial_json")
        if not isinstance(partial, str):
            raise InputFormatError(f"{kind}: field 'delta.partial_json' must be a string")
        return [self._chunk(ChunkKind.TOOL_CALL, call_id, delta=partial)] if partial else []

    def _block_stop(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index, call_id = self._block(event, kind)
        if call_id == _OTHER:
            return []
        if call_id is _CLOSED:
            raise InputFormatError(f"{kind}: block {index} was already stopped")
        self._blocks[index] = _CLOSED
        return [self._chunk(ChunkKind.TOOL_CALL, call_id, final=True)]

    def _message_delta(self, event: Mapping[str, Any], kind: str) -> None:
        delta = f.obj(event, "delta", kind)
        reason = f.opt_str(delta, "stop_reason", f"{kind}.delta")
        if reason is None:
            return
        self._stop = _STOP.get(reason)
        if self._stop is FinishReason.REFUSAL:
            details = f.opt_obj(delta, "stop_details", f"{kind}.delta") or {}
            explanation = details.get("explanation")
            self._refusal = explanation if isinstance(explanation, str) else ""

    def _message_stop(self) -> list[Chunk]:
        out = []
        if self._refusal is not None:
            refusal_id = f"{self._stream}:refusal"
            out.append(self._chunk(ChunkKind.REFUSAL, refusal_id, delta=self._refusal, final=True))
        out.append(self._end(self._stop))
        return out

    def _error_event(self, event: Mapping[str, Any]) -> list[Chunk]:
        error = event.get("error")
        code = f.short_code(error.get("type"), "error") if isinstance(error, dict) else "error"
        return self._error(code)
