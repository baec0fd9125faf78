"""OpenAI Responses API stream events to internal chunks.

A function call opens with `response.output_item.added` (a `function_call` item with `call_id` and
`name`) at an `output_index`; its argument deltas name that `output_index` (the SDK's
`ResponseStreamState` places them by it) and the item's `item_id`, which must agree. The vendor
then sends the call's final text up to three times: `function_call_arguments.done`,
`output_item.done`, and the final response (`response.completed`, or `response.incomplete`
when the response was cut), whose `output` is what the SDK hands its user. Every one of them must
equal the others (the adapter keeps a digest of the first); the call is released at the END with
the final response's text as its expected text, which the reassembler compares with the deltas
it assembled (a difference: `stream_corrupt`; a call past its bound keeps no text, and is
rejected with its bound whatever its final text). A call whose item never finished (a
`response.incomplete` mid-call, an `output_item.done` with status `incomplete`, a final
response whose item says it is not finished, whatever its `.done` said) stays open and the END
makes it incomplete (a `response.completed` saying so cannot be placed). A call a model-run
program made (programmatic tool calling: the item's `caller` is `{"type": "program", ...}`)
keeps its item `in_progress` in `output_item.done` and in the final response while the program
waits for its result: it is finished once its arguments' `.done` has come, and its item's text
must agree with it; the item's `caller` is stated on the call's first chunk, so its event names
it. A final response without `output` releases nothing.

In a dialect whose ids rotate (`copilot`, `worker.adapters.dialects`), the response's and the
items' ids are not compared from event to event: events are placed by `output_index` alone. In
a dialect whose final response lacks its output (`9router`, `new-api`), a final response
without `output`, or with an empty one, releases each call from its `output_item.done`: the
call's text there is its expected text, and a call without one never finished.

Calls the client runs besides function calls are judged too, each with its kind on its first
chunk (`call_kind`, `worker.model.CallKind`):

- `custom_tool_call`: a custom tool's free-form text (`input`), streamed like a function call's
  arguments (`response.custom_tool_call_input.delta` / `.done`), its text the call's text;
- `apply_patch_call`, `local_shell_call`, a `shell_call` the client runs (no hosted
  `environment`): whole items whose `operation` (apply_patch) or `action` (the shells) object is
  the call's text, as JSON, tool `apply_patch`, `local_shell` or `shell`. The call opens when its
  item is added and takes its text from its `output_item.done`; the events that preview it
  (`response.apply_patch_call_operation_diff.*`, `response.shell_call_command.*`) carry nothing
  the gate judges;
- `mcp_approval_request`: a remote MCP tool's call that waits for the client's approval; its
  `arguments` text is the call's, its tool `<server_label>.<name>` (as an MCP tools file names
  it), its call id the item's id (what the approval answers) tagged `#approval`
  (`naming.approval_request`: a function call's `call_id` may be the same text).

Each is released at the END like a function call, its final text checked against the final
response's item. Items the vendor runs itself (`VENDOR_RUN`: web and file search, code
interpreter, image generation, remote MCP calls and tool lists, a program and its output, a
hosted shell, a server-side tool search), and every `*_output` item, yield nothing. A call the
client runs of a kind no contract kind exists for (`computer_call`, a client-side
`tool_search_call`, any new `*_call` or `*_request`) is a rejected record of code
`unsupported_call_kind` under the item's call id (its detail names its kind when it is one
callgate knows, `UNJUDGED_KINDS`: the type of another is the stream's text), when it is first
seen; it never passes in silence, and the stream's other calls go on.

`sequence_number` is per stream, not per call, and older streams lack it. When a stream has it,
every event must. A repeated or older number is refused like any event out of place: the SDK
would place the event a second time (append a delta again, or fail on an item added twice), so
the stream is no longer the one the model sent. A jump past the next number gives every call
still streaming a hole in its own chunk numbering (`seq`), so the reassembler reports a
`sequence_gap` instead of joining text around a lost delta.

An event is refused when it cannot be placed the way the SDK places it: a stream that does not
start with `response.created`, a lifecycle event for another response id or with output items
before the end, an item added at an `output_index` already taken, an event naming an
`output_index` no item was added at (or a function call's, for an event that is not about its
arguments), an `item_id`, `call_id` or `name` that differs from its item's, a text that is not
a string, a delta after the call's `.done`, a final response that lacks a finished call, names
one never streamed, or says the response completed while a call had not finished. Any other
item keeps its type, id and call id from its `output_item.added` to its `output_item.done` (an
id no other item has), and a response that completes has each such item finished or in its
output, as the SDK requires.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from worker._native import Chunk
from worker.adapters import dialects, naming
from worker.adapters import fields as f
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import CallKind, ChunkKind, Code, FinishReason

FORMAT = "openai.responses"

_INCOMPLETE = {
    "max_output_tokens": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}
_OPEN, _DONE, _CUT = "open", "done", "cut"  # a call streaming; finished (held); ended unfinished
_FUNCTION_CALL = "function_call"


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one kind of call the client runs is read: its text streamed by delta events
    (`events`, `<prefix>.delta` / `<prefix>.done`, of the item's `field`) or whole from its
    finished item (`field`, an object written as JSON; `tool`, the tool it names)."""

    call_kind: CallKind
    field: str
    events: str
    streamed: bool = False
    tool: str | None = None


#: the calls the client runs that a contract kind judges, by item type
_KINDS: dict[str, _Kind] = {
    _FUNCTION_CALL: _Kind(
        CallKind.FUNCTION_CALL, "arguments", "response.function_call_arguments", streamed=True
    ),
    "custom_tool_call": _Kind(
        CallKind.CUSTOM_TOOL_CALL, "input", "response.custom_tool_call_input", streamed=True
    ),
    "apply_patch_call": _Kind(
        CallKind.APPLY_PATCH_CALL,
        "operation",
        "response.apply_patch_call_operation_diff",
        tool="apply_patch",
    ),
    "shell_call": _Kind(CallKind.SHELL_CALL, "action", "response.shell_call_command", tool="shell"),
    "local_shell_call": _Kind(CallKind.LOCAL_SHELL_CALL, "action", "", tool="local_shell"),
    "mcp_approval_request": _Kind(CallKind.MCP_APPROVAL_REQUEST, "arguments", ""),
}
#: the tools the adapter names itself (the built-in tools the client runs)
BUILT_IN_TOOLS = frozenset(spec.tool for spec in _KINDS.values() if spec.tool is not None)
#: events about any item; a call's own events (`_Kind.events`) are the only others that may
#: name its output_index
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})


#: the calls the client runs that callgate knows and no contract kind judges (a rejection's
#: detail names these; any other `*_call` or `*_request` kind is one it does not know)
UNJUDGED_KINDS = frozenset({"computer_call", "tool_search_call"})

#: items the vendor runs itself, or that are no calls: nothing for the gate to judge
VENDOR_RUN = frozenset(
    {
        "message",
        "reasoning",
        "file_search_call",
        "web_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_response",
        "program",
        "additional_tools",
        "compaction",
    }
)


def _identity(
    item: Mapping[str, Any], item_type: str, where: str, *, rotating: bool = False
) -> tuple[str, Any, Any]:
    """What names an item that is not a function call, as the SDK compares it between its
    `output_item.added`, its `output_item.done` and the final response: type, id, call id
    (with rotating ids, a dialect's, type and call id)."""
    item_id = f.opt_str(item, "id", where)
    return item_type, None if rotating else item_id, f.opt_str(item, "call_id", where)


def _client_runs(item: Mapping[str, Any], item_type: str, where: str) -> bool:
    """Whether an item that is not a function call is a call the client runs: `custom_tool_call`,
    `apply_patch_call`, `local_shell_call`, `computer_call`, `mcp_approval_request`, a
    `shell_call` without a hosted `environment`, a `tool_search_call` whose `execution` is
    `client`, and any other `*_call` or `*_request` kind the vendor may add. The vendor-run
    items (`VENDOR_RUN`, a hosted shell, a server-side tool search) and every `*_output` item
    are not."""
    if item_type in VENDOR_RUN or item_type.endswith("_output"):
        return False
    if item_type == "tool_search_call":
        return f.opt_str(item, "execution", where) == "client"
    if item_type == "shell_call":
        environment = f.opt_obj(item, "environment", where)
        return environment is None or environment.get("type") == "local"
    return item_type.endswith(("_call", "_request"))


def _kind_of(item: Mapping[str, Any], item_type: str, where: str) -> _Kind | None:
    """How the item is read when it is a call a contract kind judges (a `shell_call` only when
    the client runs it); None for any other item."""
    spec = _KINDS.get(item_type)
    if spec is not None and item_type == "shell_call" and not _client_runs(item, item_type, where):
        return None
    return spec


def _call_names(item: Mapping[str, Any], spec: _Kind, where: str) -> tuple[str, str]:
    """A judged item's call id and the tool it names."""
    if spec.call_kind is CallKind.MCP_APPROVAL_REQUEST:
        server = f.string(item, "server_label", where)
        call_id = naming.approval_request(f.string(item, "id", where))
        return call_id, f"{server}.{f.string(item, 'name', where)}"
    call_id = naming.vendor_call(f.string(item, "call_id", where))
    return call_id, spec.tool if spec.tool is not None else f.string(item, "name", where)


def _item_text(item: Mapping[str, Any], spec: _Kind, where: str) -> str:
    """A judged item's text: its `field` as it is for a text field, as JSON for an object."""
    if spec.call_kind in (CallKind.FUNCTION_CALL, CallKind.CUSTOM_TOOL_CALL):
        return f.text(item, spec.field, where)
    if spec.call_kind is CallKind.MCP_APPROVAL_REQUEST:
        return f.text(item, spec.field, where)
    return orjson.dumps(f.obj(item, spec.field, where)).decode()


def _caller(item: Mapping[str, Any], where: str) -> str | None:
    """Who made the call, as JSON text, when the model did not make it itself."""
    caller = f.opt_obj(item, "caller", where)
    return orjson.dumps(caller).decode() if caller is not None else None


def _programmatic(item: Mapping[str, Any], where: str) -> bool:
    """Whether a function call item was made by a model-run program (`caller.type` program):
    its item stays `in_progress` while the program runs, after its arguments are final."""
    caller = f.opt_obj(item, "caller", where)
    return caller is not None and f.opt_str(caller, "type", f"{where}.caller") == "program"


def _finished(item: Mapping[str, Any], text_final: bool, where: str) -> bool:
    """Whether a call's item (its `output_item.done`, or the final response's) says the call
    finished: status `completed` (or none), or `in_progress` for a call a model-run program
    made once its text is final (`text_final`); any other status says it was cut."""
    status = f.opt_str(item, "status", where)
    return status in (None, "completed") or (
        status == "in_progress" and text_final and _programmatic(item, where)
    )


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class _Call:
    __slots__ = (
        "call_id",
        "digest",
        "gapped",
        "item_id",
        "kind",
        "name",
        "next_seq",
        "status",
        "text",
    )

    def __init__(
        self,
        item_id: str | None,
        call_id: str,
        name: str,
        *,
        kind: str = _FUNCTION_CALL,
        status: str = _OPEN,
        next_seq: int = 0,
        gapped: bool = False,
        digest: str | None = None,
        text: str | None = None,
    ) -> None:
        self.item_id = item_id
        self.call_id = call_id
        self.name = name
        self.status = status
        self.next_seq = next_seq
        self.gapped = gapped  # an event of this stream was lost while the call was streaming
        self.digest = digest  # of the call's final text, once it is done
        self.kind = kind  # the item's type, a key of _KINDS
        # its output_item.done's text, kept only in a dialect whose final response lacks it
        self.text = text

    @property
    def spec(self) -> _Kind:
        return _KINDS[self.kind]

    @classmethod
    def from_state(cls, state: list[Any]) -> _Call:
        item_id, call_id, name, status, next_seq, gapped, digest, kind, text = state
        return cls(
            item_id,
            call_id,
            name,
            kind=kind,
            text=text,
            status=status,
            next_seq=next_seq,
            gapped=gapped,
            digest=digest,
        )

    def state(self) -> list[Any]:
        return [
            self.item_id,
            self.call_id,
            self.name,
            self.status,
            self.next_seq,
            self.gapped,
            self.digest,
            self.kind,
            self.text,
        ]


class OpenAIResponsesAdapter(VendorAdapter):
    """Incremental decoder of one Responses API stream (one `StreamAdapter`)."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        dialect = dialects.DIALECTS.get(headers.get(dialects.HEADER) or "")
        self._rotating = dialect is not None and dialect.rotating_item_ids
        self._without_output = dialect is not None and dialect.completed_without_output
        self._response_id: str | None = None  # set by response.created
        self._calls: dict[int, _Call] = {}  # function calls by output_index
        # other items by output_index: [type, id, call_id, done]
        self._others: dict[int, list[Any]] = {}
        self._numbered: bool | None = None
        self._last_seq = -1
        self._refusal: bool | None = None  # None: none seen; True: open; False: closed
        if state is not None:
            self._restore_base(state)
            self._response_id = state["response_id"]
            self._calls = {int(i): _Call.from_state(c) for i, c in state["calls"].items()}
            self._others = {int(i): list(other) for i, other in state["others"].items()}
            self._numbered = state["numbered"]
            self._last_seq = state["last_seq"]
            self._refusal = state["refusal"]
        self._ids = {call.call_id for call in self._calls.values()}
        self._items = {c.item_id for c in self._calls.values() if c.item_id is not None}
        self._items |= {other[1] for other in self._others.values() if other[1] is not None}

    def state(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "response_id": self._response_id,
            "calls": {str(i): call.state() for i, call in self._calls.items()},
            "others": {str(i): other for i, other in self._others.items()},
            "numbered": self._numbered,
            "last_seq": self._last_seq,
            "refusal": self._refusal,
        }

    @property
    def held(self) -> int:
        return 0 if self._finished else len(self._calls) + bool(self._refusal)

    def open_calls(self) -> list[str]:
        """Every function call (none is released before the END), and the refusal while it
        streams."""
        if self._finished:
            return []
        open_ids = [call.call_id for call in self._calls.values()]
        if self._refusal:
            open_ids.append(naming.refusal(self._stream))
        return open_ids

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A judged call's item, added or done."""
        item, kind = event.get("item"), event.get("type")
        if not isinstance(kind, str) or kind not in _ITEM_EVENTS or not isinstance(item, dict):
            return []
        item_type = item.get("type")
        try:
            spec = _kind_of(item, item_type, "item") if isinstance(item_type, str) else None
            return [_call_names(item, spec, "item")] if spec is not None else []
        except InputFormatError:
            return []

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        kind = f.string(event, "type", "openai.responses event")
        if event.get("error"):  # the SDK's stream raises on any event with an error
            return self._error_event(event, kind)
        self._sequence(event, kind)
        if self._response_id is None and kind not in ("response.created", "error"):
            raise InputFormatError(f"{kind}: the stream must start with response.created")
        if "output_index" in event and kind not in ("response.output_item.added",):
            self._check_index(event, kind)
        handler = _HANDLERS.get(kind)
        return handler(self, event, kind) if handler is not None else []

    def _sequence(self, event: Mapping[str, Any], kind: str) -> None:
        seq = f.opt_int(event, "sequence_number", kind)
        if self._numbered is None:
            self._numbered = seq is not None
        if self._numbered != (seq is not None):
            raise InputFormatError(f"{kind}: 'sequence_number' on some events of a stream only")
        if seq is None:
            return
        if seq <= self._last_seq:
            raise InputFormatError(
                f"{kind}: sequence_number {seq} comes after {self._last_seq} (a replayed event)"
            )
        if seq > self._last_seq + 1 and self._last_seq >= 0:
            for call in self._calls.values():
                if call.status == _OPEN:
                    call.next_seq += 1  # the lost event may have been this call's
                    call.gapped = True
        self._last_seq = seq

    def _check_index(self, event: Mapping[str, Any], kind: str) -> None:
        index = f.integer(event, "output_index", kind)
        call = self._calls.get(index)
        if call is not None:
            if kind in _ITEM_EVENTS:
                return
            events = call.spec.events
            if not (events and kind.startswith(events + ".")):
                raise InputFormatError(f"{kind}: output_index {index} is a {call.kind}")
            if not call.spec.streamed:  # a preview of a whole call: its item id must agree
                self._target(event, kind)
        elif index not in self._others and kind != "response.output_item.done":
            raise InputFormatError(f"{kind}: no item was added at output_index {index}")

    # -- the response's life ----------------------------------------------------------------

    def _lifecycle(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        response = self._response(event, kind)
        if response.get("output") not in (None, []):
            raise InputFormatError(f"{kind}: output items before the end of the response")
        return []

    def _response(self, event: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
        response = f.obj(event, "response", kind)
        response_id = f.string(response, "id", f"{kind}.response")
        if self._response_id is None:
            self._response_id = response_id
        elif response_id != self._response_id and not self._rotating:
            raise InputFormatError(f"{kind}: another response's id")
        return response

    # -- function calls -----------------------------------------------------------------------

    def _added(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(event, "output_index", kind)
        item = f.obj(event, "item", kind)
        item_type = f.string(item, "type", f"{kind}.item")
        call = self._register(index, item, item_type, kind)
        if call is None:
            return self._unjudged(item, item_type, kind)
        spec = call.spec
        opening = _item_text(item, spec, f"{kind}.item") if spec.streamed else ""
        return [self._opening(call, item, opening, kind)]

    def _opening(self, call: _Call, item: Mapping[str, Any], text: str, kind: str) -> Chunk:
        """A call's first chunk: its tool, its kind and who made it, and its first text."""
        spec = call.spec
        return self._call_chunk(
            call,
            tool=call.name,
            delta=text,
            call_kind=None if spec.call_kind is CallKind.FUNCTION_CALL else spec.call_kind,
            caller=_caller(item, f"{kind}.item"),
        )

    def _register(
        self, index: int, item: Mapping[str, Any], item_type: str, kind: str
    ) -> _Call | None:
        if index in self._calls or index in self._others:
            raise InputFormatError(f"{kind}: an item was already added at output_index {index}")
        where = f"{kind}.item"
        spec = _kind_of(item, item_type, where)
        if spec is None:
            if len(self._others) >= self._max_calls:
                raise InputFormatError(f"{kind}: more than {self._max_calls} other items")
            identity = _identity(item, item_type, f"{kind}.item", rotating=self._rotating)
            if identity[1] is not None and identity[1] in self._items:
                raise InputFormatError(f"{kind}: item {identity[1]!r} was already added")
            if identity[1] is not None:
                self._items.add(identity[1])
            self._others[index] = [*identity, kind == "response.output_item.done"]
            return None
        call_id, name = _call_names(item, spec, where)
        item_id = self._item_id(item, "id", where)
        f.opt_str(item, "status", where)
        if item_id == "":
            raise InputFormatError(f"{where}: field 'id' must not be empty")
        if item_id is not None and item_id in self._items:
            raise InputFormatError(f"{kind}: item {item_id!r} was already added")
        if call_id in self._ids:
            raise InputFormatError(f"{kind}: call_id repeats another item's call_id")
        self._admit(self.held + 1, kind)
        call = self._calls[index] = _Call(item_id, call_id, name, kind=item_type)
        self._ids.add(call_id)
        if item_id is not None:
            self._items.add(item_id)
        return call

    def _item_id(self, source: Mapping[str, Any], name: str, where: str) -> str | None:
        """An item's id as events name it; None in a dialect whose ids rotate (events are
        then placed by `output_index` alone)."""
        item_id = f.opt_str(source, name, where)
        return None if self._rotating else item_id

    def _unjudged(self, item: Mapping[str, Any], item_type: str, kind: str) -> list[Chunk]:
        """An item other than a function call, when it is first seen: nothing when the vendor
        runs it (or it is no call), else a call the client would run that no contract judges
        yet: its rejection `unsupported_call_kind`, so that it never passes in silence."""
        if not _client_runs(item, item_type, f"{kind}.item"):
            return []
        # the kind is named only from callgate's own words: the item's type, like its id, is the
        # stream's text, and the detail is the rejection's retry feedback
        named_kind = item_type if item_type in UNJUDGED_KINDS else "that callgate does not know"
        detail = (
            f"openai.responses: an item of a kind {named_kind}, a call the client runs; "
            "no contract kind judges it"
        )
        code = Code.UNSUPPORTED_CALL_KIND.value
        # named by the item's call id when it has one, so the agent waiting for it hears of it
        named = item.get("call_id", item.get("id"))
        named = naming.vendor_call(named) if isinstance(named, str) and named else None
        return [Chunk(self._stream, ChunkKind.MALFORMED, call_id=named, delta=detail, error=code)]

    def _target(self, event: Mapping[str, Any], kind: str) -> _Call:
        """The call an event about its text names, by output_index (and item_id)."""
        index = f.integer(event, "output_index", kind)
        call = self._calls.get(index)
        if call is None or not kind.startswith(call.spec.events + "."):
            raise InputFormatError(f"{kind}: output_index {index} is no call of this event's")
        item_id = self._item_id(event, "item_id", kind)
        if item_id is not None and item_id != call.item_id:
            raise InputFormatError(f"{kind}: item_id {item_id!r} is not output_index {index}'s")
        return call

    def _delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        call = self._target(event, kind)
        if call.status != _OPEN:
            raise InputFormatError(f"{kind}: arguments delta after the call's item finished")
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise InputFormatError(f"{kind}: field 'delta' must be a string")
        if not delta:
            return []
        return [self._call_chunk(call, delta=delta)]

    def _arguments_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        call = self._target(event, kind)
        name = f.opt_str(event, "name", kind)
        if name is not None and name != call.name:
            raise InputFormatError(f"{kind}: 'name' differs from the item's name")
        field = call.spec.field
        text = event.get(field)
        if not isinstance(text, str):
            raise InputFormatError(f"{kind}: field {field!r} must be a string")
        self._finish(call, text, kind)
        return []

    def _item_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        index = f.integer(event, "output_index", kind)
        item = f.obj(event, "item", kind)
        item_type = f.string(item, "type", f"{kind}.item")
        where = f"{kind}.item"
        call = self._calls.get(index)
        fresh = call is None and index not in self._others
        if call is None and fresh:
            # only the finished item was sent: the whole call in one chunk
            call = self._register(index, item, item_type, kind)
            if call is None:
                return self._unjudged(item, item_type, kind)
        elif call is None:
            other = self._others[index]
            if _identity(item, item_type, where, rotating=self._rotating) != tuple(other[:3]):
                raise InputFormatError(f"{kind}: the item at output_index {index} changed")
            other[3] = True
            return []
        elif item_type != call.kind:
            raise InputFormatError(f"{kind}: output_index {index} was a {call.kind}")
        spec = call.spec
        if self._item_id(item, "id", where) != call.item_id:
            raise InputFormatError(f"{kind}: the item's id changed")
        call_id, name = _call_names(item, spec, where)
        if call_id != call.call_id:
            raise InputFormatError(f"{kind}: the item's call id changed")
        if name != call.name:
            raise InputFormatError(f"{kind}: the item's name changed")
        out: list[Chunk] = []
        status = f.opt_str(item, "status", where)
        if _finished(item, call.status == _DONE, where):
            text = _item_text(item, spec, where)
            if fresh:
                out.append(self._opening(call, item, text, kind))
            elif not spec.streamed and call.status == _OPEN:
                out.append(self._call_chunk(call, delta=text))  # a whole call's text
            self._finish(call, text, kind)
            if self._without_output:
                call.text = text
        elif call.status == _DONE:
            raise InputFormatError(f"{kind}: a finished call's item ends {status!r}")
        else:
            if spec.streamed:
                f.opt_str(item, spec.field, where)
            if fresh:
                out.append(self._opening(call, item, "", kind))
            call.status = _CUT
        return out

    def _finish(self, call: _Call, arguments: str, kind: str) -> None:
        """A final form of the call's text: the first one finishes it, the others must agree."""
        digest = _digest(arguments)
        if call.status == _CUT:
            raise InputFormatError(f"{kind}: the call's item already ended unfinished")
        if call.status == _DONE and digest != call.digest:
            raise InputFormatError(f"{kind}: the call's final text differs from its earlier one")
        call.status, call.digest = _DONE, digest

    def _release(self, response: Mapping[str, Any], kind: str, complete: bool) -> list[Chunk]:
        """The final chunks of the finished calls, each checked against the final response."""
        output = response.get("output")
        if self._without_output and not output:
            return self._release_items(kind, complete)
        if output is None:
            return []  # nothing to check the calls against: none is released
        if not isinstance(output, list):
            raise InputFormatError(f"{kind}: field 'response.output' must be an array")
        final: dict[str, Mapping[str, Any]] = {}
        others: set[tuple[Any, ...]] = set()
        where = f"{kind}.response.output[]"
        for item in output:
            if not isinstance(item, dict):
                raise InputFormatError(f"{kind}: each of 'response.output' must be an object")
            item_type = f.string(item, "type", where)
            spec = _kind_of(item, item_type, where)
            if spec is None:
                others.add(_identity(item, item_type, where, rotating=self._rotating))
                continue
            call_id, _ = _call_names(item, spec, where)
            if call_id in final or call_id not in self._ids:
                raise InputFormatError(f"{kind}: the final response names a call never streamed")
            final[call_id] = item
        for other in self._others.values():
            if complete and not other[3] and tuple(other[:3]) not in others:
                raise InputFormatError(f"{kind}: a {other[0]} item never finished")
        out: list[Chunk] = []
        for call in self._calls.values():
            item = final.get(call.call_id)
            if call.status != _DONE:
                if complete:
                    raise InputFormatError(f"{kind}: call {call.call_id!r} never finished")
                continue
            where = f"{kind}.response.output[{call.call_id}]"
            if item is None:
                raise InputFormatError(f"{kind}: the final response lacks call {call.call_id!r}")
            if (
                item.get("type") != call.kind
                or self._item_id(item, "id", where) != call.item_id
                or _call_names(item, call.spec, where)[1] != call.name
            ):
                raise InputFormatError(f"{where}: the item's type, id or name changed")
            if not _finished(item, True, where):
                if complete:
                    raise InputFormatError(f"{kind}: call {call.call_id!r} never finished")
                continue  # the response was cut inside the call's item: the END ends it
            text = _item_text(item, call.spec, where)
            if _digest(text) != call.digest:
                raise InputFormatError(f"{where}: the final text differs from the call's .done")
            # after a lost event the texts differ by design: the seq hole already condemns it
            expected = None if call.gapped else text
            out.append(self._call_chunk(call, final=True, expected=expected))
        return out

    def _release_items(self, kind: str, complete: bool) -> list[Chunk]:
        """In a dialect whose final response lacks its output: the final chunks of the calls
        whose `output_item.done` came, each with that item's text as its expected text."""
        out: list[Chunk] = []
        for other in self._others.values():
            if complete and not other[3]:
                raise InputFormatError(f"{kind}: a {other[0]} item never finished")
        for call in self._calls.values():
            if call.status != _DONE or call.text is None:
                if complete:
                    raise InputFormatError(f"{kind}: call {call.call_id!r}'s item never finished")
                continue
            expected = None if call.gapped else call.text
            out.append(self._call_chunk(call, final=True, expected=expected))
        return out

    # -- refusal, errors, end -------------------------------------------------------------

    def _refusal_delta(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise InputFormatError(f"{kind}: field 'delta' must be a string")
        if self._refusal is False:
            raise InputFormatError(f"{kind}: refusal delta after the refusal was done")
        if self._refusal is None:
            self._admit(self.held + 1, kind)
        self._refusal = True
        return [self._chunk(ChunkKind.REFUSAL, naming.refusal(self._stream), delta=delta)]

    def _refusal_done(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        text = f.opt_str(event, "refusal", kind) or ""
        if self._refusal is False:
            raise InputFormatError(f"{kind}: the refusal was already done")
        first, self._refusal = self._refusal is None, False
        delta = text if first else ""
        expected = None if first else text
        return [
            self._chunk(
                ChunkKind.REFUSAL,
                naming.refusal(self._stream),
                delta=delta,
                final=True,
                expected=expected,
            )
        ]

    def _completed(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        out = self._release(self._response(event, kind), kind, complete=True)
        if self._refusal is not None:
            finish = FinishReason.REFUSAL
        elif self._calls:
            finish = FinishReason.TOOL_CALLS
        else:
            finish = FinishReason.STOP
        return [*out, self._end(finish)]

    def _incomplete(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        response = self._response(event, kind)
        details = f.opt_obj(response, "incomplete_details", f"{kind}.response") or {}
        reason = f.opt_str(details, "reason", f"{kind}.response.incomplete_details")
        out = self._release(response, kind, complete=False)
        return [*out, self._end(_INCOMPLETE.get(reason or ""))]

    def _failed(self, event: Mapping[str, Any], kind: str) -> list[Chunk]:
        response = self._response(event, kind)
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
        call_kind: CallKind | None = None,
        caller: str | None = None,
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
            call_kind=call_kind,
            caller=caller,
        )


_Handler = Callable[[OpenAIResponsesAdapter, Mapping[str, Any], str], list[Chunk]]
_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(_LIFECYCLE, OpenAIResponsesAdapter._lifecycle),
    "response.output_item.added": OpenAIResponsesAdapter._added,
    "response.function_call_arguments.delta": OpenAIResponsesAdapter._delta,
    "response.function_call_arguments.done": OpenAIResponsesAdapter._arguments_done,
    "response.custom_tool_call_input.delta": OpenAIResponsesAdapter._delta,
    "response.custom_tool_call_input.done": OpenAIResponsesAdapter._arguments_done,
    "response.output_item.done": OpenAIResponsesAdapter._item_done,
    "response.refusal.delta": OpenAIResponsesAdapter._refusal_delta,
    "response.refusal.done": OpenAIResponsesAdapter._refusal_done,
    "response.completed": OpenAIResponsesAdapter._completed,
    "response.incomplete": OpenAIResponsesAdapter._incomplete,
    "response.failed": OpenAIResponsesAdapter._failed,
    "error": OpenAIResponsesAdapter._error_event,
}
