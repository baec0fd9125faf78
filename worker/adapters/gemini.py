"""Google Gemini `streamGenerateContent` chunks (`GenerateContentResponse`) to internal chunks.

Each record is one streamed `GenerateContentResponse`. A client call is a `functionCall` part of
a candidate's `content.parts`; every other part (text, thoughts, `executableCode` and its result,
server-side `toolCall` / `toolResponse`) is not a client call and yields nothing. Two shapes:

- whole (the Gemini API, and Vertex AI by default): the part carries the call whole, `name`,
  `args` as a JSON object (absent: no arguments, `{}`) and an optional `id`; several parts of one
  chunk are parallel calls. The call's text is `args` written as JSON (strict JSON in, so the
  value is exactly the vendor's).
- streamed (Vertex AI `streamFunctionCallArguments`): a part with `name` and `willContinue: true`
  opens the call; the next parts of that candidate carry `partialArgs`, each a value at an RFC
  9535 JSON path (`$.a.b[0]`, `$['a b']`): a `stringValue` in pieces (`willContinue: true` on all
  but the last piece of that path), or a whole `numberValue`, `boolValue` or `nullValue`; the
  first part without `willContinue: true` ends the call (often an empty `functionCall: {}`).
  The adapter writes the JSON text as the paths arrive, in document order: each path must come
  after the previous one (the next key of an object, never a key it has; the next element of an
  array, from 0); a string piece continues only the path it is open at, and while a string is
  open the next value must be its next piece (a number, boolean or null there breaks the call).

Call ids (`worker.adapters.naming`): the vendor's `id` when the part has one (tagged `#k` in
candidate k > 0); else `<stream>#<candidate>#<n>`, where `n` counts the candidate's calls from 0
(the same stream and the same order give the same ids, so a replay names the calls as the first
run did).

A candidate ends with its `finishReason`; the stream ends (one END) once every candidate seen
has ended. Every call is held until then (see `_base`), and released only when its own candidate
stopped normally (`STOP`) or at the token limit (`MAX_TOKENS`) and the call is whole. At the
token limit the candidate's last call is released only when a part came after it: the limit may
have cut it, and Gemini does not say which part it cut. A call still streaming ends incomplete.
A call not released ends as its own candidate's finish says, whatever the others did. The
content filters (`SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`,
`MODEL_ARMOR`, the image ones) end the calls `incomplete` `content_filter`.
`MALFORMED_FUNCTION_CALL` and `UNEXPECTED_TOOL_CALL` release nothing and are each a rejected
record with its own code (`malformed_tool_call`, `unexpected_tool_call`; the vendor's
`finishMessage`, model text, is never echoed). Any other reason (`OTHER`, `TOO_MANY_TOOL_CALLS`,
`MALFORMED_RESPONSE`, ...) releases nothing: the calls end `stream_ended`. `CONTINUATION` does
not end the candidate: the next request's chunks continue it under the same stream id (as the
SDK continues it). A chunk whose `promptFeedback` has a `blockReason` ends the stream as
filtered; a chunk with an `error` member ends it as a vendor error.

An event is refused (the stream breaks, see `_base`) when it cannot be placed: not an object
where one is expected, a candidate `index` that is neither a known one nor the next, a role
other than `model`, a `functionCall` without a name when no call is streaming (or with one while
a call is), `args` beside `partialArgs`, a vendor id another call has, a partial value that is
not exactly one typed value, a JSON path that is not after the previous one, a piece of a string
that is not open, a part or a finish after the candidate ended.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from worker._native import Chunk
from worker.adapters import fields as f
from worker.adapters import naming
from worker.adapters._base import VendorAdapter
from worker.errors import InputFormatError
from worker.model import ChunkKind, Code, FinishReason

FORMAT = "google.gemini"

_FILTERED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
    }
)
#: finish reasons that are the vendor's verdict on a call: a rejected record of their own code
_REJECTS = {
    "MALFORMED_FUNCTION_CALL": Code.MALFORMED_TOOL_CALL,
    "UNEXPECTED_TOOL_CALL": Code.UNEXPECTED_TOOL_CALL,
}
_CONTINUES = "CONTINUATION"
Step = str | int  # an object member or an array index
#: the members a call part and a partial argument have (the SDK's models refuse any other)
_CALL_MEMBERS = frozenset({"id", "name", "args", "partialArgs", "willContinue"})
_PARTIAL_MEMBERS = frozenset(
    {"jsonPath", "stringValue", "numberValue", "boolValue", "nullValue", "willContinue"}
)


class _Writer:
    """Writes a call's JSON text from path-addressed values arriving in document order.

    `path` is the last value's path, `frames` the containers open along it (the root object
    first): an object's frame lists the keys it has, an array's is its last index. `string` is
    true while the last value is a string whose pieces continue."""

    __slots__ = ("frames", "path", "string")

    def __init__(self, state: list[Any] | None = None) -> None:
        self.path: list[Step] = []
        self.frames: list[Any] = [[]]
        self.string = False
        if state is not None:
            self.path, self.frames, self.string = state

    def state(self) -> list[Any]:
        return [self.path, self.frames, self.string]

    def opening(self) -> str:
        return "{"

    def put(self, path: list[Step], value: Any, more: bool, where: str) -> str:
        """The text that writes `value` at `path` (a string piece when `more` or continuing)."""
        if self.string:
            # only the next piece of the string continues it: any other value there (a number,
            # true, null) would be written into the string's text as characters of its own
            if path != self.path or not isinstance(value, str):
                raise InputFormatError(f"{where}: the string at {_show(self.path)} is not finished")
            self.string = more
            return _piece(value) + ("" if more else '"')
        if not path or isinstance(path[0], int):
            raise InputFormatError(f"{where}: the arguments are an object: a path starts $.name")
        common = 0
        while common < min(len(path), len(self.path)) and path[common] == self.path[common]:
            common += 1
        if common == len(path) or (self.path and common == len(self.path)):
            raise InputFormatError(f"{where}: {_show(path)} is not after {_show(self.path)}")
        out = [self._close(common)]
        frame = self.frames[common]
        step = path[common]
        if isinstance(step, str):
            if not isinstance(frame, list) or step in frame:
                raise InputFormatError(f"{where}: {_show(path)} is not after {_show(self.path)}")
        elif isinstance(frame, list) or step != frame + 1:
            raise InputFormatError(f"{where}: {_show(path)} is not after {_show(self.path)}")
        for depth in range(common, len(path)):
            step = path[depth]
            frame = self.frames[depth]
            first = frame == [] if isinstance(step, str) else step == 0
            out.append("" if first else ",")
            if isinstance(step, str):
                frame.append(step)
                out.append(orjson.dumps(step).decode() + ":")
            else:
                self.frames[depth] = step
            if depth + 1 < len(path):
                child = path[depth + 1]
                if isinstance(child, int) and child != 0:
                    raise InputFormatError(f"{where}: {_show(path)}: an array starts at [0]")
                self.frames.append([] if isinstance(child, str) else -1)
                out.append("{" if isinstance(child, str) else "[")
        self.path = list(path)
        if isinstance(value, str):
            self.string = more
            out.append('"' + _piece(value) + ("" if more else '"'))
        else:
            out.append(orjson.dumps(value).decode())
        return "".join(out)

    def _close(self, depth: int) -> str:
        """Close the containers deeper than `depth` along the last path."""
        closers = []
        while len(self.frames) > depth + 1:
            closers.append("}" if isinstance(self.frames.pop(), list) else "]")
        return "".join(closers)

    def finish(self, where: str) -> str:
        if self.string:
            raise InputFormatError(
                f"{where}: the call ends inside the string at {_show(self.path)}"
            )
        return self._close(0) + "}"


def _carries(content: Any) -> bool:
    """Whether a candidate's content has a part with anything in it."""
    if content is None:
        return False
    if not isinstance(content, dict):
        return True
    parts = content.get("parts")
    return parts is not None and (
        not isinstance(parts, list)
        or any(not isinstance(p, dict) or any(p.values()) for p in parts)
    )


def _piece(text: str) -> str:
    return orjson.dumps(text).decode()[1:-1]


def _show(path: list[Step]) -> str:
    return "$" + "".join(
        f"[{s}]" if isinstance(s, int) else f"[{orjson.dumps(s).decode()}]" for s in path
    )


_NAME_FIRST = r"A-Za-z_\u0080-\ud7ff\ue000-\U0010ffff"
_SHORTHAND = re.compile(rf"\.([{_NAME_FIRST}][{_NAME_FIRST}0-9]*)")
_INDEX = re.compile(r"\[(0|[1-9][0-9]{0,8})\]")
_QUOTED = re.compile(r"""\[(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\]""")
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "/": "/", "\\": "\\"}


def parse_path(text: str, where: str) -> list[Step]:
    """An RFC 9535 singular query of member names and indices (`$.a['b c'][0]`), as steps."""
    if not text.startswith("$"):
        raise InputFormatError(f"{where}: a JSON path starts with $")
    steps: list[Step] = []
    at = 1
    while at < len(text):
        if match := _SHORTHAND.match(text, at):
            steps.append(match[1])
        elif match := _INDEX.match(text, at):
            steps.append(int(match[1]))
        elif match := _QUOTED.match(text, at):
            quote = "'" if match[1] is not None else '"'
            steps.append(_unescape(match[1] if quote == "'" else match[2], quote, where))
        else:
            raise InputFormatError(f"{where}: JSON path not understood at character {at}")
        at = match.end()
    return steps


def _unescape(body: str, quote: str, where: str) -> str:
    out, at = [], 0
    while at < len(body):
        char = body[at]
        if char != "\\":
            out.append(char)
            at += 1
            continue
        escaped = body[at + 1]
        if escaped == quote:
            out.append(quote)
            at += 2
        elif escaped in _ESCAPES:
            out.append(_ESCAPES[escaped])
            at += 2
        elif escaped == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", body[at + 2 : at + 6]):
            out.append(chr(int(body[at + 2 : at + 6], 16)))
            at += 6
        else:
            raise InputFormatError(f"{where}: an escape in a JSON path name is not understood")
    name = "".join(out)
    try:
        name.encode()
    except UnicodeEncodeError:
        raise InputFormatError(f"{where}: a JSON path name holds a lone surrogate") from None
    return name


class _Candidate:
    __slots__ = ("calls", "done", "finish", "last_is_call", "partial", "streaming")

    def __init__(self, state: list[Any] | None = None) -> None:
        self.calls: list[str] = []  # call ids, in order
        self.streaming: str | None = None  # the call whose partial arguments are streaming
        self.partial: _Writer | None = None
        self.last_is_call = False  # the last part with content was a call
        self.done = False
        self.finish: FinishReason | None = None
        if state is not None:
            calls, streaming, partial, self.last_is_call, self.done, finish = state
            self.calls = list(calls)
            self.streaming = streaming
            self.partial = _Writer(partial) if partial is not None else None
            self.finish = FinishReason(finish) if finish is not None else None

    def state(self) -> list[Any]:
        partial = self.partial.state() if self.partial is not None else None
        return [self.calls, self.streaming, partial, self.last_is_call, self.done, self.finish]


#: the `finishReason`s that release a candidate's whole calls, and how the END reads them
_RELEASES = {"STOP": FinishReason.STOP, "MAX_TOKENS": FinishReason.LENGTH}


class GeminiAdapter(VendorAdapter):
    """Incremental decoder of one `streamGenerateContent` stream (one `StreamAdapter`)."""

    def __init__(
        self,
        stream_id: str,
        headers: Mapping[str, str],
        state: Mapping[str, Any] | None,
        *,
        max_calls: int,
    ) -> None:
        super().__init__(stream_id, headers, max_calls)
        self._candidates: list[_Candidate] = []
        self._held = 0
        if state is not None:
            self._restore_base(state)
            self._candidates = [_Candidate(c) for c in state["candidates"]]
            self._held = sum(len(c.calls) for c in self._candidates)
        self._ids = {call for c in self._candidates for call in c.calls}

    def state(self) -> dict[str, Any]:
        return {**self._base_state(), "candidates": [c.state() for c in self._candidates]}

    @property
    def held(self) -> int:
        return 0 if self._finished else self._held

    def open_calls(self) -> list[str]:
        """Every call of the stream: none is released before the END."""
        if self._finished:
            return []
        return [call for candidate in self._candidates for call in candidate.calls]

    @classmethod
    def announced(cls, event: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A `functionCall` part with its own id (a call without one is named by its place in
        the stream, which a broken stream no longer knows)."""
        found: list[tuple[str, str]] = []
        candidates = event.get("candidates")
        for number, candidate in enumerate(candidates if isinstance(candidates, list) else []):
            content = candidate.get("content") if isinstance(candidate, dict) else None
            parts = content.get("parts") if isinstance(content, dict) else None
            index = candidate.get("index", number) if isinstance(candidate, dict) else number
            if type(index) is not int:
                continue  # the ids of its calls depend on a candidate that cannot be told
            for part in parts if isinstance(parts, list) else []:
                call = part.get("functionCall") if isinstance(part, dict) else None
                call_id = call.get("id") if isinstance(call, dict) else None
                name = call.get("name") if isinstance(call, dict) else None
                if isinstance(call_id, str) and call_id and isinstance(name, str) and name:
                    found.append((naming.vendor_call(call_id, index), name))
        return found

    @classmethod
    def after_end(cls, event: Mapping[str, Any]) -> bool:
        """A chunk that carries nothing (usage alone: no candidate content, no finish reason,
        no error, no blocked prompt) may follow the stream's end."""
        if "error" in event or event.get("promptFeedback"):
            return False
        candidates = event.get("candidates")
        if candidates is None:
            return True
        return isinstance(candidates, list) and all(
            isinstance(c, dict) and not c.get("finishReason") and not _carries(c.get("content"))
            for c in candidates
        )

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        if "error" in event:
            error = event["error"]
            code = "error"
            if isinstance(error, dict):
                code = f.short_code(error.get("status"), f.short_code(error.get("code"), "error"))
            return self._error(code)
        out: list[Chunk] = []
        feedback = f.opt_obj(event, "promptFeedback", "GenerateContentResponse")
        candidates = event.get("candidates")
        if candidates is not None and not isinstance(candidates, list):
            raise InputFormatError("GenerateContentResponse: field 'candidates' must be an array")
        for position, raw in enumerate(candidates or ()):
            if not isinstance(raw, dict):
                raise InputFormatError("GenerateContentResponse: each candidate must be an object")
            self._candidate(raw, position, out)
        if feedback is not None and f.opt_str(feedback, "blockReason", "promptFeedback"):
            out.append(self._end(FinishReason.CONTENT_FILTER))  # the prompt was blocked
            return out
        if self._candidates and all(c.done for c in self._candidates):
            return self._close_stream(out)
        return out

    def _candidate(self, raw: Mapping[str, Any], position: int, out: list[Chunk]) -> None:
        index = f.opt_int(raw, "index", "candidates[]")
        index = position if index is None else index
        where = f"candidates[{index}]"
        if index == len(self._candidates):
            if index >= self._max_calls:
                raise InputFormatError(f"{where}: more than {self._max_calls} candidates")
            self._candidates.append(_Candidate())
        elif index > len(self._candidates):
            raise InputFormatError(
                f"{where}: a new candidate must have the next index ({len(self._candidates)})"
            )
        candidate = self._candidates[index]
        content = f.opt_obj(raw, "content", where)
        reason = f.opt_str(raw, "finishReason", where)
        if candidate.done and (content or reason):
            raise InputFormatError(f"{where}: content after the candidate's finishReason")
        if content is not None:
            role = f.opt_str(content, "role", f"{where}.content")
            if role not in (None, "model"):
                raise InputFormatError(f"{where}.content: field 'role' must be 'model'")
            parts = content.get("parts")
            if parts is not None and not isinstance(parts, list):
                raise InputFormatError(f"{where}.content: field 'parts' must be an array")
            for part in parts or ():
                if not isinstance(part, dict):
                    raise InputFormatError(f"{where}.content: each part must be an object")
                call = part.get("functionCall")
                if call is None:
                    if any(value for key, value in part.items() if key != "thoughtSignature"):
                        candidate.last_is_call = False
                    continue
                if not isinstance(call, dict):
                    raise InputFormatError(f"{where}: field 'functionCall' must be an object")
                self._function_call(index, candidate, call, f"{where}.functionCall", out)
        if reason is not None and reason != _CONTINUES:
            self._finish(candidate, reason, out)

    def _function_call(
        self,
        index: int,
        candidate: _Candidate,
        call: Mapping[str, Any],
        where: str,
        out: list[Chunk],
    ) -> None:
        if not call.keys() <= _CALL_MEMBERS:
            raise InputFormatError(f"{where}: a member the API does not define")
        name = f.opt_str(call, "name", where)
        vendor_id = f.opt_str(call, "id", where)
        args = f.opt_obj(call, "args", where)
        partial = call.get("partialArgs")
        if partial is not None and not isinstance(partial, list):
            raise InputFormatError(f"{where}: field 'partialArgs' must be an array")
        more = call.get("willContinue")
        if more is not None and not isinstance(more, bool):
            raise InputFormatError(f"{where}: field 'willContinue' must be true or false")
        if args is not None and partial is not None:
            raise InputFormatError(f"{where}: a call has either 'args' or 'partialArgs'")
        candidate.last_is_call = True
        writer = candidate.partial
        if candidate.streaming is not None and writer is not None:
            if name is not None or vendor_id is not None or args is not None:
                raise InputFormatError(f"{where}: a new call while a call's arguments stream")
            call_id = candidate.streaming
        else:
            if not name:
                raise InputFormatError(f"{where}: a call needs its 'name'")
            call_id = self._new_call(index, candidate, vendor_id, where)
            if args is not None or (partial is None and not more):
                text = orjson.dumps(args if args is not None else {}).decode()
                out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name, delta=text))
                if more:
                    raise InputFormatError(f"{where}: a call with whole 'args' does not continue")
                return
            writer = _Writer()
            candidate.streaming, candidate.partial = call_id, writer
            out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, tool=name, delta=writer.opening()))
        text = "".join(self._partial_arg(writer, raw, where) for raw in partial or ())
        if not more:
            text += writer.finish(where)
            candidate.streaming, candidate.partial = None, None
        if text:
            out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, delta=text))

    def _partial_arg(self, writer: _Writer, raw: Any, where: str) -> str:
        where = f"{where}.partialArgs[]"
        if not isinstance(raw, dict):
            raise InputFormatError(f"{where}: must be an object")
        if not raw.keys() <= _PARTIAL_MEMBERS:
            raise InputFormatError(f"{where}: a member the API does not define")
        path = parse_path(f.string(raw, "jsonPath", where), where)
        typed = [
            key for key in ("stringValue", "numberValue", "boolValue", "nullValue") if key in raw
        ]
        if len(typed) != 1:
            raise InputFormatError(f"{where}: exactly one of stringValue, numberValue, ...")
        more = raw.get("willContinue")
        if more is not None and not isinstance(more, bool):
            raise InputFormatError(f"{where}: field 'willContinue' must be true or false")
        value = raw[typed[0]]
        kind = typed[0]
        if kind == "stringValue":
            value = f.text(raw, kind, where)
        elif more:
            raise InputFormatError(f"{where}: only a string continues")
        elif kind == "numberValue" and (type(value) not in (int, float)):
            raise InputFormatError(f"{where}: field 'numberValue' must be a number")
        elif kind == "boolValue" and not isinstance(value, bool):
            raise InputFormatError(f"{where}: field 'boolValue' must be true or false")
        elif kind == "nullValue":
            if value != "NULL_VALUE":
                raise InputFormatError(f"{where}: field 'nullValue' must be 'NULL_VALUE'")
            value = None
        return writer.put(path, value, bool(more), where)

    def _new_call(
        self, index: int, candidate: _Candidate, vendor_id: str | None, where: str
    ) -> str:
        if vendor_id == "":
            raise InputFormatError(f"{where}: field 'id' must not be empty")
        call_id = (
            naming.vendor_call(vendor_id, index)
            if vendor_id is not None
            else naming.unnamed_call(self._stream, index, len(candidate.calls))
        )
        if call_id in self._ids:
            raise InputFormatError(f"{where}: the call id repeats another call's id")
        self._admit(self._held + 1, where)
        self._held += 1
        candidate.calls.append(call_id)
        self._ids.add(call_id)
        return call_id

    def _finish(self, candidate: _Candidate, reason: str, out: list[Chunk]) -> None:
        candidate.done = True
        rejection = _REJECTS.get(reason)
        if rejection is not None:
            detail = f"google.gemini: the model's function call ended {reason}"
            out.append(
                Chunk(self._stream, ChunkKind.MALFORMED, delta=detail, error=rejection.value)
            )
            candidate.finish = FinishReason.ERROR
        elif reason in _RELEASES:
            candidate.finish = _RELEASES[reason]
        elif reason in _FILTERED:
            candidate.finish = FinishReason.CONTENT_FILTER
        else:
            candidate.finish = None

    def _close_stream(self, out: list[Chunk]) -> list[Chunk]:
        """The END: the whole calls of every candidate that stopped are released; every other
        call ends as its own candidate's finish says."""
        for candidate in self._candidates:
            released = 0  # how many of its first calls it releases
            if candidate.finish in _RELEASES.values():
                released = len(candidate.calls)
                if candidate.finish is FinishReason.LENGTH and candidate.last_is_call:
                    released -= 1  # the limit may have cut the last one
            for position, call_id in enumerate(candidate.calls):
                if position < released and call_id != candidate.streaming:
                    out.append(self._chunk(ChunkKind.TOOL_CALL, call_id, final=True))
                else:
                    out.append(self._end_call(call_id, candidate.finish))
        finish = self._shared([candidate.finish for candidate in self._candidates])
        if finish is FinishReason.STOP and any(c.calls for c in self._candidates):
            finish = FinishReason.TOOL_CALLS
        out.append(self._end(finish))
        return out
