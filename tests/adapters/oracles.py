"""The providers' own SDK accumulators driven offline as oracles, and our side of the comparison.

`sdk_calls(fmt, events)` returns what the vendor's SDK makes of a stream: (id, name, argument text)
per client tool call, and the SDK's snapshot for further checks. `assemble(...)` runs the same
events through our decoder and the real reassembler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from anthropic.lib.streaming._messages import accumulate_event
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from tests.datafiles import data_path
from worker.adapters.decoder import Decoder
from worker.assembly.reassembler import AssemblyLimits, Reassembler
from worker.model import AssembledCall, Chunk

Triple = tuple[str, str, str]
RECORDED = data_path("streams")


@dataclass
class SdkResult:
    calls: list[Triple]
    snapshot: Any
    refusal: str | None = None


def sdk_chat(events: Iterable[Mapping[str, Any]]) -> SdkResult:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for event in events:
        list(state.handle_chunk(ChatCompletionChunk.model_validate(event)))
    snapshot = state.current_completion_snapshot
    calls = []
    refusal = None
    for choice in snapshot.choices:
        suffix = "" if choice.index == 0 else f":{choice.index}"
        for call in choice.message.tool_calls or []:
            calls.append((call.id + suffix, call.function.name, call.function.arguments))
        refusal = refusal or choice.message.refusal
    return SdkResult(calls, snapshot, refusal)


def sdk_responses(events: Iterable[Mapping[str, Any]]) -> SdkResult:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    arguments: dict[str, str] = {}
    items: dict[str, tuple[str, str]] = {}
    final = None
    for raw in events:
        event = construct_type(type_=ResponseStreamEvent, value=dict(raw))
        for out in state.handle_event(event):  # type: ignore[arg-type]
            if out.type == "response.output_item.added" and out.item.type == "function_call":
                items[out.item.id] = (out.item.call_id, out.item.name)
                arguments[out.item.id] = out.item.arguments
            elif out.type == "response.function_call_arguments.delta":
                arguments[out.item_id] = out.snapshot
            elif out.type == "response.completed":
                final = out.response
    if final is not None:
        calls = [
            (item.call_id, item.name, item.arguments)
            for item in final.output
            if item.type == "function_call"
        ]
    else:
        calls = [(*items[item_id], text) for item_id, text in arguments.items()]
    return SdkResult(calls, final)


def sdk_anthropic(events: Iterable[Mapping[str, Any]]) -> SdkResult:
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in events:
        if event["type"] == "error":
            continue
        snapshot = accumulate_event(
            event=dict(event),  # type: ignore[arg-type]
            current_snapshot=snapshot,
            json_bufs=buffers,
        )
    assert snapshot is not None
    calls = [
        (block.id, block.name, buffers.get(index, b"").decode())
        for index, block in enumerate(snapshot.content)
        if block.type == "tool_use"
    ]
    return SdkResult(calls, snapshot)


SDK = {
    "openai.chat": sdk_chat,
    "openai.responses": sdk_responses,
    "anthropic.messages": sdk_anthropic,
}


def sdk_calls(fmt: str, events: Iterable[Mapping[str, Any]]) -> SdkResult:
    return SDK[fmt](events)


def chunks_of(fmt: str, values: Iterable[bytes], stream_id: str = "s1") -> list[Chunk]:
    decoder = Decoder()
    out: list[Chunk] = []
    for value in values:
        out += decoder.decode(value, fmt=fmt, key=stream_id.encode())
    return out


def assemble(
    fmt: str,
    values: Iterable[bytes],
    stream_id: str = "s1",
    *,
    flush: bool = True,
) -> list[AssembledCall]:
    decoder = Decoder()
    reassembler = Reassembler(AssemblyLimits())
    done: list[AssembledCall] = []
    for offset, value in enumerate(values):
        for chunk in decoder.decode(value, fmt=fmt, key=stream_id.encode()):
            done += reassembler.feed(chunk, topic="t", partition=0, offset=offset, now=0.0)
    if flush:
        done += reassembler.flush()
    return done


def encode(events: Iterable[Mapping[str, Any]]) -> list[bytes]:
    return [orjson.dumps(event) for event in events]
