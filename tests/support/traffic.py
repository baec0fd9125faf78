"""Live traffic for the worker tests: generated model output, what each call must come to, and a
producer that sends it while workers run.

`mixed` makes canonical envelope streams of several calls each (valid, schema violations, fenced
JSON, invalid JSON, parallel calls, calls cut by max_tokens, stalled calls that time out) and
vendor streams (`openai.chat`, `anthropic.messages`), interleaved record by record over a window
of concurrent streams, so that hundreds of calls are open at any offset. `key_pairs` makes
calls of a side-effecting tool in pairs that share an idempotency key, each on its own stream,
the two streams of a pair on different partitions, with equal or different requests.

Everything is drawn from a seeded `random.Random`: the same seed gives the same traffic. Record
time is synthetic (a fixed step per record from the feeder's start), so every decision that
depends on time (idle timeouts) depends on the records alone, as the worker's do.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from worker._native import partition_for_key

Header = tuple[str, bytes]

#: the idle timeout the tests' workers run with (record time); stalled calls time out after it
IDLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Message:
    """One input record (its timestamp is the feeder's: record time is synthetic)."""

    key: bytes
    value: bytes
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class Expect:
    """What a call must come to: `outcome` and its `code` (a rejection's error_code, an
    incomplete call's reason). A keyed call (`key` set) is decided by the key's owner: one call
    of a key is accepted, the others are `duplicate` (same `request`) or
    `idempotency_conflict` (another one)."""

    outcome: str
    code: str | None = None
    key: str | None = None
    request: str | None = None


@dataclass(slots=True)
class Traffic:
    messages: list[Message] = field(default_factory=list)
    expected: dict[str, Expect] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return len(self.expected)

    @property
    def keyed(self) -> int:
        return sum(1 for e in self.expected.values() if e.key is not None)


# -- building blocks -----------------------------------------------------------------------------


def _pieces(text: str, parts: int) -> list[str]:
    parts = max(1, min(parts, len(text)))
    size, extra = divmod(len(text), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def envelopes(
    stream: str,
    call_id: str,
    tool: str,
    arguments: str,
    *,
    parts: int = 3,
    version: str | None = "1",
    final: bool = True,
    kind: str = "tool_call",
    principal: str | None = None,
) -> list[Message]:
    """One call as canonical envelopes, its text cut into `parts` chunks (its first naming
    `principal`, when one is given)."""
    out = []
    pieces = _pieces(arguments, parts)
    for seq, delta in enumerate(pieces):
        env: dict[str, Any] = {
            "stream_id": stream,
            "call_id": call_id,
            "seq": seq,
            "kind": kind,
            "delta": delta,
        }
        if seq == 0:
            env["tool"] = tool
            if version is not None:
                env["tool_version"] = version
            if principal is not None:
                env["principal"] = principal
        if final and seq == len(pieces) - 1:
            env["final"] = True
        out.append(Message(stream.encode(), orjson.dumps(env)))
    return out


def end(stream: str, reason: str = "tool_calls") -> Message:
    env = {"stream_id": stream, "kind": "end", "finish_reason": reason}
    return Message(stream.encode(), orjson.dumps(env))


def _weather(city: str, units: str = "celsius") -> str:
    return orjson.dumps({"city": city, "units": units}).decode()


def _merge(first: list[Message], second: list[Message]) -> list[Message]:
    """Two calls of one stream, chunk by chunk (parallel tool calls)."""
    out: list[Message] = []
    for i in range(max(len(first), len(second))):
        out.extend(first[i : i + 1])
        out.extend(second[i : i + 1])
    return out


_CHAT = (("content-format", b"openai.chat"),)
_ANTHROPIC = (("content-format", b"anthropic.messages"),)


def openai_chat(
    stream: str, call_id: str, arguments: str, finish: str, parts: int
) -> list[Message]:
    """An `openai.chat` stream with one tool call."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> Message:
        body = {
            "id": stream,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return Message(stream.encode(), orjson.dumps(body), _CHAT)

    first = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    return [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [first]}),
        *(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in _pieces(arguments, parts)
        ),
        chunk({}, finish),
    ]


def anthropic(stream: str, call_id: str, arguments: str, stop: str, parts: int) -> list[Message]:
    """An `anthropic.messages` stream with one tool_use block."""

    def event(body: dict[str, Any]) -> Message:
        return Message(stream.encode(), orjson.dumps(body), _ANTHROPIC)

    message = {
        "id": stream,
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": 12, "output_tokens": 1},
    }
    block = {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}}
    events = [
        event({"type": "message_start", "message": message}),
        event({"type": "content_block_start", "index": 0, "content_block": block}),
        *(
            event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
            )
            for piece in _pieces(arguments, parts)
        ),
    ]
    if stop == "tool_use":
        events.append(event({"type": "content_block_stop", "index": 0}))
    events.append(
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop},
                "usage": {"output_tokens": 20},
            }
        )
    )
    events.append(event({"type": "message_stop"}))
    return events


def interleave(streams: list[list[Message]], window: int, rng: random.Random) -> list[Message]:
    """At most `window` streams at a time, in cycles: each active stream gives its next record
    once per cycle, in an order drawn anew each cycle; each stream keeps its own order, and a
    stream that ends makes room for the next one. So two records of one stream are never more
    than `2 * window` records apart (see `widest_gap`)."""
    pending = iter(streams)
    active: list[Iterator[Message]] = []
    for stream in pending:
        active.append(iter(stream))
        if len(active) >= window:
            break
    out: list[Message] = []
    while active:
        rng.shuffle(active)
        kept: list[Iterator[Message]] = []
        for records in active:
            record = next(records, None)
            if record is not None:
                out.append(record)
                kept.append(records)
                continue
            following = next(pending, None)
            if following is not None:
                kept.append(iter(following))
        active = kept
    return out


def widest_gap(messages: list[Message]) -> int:
    """The most records between two consecutive records of one stream (one key)."""
    last: dict[bytes, int] = {}
    widest = 0
    for index, message in enumerate(messages):
        if message.key in last:
            widest = max(widest, index - last[message.key])
        last[message.key] = index
    return widest


# -- the loads ------------------------------------------------------------------------------------


def mixed(run: str, calls: int, *, seed: int, window: int = 200) -> Traffic:
    """About `calls` calls of every kind (see the module docstring), interleaved."""
    rng = random.Random(seed)
    traffic = Traffic()
    expected = traffic.expected
    streams: list[list[Message]] = []
    # a few stalled calls first: they time out once their partition's time passes the timeout
    for s in range(max(1, calls // 1000)):
        stream, call = f"{run}:stall{s}", f"{run}:stall{s}:c0"
        streams.append(envelopes(stream, call, "get_weather", _weather("Oslo"), final=False)[:2])
        expected[call] = Expect("incomplete", "timeout")
    made = len(expected)
    s = 0
    while made < calls:
        s += 1
        stream = f"{run}:s{s}"
        draw = rng.random()
        if draw < 0.06:  # openai.chat, one call, sometimes cut by max_tokens
            call = f"{run}:s{s}:chat"
            cut = rng.random() < 0.2
            args = '{"city": "Par' if cut else _weather(f"Paris{s}")
            finish = "length" if cut else "tool_calls"
            streams.append(openai_chat(stream, call, args, finish, rng.randint(1, 4)))
            expected[call] = Expect("incomplete", "max_tokens") if cut else Expect("accepted")
            made += 1
            continue
        if draw < 0.12:  # anthropic.messages, one call, sometimes cut by max_tokens
            call = f"{run}:s{s}:toolu"
            cut = rng.random() < 0.2
            args = '{"city": "Ro' if cut else _weather(f"Rome{s}")
            stop = "max_tokens" if cut else "tool_use"
            streams.append(anthropic(stream, call, args, stop, rng.randint(1, 4)))
            expected[call] = Expect("incomplete", "max_tokens") if cut else Expect("accepted")
            made += 1
            continue
        records: list[Message] = []
        finish = "tool_calls"
        for c in range(rng.randint(2, 8)):
            call = f"{run}:s{s}:c{c}"
            parts = rng.randint(1, 5)
            kind = rng.random()
            if kind < 0.65:
                records += envelopes(
                    stream, call, "get_weather", _weather(f"c{s}-{c}"), parts=parts
                )
                expected[call] = Expect("accepted")
            elif kind < 0.77:
                bad = _weather(f"c{s}-{c}", "kelvin")
                records += envelopes(stream, call, "get_weather", bad, parts=parts)
                expected[call] = Expect("rejected", "schema_violation")
            elif kind < 0.83:
                fenced = f"```json\n{_weather(f'f{s}-{c}')}\n```"
                records += envelopes(stream, call, "get_weather", fenced, parts=parts)
                expected[call] = Expect("accepted")
            elif kind < 0.88:
                broken = '{"city": "Rome",, "units": "celsius"}'
                records += envelopes(stream, call, "get_weather", broken, parts=parts)
                expected[call] = Expect("rejected", "invalid_json")
            elif kind < 0.96:  # two parallel calls, chunk by chunk
                other = f"{call}p"
                records += _merge(
                    envelopes(stream, call, "get_weather", _weather(f"a{s}-{c}"), parts=parts),
                    envelopes(stream, other, "get_weather", _weather(f"b{s}-{c}"), parts=3),
                )
                expected[call] = expected[other] = Expect("accepted")
                made += 1
            else:  # the model ran out of tokens: the stream ends here
                head = '{"city": "Ber'
                records += envelopes(stream, call, "get_weather", head, parts=parts, final=False)
                expected[call] = Expect("incomplete", "max_tokens")
                finish = "length"
                made += 1
                break
            made += 1
            if made >= calls:
                break
        records.append(end(stream, finish))
        streams.append(records)
    traffic.messages = interleave(streams, window, rng)
    return traffic


def _payment(key: str, amount: int, *, reordered: bool = False) -> str:
    fields = {
        "amount_minor": amount,
        "currency": "EUR",
        "recipient": "acct_4711",
        "description": None,
        "idempotency_key": key,
    }
    if reordered:  # the same request written differently: equal in canonical form
        return orjson.dumps(dict(reversed(fields.items())), option=orjson.OPT_INDENT_2).decode()
    return orjson.dumps(fields).decode()


def _stream_on(prefix: str, partition: int, partitions: int) -> str:
    """A stream id (the record key) that lands on `partition`."""
    for n in range(10_000):
        name = f"{prefix}-{n}"
        if partition_for_key(name.encode(), partitions) == partition:
            return name
    raise AssertionError("no stream id found for the partition")  # pragma: no cover


def key_pairs(run: str, pairs: int, partitions: int, *, seed: int, window: int = 200) -> Traffic:
    """`pairs` idempotency keys, two calls each on streams of different partitions: equal
    requests (written differently) for half of the keys, different ones for the others."""
    rng = random.Random(seed)
    traffic = Traffic()
    streams: list[list[Message]] = []
    tag = run.replace(":", "-").replace(".", "-")
    for k in range(pairs):
        key = f"{tag}-key{k}"
        equal = rng.random() < 0.5
        first_partition = rng.randrange(partitions)
        second_partition = (first_partition + rng.randrange(1, partitions)) % partitions
        amounts = (100 + k, 100 + k if equal else 200 + k)
        for side, (partition, amount) in enumerate(
            zip((first_partition, second_partition), amounts, strict=True)
        ):
            stream = _stream_on(f"{run}:k{k}{'ab'[side]}", partition, partitions)
            call = f"{stream}:pay"
            args = _payment(key, amount, reordered=side == 1)
            streams.append(
                [
                    *envelopes(stream, call, "create_payment", args, parts=rng.randint(1, 4)),
                    end(stream),
                ]
            )
            traffic.expected[call] = Expect("keyed", key=key, request=f"{key}:{amount}")
    rng.shuffle(streams)
    traffic.messages = interleave(streams, window, rng)
    return traffic


# -- the producer ---------------------------------------------------------------------------------


class Feeder:
    """Sends `messages` in order while workers run: about `per_second`, in slices every 50 ms,
    never past `limit` (a gate the test moves; `None`: no gate). Record time is synthetic:
    the i-th record's timestamp is the start plus i * `step_ms`. Each record goes to the
    partition of its key (Kafka's default partitioner), named explicitly."""

    TICK_S = 0.05

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        messages: list[Message],
        *,
        per_second: float,
        step_ms: int = 1,
    ) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._partitions = partitions
        self._messages = messages
        self._per_tick = max(1, int(per_second * self.TICK_S))
        self._step_ms = step_ms
        self.produced = 0
        self._limit: int | None = None
        self._moved = asyncio.Event()

    @property
    def total(self) -> int:
        return len(self._messages)

    @property
    def done(self) -> bool:
        return self.produced >= self.total

    @property
    def held(self) -> bool:
        """Waiting at the gate (or done): nothing more arrives until the test moves it."""
        return self.done or (self._limit is not None and self.produced >= self._limit)

    def limit(self, count: int | None) -> None:
        self._limit = count
        self._moved.set()

    async def run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, linger_ms=5, acks="all")
        await producer.start()
        try:
            base_ms = int(time.time() * 1000)
            next_tick = time.monotonic()
            while self.produced < self.total:
                upto = min(self.total, self.produced + self._per_tick)
                if self._limit is not None:
                    upto = min(upto, self._limit)
                if upto <= self.produced:
                    self._moved.clear()
                    await self._moved.wait()
                    next_tick = time.monotonic()
                    continue
                futures = []
                for index in range(self.produced, upto):
                    message = self._messages[index]
                    futures.append(
                        await producer.send(
                            self._topic,
                            message.value,
                            key=message.key,
                            headers=list(message.headers) or None,
                            partition=partition_for_key(message.key, self._partitions),
                            timestamp_ms=base_ms + index * self._step_ms,
                        )
                    )
                await asyncio.gather(*futures)
                self.produced = upto
                next_tick += self.TICK_S
                await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        finally:
            await producer.stop()


def step_for(messages: list[Message], idle_timeout_s: float = IDLE_TIMEOUT_S) -> int:
    """Milliseconds of record time per record: the traffic spans three idle timeouts (the
    stalled calls at its start time out well before it ends), and no call that goes on sits
    idle that long, even across three records of its stream that make no chunk (a vendor's
    closing events)."""
    idle_ms = int(idle_timeout_s * 1000)
    step = max(1, -(-3 * idle_ms // len(messages)))
    assert 3 * widest_gap(messages) * step < idle_ms, "the traffic is too sparse for its window"
    return step


def keys_of(expected: Iterable[Expect]) -> set[str]:
    return {e.key for e in expected if e.key is not None}
