"""OpenAI Chat Completions stream chunks (`chat.completion.chunk`) to internal chunks.

Tool calls arrive as `choices[].delta.tool_calls[]`, keyed by `index` within the choice; `id` and
`function.name` come only on a call's first delta. Chat Completions has no per-call close event:
the calls of a choice are closed only by that choice's `finish_reason` of `tool_calls` or `stop`;
after `length` or `content_filter` they stay open, so the reassembler marks them incomplete.
The stream ends (one END chunk) once every choice seen has its finish reason, or at the usage
chunk (`choices: []`) that closes a stream; a usage chunk after the end is ignored.

With n > 1 choices, the calls and the refusal of choice k > 0 get a `:k` suffix on their ids so
that equal vendor ids in two choices cannot merge. Text content is not a call and yields nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.adapters import fields as f
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import Chunk, ChunkKind, FinishReason

FORMAT = "openai.chat"

_FINISH = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}
#: finish reasons that say the choice's calls are structurally complete
_CLOSES = frozenset({FinishReason.STOP, FinishReason.TOOL_CALLS})
#: when choices end differently, the END carries the reason that matters most for open calls
_PRIORITY = (
    FinishReason.CONTENT_FILTER,
    FinishReason.LENGTH,
    FinishReason.ERROR,
    FinishReason.REFUSAL,
    FinishReason.TOOL_CALLS,
    FinishReason.STOP,
)


@dataclass(slots=True)
class _Call:
    call_id: str
    vendor_id: str | None
    name: str


@dataclass(slots=True)
class _Choice:
    calls: dict[int, _Call] = field(default_factory=dict)
    call_ids: set[str] = field(default_factory=set)
    refusal: bool = False
    done: bool = False
    finish: FinishReason | None = None

    def state(self) -> dict[str, Any]:
        return {
            "calls": {str(i): [c.call_id, c.vendor_id, c.name] for i, c in self.calls.items()},
            "refusal": self.refusal,
            "done": self.done,
            "finish": self.finish,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _Choice:
        calls = {int(i): _Call(*call) for i, call in state["calls"].items()}
        finish = state["finish"]
        return cls(
            calls,
            {call.call_id for call in calls.values()},
            state["refusal"],
            state["done"],
            FinishReason(finish) if finish is not None else None,
        )


class OpenAIChatAdapter(VendorAdapter):
    """Incremental decoder of one Chat Completions stream (one `StreamAdapter`)."""

    def __init__(
        self, stream_id: str, headers: Mapping[str, str], state: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(stream_id, headers)
        self._choices: dict[int, _Choice] = {}
        if state is not None:
            self._restore_base(state)
            self._choices = {int(i): _Choice.from_state(c) for i, c in state["choices"].items()}

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "choices": {str(i): choice.state() for i, choice in self._choices.items()},
        }

    def open_calls(self) -> list[str]:
        """The calls (and refusals) of every choice not closed by its finish reason."""
        open_ids: list[str] = []
        for index, choice in self._choices.items():
            if choice.done and choice.finish in _CLOSES:
                continue
            open_ids.extend(call.call_id for call in choice.calls.values())
            if choice.refusal:
                open_ids.append(self._refusal_id(index))
        return open_ids

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if self._finished:
            raise InputFormatError("openai.chat: event after the end of the stream")
        if "error" in event and "choices" not in event:
            return self._error_event(event)
        choices = f.array(event, "choices", "chat.completion.chunk")
        out: list[Chunk] = []
        if not choices:
            # The usage chunk is the stream's last one.
            self._finished = True
            if self._choices:
                out.append(self._end(self._end_reason()))
            return out
        for raw in choices:
            if not isinstance(raw, dict):
                raise InputFormatError("chat.completion.chunk: each of 'choices' must be an object")
            self._choice(raw, out)
        if all(choice.done for choice in self._choices.values()):
            out.append(self._end(self._end_reason()))
        return out

    def _choice(self, raw: Mapping[str, Any], out: list[Chunk]) -> None:
        index = f.integer(raw, "index", "choices[]")
        where = f"choices[{index}]"
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = _Choice()
        elif choice.done:
            raise InputFormatError(f"{where}: delta after the choice's finish_reason")
        delta = f.opt_obj(raw, "delta", where) or {}
        if delta.get("function_call") is not None:
            raise InputFormatError(f"{where}: legacy delta.function_call is not supported")
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise InputFormatError(f"{where}: delta.tool_calls must be an array")
            for call in tool_calls:
                if not isinstance(call, dict):
                    raise InputFormatError(f"{where}: each of delta.tool_calls must be an object")
                self._tool_delta(index, choice, call, out)
        refusal = f.opt_str(delta, "refusal", f"{where}.delta")
        if refusal is not None and (refusal or not choice.refusal):
            choice.refusal = True
            out.append(self._chunk(ChunkKind.REFUSAL, self._refusal_id(index), delta=refusal))
        raw_finish = f.opt_str(raw, "finish_reason", where)
        if raw_finish is not None:
            self._finish(index, choice, raw_finish, out)

    def _tool_delta(
        self, choice_index: int, choice: _Choice, raw: Mapping[str, Any], out: list[Chunk]
    ) -> None:
        index = f.integer(raw, "index", f"choices[{choice_index}].delta.tool_calls[]")
        where = f"choices[{choice_index}].delta.tool_calls[{index}]"
        vendor_id = f.opt_str(raw, "id", where) or None
        function = f.opt_obj(raw, "function", where) or {}
        name = f.opt_str(function, "name", f"{where}.function") or None
        arguments = f.opt_str(function, "arguments", f"{where}.function") or ""
        call = choice.calls.get(index)
        if call is None:
            if name is None:
                raise InputFormatError(f"{where}: the first delta of a tool call needs its name")
            base = vendor_id or f"{self._stream}:{choice_index}:{index}"
            call_id = base if choice_index == 0 else f"{base}:{choice_index}"
            if call_id in choice.call_ids:
                raise InputFormatError(f"{where}: tool call id repeats another call's id")
            choice.calls[index] = _Call(call_id, vendor_id, name)
            choice.call_ids.add(call_id)
            out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name, delta=arguments))
            return
        if vendor_id is not None and vendor_id != call.vendor_id:
            raise InputFormatError(f"{where}: the tool call's id changed mid-stream")
        if name is not None and name != call.name:
            raise InputFormatError(f"{where}: the tool call's name changed mid-stream")
        if arguments:
            out.append(self._chunk(ChunkKind.TOOL_CALL, call.call_id, delta=arguments))

    def _finish(self, index: int, choice: _Choice, raw: str, out: list[Chunk]) -> None:
        finish = _FINISH.get(raw)
        choice.done = True
        choice.finish = (
            FinishReason.REFUSAL if finish is FinishReason.STOP and choice.refusal else finish
        )
        if finish in _CLOSES:
            for call in choice.calls.values():
                out.append(self._chunk(ChunkKind.TOOL_CALL, call.call_id, final=True))
            if choice.refusal:
                out.append(self._chunk(ChunkKind.REFUSAL, self._refusal_id(index), final=True))

    def _error_event(self, event: Mapping[str, Any]) -> list[Chunk]:
        error = event.get("error")
        code = "error"
        if isinstance(error, dict):
            code = f.short_code(error.get("code"), f.short_code(error.get("type"), "error"))
        return self._error(code)

    def _end_reason(self) -> FinishReason | None:
        reasons = {choice.finish for choice in self._choices.values()}
        finish = next((reason for reason in _PRIORITY if reason in reasons), None)
        if None in reasons and finish in _CLOSES:
            finish = None  # a choice without a known finish reason: its calls ended with the stream
        return finish

    def _refusal_id(self, choice_index: int) -> str:
        base = f"{self._stream}:refusal"
        return base if choice_index == 0 else f"{base}:{choice_index}"
