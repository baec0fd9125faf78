"""OpenAI Chat Completions stream chunks (`chat.completion.chunk`) to internal chunks.

Tool calls arrive as `choices[].delta.tool_calls[]`, keyed by `index` within the choice; `id` and
`function.name` come only on a call's first delta. Chat Completions has no per-call close event:
the calls of a choice are complete once that choice's `finish_reason` is `tool_calls` or `stop`;
after `length` or `content_filter` they end incomplete (`max_tokens`, `content_filter`), each
call by its own choice's finish whatever the other choices' were (a choice that never finished:
`stream_ended`). The stream ends (one END chunk) once every choice seen has its finish reason,
or at the usage chunk (`choices: []`) that closes a stream. Every call is held until that END
(see `_base`).

The official SDK (`ChatCompletionStreamState`) is the reference for what a stream means, and it
places pieces by position: a choice's `index` and a tool call's `index` are list positions, every
string field is concatenated onto what came before, and a chunk whose `object` is not a chunk's is
skipped. So an event is refused when the SDK would read it differently from us, or could not:

- `object` other than `chat.completion.chunk` (an empty one, Azure's filter annotation, only when
  it carries nothing), a truthy `error` ends the stream as a vendor error;
- `choices` not an array of objects, a choice `index` that is not the next new one or a known
  one, `delta` not an object, `logprobs` / `moderation` / `usage` not objects;
- any text field (`content`, `refusal`, `role`, `finish_reason`, a call's `id`, `type`,
  `function.name`, `function.arguments`) that is not a string or null; `function_call` (legacy);
- a tool call entry that is not an object, without `function`, a `type` other than `function`,
  an `index` that is neither the next new call nor the current one (calls stream one after the
  other: a piece for an earlier call, or a later call out of order, is refused);
- a first delta without a name, with an empty id, or with an id another call has; a later one that
  names an id or a name (the SDK would append it to the call's own);
- anything but an empty delta for a choice after its finish reason, a second finish reason.

With n > 1 choices, the calls and the refusal of choice k > 0 are tagged `#k`
(`worker.adapters.naming`) so that equal vendor ids in two choices cannot merge. Text content is
not a call and yields nothing.

A stream read in a dialect (`worker.adapters.dialects`) relaxes only what its server does: with
`reused_index` (Ollama, Dynamo) a delta at the current index that opens with a new id and a name
is the next call; with `cut_calls_finish_as_tool_calls` (vLLM) each call's text is followed
(where its JSON value ends) and a call whose text ends inside its value is not released, ending
`max_tokens` instead: a cut call is never accepted, whatever the finish reason says; with
`double_encoded_arguments` (vLLM) each call says so on its first chunk, and the gate decodes its
text once if it is a JSON string (a recorded repair, `worker.core.repair`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker._native import Chunk
from worker.adapters import dialects, naming
from worker.adapters import fields as f
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, FinishReason

FORMAT = "openai.chat"
OBJECT = "chat.completion.chunk"

_FINISH = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}
#: finish reasons that release a choice's calls (REFUSAL: a STOP after a refusal)
_RELEASES = frozenset({FinishReason.STOP, FinishReason.TOOL_CALLS, FinishReason.REFUSAL})
#: delta values that change nothing in the SDK's snapshot (allowed after a choice finished)
_EMPTY: tuple[Any, ...] = (None, "", [])


class _JsonEnd:
    """Whether a text read piece by piece has ended its JSON value: its nesting depth, and
    whether it is inside a string (an escape pending) or has seen a value at all."""

    __slots__ = ("depth", "escape", "started", "string")

    def __init__(self, state: list[Any] | None = None) -> None:
        self.depth, self.string, self.escape, self.started = state or [0, False, False, False]

    def state(self) -> list[Any]:
        return [self.depth, self.string, self.escape, self.started]

    def feed(self, text: str) -> None:
        for char in text:
            if self.string:
                if self.escape:
                    self.escape = False
                elif char == "\\":
                    self.escape = True
                elif char == '"':
                    self.string = False
            elif char == '"':
                self.string = self.started = True
            elif char in "{[":
                self.depth += 1
                self.started = True
            elif char in "}]":
                self.depth -= 1
            elif not char.isspace():
                self.started = True

    @property
    def ended(self) -> bool:
        return self.started and self.depth <= 0 and not self.string


class _Choice:
    __slots__ = ("calls", "done", "ends", "finish", "refusal")

    def __init__(
        self,
        calls: list[str] | None = None,
        refusal: bool = False,
        done: bool = False,
        finish: FinishReason | None = None,
        ends: list[_JsonEnd] | None = None,
    ) -> None:
        self.calls = calls if calls is not None else []  # call ids, by tool call index
        self.refusal = refusal  # the refusal channel is open
        self.done = done  # the choice has its finish reason
        self.finish = finish  # that reason, normalized (None: unknown)
        self.ends = ends if ends is not None else []  # each call's JSON end (vLLM's dialect)

    def state(self) -> list[Any]:
        return [self.calls, self.refusal, self.done, self.finish, [e.state() for e in self.ends]]

    @classmethod
    def from_state(cls, state: list[Any]) -> _Choice:
        calls, refusal, done, finish, ends = state
        finish = FinishReason(finish) if finish is not None else None
        return cls(list(calls), refusal, done, finish, [_JsonEnd(e) for e in ends])


class OpenAIChatAdapter(VendorAdapter):
    """Incremental decoder of one Chat Completions stream (one `StreamAdapter`)."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        self._dialect = dialects.DIALECTS.get(headers.get(dialects.HEADER) or "")
        self._choices: list[_Choice] = []
        self._ids: set[str] = set()  # every call id of the stream (they must not repeat)
        self._held = 0
        self._done = 0  # choices with their finish reason
        if state is not None:
            self._restore_base(state)
            self._choices = [_Choice.from_state(c) for c in state["choices"]]
            self._ids = {call for choice in self._choices for call in choice.calls}
            self._held = sum(len(c.calls) + c.refusal for c in self._choices)
            self._done = sum(c.done for c in self._choices)

    def state(self) -> dict[str, Any]:
        return {**self._base_state(), "choices": [choice.state() for choice in self._choices]}

    @property
    def held(self) -> int:
        return 0 if self._finished else self._held

    def open_calls(self) -> list[str]:
        """Every call and refusal of the stream: none is released before the END."""
        if self._finished:
            return []
        open_ids: list[str] = []
        for index, choice in enumerate(self._choices):
            open_ids.extend(choice.calls)
            if choice.refusal:
                open_ids.append(self._refusal_id(index))
        return open_ids

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Each tool call delta that opens a call (with its id and name)."""
        found: list[tuple[str, str]] = []
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            number = choice.get("index") if isinstance(choice, dict) else None
            if type(number) is not int:
                continue  # the ids of its calls depend on a choice that cannot be told
            for call in calls if isinstance(calls, list) else []:
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                call_id = call.get("id") if isinstance(call, dict) else None
                if isinstance(call_id, str) and call_id and isinstance(name, str) and name:
                    found.append((naming.vendor_call(call_id, number), name))
        return found

    @classmethod
    def after_end(cls, event: Mapping[str, Any]) -> bool:
        """The usage chunk (`choices: []`), and a chunk whose choices carry nothing the SDK
        would take (an empty delta, no finish reason), may follow the stream's end."""
        choices = event.get("choices")
        if (
            event.get("error")
            or event.get("object") not in (OBJECT, "")
            or type(choices) is not list
        ):
            return False
        return not any(_carries(choice) for choice in choices)

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if event.get("error"):
            return self._error_event(event["error"])
        choices = f.array(event, "choices", "chat.completion.chunk")
        kind = event.get("object")
        if kind != OBJECT:
            if kind == "" and not any(_carries(choice) for choice in choices):
                return []  # an annotation the SDK skips, and it carries nothing
            raise InputFormatError(f"chat.completion.chunk: field 'object' must be {OBJECT!r}")
        f.opt_obj(event, "usage", "chat.completion.chunk")
        f.opt_obj(event, "moderation", "chat.completion.chunk")
        f.opt_str(event, "system_fingerprint", "chat.completion.chunk")
        out: list[Chunk] = []
        if not choices:
            # The usage chunk is the stream's last one.
            if not self._choices:
                self._finished = True
                return out
            return self._close_stream(out)
        for raw in choices:
            if not isinstance(raw, dict):
                raise InputFormatError("chat.completion.chunk: each of 'choices' must be an object")
            self._choice(raw, out)
        if self._done == len(self._choices):
            return self._close_stream(out)
        return out

    def _choice(self, raw: Mapping[str, Any], out: list[Chunk]) -> None:
        index = f.integer(raw, "index", "choices[]")
        where = f"choices[{index}]"
        if index == len(self._choices):
            if index >= self._max_calls:
                raise InputFormatError(f"{where}: more than {self._max_calls} choices")
            self._choices.append(_Choice())
        elif index > len(self._choices):
            raise InputFormatError(
                f"{where}: a new choice must have the next index ({len(self._choices)})"
            )
        choice = self._choices[index]
        delta = f.obj(raw, "delta", where)
        f.opt_obj(raw, "logprobs", where)
        raw_finish = f.opt_str(raw, "finish_reason", where) or None  # the SDK ignores ""
        for name in ("content", "role", "refusal"):
            f.opt_str(delta, name, f"{where}.delta")
        if delta.get("function_call") is not None:
            raise InputFormatError(f"{where}: legacy delta.function_call is not supported")
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise InputFormatError(f"{where}: delta.tool_calls must be an array")
        if choice.done:
            if raw_finish is not None or any(value not in _EMPTY for value in delta.values()):
                raise InputFormatError(f"{where}: delta after the choice's finish_reason")
            return
        for call in tool_calls or ():
            if not isinstance(call, dict):
                raise InputFormatError(f"{where}: each of delta.tool_calls must be an object")
            self._tool_delta(index, choice, call, out)
        refusal = delta.get("refusal")
        if refusal is not None and (refusal or not choice.refusal):
            if not choice.refusal:
                self._admit(self._held + 1, where)
                self._held += 1
            choice.refusal = True
            out.append(self._chunk(ChunkKind.REFUSAL, self._refusal_id(index), delta=refusal))
        if raw_finish is not None:
            finish = _FINISH.get(raw_finish)
            choice.done = True
            self._done += 1
            choice.finish = (
                FinishReason.REFUSAL if finish is FinishReason.STOP and choice.refusal else finish
            )

    def _tool_delta(
        self, choice_index: int, choice: _Choice, raw: Mapping[str, Any], out: list[Chunk]
    ) -> None:
        index = f.integer(raw, "index", f"choices[{choice_index}].delta.tool_calls[]")
        where = f"choices[{choice_index}].delta.tool_calls[{index}]"
        function = f.obj(raw, "function", where)
        vendor_id = f.opt_str(raw, "id", where)
        kind = f.opt_str(raw, "type", where)
        if kind not in (None, "function"):
            raise InputFormatError(f"{where}: field 'type' must be 'function'")
        name = f.opt_str(function, "name", f"{where}.function")
        arguments = f.opt_str(function, "arguments", f"{where}.function") or ""
        dialect = self._dialect
        if dialect is not None and dialect.reused_index and choice.calls:
            # the server puts every call at one index: placed by its id instead, a delta that
            # opens with a new id and a name is the next call, any other continues the current
            current = len(choice.calls) - 1
            opens = (
                vendor_id
                and name
                and self._call_id(choice_index, index, vendor_id) != choice.calls[-1]
            )
            index = current + 1 if opens else current
        if index == len(choice.calls):
            if not name:
                raise InputFormatError(f"{where}: the first delta of a tool call needs its name")
            if vendor_id == "":
                raise InputFormatError(f"{where}: field 'id' must not be empty")
            call_id = self._call_id(choice_index, index, vendor_id)
            if call_id in self._ids:
                raise InputFormatError(f"{where}: tool call id repeats another call's id")
            self._admit(self._held + 1, where)
            self._held += 1
            choice.calls.append(call_id)
            self._ids.add(call_id)
            if dialect is not None and dialect.cut_calls_finish_as_tool_calls:
                choice.ends.append(_JsonEnd())
                choice.ends[-1].feed(arguments)
            double = dialect is not None and dialect.double_encoded_arguments
            out.append(
                self._chunk(
                    ChunkKind.TOOL_CALL, call_id, tool=name, delta=arguments, double_encoded=double
                )
            )
            return
        if index != len(choice.calls) - 1:
            raise InputFormatError(
                f"{where}: out of order (the current tool call is {len(choice.calls) - 1})"
            )
        if vendor_id:
            raise InputFormatError(f"{where}: the tool call's id changed mid-stream")
        if name:
            raise InputFormatError(f"{where}: the tool call's name changed mid-stream")
        if arguments:
            if choice.ends:
                choice.ends[-1].feed(arguments)
            out.append(self._chunk(ChunkKind.TOOL_CALL, choice.calls[-1], delta=arguments))

    def _call_id(self, choice_index: int, index: int, vendor_id: str | None) -> str:
        if vendor_id:
            return naming.vendor_call(vendor_id, choice_index)
        return naming.unnamed_call(self._stream, choice_index, index)

    def _close_stream(self, out: list[Chunk]) -> list[Chunk]:
        """The END: the calls (and refusal) of every choice its finish reason closed are
        released; every other ends as its own choice's finish says (a choice that never
        finished: with the stream)."""
        for index, choice in enumerate(self._choices):
            releases = choice.done and choice.finish in _RELEASES
            for position, call_id in enumerate(choice.calls):
                if not releases:
                    out.append(self._end_call(call_id, choice.finish))
                elif choice.ends and not choice.ends[position].ended:
                    # the token limit cut it, whatever the finish reason says
                    out.append(self._end_call(call_id, FinishReason.LENGTH))
                else:
                    out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, final=True))
            if choice.refusal:
                refusal_id = self._refusal_id(index)
                if releases:
                    out.append(self._chunk(ChunkKind.REFUSAL, refusal_id, final=True))
                else:
                    out.append(self._end_call(refusal_id, choice.finish))
        out.append(self._end(self._shared([choice.finish for choice in self._choices])))
        return out

    def _error_event(self, error: Any) -> list[Chunk]:
        code = "error"
        if isinstance(error, dict):
            code = f.short_code(error.get("code"), f.short_code(error.get("type"), "error"))
        return self._error(code)

    def _refusal_id(self, choice_index: int) -> str:
        return naming.refusal(self._stream, choice_index)


def _carries(choice: Any) -> bool:
    """Whether a choice carries anything the SDK would take: anything but an empty delta and
    no finish reason."""
    if not isinstance(choice, dict):
        return True
    delta = choice.get("delta")
    if delta is not None and (
        not isinstance(delta, dict) or any(value not in _EMPTY for value in delta.values())
    ):
        return True
    return choice.get("finish_reason") not in (None, "")
