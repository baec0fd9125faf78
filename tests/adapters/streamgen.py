"""Generated vendor streams for what the recordings lack (pure: a seeded `Random` in, events out).

Every builder returns the vendor's own events as dicts, shaped like the recorded ones in
`tests/data/streams/`; `to_sse` writes them as the vendor sends them. Run this module to
rewrite the committed files under `tests/data/generated/` (a test checks they are current).
"""

from __future__ import annotations

import random
import sys
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from tests.datafiles import DATA

Event = dict[str, Any]
Call = tuple[str, str, str]  # (call id, tool name, argument text)

FIXTURES = DATA / "generated"


def split_text(text: str, rng: random.Random, max_piece: int = 8) -> list[str]:
    """`text` cut into pieces of 1..max_piece characters (at least one piece, maybe empty)."""
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_piece)
        pieces.append(text[i : i + n])
        i += n
    return pieces or [""]


def interleave(streams: Sequence[Sequence[Any]], rng: random.Random) -> list[tuple[int, Any]]:
    """A random merge of several sequences that keeps each one's own order."""
    cursors = [0] * len(streams)
    live = [i for i, s in enumerate(streams) if s]
    out: list[tuple[int, Any]] = []
    while live:
        k = rng.randrange(len(live))
        i = live[k]
        out.append((i, streams[i][cursors[i]]))
        cursors[i] += 1
        if cursors[i] == len(streams[i]):
            live[k] = live[-1]
            live.pop()
    return out


def _round_robin(per_call: list[list[Event]], rng: random.Random) -> list[Event]:
    return [event for _, event in interleave(per_call, rng)]


# -- OpenAI Responses -------------------------------------------------------------------------


def _response(response_id: str, status: str, output: list[Event], **extra: Any) -> Event:
    return {
        "id": response_id,
        "object": "response",
        "status": status,
        "error": None,
        "incomplete_details": None,
        "output": output,
        "model": "gpt-4o-mini-2024-07-18",
        **extra,
    }


def _item(item_id: str, call: Call, arguments: str, status: str) -> Event:
    call_id, name, _ = call
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def responses_stream(
    response_id: str,
    calls: Sequence[Call],
    rng: random.Random,
    *,
    numbered: bool = True,
    parallel: bool = True,
    cut_after: int | None = None,
    incomplete_reason: str = "max_output_tokens",
) -> list[Event]:
    """A Responses stream with one function call per entry of `calls`.

    `parallel` interleaves the calls' argument deltas (each call keeps its own order); with
    `cut_after=k` the stream stops after k argument deltas in total and ends with
    `response.incomplete` (`incomplete_reason`), leaving the calls that were mid-way open; its
    output lists every item added, as the API reports a cut response.
    """
    events: list[Event] = [
        {"type": "response.created", "response": _response(response_id, "in_progress", [])},
        {"type": "response.in_progress", "response": _response(response_id, "in_progress", [])},
    ]
    per_call: list[list[Event]] = []
    items = []
    for index, call in enumerate(calls):
        item_id = f"fc_{response_id}_{index}"
        items.append(item_id)
        body: list[Event] = [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": _item(item_id, call, "", "in_progress"),
            }
        ]
        for piece in split_text(call[2], rng):
            body.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item_id,
                    "output_index": index,
                    "delta": piece,
                }
            )
        body.append(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item_id,
                "output_index": index,
                "arguments": call[2],
            }
        )
        body.append(
            {
                "type": "response.output_item.done",
                "output_index": index,
                "item": _item(item_id, call, call[2], "completed"),
            }
        )
        per_call.append(body)
    body_events = _round_robin(per_call, rng) if parallel else [e for b in per_call for e in b]
    if cut_after is None:
        events += body_events
        output = [_item(items[i], call, call[2], "completed") for i, call in enumerate(calls)]
        events.append(
            {"type": "response.completed", "response": _response(response_id, "completed", output)}
        )
    else:
        deltas = 0
        for event in body_events:
            if event["type"] == "response.function_call_arguments.delta":
                if deltas == cut_after:
                    break
                deltas += 1
            events.append(event)
        events.append(
            {
                "type": "response.incomplete",
                "response": _response(
                    response_id,
                    "incomplete",
                    _cut_output(events, items, calls),
                    incomplete_details={"reason": incomplete_reason},
                ),
            }
        )
    if numbered:
        for number, event in enumerate(events):
            event["sequence_number"] = number
    return events


def _cut_output(events: list[Event], items: list[str], calls: Sequence[Call]) -> list[Event]:
    """The output of a response cut after `events`: every item added, finished ones whole,
    the one being streamed with the text it had (status `incomplete`), as the API reports it."""
    added: dict[int, str] = {}
    done: set[int] = set()
    for event in events:
        if event["type"] == "response.output_item.added":
            added[event["output_index"]] = ""
        elif event["type"] == "response.function_call_arguments.delta":
            added[event["output_index"]] += event["delta"]
        elif event["type"] == "response.output_item.done":
            done.add(event["output_index"])
    return [
        _item(items[index], calls[index], calls[index][2], "completed")
        if index in done
        else _item(items[index], calls[index], text, "incomplete")
        for index, text in sorted(added.items())
    ]


# -- OpenAI Chat Completions ------------------------------------------------------------------


def chat_stream(
    completion_id: str,
    choices: Sequence[Sequence[Call]],
    rng: random.Random,
    *,
    finish: Sequence[str] | None = None,
    usage: bool = True,
) -> list[Event]:
    """A Chat Completions stream; `choices[k]` are choice k's parallel calls (n = len(choices))."""
    finish = finish or ["tool_calls"] * len(choices)

    def chunk(index: int, delta: Event, reason: str | None = None) -> Event:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": 1727346178,
            "model": "gpt-4o-2024-08-06",
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            ],
        }

    # the role chunks open every choice in index order, as the API sends them
    events = [chunk(k, {"role": "assistant", "content": None}) for k in range(len(choices))]
    per_choice: list[list[Event]] = []
    for k, calls in enumerate(choices):
        body: list[Event] = []
        for t, (call_id, name, arguments) in enumerate(calls):
            function = {"name": name, "arguments": ""}
            first = {"index": t, "id": call_id, "type": "function", "function": function}
            body.append(chunk(k, {"tool_calls": [first]}))
            for piece in split_text(arguments, rng):
                more = {"index": t, "function": {"arguments": piece}}
                body.append(chunk(k, {"tool_calls": [more]}))
        body.append(chunk(k, {}, finish[k]))
        per_choice.append(body)
    events += _round_robin(per_choice, rng)
    if usage:
        events.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": 1727346178,
                "model": "gpt-4o-2024-08-06",
                "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )
    return events


# -- Anthropic Messages -----------------------------------------------------------------------


def anthropic_stream(
    message_id: str,
    calls: Sequence[Call],
    rng: random.Random,
    *,
    stop_reason: str = "tool_use",
    cut_last_after: int | None = None,
    server_tool: bool = False,
) -> list[Event]:
    """A Messages stream: a text block, then one `tool_use` block per call.

    With `cut_last_after=k` the last call's block gets only k argument deltas and no
    `content_block_stop` (what `max_tokens` looks like); `server_tool` adds a `server_tool_use`
    block, which is not a client call.
    """
    events: list[Event] = [
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-20250514",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Let me do that."},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    index = 1
    if server_tool:
        events += [
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {
                    "type": "server_tool_use",
                    "id": f"srvtoolu_{message_id}",
                    "name": "web_search",
                    "input": {},
                },
            },
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": '{"query": "weather"}'},
            },
            {"type": "content_block_stop", "index": index},
        ]
        index += 1
    for n, (call_id, name, arguments) in enumerate(calls):
        last = n == len(calls) - 1
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
            }
        )
        pieces = ["", *split_text(arguments, rng)]
        if last and cut_last_after is not None:
            pieces = pieces[:cut_last_after]
        for piece in pieces:
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
            )
        if not (last and cut_last_after is not None):
            events.append({"type": "content_block_stop", "index": index})
        index += 1
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 50},
        },
        {"type": "message_stop"},
    ]
    return events


# -- Google Gemini ----------------------------------------------------------------------------


def _gemini_chunk(
    response_id: str, candidate: int, parts: list[Event], finish: str | None = None
) -> Event:
    body: Event = {"content": {"role": "model", "parts": parts}}
    if candidate:
        body["index"] = candidate
    if finish is not None:
        body["finishReason"] = finish
    chunk: Event = {
        "candidates": [body],
        "modelVersion": "gemini-2.5-flash",
        "responseId": response_id,
    }
    if finish is not None:
        chunk["usageMetadata"] = {
            "promptTokenCount": 52,
            "candidatesTokenCount": 20,
            "totalTokenCount": 72,
        }
    return chunk


def _leaves(value: Any, path: str = "$") -> list[tuple[str, Any]]:
    """The scalar values of a JSON value with their JSON paths, in document order (an empty
    array or object has no value a partial argument can carry, and is left out)."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{path}[{i}]")]
    return [(path, value)]


def _partial_arg(path: str, value: Any) -> Event:
    if isinstance(value, bool):
        return {"jsonPath": path, "boolValue": value}
    if value is None:
        return {"jsonPath": path, "nullValue": "NULL_VALUE"}
    if isinstance(value, int | float):
        return {"jsonPath": path, "numberValue": value}
    raise TypeError(value)


def gemini_stream(
    response_id: str,
    calls: Sequence[Call],
    rng: random.Random,
    *,
    partial: bool = False,
    with_ids: bool = False,
    finish: str = "STOP",
    cut_after: int | None = None,
    candidate: int = 0,
) -> list[Event]:
    """A `streamGenerateContent` stream of one candidate, a text part, then one function call
    per entry of `calls`.

    Whole calls (`partial` false) come as `functionCall` parts with `args`, the first two in one
    chunk (parallel calls); with `partial` each call streams its arguments as Vertex AI's
    `partialArgs` (strings in pieces, each path closed by an empty last piece, the call ended by
    an empty `functionCall`). `with_ids` gives each call its id. With `cut_after=k` the stream
    stops after k partial pieces in all and the last chunk says `finish` (`MAX_TOKENS`)."""
    events = [_gemini_chunk(response_id, candidate, [{"text": "Let me look that up."}])]
    pending: list[Event] = []
    pieces = 0
    cut = False
    for call_id, name, arguments in calls:
        head: Event = {"name": name}
        if with_ids:
            head["id"] = call_id
        if not partial:
            pending.append({"functionCall": {**head, "args": orjson.loads(arguments)}})
            if len(pending) == 2:
                events.append(_gemini_chunk(response_id, candidate, pending))
                pending = []
            continue
        events.append(
            _gemini_chunk(
                response_id, candidate, [{"functionCall": {**head, "willContinue": True}}]
            )
        )
        for path, value in _leaves(orjson.loads(arguments)):
            if isinstance(value, str):
                args = [
                    {"jsonPath": path, "stringValue": piece, "willContinue": True}
                    for piece in split_text(value, rng)
                    if piece
                ] + [{"jsonPath": path, "stringValue": ""}]
            else:
                args = [_partial_arg(path, value)]
            for arg in args:
                if cut_after is not None and pieces == cut_after:
                    cut = True
                    break
                pieces += 1
                part = {"functionCall": {"partialArgs": [arg], "willContinue": True}}
                events.append(_gemini_chunk(response_id, candidate, [part]))
            if cut:
                break
        if cut:
            break
        events.append(_gemini_chunk(response_id, candidate, [{"functionCall": {}}]))
    if pending:
        events.append(_gemini_chunk(response_id, candidate, pending))
    events.append(_gemini_chunk(response_id, candidate, [{"text": ""}], finish))
    return events


# -- Amazon Bedrock ConverseStream -----------------------------------------------------------


def bedrock_stream(
    calls: Sequence[Call],
    rng: random.Random,
    *,
    stop_reason: str = "tool_use",
    cut_last_after: int | None = None,
    server_tool: bool = False,
    metadata: bool = True,
) -> list[Event]:
    """A ConverseStream as boto3 yields it: a text block (no start event, as Bedrock sends
    text), then a `toolUse` block per call, `messageStop`, `metadata`.

    With `cut_last_after=k` the last call's block gets only k input pieces and no stop (what a
    cut looks like); `server_tool` adds a tool Bedrock runs itself and its result block."""
    events: list[Event] = [{"messageStart": {"role": "assistant"}}]
    index = 0
    for piece in split_text("Let me check that.", rng):
        events.append({"contentBlockDelta": {"contentBlockIndex": index, "delta": {"text": piece}}})
    events.append({"contentBlockStop": {"contentBlockIndex": index}})
    index += 1
    if server_tool:
        server_id = f"tooluse_server_{rng.randrange(10**6)}"
        start = {"toolUse": {"toolUseId": server_id, "name": "nova_code_interpreter"}}
        start["toolUse"]["type"] = "server_tool_use"
        result = {"toolResult": {"toolUseId": server_id, "status": "success"}}
        output = [{"json": {"stdOut": "42", "exitCode": 0}}]
        events += [
            {"contentBlockStart": {"contentBlockIndex": index, "start": start}},
            {
                "contentBlockDelta": {
                    "contentBlockIndex": index,
                    "delta": {"toolUse": {"input": '{"snippet":"6 * 7"}'}},
                }
            },
            {"contentBlockStop": {"contentBlockIndex": index}},
            {"contentBlockStart": {"contentBlockIndex": index + 1, "start": result}},
            {
                "contentBlockDelta": {
                    "contentBlockIndex": index + 1,
                    "delta": {"toolResult": output},
                }
            },
            {"contentBlockStop": {"contentBlockIndex": index + 1}},
        ]
        index += 2
    for n, (call_id, name, arguments) in enumerate(calls):
        last = n == len(calls) - 1
        start = {"toolUse": {"toolUseId": call_id, "name": name}}
        events.append({"contentBlockStart": {"contentBlockIndex": index, "start": start}})
        pieces = split_text(arguments, rng)
        if last and cut_last_after is not None:
            pieces = pieces[:cut_last_after]
        for piece in pieces:
            delta = {"toolUse": {"input": piece}}
            events.append({"contentBlockDelta": {"contentBlockIndex": index, "delta": delta}})
        if not (last and cut_last_after is not None):
            events.append({"contentBlockStop": {"contentBlockIndex": index}})
        index += 1
    events.append({"messageStop": {"stopReason": stop_reason}})
    if metadata:
        usage = {"inputTokens": 400, "outputTokens": 60, "totalTokens": 460}
        events.append({"metadata": {"usage": usage, "metrics": {"latencyMs": 420}}})
    return events


def to_eventstream(events: Iterable[Event]) -> bytes:
    """Events as an AWS event-stream body: each an `event` message whose `:event-type` is the
    event's one member and whose payload is that member's value (`:exception-type` for an
    exception)."""
    out = bytearray()
    for event in events:
        ((kind, body),) = event.items()
        message_type = "exception" if kind.endswith("Exception") else "event"
        type_header = ":exception-type" if message_type == "exception" else ":event-type"
        headers = b"".join(
            _eventstream_header(name, value)
            for name, value in (
                (type_header, kind),
                (":content-type", "application/json"),
                (":message-type", message_type),
            )
        )
        payload = orjson.dumps(body)
        total = 12 + len(headers) + len(payload) + 4
        prelude = total.to_bytes(4, "big") + len(headers).to_bytes(4, "big")
        message = prelude + zlib.crc32(prelude).to_bytes(4, "big") + headers + payload
        out += message + zlib.crc32(message).to_bytes(4, "big")
    return bytes(out)


def _eventstream_header(name: str, value: str) -> bytes:
    raw = value.encode()
    return bytes([len(name)]) + name.encode() + b"\x07" + len(raw).to_bytes(2, "big") + raw


# -- canonical envelope -----------------------------------------------------------------------


def envelope_call(stream_id: str, call: Call, rng: random.Random) -> list[Event]:
    """The envelopes of one call, `seq` from 0, the last one `final`."""
    call_id, name, arguments = call
    pieces = split_text(arguments, rng)
    out = []
    for seq, piece in enumerate(pieces):
        envelope: Event = {
            "stream_id": stream_id,
            "call_id": call_id,
            "seq": seq,
            "kind": "tool_call",
            "delta": piece,
            "final": seq == len(pieces) - 1,
        }
        if seq == 0:
            envelope["tool"] = name
        out.append(envelope)
    return out


# -- arguments, SSE ---------------------------------------------------------------------------


def arguments(rng: random.Random) -> str:
    """A JSON object with strings that need escaping and non-ASCII text."""
    value = {
        "city": rng.choice(["Hangzhou", "São Paulo", "Zürich", 'Quote"d', "back\\slash", "東京"]),
        "days": rng.randint(1, 14),
        "units": rng.choice(["c", "f"]),
        "tags": [rng.choice(["a", "b", "\n"]) for _ in range(rng.randint(0, 3))],
    }
    return orjson.dumps(value).decode()


def to_sse(events: Iterable[Event], *, named: bool, done: bool = False) -> bytes:
    """Events as an SSE body: `event:` lines when `named` (Responses, Anthropic), `[DONE]` last."""
    out = bytearray()
    for event in events:
        if named:
            out += f"event: {event['type']}\n".encode()
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    if done:
        out += b"data: [DONE]\n\n"
    return bytes(out)


WEATHER: Call = ("call_weather_1", "get_weather", '{"city":"Hangzhou","units":"c"}')
STOCK: Call = ("call_stock_2", "get_stock_price", '{"ticker":"AAPL","exchange":"NASDAQ"}')
SHELL: Call = ("call_shell_3", "run_shell", '{"argv":["ls","pwd"]}')


def committed_fixtures() -> dict[str, bytes]:
    # the Bedrock ones as an AWS event-stream body, the Gemini and OpenAI ones as SSE
    """The generated streams kept as files under tests/data/generated/, for `callgate check`."""
    return {
        "openai_responses_parallel_calls.sse": to_sse(
            responses_stream("resp_gen_parallel", [WEATHER, STOCK, SHELL], random.Random(1)),
            named=True,
        ),
        "openai_responses_incomplete_mid_call.sse": to_sse(
            responses_stream(
                "resp_gen_incomplete", [WEATHER, SHELL], random.Random(2), cut_after=11
            ),
            named=True,
        ),
        "anthropic_max_tokens_two_tool_blocks.sse": to_sse(
            anthropic_stream(
                "msg_gen_max_tokens",
                [
                    ("toolu_gen_1", WEATHER[1], WEATHER[2]),
                    ("toolu_gen_2", SHELL[1], SHELL[2]),
                ],
                random.Random(3),
                stop_reason="max_tokens",
                cut_last_after=3,
            ),
            named=True,
        ),
        "google_gemini_parallel_whole_calls.sse": to_sse(
            gemini_stream("gen_parallel", [WEATHER, STOCK, SHELL], random.Random(5)),
            named=False,
        ),
        "google_gemini_partial_args_cut_by_max_tokens.sse": to_sse(
            gemini_stream(
                "gen_max_tokens",
                [WEATHER, SHELL],
                random.Random(6),
                partial=True,
                finish="MAX_TOKENS",
                cut_after=8,
            ),
            named=False,
        ),
        "bedrock_converse_two_tool_blocks_and_a_server_tool.eventstream": to_eventstream(
            bedrock_stream([WEATHER, STOCK], random.Random(7), server_tool=True)
        ),
        "bedrock_converse_max_tokens_inside_the_last_tool_block.eventstream": to_eventstream(
            bedrock_stream(
                [WEATHER, SHELL], random.Random(8), stop_reason="max_tokens", cut_last_after=3
            )
        ),
        "openai_chat_two_choices.sse": to_sse(
            chat_stream("chatcmpl_gen_n2", [[WEATHER], [WEATHER, STOCK]], random.Random(4)),
            named=False,
            done=True,
        ),
    }


if __name__ == "__main__":
    FIXTURES.mkdir(exist_ok=True)
    for name, body in committed_fixtures().items():
        (FIXTURES / name).write_bytes(body)
        print(FIXTURES / name, file=sys.stderr)
