"""The runner end to end against the real embedded broker, in-process.

Chunks produced with aiokafka and with confluent-kafka (librdkafka, a real third-party client;
Debian's kcat fails against tansu with "Read underflow"), outcome topics read back, every call's
outcome checked; a failing output topic pauses fetching and commits nothing past it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from tests.runtime.kafka_helpers import (
    SCHEMAS,
    Record,
    committed,
    create,
    end_of_stream,
    envelope_call,
    interleave,
    produce,
    read_outcomes,
    unique,
)
from worker.core.processor import Processor
from worker.metrics import Metrics
from worker.runtime.runner import Runner
from worker.settings import Settings, load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

WEATHER = '{"city": "Hangzhou", "unit": "celsius"}'


def _settings(bootstrap: str, group: str, topics: dict[str, str], **kafka: Any) -> Settings:
    return load_settings(
        kafka={
            "bootstrap_servers": [bootstrap],
            "group_id": group,
            "session_timeout_ms": 2000,
            "fetch_max_records": 50,
            **kafka,
        },
        topics=topics,
        schemas={"dir": str(SCHEMAS)},
        plugins=[],
        metrics={"enabled": False},
        shutdown_grace_s=5,
    )


async def _run_until(runner: Runner, done: Any, timeout_s: float) -> None:
    await runner.start()
    task = asyncio.create_task(runner.run())
    try:
        deadline = time.monotonic() + timeout_s
        while not await done() and time.monotonic() < deadline:
            await asyncio.sleep(0)  # done() itself waits on the broker
    finally:
        runner.request_stop()
        await task
        await runner.close()


def _scenarios(run: str) -> tuple[list[Record], dict[str, tuple[str, str | None]]]:
    """Records of every kind of call, and each call's expected (outcome, code or reason)."""
    s = lambda name: f"{run}:{name}"  # noqa: E731
    c = lambda name: f"{run}:{name}"  # noqa: E731
    streams = [
        [*envelope_call(s("ok"), c("ok"), "get_weather", WEATHER), end_of_stream(s("ok"))],
        [
            *interleave(
                [
                    envelope_call(
                        s("par"), c("par1"), "get_weather", '{"city": "Lisbon"}', parts=4
                    ),
                    envelope_call(s("par"), c("par2"), "get_weather", '{"city": "Porto"}', parts=5),
                ]
            ),
            end_of_stream(s("par")),
        ],
        [
            *envelope_call(s("cut"), c("cut"), "get_weather", '{"city": "Ber', final=False),
            end_of_stream(s("cut"), "length"),
        ],
        [
            *envelope_call(
                s("ref"), c("ref"), "", "I can't help with that.", kind="refusal", parts=1
            ),
            end_of_stream(s("ref"), "stop"),
        ],
        [
            *envelope_call(s("bad"), c("bad"), "get_weather", '{"unit": "kelvin"}'),
            end_of_stream(s("bad")),
        ],
        [
            *envelope_call(s("fence"), c("fence"), "get_weather", f"```json\n{WEATHER}\n```"),
            end_of_stream(s("fence")),
        ],
        [
            *envelope_call(s("dup"), c("dup"), "get_weather", '{"city": "Rome", "city": "Milan"}'),
            end_of_stream(s("dup")),
        ],
        [
            *envelope_call(s("who"), c("who"), "launch_rocket", '{"target": "moon"}'),
            end_of_stream(s("who")),
        ],
        [
            *envelope_call(
                s("pay"),
                c("pay1"),
                "create_payment",
                '{"amount": 5, "currency": "EUR", "recipient": "a"}',
                idempotency_key=f"{run}:k",
            ),
            *envelope_call(
                s("pay"),
                c("pay2"),
                "create_payment",
                '{"amount": 6, "currency": "EUR", "recipient": "a"}',
                idempotency_key=f"{run}:k",
            ),
            end_of_stream(s("pay")),
        ],
    ]
    chat = f"{run}:chat"
    chat_events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": c("chat"),
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":'},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    streams.append(
        [
            (
                chat.encode(),
                orjson.dumps({"id": chat, "object": "chat.completion.chunk", **ev}),
                [("content-format", b"openai.chat")],
            )
            for ev in chat_events
        ]
    )
    expected: dict[str, tuple[str, str | None]] = {
        c("ok"): ("accepted", None),
        c("par1"): ("accepted", None),
        c("par2"): ("accepted", None),
        c("cut"): ("incomplete", "max_tokens"),
        c("ref"): ("rejected", "refusal"),
        c("bad"): ("rejected", "schema_violation"),
        c("fence"): ("accepted", None),
        c("dup"): ("rejected", "duplicate_key"),
        c("who"): ("rejected", "unknown_tool"),
        c("pay1"): ("accepted", None),
        c("pay2"): ("rejected", "idempotency_conflict"),
        c("chat"): ("accepted", None),
    }
    return interleave(streams), expected


def _confluent_produce(bootstrap: str, topic: str, records: list[Record]) -> list[tuple[int, int]]:
    """Produce with librdkafka; (partition, offset) of each delivered record."""
    errors: list[str] = []
    delivered: list[tuple[int, int]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err:
            errors.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset()))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": False, "acks": "all"}
    )
    for key, value, headers in records:
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers or None,
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0, "confluent-kafka did not deliver every record in time"
    assert errors == []
    return delivered


@pytest.mark.asyncio
async def test_every_call_gets_its_outcome_on_its_topic(bootstrap: str) -> None:
    run = unique("e2e")
    topics = {
        "input": f"{run}.in",
        "accepted": f"{run}.ok",
        "rejected": f"{run}.rejected",
        "incomplete": f"{run}.incomplete",
    }
    await create(
        bootstrap,
        {topics["input"]: 3, topics["accepted"]: 2, topics["rejected"]: 1, topics["incomplete"]: 1},
    )
    records, expected = _scenarios(run)
    positions = await produce(bootstrap, topics["input"], records)
    # the third-party client: a valid call, a violation, and a poison record
    third = f"{run}:rdkafka"
    third_records = [
        *envelope_call(third, f"{run}:rd-ok", "get_weather", WEATHER, parts=2),
        *envelope_call(third, f"{run}:rd-bad", "get_weather", '{"city": 7}', parts=2),
        end_of_stream(third),
    ]
    positions += await asyncio.to_thread(
        _confluent_produce, bootstrap, topics["input"], third_records
    )
    expected[f"{run}:rd-ok"] = ("accepted", None)
    expected[f"{run}:rd-bad"] = ("rejected", "schema_violation")
    poison_at = await produce(bootstrap, topics["input"], [(b"p", b"\x00 not json", [])])
    poison_id = f"record:{topics['input']}:{poison_at[0][0]}:{poison_at[0][1]}"
    expected[poison_id] = ("rejected", "malformed_record")

    group = unique("g")
    settings = _settings(bootstrap, group, topics)
    processor = Processor.from_settings(settings)
    metrics = Metrics(processor.tool_names)
    runner = Runner(settings, processor, metrics)
    outputs = [topics["accepted"], topics["rejected"], topics["incomplete"]]

    async def all_judged() -> bool:
        await asyncio.sleep(0.1)
        return runner.stats.acknowledged >= len(expected) and runner.ledger.pending == 0

    await _run_until(runner, all_judged, timeout_s=45)
    outcomes = await read_outcomes(bootstrap, outputs, until_calls=expected, timeout_s=15)

    got = {
        call: (events[0]["outcome"], events[0].get("error_code") or events[0].get("reason"))
        for call, events in outcomes.by_call.items()
    }
    assert got == expected
    for event in outcomes.events:
        assert event["_topic"] == topics[event["outcome"]], event
        assert event["_key"] == event["call_id"].encode()
        # executors filter on headers without parsing the value
        headers = event["_headers"]
        assert headers["outcome"] == event["outcome"].encode()
        assert headers["tool"] == (event.get("tool") or "").encode()
        schema = event.get("schema") or {}
        assert headers["schema-version"] == str(schema.get("version") or "").encode()
        assert len({e["event_id"] for e in outcomes.by_call[event["call_id"]]}) == 1
    fence = outcomes.by_call[f"{run}:fence"][0]
    assert fence["repairs"] == [{"kind": "markdown_fence"}]
    assert fence["arguments"] == orjson.loads(WEATHER)
    assert outcomes.by_call[f"{run}:ok"][0]["schema"] == {
        "id": "weather.get_weather",
        "version": "1",
    }

    # every input record is covered: the committed offsets are the partitions' ends
    ends: dict[int, int] = {}
    for partition, offset in [*positions, *poison_at]:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    commits = await committed(bootstrap, group, topics["input"], 3)
    assert {p: commits[p] for p in ends} == ends
    assert runner.stats.produce_errors == 0


@pytest.mark.asyncio
async def test_a_failing_output_topic_pauses_and_commits_nothing_past_it(bootstrap: str) -> None:
    run = unique("fail")
    topics = {
        "input": f"{run}.in",
        "accepted": "not a valid topic!",
        "rejected": f"{run}.out",
        "incomplete": f"{run}.out",
    }
    await create(bootstrap, {topics["input"]: 1, f"{run}.out": 1})
    stream = f"{run}:s"
    records = [
        *envelope_call(
            stream, f"{run}:good", "get_weather", WEATHER
        ),  # -> accepted: cannot be sent
        *envelope_call(stream, f"{run}:bad", "get_weather", '{"unit": 1}'),  # -> rejected: sent
        end_of_stream(stream),
    ]
    await produce(bootstrap, topics["input"], records)
    group = unique("g")
    settings = _settings(bootstrap, group, topics, request_timeout_ms=1000)
    runner = Runner(settings, Processor.from_settings(settings))

    async def stalled() -> bool:
        await asyncio.sleep(0.1)
        return runner.stats.produce_errors >= 2 and runner.stats.pauses >= 1

    ready_while_failing: list[tuple[bool, str]] = []

    async def observe() -> bool:
        done = await stalled()
        if done:
            ready_while_failing.append(runner.readiness())
        return done

    await _run_until(runner, observe, timeout_s=30)
    assert runner.stats.pauses >= 1
    assert ready_while_failing
    assert ready_while_failing[0][0] is False
    assert "producer failing" in ready_while_failing[0][1]
    assert runner.ledger.pending >= 1
    # the rejected event did go out, but the input stays uncommitted behind the accepted one
    outcomes = await read_outcomes(
        bootstrap, [f"{run}.out"], until_calls=[f"{run}:bad"], timeout_s=10
    )
    assert f"{run}:bad" in outcomes.by_call
    assert (await committed(bootstrap, group, topics["input"], 1))[0] is None

    # a worker with a working output topic replays from the start and judges both calls
    fixed = {**topics, "accepted": f"{run}.out"}
    settings = _settings(bootstrap, group, fixed)
    runner = Runner(settings, Processor.from_settings(settings))

    async def caught_up() -> bool:
        await asyncio.sleep(0.1)
        return runner.stats.acknowledged >= 2 and runner.ledger.pending == 0

    await _run_until(runner, caught_up, timeout_s=30)
    outcomes = await read_outcomes(
        bootstrap, [f"{run}.out"], until_calls=[f"{run}:good", f"{run}:bad"], timeout_s=10
    )
    assert outcomes.by_call[f"{run}:good"][0]["outcome"] == "accepted"
    assert {e["event_id"] for e in outcomes.by_call[f"{run}:bad"]} == {
        outcomes.by_call[f"{run}:bad"][0]["event_id"]
    }
    assert (await committed(bootstrap, group, topics["input"], 1))[0] == len(records)
