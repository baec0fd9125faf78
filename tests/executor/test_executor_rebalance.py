"""Two executors in one group, a rebalance while handlers run, on tansu (at_least_once) and
Apache Kafka (exactly_once).

The first executor runs alone, in two handlers that block on their first attempt (a payment,
safe to retry, and a lookup, not safe to retry, on two partitions of the requests topic), with
payments and lookups before and after them, every record of the validated topic written twice
(a duplicate, as a gate re-judging after its own crash writes it). A second executor then
joins the group: the rebalance revokes the first's partitions, its handlers are cancelled past
the grace, and each key's next owner (either executor) restores it. More calls come during and
after the rebalance, with equal repeats and conflicting requests of payments already paid.

Then: every payment ran once but the blocked one (twice: attempt 1 cancelled, attempt 2
recorded), the blocked lookup ran once and is `interrupted`, every call has one result (under
at_least_once possibly written again, always the same), each repeat got its payment's recorded
result and each conflict ran nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

from callgate_executor import Call, Executor
from tests.support.executor import Judge, ResultTail, blocked_lookup, broker_settings, produce
from tests.support.outcomes import read_records
from tests.support.shop_executor import Lookup, Pay
from worker.published.model import Accepted, parse_event
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 3
WAIT_S = 90.0
PAYMENTS = 12


class Handlers:
    """Shared by both executors: what ran, per key and attempt."""

    def __init__(self) -> None:
        self.attempts: dict[str, list[int]] = {}
        self.payment_ids: dict[str, int] = {}
        self.lookups: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.blocked = asyncio.Event()
        self.entered: set[str] = set()

    async def pay(self, call: Call[Pay]) -> dict[str, Any]:
        key = call.arguments.idempotency_key
        self.attempts.setdefault(key, []).append(call.attempt)
        if call.arguments.recipient == "block" and call.attempt == 1:
            await self._block(key)
        payment_id = self.payment_ids.setdefault(key, len(self.payment_ids) + 1)
        return {"payment_id": payment_id, "status": "paid"}

    async def lookup(self, call: Call[Lookup]) -> dict[str, Any]:
        sku = call.arguments.sku
        self.lookups[sku] += 1
        if sku == "block":
            await self._block(sku)
        return {"sku": sku, "stock": len(sku)}

    async def _block(self, what: str) -> None:
        self.entered.add(what)
        if len(self.entered) == 2:
            self.blocked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled[what] += 1
            raise

    def executor(self, settings: Settings) -> Executor:
        executor = Executor(settings)
        executor.tool("pay", arguments=Pay, retry_safe=True)(self.pay)
        executor.tool("lookup", arguments=Lookup, retry_safe=False, timeout_s=600)(self.lookup)
        return executor


@pytest.fixture(params=["tansu", "apache"])
def target(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """A session broker's bootstrap servers, and whether it runs exactly_once."""
    if request.param == "tansu":
        return str(request.getfixturevalue("kafka_broker").bootstrap_servers), False
    return str(request.getfixturevalue("apache_kafka").bootstrap_servers), True


def _call_id(event: bytes) -> str:
    parsed = parse_event(event)
    assert isinstance(parsed, Accepted)
    return parsed.call_id


@pytest.mark.asyncio
async def test_a_rebalance_during_handlers_keeps_the_execute_contract(
    target: tuple[str, bool],
) -> None:
    bootstrap, exactly_once = target
    run = uuid.uuid4().hex[:8]
    settings = broker_settings(bootstrap, run, exactly_once=exactly_once, partitions=PARTITIONS)
    validated = settings.topics.accepted
    await Kafka(settings).ensure_topics([TopicSpec(validated, PARTITIONS, compacted=False)])
    judge = Judge()

    def pay(n: int, *, amount: int = 100, recipient: str = "acme", tag: str = "") -> bytes:
        return judge.pay(f"{run}-k{n}", amount, call_id=f"{run}-pay{n}{tag}", recipient=recipient)

    blocked_pay = judge.pay(f"{run}-kb", 7, call_id=f"{run}-pay-block", recipient="block")
    lookup = blocked_lookup(judge, blocked_pay, f"{run}-lookup", PARTITIONS)
    before = [pay(n) for n in range(PAYMENTS // 2)]
    during = [pay(n) for n in range(PAYMENTS // 2, PAYMENTS)]
    during += [judge.accepted("lookup", {"sku": f"s{n}"}, call_id=f"{run}-l{n}") for n in range(4)]
    repeats = [pay(n, tag="-again") for n in range(PAYMENTS)]
    conflicts = [pay(n, amount=999, tag="-conflict") for n in range(0, PAYMENTS, 3)]

    def twice(events: list[bytes]) -> list[tuple[str, bytes]]:
        return [(_call_id(e), e) for e in events for _ in range(2)]

    handlers = Handlers()
    tail = ResultTail(bootstrap, settings.executor.results, read_committed=exactly_once)
    first, second = handlers.executor(settings), handlers.executor(settings)
    await first.start()
    tasks = [asyncio.create_task(first.run())]
    started = [first]
    try:
        await tail.start(PARTITIONS)
        await produce(bootstrap, validated, twice([*before, blocked_pay, lookup]))
        await asyncio.wait_for(handlers.blocked.wait(), WAIT_S)
        # the second joins while both handlers block: the group rebalances
        await second.start()
        started.append(second)
        tasks.append(asyncio.create_task(second.run()))
        await produce(bootstrap, validated, twice(during))
        await tail.wait_for(
            [_call_id(e) for e in [*before, *during, blocked_pay, lookup]],
            timeout_s=WAIT_S,
            alive=lambda: not any(t.done() for t in tasks),
        )
        await produce(bootstrap, validated, twice([*repeats, *conflicts]))
        await tail.wait_for(
            [_call_id(e) for e in [*repeats, *conflicts]],
            timeout_s=WAIT_S,
            alive=lambda: not any(t.done() for t in tasks),
        )
    finally:
        for executor in started:
            executor.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
        for executor in started:
            await executor.close()
    await tail.drain(timeout_s=WAIT_S)
    await tail.stop()
    for task in tasks:
        assert task.exception() is None

    assert second.stats["routed"] + second.stats["executed"] > 0, "the second took no part"
    results = await read_records(
        bootstrap, {settings.executor.results: PARTITIONS}, read_committed=exactly_once
    )
    by_call: dict[str, list[bytes]] = {}
    for record in results:
        by_call.setdefault(record.key.decode(), []).append(record.value)
    for call_id, values in by_call.items():
        assert len(set(values)) == 1, f"{call_id} got different results: {values}"
        if exactly_once:
            assert len(values) == 1, call_id

    for n in range(PAYMENTS):
        assert handlers.attempts[f"{run}-k{n}"] == [1], n
        paid = tail.by_call[f"{run}-pay{n}"][0]
        assert (paid["status"], paid["replayed"]) == ("succeeded", False)
        again = tail.by_call[f"{run}-pay{n}-again"][0]
        assert (again["status"], again["replayed"]) == ("succeeded", True)
        assert (again["output"], again["executed_event_id"]) == (
            paid["output"],
            paid["event_id"],
        )
    for n in range(0, PAYMENTS, 3):
        conflict = tail.by_call[f"{run}-pay{n}-conflict"][0]
        assert (conflict["status"], conflict["executed_event_id"]) == ("conflict", None)
    assert handlers.attempts[f"{run}-kb"] == [1, 2]
    retried = tail.by_call[f"{run}-pay-block"][0]
    assert (retried["status"], retried["attempts"]) == ("succeeded", 2)
    interrupted = tail.by_call[_call_id(lookup)][0]
    assert (interrupted["status"], interrupted["error"]["type"]) == ("interrupted", "interrupted")
    assert handlers.lookups["block"] == 1
    assert all(handlers.lookups[f"s{n}"] == 1 for n in range(4))
    assert handlers.cancelled == {f"{run}-kb": 1, "block": 1}
