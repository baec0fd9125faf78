"""OpenAI Responses API stream events to internal chunks.

A function call opens with `response.output_item.added` (a `function_call` item with `call_id` and
`name`); its argument deltas name only `item_id` / `output_index`, mapped back to the `call_id`
here. `function_call_arguments.done` or `output_item.done` (status completed) closes it, after the
full `arguments` they carry go to the reassembler as the call's expected text, which must equal
the deltas it assembled (else the call is `stream_corrupt`). An item
that is never closed (`response.incomplete` mid-call) stays open, so the reassembler marks it
incomplete from the END's finish reason.

`sequence_number` is per stream, not per call, and older streams lack it. When a stream has it, a
repeated or older number is a replayed event and is dropped, and a jump past the next number gives
every open call a hole in its own chunk numbering (`seq`), so the reassembler reports a
`sequence_gap` instead of joining text around a lost delta. Other event types (text, reasoning,
built-in tools) yield nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.adapters import fields as f
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import Chunk, ChunkKind, FinishReason

FORMAT = "openai.responses"

_INCOMPLETE = {
    "max_output_tokens": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}


@dataclass(slots=True)
class _Call:
    call_id: str
    name: str
    open: bool = True
    next_seq: int = 0
    gapped: bool = False  # an event of this stream was lost while the call was open


class OpenAIResponsesAdapter(VendorAdapter):
    """Incremental decoder of one Responses API stream (one `StreamAdapter`)."""

    def __init__(
        self, stream_id: str, headers: Mapping[str, str], state: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(stream_id, headers)
        self._calls: dict[str, _Call] = {}  # by item id
        self._items: dict[int, str] = {}  # output_index -> item id
        self._numbered: bool | None = None
        self._last_seq = -1
        self._refusal: bool | None = None  # None: none seen; True: open; False: closed
        if state is not None:
            self._restore_base(state)
            self._calls = {item: _Call(*call) for item, call in state["calls"].items()}
            self._items = {int(i): item for i, item in state["items"].items()}
            self._numbered = state["numbered"]
            self._last_seq = state["last_seq"]
            self._refusal = state["refusal"]

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "calls": {
                item: [c.call_id, c.name, c.open, c.next_seq, c.gapped]
                for item, c in self._calls.items()
            },
            "items": {str(i): item for i, item in self._items.items()},
            "numbered": self._numbered,
            "last_seq": self._last_seq,
            "refusal": self._refusal,
        }

    def open_calls(self) -> list[str]:
        """The function calls not closed yet, and the refusal while it streams."""
        open_ids = [call.call_id for call in self._calls.values() if call.open]
        if self._refusal:
            open_ids.append(f"{self._stream}:refusal")
        return open_ids

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if self._finished:
            raise InputFormatError("openai.responses: event after the end of the stream")
        kind = f.string(event, "type", "openai.responses event")
        if self._replayed(event, kind):
            return []
        handler = _HANDLERS.get(kind)
        return handler(self, event, kind) if handler is not None else []

    def _replayed(self, event: Mapping[str, Any], kind: str) -> bool:
        seq = f.opt_int(event, "sequence_number", kind)
        if self._numbered is None:
            self._numbered = seq is not None
        if not self._numbered or seq is None:
            return False
        if seq <= self._last_seq:
            return True
        if seq > self._last_seq + 1 and self._last_seq >= 0:
            for call in self._calls.values():
                if call.open:
                    call.next_seq += 1  # the lost event may have been this call's
                    call.gapped = True
        self._last_seq = seq
        return False

    # -- function calls -------------------------------------------------------------------

    def _added(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        item = f.obj(event, "item", kind)
        if item.get("type") != "function_call":
            return []
        item_id = self._register(event, item, kind)
        call = self._calls[item_id]
        arguments = f.opt_str(item, "arguments", f"{kind}.item") or ""
        return [self._call_chunk(call, tool=call.name, delta=arguments)]

    def _register(self, event: Mapping[str, Any], item: Mapping[str, Any], kind: str) -> str:
        where = f"{kind}.item"
        call_id = f.string(item, "call_id", where)
        name = f.string(item, "name", where)
        index = f.opt_int(event, "output_index", kind)
        item_id = f.opt_str(item, "id", where) or f"{call_id}@{index}"
        if item_id in self._calls:
            raise InputFormatError(f"{kind}: item {item_id!r} was already added")
        if any(call.call_id == call_id for call in self._calls.values()):
            raise InputFormatError(f"{kind}: call_id repeats another item's call_id")
        self._calls[item_id] = _Call(call_id, name)
        if index is not None:
            self._items[index] = item_id
        return item_id

    def _find(self, event: Mapping[str, Any], kind: str) -> _Call:
        item_id = f.opt_str(event, "item_id", kind)
        if item_id is None:
            index = f.opt_int(event, "output_index", kind)
            item_id = self._items.get(index) if index is not None else None
            if item_id is None:
                raise InputFormatError(f"{kind}: names no known item (no item_id, output_index)")
        call = self._calls.get(item_id)
        if call is None:
            raise InputFormatError(f"{kind}: item {item_id!r} is not an open function call")
        return call

    def _delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        call = self._find(event, kind)
        if not call.open:
            raise InputFormatError(f"{kind}: arguments delta after the call was closed")
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise InputFormatError(f"{kind}: field 'delta' must be a string")
        if not delta:
            return []
        return [self._call_chunk(call, delta=delta)]

    def _arguments_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        call = self._find(event, kind)
        name = f.opt_str(event, "name", kind)
        if name is not None and name != call.name:
            raise InputFormatError(f"{kind}: 'name' differs from the item's name")
        arguments = event.get("arguments")
        if not isinstance(arguments, str):
            raise InputFormatError(f"{kind}: field 'arguments' must be a string")
        return self._close(call, arguments, kind)

    def _item_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        item = f.obj(event, "item", kind)
        if item.get("type") != "function_call":
            return []
        status = f.opt_str(item, "status", f"{kind}.item")
        arguments = f.opt_str(item, "arguments", f"{kind}.item") or ""
        item_id = f.opt_str(item, "id", f"{kind}.item")
        if item_id is None:
            index = f.opt_int(event, "output_index", kind)
            item_id = self._items.get(index) if index is not None else None
        call = self._calls.get(item_id) if item_id is not None else None
        if call is None:
            # Only the finished item was sent: the whole call in one chunk.
            call = self._calls[self._register(event, item, kind)]
            if status not in (None, "completed"):
                return [self._call_chunk(call, tool=call.name, delta=arguments)]
            call.open = False
            return [self._call_chunk(call, tool=call.name, delta=arguments, final=True)]
        if call.call_id != f.string(item, "call_id", f"{kind}.item"):
            raise InputFormatError(f"{kind}: the item's call_id changed")
        if not call.open or status not in (None, "completed"):
            return []
        return self._close(call, arguments, kind)

    def _close(self, call: _Call, arguments: str, kind: str) -> list[Chunk]:
        if not call.open:
            return []
        call.open = False
        # after a lost event the texts differ by design: the seq hole already condemns the call
        expected = None if call.gapped else arguments
        return [self._call_chunk(call, final=True, expected=expected)]

    # -- refusal, errors, end -------------------------------------------------------------

    def _refusal_delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise InputFormatError(f"{kind}: field 'delta' must be a string")
        if self._refusal is False:
            raise InputFormatError(f"{kind}: refusal delta after the refusal was done")
        self._refusal = True
        return [self._chunk(ChunkKind.REFUSAL, f"{self._stream}:refusal", delta=delta)]

    def _refusal_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        text = f.opt_str(event, "refusal", kind) or ""
        first, self._refusal = self._refusal is None, False
        delta = text if first else ""
        return [self._chunk(ChunkKind.REFUSAL, f"{self._stream}:refusal", delta=delta, final=True)]

    def _completed(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        f.obj(event, "response", kind)
        if self._refusal is not None:
            finish = FinishReason.REFUSAL
        elif self._calls:
            finish = FinishReason.TOOL_CALLS
        else:
            finish = FinishReason.STOP
        return [self._end(finish)]

    def _incomplete(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        response = f.obj(event, "response", kind)
        details = f.opt_obj(response, "incomplete_details", f"{kind}.response") or {}
        reason = f.opt_str(details, "reason", f"{kind}.response.incomplete_details")
        return [self._end(_INCOMPLETE.get(reason or ""))]

    def _failed(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        response = f.obj(event, "response", kind)
        error = f.opt_obj(response, "error", f"{kind}.response") or {}
        return self._error(f.short_code(error.get("code"), "response_failed"))

    def _error_event(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        nested = event.get("error")
        source = nested if isinstance(nested, dict) else event
        code = f.short_code(source.get("code"), f.short_code(source.get("type"), "error"))
        return self._error(code)

    def _call_chunk(
        self,
        call: _Call,
        *,
        tool: str | None = None,
        delta: str = "",
        final: bool = False,
        expected: str | None = None,
    ) -> Chunk:
        seq = None
        if self._numbered:
            seq, call.next_seq = call.next_seq, call.next_seq + 1
        return self._chunk(
            ChunkKind.TOOL_CALL,
            call.call_id,
            seq=seq,
            tool=tool,
            delta=delta,
            final=final,
            expected=expected,
        )


_HANDLERS = {
    "response.output_item.added": OpenAIResponsesAdapter._added,
    "response.function_call_arguments.delta": OpenAIResponsesAdapter._delta,
    "response.function_call_arguments.done": OpenAIResponsesAdapter._arguments_done,
    "response.output_item.done": OpenAIResponsesAdapter._item_done,
    "response.refusal.delta": OpenAIResponsesAdapter._refusal_delta,
    "response.refusal.done": OpenAIResponsesAdapter._refusal_done,
    "response.completed": OpenAIResponsesAdapter._completed,
    "response.incomplete": OpenAIResponsesAdapter._incomplete,
    "response.failed": OpenAIResponsesAdapter._failed,
    "error": OpenAIResponsesAdapter._error_event,
}
