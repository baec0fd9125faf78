"""Sample model output for the demo: every case the gate decides, as Kafka records.

Canonical envelopes (valid calls, parallel interleaved calls, truncated and abandoned ones,
refusals, schema violations, a fenced JSON repair, duplicate keys, idempotency duplicates and
conflicts, unknown tools, poison records) and vendor events (`openai.chat`, `openai.responses`,
`anthropic.messages`, `google.gemini`, `bedrock.converse`, `mcp.result`), both synthesized and
replayed from recordings shipped in `samples/` (copies of recorded vendor streams;
`samples/PROVENANCE.md` says where each comes from). Streams are interleaved record by record
as a busy topic would carry them, while each stream's own records keep their order (they share
a key, hence a partition).

Each call of a run gets ids under the run's prefix, so repeated demo runs do not collide in
idempotency state; idempotency keys are per run too.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson

from worker.adapters.input import read_records

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class SampleRecord:
    """One input record: key = stream id; `scenario` says what it shows (for the demo's log)."""

    key: bytes
    value: bytes
    headers: Headers
    scenario: str


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _pieces(text: str, parts: int) -> list[str]:
    """`text` cut into `parts` non-empty pieces (fewer when it is shorter)."""
    parts = max(1, min(parts, len(text)))
    size, extra = divmod(len(text), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return out


@dataclass(frozen=True, slots=True)
class _Stream:
    stream_id: str
    scenario: str
    records: tuple[tuple[bytes, Headers], ...]


class _Envelopes:
    """Builds canonical envelope streams for one run."""

    def __init__(self, run: str) -> None:
        self.run = run

    def stream(self, name: str, scenario: str, envelopes: Iterable[dict[str, Any]]) -> _Stream:
        sid = f"{self.run}:{name}"
        records = tuple((_dumps({"stream_id": sid, **env}), ()) for env in envelopes)
        return _Stream(sid, scenario, records)

    def raw(self, name: str, scenario: str, value: bytes, headers: Headers = ()) -> _Stream:
        return _Stream(f"{self.run}:{name}", scenario, ((value, headers),))

    def call(
        self,
        call_id: str,
        tool: str,
        arguments: str,
        *,
        parts: int = 3,
        version: str | None = None,
        idempotency_key: str | None = None,
        final: bool = True,
        kind: str = "tool_call",
    ) -> list[dict[str, Any]]:
        cid = f"{self.run}:{call_id}"
        chunks: list[dict[str, Any]] = []
        for seq, delta in enumerate(_pieces(arguments, parts)):
            env: dict[str, Any] = {"call_id": cid, "seq": seq, "kind": kind, "delta": delta}
            if seq == 0:
                env["tool"] = tool
                if version is not None:
                    env["tool_version"] = version
                if idempotency_key is not None:
                    env["idempotency_key"] = idempotency_key
            chunks.append(env)
        chunks[-1]["final"] = final
        return chunks


def _end(reason: str) -> dict[str, Any]:
    return {"kind": "end", "finish_reason": reason}


def _interleave(*calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = itertools.chain.from_iterable(itertools.zip_longest(*calls))
    return [chunk for chunk in merged if chunk is not None]


def _payment(amount_minor: int, key: str | None) -> str:
    arguments: dict[str, Any] = {
        "amount_minor": amount_minor,
        "currency": "EUR",
        "recipient": "acct_4711",
        "description": "invoice 2026-118",
    }
    if key is not None:
        arguments["idempotency_key"] = key
    return orjson.dumps(arguments).decode()


#: the demo's refunds (contract `payments.refund_payment`, requiring approval) by call id, and
#: what the demo decides on each through `callgate approve` / `callgate deny`
REFUND_DECISIONS = {"refund-approve": "approve", "refund-deny": "deny"}


def _refund(amount_minor: int, key: str, reason: str) -> str:
    arguments = {
        "payment_id": "pay_4711",
        "amount_minor": amount_minor,
        "currency": "EUR",
        "reason": reason,
        "idempotency_key": key,
    }
    return orjson.dumps(arguments).decode()


def _repeat_first(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chunks[0], *chunks]


def _drop_second(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chunks[0], *chunks[2:]]


def envelope_streams(run: str) -> list[_Stream]:
    e = _Envelopes(run)
    weather = '{"city": "Hangzhou", "units": "celsius"}'
    key = f"{run}-order-1".replace(".", "-").replace(":", "-")
    payment = _payment(1250, key)
    other_payment = _payment(9900, key)
    stalled = e.call("stalled", "get_weather", weather, final=False)[:2]
    refunds = [
        e.call(
            call_id,
            "refund_payment",
            _refund(amount, refund_key, reason),
            idempotency_key=refund_key,
        )
        for call_id, amount, reason in (
            ("refund-approve", 1250, "order cancelled"),
            ("refund-deny", 99000, "customer asks twice"),
        )
        for refund_key in [f"{key}-{call_id}"]
    ]
    return [
        e.stream(
            "valid", "valid call", [*e.call("w1", "get_weather", weather), _end("tool_calls")]
        ),
        e.stream(
            "v2",
            "valid call, schema v2",
            [
                *e.call(
                    "w2",
                    "get_weather",
                    '{"city": "Oslo", "units": "celsius", "days": 3}',
                    version="2",
                ),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "parallel",
            "parallel interleaved calls",
            [
                *_interleave(
                    e.call("p1", "get_weather", '{"city": "Lisbon", "units": "celsius"}', parts=4),
                    e.call(
                        "p2", "get_weather", '{"city": "Porto", "units": "fahrenheit"}', parts=5
                    ),
                ),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "truncated",
            "truncated by max_tokens",
            [*e.call("t1", "get_weather", '{"city": "Ber', final=False), _end("length")],
        ),
        e.stream(
            "ended",
            "stream ended mid-call",
            [*e.call("t2", "get_weather", '{"city": "Ro', final=False), _end("stop")],
        ),
        e.stream("stalled", "no chunk for the idle timeout", stalled),
        e.stream(
            "refusal",
            "model refused",
            [*e.call("r1", "", "I can't help with that.", kind="refusal", parts=1), _end("stop")],
        ),
        e.stream(
            "violation",
            "schema violation",
            [
                *e.call("s1", "get_weather", '{"city": "Rome", "units": "kelvin"}'),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "fenced",
            "fenced JSON repaired",
            [*e.call("f1", "get_weather", f"```json\n{weather}\n```"), _end("tool_calls")],
        ),
        e.stream(
            "dupkey",
            "duplicate key",
            [
                *e.call(
                    "d1", "get_weather", '{"city": "Rome", "city": "Milan", "units": "celsius"}'
                ),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "badjson",
            "invalid JSON",
            [*e.call("j1", "get_weather", '{"city": "Rome",}'), _end("tool_calls")],
        ),
        e.stream(
            "unknown",
            "unknown tool",
            [*e.call("u1", "launch_rocket", '{"target": "moon"}'), _end("tool_calls")],
        ),
        e.stream(
            "pay",
            "payment, then its replay (duplicate), then a conflict",
            [
                *e.call("pay1", "create_payment", payment, idempotency_key=key),
                *e.call("pay2", "create_payment", payment, idempotency_key=key),
                *e.call("pay3", "create_payment", other_payment, idempotency_key=key),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "refunds",
            "refunds requiring approval: one approved, one denied (callgate approve / deny)",
            [*refunds[0], *refunds[1], _end("tool_calls")],
        ),
        e.stream(
            "nokey",
            "side-effecting tool without an idempotency key",
            [*e.call("pay4", "create_payment", _payment(700, None)), _end("tool_calls")],
        ),
        e.stream(
            "dupchunk",
            "duplicate chunk dropped",
            [
                *_repeat_first(e.call("dc1", "get_weather", weather)),
                _end("tool_calls"),
            ],
        ),
        e.stream(
            "gap",
            "sequence gap",
            [
                *_drop_second(e.call("g1", "get_weather", weather, parts=4)),
                _end("tool_calls"),
            ],
        ),
        e.raw("poison", "poison record (not JSON)", b"\x00not json at all"),
        e.raw(
            "badformat",
            "unknown content-format",
            b"{}",
            (("content-format", b"gemini.stream"),),
        ),
    ]


def _chat(sid: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": sid,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _openai_chat_call(
    run: str, name: str, arguments: str, finish: str, dialect: str | None = None
) -> _Stream:
    """A Chat Completions call streamed in pieces; `dialect`: the server's (content-format)."""
    sid = f"{run}:chat-{name}"
    events = [
        _chat(sid, {"role": "assistant", "content": None}),
        _chat(
            sid,
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"{run}:chat-{name}-call",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
        ),
        *(
            _chat(sid, {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in _pieces(arguments, 4)
        ),
        _chat(sid, {}, finish),
    ]
    fmt = "openai.chat" if dialect is None else f"openai.chat; dialect={dialect}"
    headers: Headers = (("content-format", fmt.encode()),)
    return _Stream(sid, f"{fmt} {name}", tuple((_dumps(ev), headers) for ev in events))


def _anthropic_call(run: str, name: str, arguments: str, stop: str | None) -> _Stream:
    sid = f"{run}:anthropic-{name}"
    block = {"type": "tool_use", "id": f"{run}:toolu-{name}", "name": "get_weather", "input": {}}
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": sid,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-sonnet-4-5",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 25, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": block},
        *(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            for piece in ["", *_pieces(arguments, 3)]
        ),
    ]
    if stop == "tool_use":
        events.append({"type": "content_block_stop", "index": 0})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 40},
        }
    )
    events.append({"type": "message_stop"})
    headers: Headers = (("content-format", b"anthropic.messages"),)
    return _Stream(sid, f"anthropic.messages {name}", tuple((_dumps(ev), headers) for ev in events))


def _gemini_call(run: str, name: str, arguments: str, finish: str) -> _Stream:
    """A Gemini stream: text, then the call's arguments streamed as Vertex AI `partialArgs`
    (each top-level argument in two pieces), then the finish."""
    sid = f"{run}:gemini-{name}"

    def chunk(part: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part or {"text": ""}]}}
        if finish is not None:
            candidate["finishReason"] = finish
        return {"candidates": [candidate], "responseId": sid}

    def partial(path: str, text: str, more: bool) -> dict[str, Any]:
        arg: dict[str, Any] = {"jsonPath": path, "stringValue": text}
        if more:
            arg["willContinue"] = True
        return {"functionCall": {"partialArgs": [arg], "willContinue": True}}

    events = [chunk({"text": "Checking the weather."})]
    events.append(chunk({"functionCall": {"name": "get_weather", "willContinue": True}}))
    for key, value in orjson.loads(arguments).items():
        for piece in _pieces(value, 2):
            events.append(chunk(partial(f"$.{key}", piece, True)))
        events.append(chunk(partial(f"$.{key}", "", False)))
    if finish == "STOP":
        events.append(chunk({"functionCall": {}}))
    events.append(chunk(None, finish))
    headers: Headers = (("content-format", b"google.gemini"),)
    return _Stream(sid, f"google.gemini {name}", tuple((_dumps(ev), headers) for ev in events))


def _bedrock_call(run: str, name: str, arguments: str, stop: str) -> _Stream:
    """A Bedrock ConverseStream as boto3 yields it: text, one tool block, the stop, usage."""
    sid = f"{run}:bedrock-{name}"
    tool = {"toolUseId": f"{run}:tooluse-{name}", "name": "get_weather"}
    events: list[dict[str, Any]] = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "Checking."}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"contentBlockStart": {"contentBlockIndex": 1, "start": {"toolUse": tool}}},
        *(
            {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": p}}}}
            for p in _pieces(arguments, 3)
        ),
        {"contentBlockStop": {"contentBlockIndex": 1}},
        {"messageStop": {"stopReason": stop}},
        {"metadata": {"usage": {"inputTokens": 30, "outputTokens": 12, "totalTokens": 42}}},
    ]
    headers: Headers = (("content-format", b"bedrock.converse"),)
    return _Stream(sid, f"bedrock.converse {name}", tuple((_dumps(ev), headers) for ev in events))


def _mcp(run: str, name: str, tool: str, result: Any) -> _Stream:
    sid = f"{run}:mcp-{name}"
    headers: Headers = (
        ("content-format", b"mcp.result"),
        ("tool", tool.encode()),
        ("call-id", f"{run}:mcp-{name}".encode()),
    )
    value = _dumps({"jsonrpc": "2.0", "id": 1, "result": result})
    return _Stream(sid, f"mcp.result {name}", ((value, headers),))


def _replay(run: str, file: str, fmt: str, scenario: str, dialect: str | None = None) -> _Stream:
    """A recorded vendor stream from `samples/`, under a stream id of this run (read in the
    server's `dialect`, when it has one)."""
    sid = f"{run}:rec-{file.split('.', maxsplit=1)[0]}"
    named = fmt if dialect is None else f"{fmt}; dialect={dialect}"
    headers: Headers = (("content-format", named.encode()),)
    data = resources.files("callgate_demo").joinpath("samples", file).read_bytes()
    values = [value for value in read_records(io.BytesIO(data), fmt) if isinstance(value, bytes)]
    return _Stream(sid, scenario, tuple((value, headers) for value in values))


def _sample_json(file: str) -> Any:
    return orjson.loads(resources.files("callgate_demo").joinpath("samples", file).read_bytes())


def vendor_streams(run: str) -> list[_Stream]:
    weather = '{"city": "Paris", "units": "celsius"}'
    return [
        _openai_chat_call(run, "valid", weather, "tool_calls"),
        _openai_chat_call(run, "truncated", '{"city": "Par', "length"),
        # vLLM sends these arguments double-encoded: decoded once, the repair double_encoded
        _openai_chat_call(
            run, "double-encoded", orjson.dumps(weather).decode(), "tool_calls", "vllm"
        ),
        _anthropic_call(run, "valid", weather, "tool_use"),
        _anthropic_call(run, "max-tokens", '{"city": "Pa', "max_tokens"),
        _gemini_call(run, "valid", weather, "STOP"),
        _gemini_call(run, "max-tokens", weather, "MAX_TOKENS"),
        _bedrock_call(run, "valid", weather, "tool_use"),
        _bedrock_call(run, "max-tokens", weather, "max_tokens"),
        _mcp(
            run, "result", "weather.get_weather_data", _sample_json("mcp_structured_content.json")
        ),
        _mcp(run, "tool-error", "weather.get_weather_data", _sample_json("mcp_tool_error.json")),
        _replay(
            run,
            "parallel_tool_calls_weather_and_stock.sse",
            "openai.chat",
            "recorded openai.chat parallel calls",
        ),
        _replay(run, "refusal_delta_refusal.sse", "openai.chat", "recorded openai.chat refusal"),
        _replay(
            run,
            "truncated_finish_reason_length.sse",
            "openai.chat",
            "recorded openai.chat finish_reason length",
        ),
        _replay(run, "tool_use_response.sse", "anthropic.messages", "recorded anthropic tool_use"),
        _replay(
            run,
            "incomplete_partial_json_response.sse",
            "anthropic.messages",
            "recorded anthropic max_tokens mid tool_use",
        ),
        _replay(
            run,
            "dotnet_function_call_get_weather_at_location.sse",
            "openai.responses",
            "recorded openai.responses function call",
        ),
        _replay(
            run,
            "vercel_custom_tool_call.jsonl",
            "openai.responses",
            "recorded openai.responses custom tool call (no contract of its kind: rejected)",
        ),
        _replay(
            run,
            "rustgenai_tools_completed_no_output_field.sse",
            "openai.responses",
            "recorded openai.responses final response without output (9router dialect)",
            dialect="9router",
        ),
        _replay(
            run,
            "vercel_partial_args_two_calls.jsonl",
            "google.gemini",
            "recorded google.gemini streamed arguments, two calls",
        ),
        _replay(
            run,
            "pydanticai_nova_text_then_tool_use.eventstream",
            "bedrock.converse",
            "recorded bedrock.converse tool use (AWS event stream)",
        ),
    ]


def sample_traffic(run: str) -> list[SampleRecord]:
    """Every sample stream of one run, interleaved record by record across streams."""
    streams = [*envelope_streams(run), *vendor_streams(run)]
    return list(_round_robin(streams))


def _round_robin(streams: list[_Stream]) -> Iterator[SampleRecord]:
    for row in itertools.zip_longest(*(s.records for s in streams)):
        for stream, record in zip(streams, row, strict=True):
            if record is not None:
                value, headers = record
                yield SampleRecord(stream.stream_id.encode(), value, headers, stream.scenario)
