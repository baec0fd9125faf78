"""The providers' own SDK accumulators driven offline as oracles, and our side of the comparison.

`sdk_calls(fmt, events, stream_id)` feeds a stream to the vendor's SDK the way its streaming
client does (events built leniently with the SDK's own `construct_type`, the SDK's own filters and
error checks), one event at a time, and returns what the SDK holds for every client tool call: its
name and argument text, by the call id our adapters give it. When the SDK raises on an event the
stream is unplaceable from that event on (`raised_at`), and the view is the SDK's before it.

`gate(...)` runs records through the whole path the worker runs (`worker.compose`: decoder,
native reassembler, gate), with contracts that accept any object for every tool named, so that
the only reasons not to accept a call are the stream's.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from anthropic._models import construct_type as anthropic_construct
from anthropic.lib.streaming._messages import accumulate_event, build_events
from anthropic.types import RawMessageStreamEvent
from botocore.eventstream import EventStreamBuffer
from google.genai import types as genai
from google.genai.models import _GenerateContentResponse_from_vertex
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.chat._completions import _is_valid_chat_completion_chunk_weak
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from strands.event_loop.streaming import process_stream
from strands.types.events import ModelStopReason

from tests.datafiles import data_path
from tests.reference.vendor import approval_call, named_call, unnamed_call
from worker._native import AssembledCall, Assembler, Chunk
from worker.adapters.decoder import ENVELOPE, Decoder
from worker.compose import build_processor, build_registry
from worker.core.processor import Emission, Processor
from worker.settings import Settings, load_settings

RECORDED = data_path("streams")
CHAT, RESPONSES, ANTHROPIC, MCP, GEMINI, BEDROCK = (
    "openai.chat",
    "openai.responses",
    "anthropic.messages",
    "mcp.result",
    "google.gemini",
    "bedrock.converse",
)
#: the folder of tests/data/streams and the prefix of tests/data/generated files, per format
FOLDERS = {
    "openai_chat": CHAT,
    "openai_responses": RESPONSES,
    "anthropic": ANTHROPIC,
    "google_gemini": GEMINI,
    "bedrock_converse": BEDROCK,
}
#: formats whose SDK hands its user each call's arguments as a JSON value, not as text
VALUE_FORMATS = frozenset({GEMINI, BEDROCK})
#: the recordings' file names: SSE bodies, and one event per line
RECORDING_PATTERNS = ("*/*.sse", "*/*.jsonl", "*/*.eventstream")
#: the generated streams' file names (tests/data/generated/)
GENERATED_PATTERNS = ("*.sse", "*.eventstream")

Event = dict[str, Any]


class Call(NamedTuple):
    name: Any
    arguments: Any
    #: the kind of call (OpenAI Responses' item type; every other format's are function calls)
    kind: str = "function_call"


@dataclass
class SdkResult:
    """What the SDK made of a stream: each client tool call by our call id, in its order."""

    calls: dict[str, Call] = field(default_factory=dict)
    raised_at: int | None = None
    error: str | None = None
    snapshot: Any = None
    refusal: str | None = None

    def triples(self) -> list[tuple[str, Any, Any]]:
        return [(call_id, call.name, call.arguments) for call_id, call in self.calls.items()]

    def holds(self, fmt: str, call_id: str, name: str, arguments: str) -> bool:
        """Whether the SDK holds this call: the same name and the same text, or for a format
        whose SDK hands its user a JSON value rather than text, the same value."""
        held = self.calls.get(call_id)
        if held is None or held.name != name:
            return False
        if fmt in VALUE_FORMATS:
            return same_json(orjson.loads(arguments), orjson.loads(held.arguments))
        if not isinstance(held.arguments, str):
            # a built-in tool's value, as the SDK's model holds it: its keys in the model's order
            ours = orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS)
            return ours == orjson.dumps(held.arguments, option=orjson.OPT_SORT_KEYS)
        return bool(held.arguments == arguments)


# -- OpenAI Chat Completions ------------------------------------------------------------------


def sdk_chat(events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """`ChatCompletionStream`: a truthy `error` raises (as `Stream` does), chunks are built
    leniently, chunks whose `object` is not a chunk's are skipped, the rest accumulated."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    result = SdkResult()
    for number, raw in enumerate(events):
        try:
            if raw.get("error"):
                raise RuntimeError("the stream's error event (openai.APIError)")
            chunk = construct_type(type_=ChatCompletionChunk, value=copy.deepcopy(dict(raw)))
            if not _is_valid_chat_completion_chunk_weak(chunk):
                continue
            list(state.handle_chunk(chunk))
            snapshot = state.current_completion_snapshot
            calls, refusal = _chat_view(snapshot, stream_id)
        except Exception as exc:
            result.raised_at, result.error = number, f"{type(exc).__name__}: {exc}"
            return result
        result.calls, result.refusal, result.snapshot = calls, refusal, snapshot
    return result


def _chat_view(snapshot: Any, stream_id: str) -> tuple[dict[str, Call], str | None]:
    calls: dict[str, Call] = {}
    refusal = None
    for position, choice in enumerate(snapshot.choices):
        message = choice.message
        for index, call in enumerate(getattr(message, "tool_calls", None) or []):
            vendor_id = getattr(call, "id", None)
            call_id = (
                named_call(str(vendor_id), position)
                if vendor_id is not None
                else unnamed_call(stream_id, position, index)
            )
            function = getattr(call, "function", None)
            calls[str(call_id)] = Call(
                getattr(function, "name", None), getattr(function, "arguments", None)
            )
        refusal = refusal or getattr(message, "refusal", None)
    return calls, refusal


# -- OpenAI Responses -------------------------------------------------------------------------


def sdk_responses(events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """`ResponseStream`: events built leniently and handled by `ResponseStreamState`. The calls
    are those of the final response (`response.completed`), else of the response an
    `response.incomplete` / `response.failed` event hands the user, else the items so far."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    result = SdkResult()
    final: Any = None
    for number, raw in enumerate(events):
        try:
            if raw.get("error"):
                raise RuntimeError("the stream's error event (openai.APIError)")
            event = construct_type(type_=ResponseStreamEvent, value=copy.deepcopy(dict(raw)))
            for out in state.handle_event(event):  # type: ignore[arg-type]
                if out.type in ("response.completed", "response.incomplete", "response.failed"):
                    final = out.response
            items = final.output if final is not None else state._output_items.values()
            calls = _responses_view(items)
        except Exception as exc:
            result.raised_at, result.error = number, f"{type(exc).__name__}: {exc}"
            return result
        result.calls, result.snapshot = calls, final
    return result


def _responses_view(items: Iterable[Any]) -> dict[str, Call]:
    """The calls the client runs, as the SDK's items hold them: a function call's arguments, a
    custom tool's input and an MCP approval request's arguments as text; a built-in tool's
    operation or action as its JSON value."""
    calls: dict[str, Call] = {}
    for item in items or []:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            calls[named_call(str(item.call_id))] = Call(item.name, item.arguments)
        elif kind == "custom_tool_call":
            calls[named_call(str(item.call_id))] = Call(item.name, item.input, kind)
        elif kind == "mcp_approval_request":
            tool = f"{item.server_label}.{item.name}"
            calls[approval_call(str(item.id))] = Call(tool, item.arguments, kind)
        elif kind in _BUILT_IN and (kind != "shell_call" or _local(item)):
            tool, field = _BUILT_IN[kind]
            calls[named_call(str(item.call_id))] = Call(tool, _as_json(getattr(item, field)), kind)
    return calls


#: the client-run built-in tools' items: the tool each names, the field that is its call
_BUILT_IN = {
    "apply_patch_call": ("apply_patch", "operation"),
    "shell_call": ("shell", "action"),
    "local_shell_call": ("local_shell", "action"),
}


def _local(item: Any) -> bool:
    environment = getattr(item, "environment", None)
    return environment is None or getattr(environment, "type", None) == "local"


def _as_json(value: Any) -> dict[str, Any]:
    """A field of an SDK item as the JSON value it was sent as."""
    return dict(value.to_dict()) if hasattr(value, "to_dict") else dict(value)


# -- Anthropic Messages -----------------------------------------------------------------------

_PARTIAL_JSON = "Unable to parse tool parameter JSON from model"


def sdk_anthropic(events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """`MessageStream`: `ping` is skipped and `error` raises (as `Stream` does), events before
    `message_start` are passed over, the rest accumulated and turned into the SDK's events.

    The accumulator also parses each tool block's partial JSON and raises on text that cannot
    begin a JSON value. That judges the model's text, which the gate does for each call (a call
    whose text is not JSON is never accepted), not the stream's structure: the oracle records the
    text as the accumulator would have, and goes on."""
    snapshot: Any = None
    buffers: dict[int, bytes] = {}
    result = SdkResult()
    for number, raw in enumerate(events):
        try:
            kind = raw.get("type")
            if kind == "error":
                raise RuntimeError("the stream's error event (anthropic.APIStatusError)")
            if kind == "ping":
                continue
            event: Any = anthropic_construct(
                type_=RawMessageStreamEvent, value=copy.deepcopy(dict(raw))
            )
            if snapshot is None and event.type != "message_start":
                continue
            try:
                snapshot = accumulate_event(
                    event=event, current_snapshot=snapshot, json_bufs=buffers
                )
            except ValueError as exc:
                if not str(exc).startswith(_PARTIAL_JSON):
                    raise
                buffers[event.index] = buffers.get(event.index, b"") + bytes(
                    event.delta.partial_json, "utf-8"
                )
            build_events(event=event, message_snapshot=snapshot)
            calls = {
                # a block that took no text keeps the input it started with
                named_call(str(block.id)): Call(
                    block.name,
                    buffers.get(index, b"").decode() or orjson.dumps(block.input).decode(),
                )
                for index, block in enumerate(snapshot.content)
                if getattr(block, "type", None) == "tool_use"
            }
        except Exception as exc:
            result.raised_at, result.error = number, f"{type(exc).__name__}: {exc}"
            return result
        result.calls, result.snapshot = calls, snapshot
    return result


# -- Google Gemini ----------------------------------------------------------------------------


def sdk_gemini(events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """`Models.generate_content_stream`: a chunk with an `error` member raises (as the SDK's
    `request_streamed` does); every other chunk goes through the SDK's own response converter,
    and the parts that carry calls are built by its own model (`FunctionCall`). As with the
    OpenAI oracle, the rest of a chunk is read leniently: what a chunk says about usage or text
    is not where a call is placed.

    The SDK hands a streamed call's `partialArgs` to its user as they come (Vertex AI's
    `streamFunctionCallArguments`) and joins nothing; here they are joined as the API defines
    them: each value set at its JSON path, string pieces of a path appended, the call ending
    with the first part whose `willContinue` is not true. Call ids are the vendor's, else
    `<stream>:<candidate>:<n>` (the adapter's documented rule)."""
    result = SdkResult()
    calls: dict[str, Call] = {}
    counts: dict[int, int] = {}
    streaming: dict[int, tuple[str, str, dict[str, Any]]] = {}  # candidate -> call being joined
    for number, raw in enumerate(events):
        try:
            if "error" in raw:
                raise RuntimeError("the stream's error chunk (genai.errors.APIError)")
            converted = _GenerateContentResponse_from_vertex(copy.deepcopy(dict(raw)), None, None)
            for position, candidate in enumerate(converted.get("candidates") or []):
                index = genai.Candidate.model_validate({"index": candidate.get("index")}).index
                k = position if index is None else index
                content = candidate.get("content") or {}
                for part in content.get("parts") or []:
                    if part.get("functionCall") is None:
                        continue
                    call = genai.FunctionCall.model_validate(part["functionCall"])
                    if k in streaming:
                        call_id, name, args = streaming[k]
                    else:
                        n = counts.get(k, 0)
                        counts[k] = n + 1
                        call_id = (
                            named_call(call.id, k)
                            if call.id is not None
                            else unnamed_call(stream_id, k, n)
                        )
                        name, args = call.name, dict(call.args or {})
                    for piece in call.partial_args or []:
                        _set_partial(args, piece)
                    if call.will_continue:
                        streaming[k] = (call_id, name, args)
                    else:
                        streaming.pop(k, None)
                    calls[call_id] = Call(name, orjson.dumps(args).decode())
        except Exception as exc:
            result.raised_at, result.error = number, f"{type(exc).__name__}: {exc}"
            return result
        result.calls = dict(calls)
    return result


_PATH_STEP = re.compile(
    r"\.([^.\[\]]+)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|\[\"((?:[^\"\\]|\\.)*)\"\]"
)


def _set_partial(args: dict[str, Any], piece: Any) -> None:
    """Set one `PartialArg` into `args` (a string piece appended to the string there)."""
    path = piece.json_path
    if not path or not path.startswith("$"):
        raise ValueError(f"not a JSON path: {path!r}")
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        match = _PATH_STEP.match(path, at)
        if match is None:
            raise ValueError(f"JSON path not understood: {path!r}")
        name, index, single, double = match.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(next(text for text in (name, single, double) if text is not None))
        at = match.end()
    if not steps or not isinstance(steps[0], str):
        raise ValueError(f"not a path into the arguments object: {path!r}")
    node: Any = args
    for step, following in itertools.pairwise(steps):
        node = _slot(node, step, [] if isinstance(following, int) else {})
    last = steps[-1]
    if piece.string_value is not None:
        _slot(node, last, "")
        node[last] += piece.string_value
        return
    if piece.number_value is not None:
        value: Any = piece.number_value
    elif piece.bool_value is not None:
        value = piece.bool_value
    else:
        value = None
    _slot(node, last, None)
    node[last] = value


def _slot(node: Any, step: str | int, empty: Any) -> Any:
    """The value at `step` of a container, made `empty` when it is not there yet."""
    if isinstance(step, int):
        while len(node) <= step:
            node.append(None)
        if node[step] is None:
            node[step] = empty
        return node[step]
    return node.setdefault(step, empty)


def same_json(a: Any, b: Any) -> bool:
    """Equal JSON values, a number equal to a number of either kind, never to a boolean."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# -- Amazon Bedrock ConverseStream -----------------------------------------------------------


#: strands warns (logs) about every tool input it cannot parse, which mutated streams are full of
logging.getLogger("strands").setLevel(logging.ERROR)


def sdk_bedrock(events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """strands-agents' `process_stream`, the accumulator its Bedrock model feeds ConverseStream
    events (as boto3 yields them) to: each tool block's input text is joined and parsed at its
    `contentBlockStop` into the message's `toolUse` (its `input` a JSON value). An exception
    event raises, as boto3's event stream does. When it raises on event k, the view is the
    message of the events before k."""
    events = [copy.deepcopy(dict(event)) for event in events]
    result = SdkResult()
    pulled = 0

    async def chunks() -> Any:
        nonlocal pulled
        for event in events:
            pulled += 1
            if any(str(name).endswith("Exception") for name in event):
                raise RuntimeError("the stream's exception event (botocore EventStreamError)")
            yield event

    async def run(upto: int) -> Any:
        nonlocal pulled
        pulled = 0
        final = None
        async for out in process_stream(_slice(chunks(), upto)):
            if isinstance(out, ModelStopReason):
                final = out
        return final

    try:
        final = asyncio.run(run(len(events)))
    except Exception as exc:
        result.raised_at, result.error = pulled - 1, f"{type(exc).__name__}: {exc}"
        try:
            final = asyncio.run(run(result.raised_at))
        except Exception:
            return result
    message = final.message if final is not None else {"content": []}
    # strands keeps the use of a tool Bedrock runs itself in its message too: no client call
    server = [
        event["contentBlockStart"]["start"]["toolUse"].get("toolUseId")
        for event in events
        if isinstance(event.get("contentBlockStart"), dict)
        and isinstance(event["contentBlockStart"].get("start"), dict)
        and isinstance(event["contentBlockStart"]["start"].get("toolUse"), dict)
        and event["contentBlockStart"]["start"]["toolUse"].get("type") == "server_tool_use"
    ]
    for block in message.get("content", []):
        if "toolUse" in block and block["toolUse"].get("toolUseId") not in server:
            use = block["toolUse"]
            result.calls[named_call(str(use["toolUseId"]))] = Call(
                use["name"], orjson.dumps(use["input"]).decode()
            )
    return result


async def _slice(source: Any, upto: int) -> Any:
    count = 0
    async for item in source:
        if count == upto:
            return
        count += 1
        yield item


def eventstream_messages(body: bytes) -> list[tuple[str, bytes]]:
    """botocore's own reading of an AWS event-stream body: each message's type and payload."""
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    out = []
    for message in buffer:
        headers = message.headers
        kind = headers.get(":event-type") or headers.get(":exception-type")
        out.append((str(kind), bytes(message.payload)))
    return out


SDK = {
    CHAT: sdk_chat,
    RESPONSES: sdk_responses,
    ANTHROPIC: sdk_anthropic,
    GEMINI: sdk_gemini,
    BEDROCK: sdk_bedrock,
}


def sdk_calls(fmt: str, events: Iterable[Mapping[str, Any]], stream_id: str = "s1") -> SdkResult:
    """What the SDK of `fmt` makes of `events`. Its pydantic models warn when they serialize a
    value of a type they do not expect (what mutated streams hand them on purpose): a warning is
    not the SDK's answer, so warnings are not errors here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SDK[fmt](events, stream_id)


# -- our side ---------------------------------------------------------------------------------


class Record(NamedTuple):
    """A vendor record as the worker fetches it."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def records(
    fmt: str,
    values: Iterable[bytes],
    stream_id: str = "s1",
    *,
    topic: str = "in",
    partition: int = 0,
    start: int = 0,
    headers: Mapping[str, str] | None = None,
    step_ms: int = 10,
) -> list[Record]:
    """Vendor records of one stream (key = stream id, `content-format` = `fmt`), `step_ms` apart
    (record time: the reassembler's clock)."""
    extra = tuple((name, value.encode()) for name, value in (headers or {}).items())
    head = () if fmt == ENVELOPE else (("content-format", fmt.encode()),)
    key = None if fmt == ENVELOPE else stream_id.encode()
    return [
        Record(topic, partition, start + i, (start + i) * step_ms, key, value, head + extra)
        for i, value in enumerate(values)
    ]


#: the reassembler's bounds in these tests (the settings' defaults)
_DEFAULTS = Settings()


def assembler(**overrides: int) -> Assembler:
    limits, assembly = _DEFAULTS.limits, _DEFAULTS.assembly
    bounds = {
        "max_call_bytes": limits.max_bytes,
        "max_call_chunks": limits.max_chunks,
        "max_open_calls_per_partition": limits.max_open_calls_per_partition,
        "max_id_bytes": limits.max_id_bytes,
        "max_detail_bytes": limits.max_message_bytes,
        "idle_timeout_ms": round(assembly.idle_timeout_s * 1000),
        "max_call_lifetime_ms": round(assembly.max_call_lifetime_s * 1000),
        "recently_closed_per_partition": limits.recently_closed_per_partition,
        **overrides,
    }
    return Assembler(**bounds)


def decoder(
    max_streams: int | None = None,
    *,
    closed: int | None = None,
    dialects: Mapping[str, str] | None = None,
) -> Decoder:
    """The worker's decoder (its bounds from the default settings, unless given)."""
    limits = _DEFAULTS.limits
    return Decoder(
        max_streams_per_partition=max_streams or limits.max_open_calls_per_partition,
        closed_streams_per_partition=closed or limits.recently_closed_per_partition,
        max_id_bytes=limits.max_id_bytes,
        dialects=dialects,
    )


def chunks_of(
    fmt: str,
    values: Iterable[bytes],
    stream_id: str = "s1",
    *,
    headers: Mapping[str, str] | None = None,
) -> list[Chunk]:
    """The chunks the decoder makes of one stream's records."""
    dec = decoder()
    return [
        chunk
        for rec in records(fmt, values, stream_id, headers=headers)
        for chunk in dec.decode(rec, fmt)
    ]


def assemble(
    fmt: str,
    values: Iterable[bytes],
    stream_id: str = "s1",
    *,
    flush: bool = True,
    headers: Mapping[str, str] | None = None,
) -> list[AssembledCall]:
    """Decoder and native reassembler on one stream: every call it closes."""
    dec, asm = decoder(), assembler()
    batch = records(fmt, values, stream_id, headers=headers)
    done = list(asm.feed_records("in", 0, batch, dec.decode))
    return done + list(asm.flush()) if flush else done


def permissive_contracts(directory: Path, tools: Iterable[str] | Mapping[str, str]) -> Path:
    """A contracts directory where each of `tools` takes any JSON object (any text for a custom
    tool): `tools` names them, or maps each to the kind of call it is made by (a remote MCP
    tool's approval request, `server.tool`, is judged by the tool of an MCP tools file)."""
    domain = directory / "any"
    domain.mkdir(parents=True, exist_ok=True)
    kinds = dict(tools) if isinstance(tools, Mapping) else dict.fromkeys(tools, "function_call")
    mcp: dict[str, list[Any]] = {}
    for tool, kind in sorted(kinds.items()):
        schema: dict[str, Any] = {"$schema": DRAFT_2020_12, "type": "object"}
        if kind == "mcp_approval_request":
            server, name = tool.split(".", 1)
            mcp.setdefault(server, []).append({"name": name, "inputSchema": schema})
            continue
        if kind != "function_call":
            schema["x-callgate"] = {"call_kind": kind}
        (domain / f"{tool}.v1.schema.json").write_bytes(orjson.dumps(schema))
    for server, listed in mcp.items():
        (domain / f"{server}.tools.json").write_bytes(orjson.dumps({"tools": listed}))
    return directory


DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


class Gate:
    """The worker's whole path (`worker.compose`) on one contracts directory, a fresh processor
    (decoder and reassembler state) per run."""

    def __init__(self, contracts: Path, **limits: Any) -> None:
        self.settings = load_settings(schemas={"dir": contracts}, limits=limits)
        self.registry = build_registry(self.settings)

    def processor(self) -> Processor:
        return build_processor(self.settings, self.registry)

    def run(self, batches: Sequence[Sequence[Record]], *, flush: bool = True) -> list[Emission]:
        processor = self.processor()
        out: list[Emission] = []
        for batch in batches:
            if batch:
                out += processor.feed(batch[0].topic, batch[0].partition, batch)
        return out + processor.flush() if flush else out


def encode(events: Iterable[Mapping[str, Any]]) -> list[bytes]:
    return [orjson.dumps(event) for event in events]
