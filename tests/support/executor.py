"""What the executor tests share: their contracts, and accepted events made by the real gate.

`CONTRACTS` (tests/data/executor) holds `shop.pay` (keyed, side effects, an output schema),
`shop.lookup` (no key: executions keyed by event id) and `shop.wire` (requires approval).
`Judge` runs calls through the gate (`worker.compose.build_processor`, the processor
`callgate run` uses) as canonical envelopes and returns the accepted event each comes to, as
its key's owner would receive it: the executor is tested on the gate's own events, equal
repeats and conflicts included (the gate's key owner would reject those; an executor must
hold the contract without it).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from callgate_executor import contract
from tests.datafiles import DATA
from tests.support import published
from tests.support.traffic import envelopes
from worker.check import FileRecord
from worker.compose import build_processor, build_registry
from worker.core.approval import Decided, Decision, approved_event, pending_event
from worker.core.events import read_idempotency_request
from worker.core.processor import Route
from worker.published import Document
from worker.published.model import Accepted, parse_event
from worker.settings import Settings

CONTRACTS = DATA / "executor"
INPUT = "model-output"


def contract_settings(**sections: Any) -> Settings:
    """Settings with the executor tests' contracts (and any other sections given)."""
    return Settings.model_validate({"schemas": {"dir": str(CONTRACTS)}, **sections})


def broker_settings(
    bootstrap: str, run: str, *, exactly_once: bool, partitions: int, **kafka: Any
) -> Settings:
    """The settings of an executor test on a broker: its run's own validated, results and
    group names, the guarantee, a 6 s session and a 0.5 s grace (and any other kafka settings
    given)."""
    return contract_settings(
        kafka={"bootstrap_servers": bootstrap, "session_timeout_ms": 6000, **kafka},
        topics={"accepted": f"validated-{run}"},
        delivery={"guarantee": "exactly_once" if exactly_once else "at_least_once"},
        executor={
            "group_id": f"executor-{run}",
            "results": f"results-{run}",
            "partitions": partitions,
        },
        shutdown_grace_s=0.5,
    )


class Judge:
    """The gate in this process, turning calls into their accepted events."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or contract_settings()
        self._processor = build_processor(settings, build_registry(settings))
        self._offsets = itertools.count()

    def judged(
        self,
        tool: str,
        arguments: str,
        *,
        call_id: str,
        stream: str | None = None,
        version: str | None = "1",
        principal: str | None = None,
    ) -> tuple[Route, bytes]:
        """Where the gate sends one call (its arguments' text as the model streamed it, for
        `principal`), and its event (a keyed call's as its key's owner receives it)."""
        stream = stream or f"stream-{call_id}"
        messages = envelopes(stream, call_id, tool, arguments, version=version, principal=principal)
        records = [
            FileRecord(INPUT, 0, next(self._offsets), None, m.key, m.value, m.headers)
            for m in messages
        ]
        emissions = self._processor.feed(INPUT, 0, records)
        assert len(emissions) == 1, f"{call_id} was judged before (a call id is judged once)"
        emission = emissions[0]
        if emission.route is Route.IDEMPOTENCY:
            return Route.ACCEPTED, read_idempotency_request(emission.value).event
        return emission.route, emission.value

    def accepted(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        stream: str | None = None,
        version: str | None = "1",
        principal: str | None = None,
    ) -> bytes:
        """The accepted event of one call (AssertionError if the gate does not accept it)."""
        text = orjson.dumps(arguments).decode()
        route, value = self.judged(
            tool, text, call_id=call_id, stream=stream, version=version, principal=principal
        )
        assert route is Route.ACCEPTED, orjson.loads(value)
        return value

    def approved(
        self, tool: str, arguments: dict[str, Any], *, call_id: str, fingerprint: str | None = None
    ) -> bytes:
        """The accepted event of a call whose contract requires approval, as the gate releases
        it once approved (held with the gate's fingerprint, then approved:
        `worker.core.approval`); `fingerprint`: the one its approval states instead (forged)."""
        pending, _ = pending_event(self.accepted(tool, arguments, call_id=call_id))
        decided = Decided(Decision.APPROVE, offset=0, at_ms=1, by="ops")
        event = orjson.loads(approved_event(pending, decided))
        if fingerprint is not None:
            event["approval"]["fingerprint"] = fingerprint
        return orjson.dumps(event)

    def pay(
        self,
        key: str,
        amount: int,
        *,
        call_id: str,
        recipient: str = "acme",
        principal: str | None = None,
    ) -> bytes:
        arguments = {
            "amount_minor": amount,
            "currency": "EUR",
            "recipient": recipient,
            "idempotency_key": key,
        }
        return self.accepted("pay", arguments, call_id=call_id, principal=principal)


async def produce(bootstrap: str, topic: str, events: Iterable[tuple[str, bytes]]) -> None:
    """Each (call id, accepted event) to `topic`, keyed by its call id as the gate keys it,
    each acknowledged before the next."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for call_id, event in events:
            await producer.send_and_wait(topic, event, key=call_id.encode())
    finally:
        await producer.stop()


def blocked_lookup(judge: Judge, other: bytes, call_id: str, partitions: int) -> bytes:
    """The accepted event of a `lookup` of sku `block` whose execution key is on another
    partition of the requests topic than the accepted event `other`'s (so both run at once)."""
    partitioner = DefaultPartitioner()
    everything = list(range(partitions))
    accepted = parse_event(other)
    assert isinstance(accepted, Accepted)
    taken = partitioner(contract.execution_key(accepted).encode(), everything, everything)
    for attempt in range(100):
        event = judge.accepted("lookup", {"sku": "block"}, call_id=f"{call_id}-{attempt}")
        accepted = parse_event(event)
        assert isinstance(accepted, Accepted)
        key = contract.execution_key(accepted).encode()
        if partitioner(key, everything, everything) != taken:
            return event
    raise AssertionError("no call id in 100 lands on another partition")


class ResultTail:
    """Follows the tool-results topic from its start: every result, held to the published
    schema (strict), by call id (read_committed under exactly_once)."""

    def __init__(self, bootstrap: str, topic: str, *, read_committed: bool) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        self._topic = topic
        self.by_call: dict[str, list[dict[str, Any]]] = {}
        self.count = 0

    async def start(self, partitions: int) -> ResultTail:
        """Assigned to the topic's `partitions`, each from its start."""
        await self._consumer.start()
        tps = [TopicPartition(self._topic, p) for p in range(partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        return self

    async def poll(self) -> None:
        for records in (await self._consumer.getmany(timeout_ms=100)).values():
            for record in records:
                result = published.check(Document.TOOL_RESULT, record.value)
                assert record.key == result["call_id"].encode()
                self.by_call.setdefault(result["call_id"], []).append(result)
                self.count += 1

    async def wait_until(
        self,
        done: Callable[[], bool],
        what: str,
        *,
        timeout_s: float,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """Poll until `done()` (AssertionError at the deadline, or once `alive()` is false)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            assert alive(), f"the executor died while waiting for {what}"
            assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
            await self.poll()

    async def wait_for(
        self, calls: Iterable[str], *, timeout_s: float, alive: Callable[[], bool] = lambda: True
    ) -> None:
        """Until each of `calls` has a result."""
        wanted = set(calls)
        await self.wait_until(
            lambda: wanted <= self.by_call.keys(),
            f"result for {len(wanted - self.by_call.keys())} calls",
            timeout_s=timeout_s,
            alive=alive,
        )

    async def drain(self, *, timeout_s: float) -> None:
        """Until every result written so far is read (committed ones, under read_committed)."""
        tps = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [tp for tp, end in ends.items() if await self._consumer.position(tp) < end]
            if not behind:
                return
            assert time.monotonic() < deadline, f"the results not read within {timeout_s} s"
            await self.poll()

    def only(self, call_id: str) -> dict[str, Any]:
        """The one result of a call (AssertionError when it has none or several)."""
        results = self.by_call.get(call_id, [])
        assert len(results) == 1, (call_id, results)
        return results[0]

    async def stop(self) -> None:
        await self._consumer.stop()
