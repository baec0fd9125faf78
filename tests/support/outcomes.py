"""Reading what the workers wrote, and the one checker of the delivery tests.

- `OutcomeTail` follows the outcome topics from their start while workers run (progress);
- `read_all` reads topics to their end offsets (the final word, after every worker stopped);
- `reference` judges the input as the broker holds it in this process, in one pass, with the
  same settings: what an undisturbed worker writes;
- `check` fails on any loss, any event for an unknown call (a call whose contract requires
  approval comes to its `pending_approval` event, keyed by its event id), any repeated event
  that differs from the first in anything but `metrics.phases_us` (or its topic, partition,
  key, headers),
  any event on the wrong topic or with the wrong headers, any outcome other than expected or
  than the reference's, and any key accepted twice or a duplicate that does not name the
  acceptance. It returns the figures: calls, events, identical replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.support.published import check_event
from tests.support.traffic import Expect
from worker.compose import build_processor, build_registry
from worker.core.approval import PENDING_OUTCOME, pending_event
from worker.core.events import idempotency_rejection, read_idempotency_request
from worker.core.processor import Route
from worker.model import Code
from worker.settings import Settings

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class Seen:
    """One record of an outcome topic, as read."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[Header, ...]
    event: dict[str, Any]


def as_seen(record: Any) -> Seen:
    """An outcome record (as aiokafka reads it, or any record with its fields) as `Seen`, once
    its event holds to the published schema."""
    return Seen(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        tuple(record.headers or ()),
        check_event(record.value),
    )


def _consumer(bootstrap: str, read_committed: bool) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )


async def read_records(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    read_committed: bool = False,
    timeout_s: float = 240.0,
) -> list[Any]:
    """Every record of the topics (name -> partitions) from their start to their end now
    (`timeout_s`: only a hang reaches it)."""
    consumer = _consumer(bootstrap, read_committed)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, count in topics.items() for p in range(count)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        # transaction markers take offsets too: read until every position reaches its end
        todo = [tp for tp in tps if ends[tp] > 0]
        while todo:
            assert time.monotonic() < deadline, (
                f"{topics} not readable to their end within {timeout_s:.0f} s: still reading {todo}"
            )
            for batch in (await consumer.getmany(*todo, timeout_ms=500)).values():
                records.extend(batch)
            todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]
        return records
    finally:
        await consumer.stop()


async def read_all(
    bootstrap: str, topics: Mapping[str, int], *, read_committed: bool = False
) -> list[Seen]:
    return [
        as_seen(r) for r in await read_records(bootstrap, topics, read_committed=read_committed)
    ]


class OutcomeTail:
    """Follows the outcome topics (name -> partitions) from their start, in the background:
    how many events were read, and the calls they name (progress, while workers run).

    tansu (0.6) can hand a reader that follows a partition which several producers append to
    at once a batch written after one it has not stored yet: the reader moves past the
    earlier batch and never sees it, though the log holds it (a read from the start finds it;
    Apache Kafka hands out nothing past the first record not stored). The workers are such
    producers of the outcome topics, so `catch_up` reads the topics again from their start,
    and tells the events the tail had moved past (`skipped`) from those it has not reached."""

    def __init__(self, bootstrap: str, topics: Mapping[str, int], *, read_committed: bool = False):
        self._bootstrap = bootstrap
        self._topics = dict(topics)
        self._read_committed = read_committed
        self._events = 0
        self._read: set[str] = set()  # the calls of the events the tail read
        self._found: set[str] = set()  # those a read from the start found, the tail had not
        self._passed: set[str] = set()  # of those, the ones at offsets the tail had moved past
        self._last_event = time.monotonic()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OutcomeTail:
        consumer = _consumer(self._bootstrap, self._read_committed)
        await consumer.start()
        tps = [TopicPartition(t, p) for t, count in self._topics.items() for p in range(count)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow())
        return self

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            for batch in (await self._consumer.getmany(timeout_ms=100)).values():
                for record in batch:
                    self._events += 1
                    self._read.add(orjson.loads(record.value)["call_id"])
                    self._last_event = time.monotonic()

    async def catch_up(self) -> None:
        """Read the topics again from their start: the calls the tail skipped are seen now."""
        assert self._consumer is not None
        passed = {tp: await self._consumer.position(tp) for tp in self._consumer.assignment()}
        records = await read_records(
            self._bootstrap, self._topics, read_committed=self._read_committed
        )
        for record in records:
            call = orjson.loads(record.value)["call_id"]
            if call not in self._read:
                self._found.add(call)
                if record.offset < passed[TopicPartition(record.topic, record.partition)]:
                    self._passed.add(call)
        self._last_event = time.monotonic()  # the next catch-up waits for another quiet spell

    @property
    def skipped(self) -> set[str]:
        """Calls whose event the tail moved past without reading it (and has not read since)."""
        return self._passed - self._read

    def _reading(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()  # the reader's own failure, if it failed

    @property
    def events(self) -> int:
        self._reading()
        return self._events

    @property
    def calls(self) -> set[str]:
        self._reading()
        return self._read | self._found

    @property
    def quiet_s(self) -> float:
        """Seconds since the tail last read an event."""
        return time.monotonic() - self._last_event

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


async def committed_to_end(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    """Whether the group committed every partition of `topic` to its end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            if (await consumer.committed(tp) or 0) < ends[tp]:
                return False
        return True
    finally:
        await consumer.stop()


# -- the reference ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ref:
    """What an undisturbed worker writes for a call: the route, and the event (for a keyed call
    the accepted event that waits for its key's owner)."""

    route: Route
    event: dict[str, Any]


def reference(settings: Settings, records: Iterable[Any]) -> dict[str, Ref]:
    """The input (records as read from the broker) judged in one pass, partition by partition."""
    processor = build_processor(settings, build_registry(settings))
    by_partition: dict[tuple[str, int], list[Any]] = {}
    for record in records:
        by_partition.setdefault((record.topic, record.partition), []).append(record)
    refs: dict[str, Ref] = {}
    for (topic, partition), fetched in sorted(by_partition.items()):
        fetched.sort(key=lambda r: r.offset)
        for emission in processor.feed(topic, partition, fetched):
            value = emission.value
            if emission.route is Route.IDEMPOTENCY:
                value = read_idempotency_request(value).event
            call_id = emission.call.call_id
            assert call_id not in refs, f"the reference judged {call_id} twice"
            refs[call_id] = Ref(emission.route, orjson.loads(value))
    return refs


# -- the checker ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Figures:
    calls: int = 0
    events: int = 0
    #: events that repeat an earlier one (identical but for the phase timings)
    replays: int = 0
    replayed_calls: int = 0
    keys: int = 0
    duplicates: int = 0
    conflicts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        base = (
            f"calls={self.calls} events={self.events} replays={self.replays} "
            f"replayed_calls={self.replayed_calls}"
        )
        if self.keys:
            base += f" keys={self.keys} duplicates={self.duplicates} conflicts={self.conflicts}"
        return " ".join([base, *(f"{k}={v}" for k, v in self.extra.items())])


def without_timings(event: Mapping[str, Any]) -> dict[str, Any]:
    metrics = {k: v for k, v in event["metrics"].items() if k != "phases_us"}
    return {**event, "metrics": metrics}


def _headers_of(event: Mapping[str, Any]) -> tuple[Header, ...]:
    schema = event.get("schema") or {}
    return (
        ("outcome", event["outcome"].encode()),
        ("tool", (event.get("tool") or "").encode()),
        ("schema-version", str(schema.get("version") or "").encode()),
    )


class _Problems:
    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, text: str) -> None:
        self.found.append(text)

    def raise_any(self) -> None:
        if self.found:
            shown = "\n".join(self.found[:12])
            raise AssertionError(f"{len(self.found)} problems, the first ones:\n{shown}")


def check(
    seen: list[Seen],
    expected: Mapping[str, Expect],
    refs: Mapping[str, Ref],
    topics: Mapping[str, str],
    *,
    max_feedback_bytes: int,
    exactly_once: bool = False,
) -> Figures:
    """Every expected call has exactly one verdict (see the module docstring); `topics` maps
    each outcome to its topic; `max_feedback_bytes` is the workers' setting (a duplicate's
    rejection is derived from the accepted event with it). Under `exactly_once` no event may
    repeat at all."""
    problem = _Problems()
    # the generator and the reference must agree before the workers are judged by them
    if set(refs) != set(expected):
        problem(
            f"the reference judged {len(refs)} calls, {len(expected)} expected: "
            f"missing {sorted(set(expected) - set(refs))[:5]}, "
            f"unknown {sorted(set(refs) - set(expected))[:5]}"
        )
    by_call: dict[str, list[Seen]] = {}
    for record in seen:
        by_call.setdefault(record.event["call_id"], []).append(record)
    unknown = sorted(set(by_call) - set(expected))
    if unknown:
        problem(f"events for {len(unknown)} unknown calls, e.g. {unknown[:5]}")
    lost = sorted(set(expected) - set(by_call))
    if lost:
        problem(f"{len(lost)} calls lost (no event), e.g. {lost[:5]}")
    figures = Figures(calls=len(expected), events=len(seen))
    first_of: dict[str, Seen] = {}
    for call, records in by_call.items():
        if call not in expected:
            continue
        first = records[0]
        first_of[call] = first
        again = records[1:]
        figures.replays += len(again)
        figures.replayed_calls += bool(again)
        if exactly_once and again:
            problem(f"{call}: {len(records)} events under exactly_once")
        first_plain = without_timings(first.event)
        for other in again:
            where = (other.topic, other.partition, other.key, other.headers)
            if where != (first.topic, first.partition, first.key, first.headers):
                problem(f"{call}: a repeated event went elsewhere: {where} != {first}")
            if without_timings(other.event) != first_plain:
                problem(f"{call}: contradictory events:\n  {first.event}\n  {other.event}")
        event = first.event
        outcome = event["outcome"]
        if first.topic != topics.get(outcome):
            problem(f"{call}: {outcome} event on topic {first.topic}")
        # a call waiting for approval is keyed by its event id, as decisions name it
        key = event["event_id"] if outcome == PENDING_OUTCOME else call
        if first.key != key.encode():
            problem(f"{call}: record key {first.key!r}")
        if first.headers != _headers_of(event):
            problem(f"{call}: headers {first.headers} for {event}")
        expect = expected[call]
        if expect.key is None:
            got = (outcome, event.get("error_code") or event.get("reason"))
            if got != (expect.outcome, expect.code):
                problem(f"{call}: {got}, expected {(expect.outcome, expect.code)}: {event}")
            ref = refs.get(call)
            if ref is not None and without_timings(ref.event) != first_plain:
                problem(f"{call}: differs from the reference:\n  {ref.event}\n  {event}")
    _check_keys(
        expected,
        refs,
        first_of,
        figures=figures,
        problem=problem,
        max_feedback_bytes=max_feedback_bytes,
    )
    problem.raise_any()
    return figures


def _check_keys(
    expected: Mapping[str, Expect],
    refs: Mapping[str, Ref],
    first_of: Mapping[str, Seen],
    *,
    figures: Figures,
    problem: _Problems,
    max_feedback_bytes: int,
) -> None:
    """Per idempotency key: exactly one call accepted (as the reference accepted it); every
    other one rejected `duplicate` (an equal request) or `idempotency_conflict`, naming the
    accepted event in `duplicate_of`, and otherwise the accepted event it was judged as."""
    calls_of: dict[str, list[str]] = {}
    for call, expect in expected.items():
        if expect.key is not None:
            calls_of.setdefault(expect.key, []).append(call)
    figures.keys = len(calls_of)
    for key, calls in sorted(calls_of.items()):
        if not all(call in first_of for call in calls):
            continue  # reported as lost
        # the key's accepted call, or its pending event when its contract requires approval
        accepted = [
            c for c in calls if first_of[c].event["outcome"] in ("accepted", PENDING_OUTCOME)
        ]
        if len(accepted) != 1:
            problem(f"key {key}: {len(accepted)} calls accepted: {accepted or calls}")
            continue
        (winner,) = accepted
        winner_event = first_of[winner].event
        ref = refs.get(winner)
        if ref is not None:
            wanted = ref.event
            if winner_event["outcome"] == PENDING_OUTCOME:
                wanted = orjson.loads(pending_event(orjson.dumps(ref.event))[0])
            if without_timings(wanted) != without_timings(winner_event):
                problem(f"{winner}: differs from the reference:\n  {wanted}\n  {winner_event}")
        for call in calls:
            if call == winner:
                continue
            event = first_of[call].event
            equal = expected[call].request == expected[winner].request
            code = "duplicate" if equal else "idempotency_conflict"
            figures.duplicates += equal
            figures.conflicts += not equal
            if (event["outcome"], event.get("error_code")) != ("rejected", code):
                problem(f"{call} (key {key}): expected rejected {code}: {event}")
            if event.get("duplicate_of") != winner_event["event_id"]:
                problem(
                    f"{call} (key {key}): duplicate_of {event.get('duplicate_of')}, the "
                    f"accepted event is {winner_event['event_id']}"
                )
            ref = refs.get(call)
            if ref is not None:
                _, derived = idempotency_rejection(
                    orjson.dumps(ref.event),
                    Code(code),
                    winner_event["event_id"],
                    max_feedback_bytes,
                )
                if without_timings(derived) != without_timings(event):
                    problem(
                        f"{call}: differs from its reference rejection:\n  {derived}\n  {event}"
                    )


def expected_from(refs: Mapping[str, Ref]) -> dict[str, Expect]:
    """What each call must come to, as the reference judged it (for traffic not generated
    here): keyed calls by their key and canonical arguments."""
    expected: dict[str, Expect] = {}
    for call, ref in refs.items():
        event = ref.event
        if ref.route is Route.IDEMPOTENCY:
            request = orjson.dumps(event.get("arguments"), option=orjson.OPT_SORT_KEYS).decode()
            expected[call] = Expect("keyed", key=event["idempotency_key"], request=request)
        else:
            expected[call] = Expect(
                event["outcome"], event.get("error_code") or event.get("reason")
            )
    return expected
