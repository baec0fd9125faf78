"""The executor: a consumer group on the validated topic that runs each accepted call once.

Two stages in one consumer group, so that one member owns each execution key:

1. *Route.* A record of the validated topic (an accepted event, keyed by its call id) is
   written to `<group>.requests` keyed by its execution key (`contract.execution_key`), and
   the validated offset committed with it. An accepted MCP tool result (judged in phase
   `tool_output_validation`) is not a call: it is passed over.
   A call of a kind the client does not run (an approved `mcp_approval_request`: its remote MCP
   server runs it) is passed over alike, logged and counted `passed_over`, with no result
   (`contract.not_to_run`).
2. *Execute.* Partition N of the requests topic is owned by one member, which holds the latest
   record of each of its keys, restored from partition N of `<group>.executions` (compacted)
   when it is assigned. For each request, in order, `contract.answer` says what to do, then:

   a. RUN: the `started` record is written (committed, under exactly_once) before the handler
      runs; the handler runs within its deadline (`handlers.run_handler`); then the records
      the handler emitted, the `done` record, the call's result and the request's offset are
      written: under exactly_once in one transaction, else each acknowledged before the next.
   b. REPLAY, CONFLICT, INTERRUPTED, REFUSED (no handler, no contract of the call's schema
      version, a principal the contract does not allow, no approval or one naming other
      arguments, arguments the handler's type refuses: `contract.refusal`): the call's
      records (an `answered` record holding its answer; an interruption's `done`), then its
      result and the offset, written alike.
   c. ALREADY_DONE (a call answered before, delivered again): the answer it got. Under
      exactly_once only the offset (its result was committed with its records); under
      at_least_once too when this member wrote that result itself, else (a member that
      restored the partition cannot know whether it was written) the recorded result again.

Under exactly_once each owned partition (of both topics) writes with a transactional producer
of its own, `<group>-<topic>-<partition>`: a partition's next owner fences its former owner
before it restores, so it reads everything that owner committed and nothing it did not. Under
at_least_once the writes are acknowledged in that order before the offset is committed; a crash
may then write a call's result twice (the same result, never another) or run a handler safe to
retry again; and before a run's records the member asks the group whether the partition is
still its own (`_still_owned`), so that one the group expelled during the handler does not
record a run its successor answered already.

A partition being revoked (a rebalance, a stop) finishes the call in its handler and stops
before the next. Any failure to write or commit stops the executor (`run` raises
`BrokerError`): what was not committed is done again by the partition's next owner, under the
rules above. Nothing a call's own code or content does is such a failure: whatever its handler,
its argument or output model raise is the call's result (`handlers`), and what it returns or
emits is bounded and checked before it is written (`contract.ran`); so is the result callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from callgate_executor import contract
from callgate_executor.contract import Emitted, Execution, Step, encode_result
from callgate_executor.handlers import (
    Call,
    Handler,
    Handlers,
    HandlerSpec,
    executor_cancelling,
    interrupts,
    note_interrupts,
    raise_if_interrupted,
    run_handler,
    typed_arguments,
)
from worker.compose import build_registry, tool_labels
from worker.errors import BrokerError, ConfigError, StateError
from worker.metrics import Metrics
from worker.published.model import Accepted, ResultError, ToolResult, parse_event
from worker.runtime.kafka import READ_COMMITTED, Kafka, Listener
from worker.runtime.kafka_options import consumer_options, producer_options
from worker.runtime.provision import largest_record_batch
from worker.runtime.topics import TopicSpec
from worker.schemas.contract import Contract
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings

log = logging.getLogger("callgate.executor")

F = TypeVar("F", bound=Handler)

#: the outcome (`stats` member, `callgate_executor_calls_total` label) of each answer but a run
_STATS = {
    Step.REPLAY: "replayed",
    Step.CONFLICT: "conflict",
    Step.REFUSED: "refused",
    Step.INTERRUPTED: "interrupted",
    Step.ALREADY_DONE: "redelivered",
}


def executor_settings(settings: Settings) -> Settings:
    """The settings as the executor's clients read them: its own group id, and its own
    transactional ids (`<executor group>-<topic>-<partition>`)."""
    group = settings.executor.group_id
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"group_id": group}),
            "delivery": settings.delivery.model_copy(update={"transactional_id_prefix": group}),
        }
    )


@dataclass(slots=True)
class _Partition:
    """An owned partition: its producer (exactly_once), the task working on its last fetch,
    and (requests partitions) the latest record of each of its keys."""

    tp: TopicPartition
    producer: AIOKafkaProducer | None
    state: dict[str, Execution] = field(default_factory=dict)
    #: the calls whose result this member wrote (acknowledged) since it was assigned
    delivered: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    revoked: bool = False


class Executor:
    """Runs the registered handlers on the accepted calls of the validated topic (see the
    module docstring). `start`, `run` until `request_stop`, `close`; or `async with`."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: SchemaRegistry | None = None,
        on_result: Callable[[ToolResult], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = executor_settings(settings)
        self._exactly_once = settings.delivery.guarantee == "exactly_once"
        self._kafka = Kafka(self.settings)
        self._registry = registry if registry is not None else build_registry(settings)
        self._handlers = Handlers()
        #: `callgate_executor_calls_total{tool, outcome}` (and the process series) in
        #: `metrics.registry`, for the executor's process to serve
        self.metrics = metrics if metrics is not None else Metrics(tool_labels(self._registry))
        self._on_result = on_result
        ex = settings.executor
        self.validated = settings.topics.accepted
        self.requests, self.executions, self.results = ex.requests, ex.executions, ex.results
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._owned: dict[TopicPartition, _Partition] = {}
        self._stop = asyncio.Event()
        self._failure: BaseException | None = None
        #: puts SIGINT's handler back as `run` found it (`handlers.note_interrupts`)
        self._restore_interrupts: Callable[[], None] | None = None
        #: what came of the calls so far: `executed` (a handler ran to an outcome), `replayed`,
        #: `conflict`, `refused`, `interrupted`, `redelivered` (ALREADY_DONE), `routed`, and
        #: the statuses of the runs (`succeeded`, `failed`, `timed_out`)
        self.stats: Counter[str] = Counter()

    # -- registration ----------------------------------------------------------------------

    def tool(
        self,
        name: str,
        *,
        arguments: type[BaseModel],
        version: str | None = None,
        retry_safe: bool,
        timeout_s: float | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated async function as the handler of tool `name` (bare name or
        schema id) at schema `version` (None: any version without a handler of its own). A call
        is given the handler of its event's schema id and version, the contract its approval
        and its output are judged by, whichever name either was registered by.
        `retry_safe`: whether running it again after an executor died during a run is safe
        (it deduplicates by the idempotency key, or has no effect outside Kafka)."""

        def register(handler: F) -> F:
            self.register(
                name,
                handler,
                arguments=arguments,
                version=version,
                retry_safe=retry_safe,
                timeout_s=timeout_s,
            )
            return handler

        return register

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        arguments: type[BaseModel],
        version: str | None = None,
        retry_safe: bool,
        timeout_s: float | None = None,
    ) -> None:
        schema_id = self._registry.schema_id(name)
        if schema_id is None:
            raise ConfigError(f"no contract is registered for tool {name!r}")
        timeout = self.settings.executor.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ConfigError(f"the timeout of {name!r}'s handler must be positive")
        spec = HandlerSpec(name, schema_id, version, handler, arguments, retry_safe, timeout)
        self._handlers.add(spec)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Make the internal topics (or check them), then join the group."""
        if not len(self._handlers):
            raise ConfigError("an executor needs at least one handler")
        ex = self.settings.executor
        largest = largest_record_batch(self.settings)
        await self._kafka.ensure_topics(
            [
                TopicSpec(self.requests, ex.partitions, False, max_message_bytes=largest),
                TopicSpec(self.executions, ex.partitions, True, max_message_bytes=largest),
                TopicSpec(self.results, ex.partitions, False, max_message_bytes=largest),
            ]
        )
        counts = await self._kafka.partition_counts([self.requests, self.executions])
        if counts.get(self.requests) != counts.get(self.executions):
            raise ConfigError(
                f"{self.requests} and {self.executions} must have as many partitions "
                f"(they have {counts.get(self.requests)} and {counts.get(self.executions)})"
            )
        await self._kafka.start()  # the connection `_topics_exist` asks on
        if not self._exactly_once:
            self._producer = AIOKafkaProducer(**producer_options(self.settings))
            await self._producer.start()
        options = consumer_options(self.settings)
        options["auto_offset_reset"] = "earliest"
        if self._exactly_once:
            options["isolation_level"] = READ_COMMITTED
        self._consumer = AIOKafkaConsumer(**options)
        await self._consumer.start()
        self._consumer.subscribe(
            [self.validated, self.requests], listener=Listener(self._revoked, self._assigned)
        )

    def request_stop(self) -> None:
        self._stop.set()

    async def serve(self) -> None:
        """`start`, `run` until SIGTERM or SIGINT, `close`: an executor process's main. A
        signal while it closes (a second Ctrl-C) asks for the stop again, and nothing more:
        the handlers still running are given their grace, as by the first."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop)
        try:
            await self.start()
            await self.run()
        finally:
            try:
                await self.close()
            finally:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)

    async def run(self) -> None:
        """Fetch and work until `request_stop`; raises `BrokerError` when a write or a commit
        failed (what was not committed is done again by the partition's next owner)."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        if self._restore_interrupts is None:  # until `close` has let the handlers go
            self._restore_interrupts = note_interrupts()
        timeout_ms = self.settings.kafka.fetch_timeout_ms
        while not self._stop.is_set():
            try:
                batches = await consumer.getmany(timeout_ms=timeout_ms)
            except KafkaError as exc:
                raise BrokerError(f"the executor cannot fetch: {exc!r}") from exc
            for tp, records in batches.items():
                owned = self._owned.get(tp)
                if not records:
                    continue
                if owned is None or owned.revoked:
                    # fetched before the partition was opened (the group's callback opens it
                    # while the fetcher runs), or after it was let go: read again, if still
                    # this member's, once it is open
                    if tp in consumer.assignment():
                        consumer.seek(tp, records[0].offset)
                    continue
                consumer.pause(tp)
                owned.task = asyncio.create_task(self._work(owned, records))
        if self._failure is not None:
            raise BrokerError(f"the executor stopped: {self._failure!r}") from self._failure

    async def close(self) -> None:
        """Finish the calls in their handlers (within `shutdown_grace_s`; then they are
        cancelled, and one that ignores it is left behind after another grace), then leave."""
        await self._release(list(self._owned))
        if self._consumer is not None:
            with contextlib.suppress(KafkaError):
                await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            with contextlib.suppress(KafkaError):
                await self._producer.stop()
            self._producer = None
        with contextlib.suppress(KafkaError):
            await self._kafka.close()
        restore, self._restore_interrupts = self._restore_interrupts, None
        if restore is not None:
            restore()

    # -- the group -------------------------------------------------------------------------

    async def _assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp in self._owned:
                continue
            producer = None
            if self._exactly_once:
                # opening the partition's producer fences its former owner (and completes
                # that owner's open transaction) before the restore reads what it committed
                producer = self._kafka.transactional_producer(tp.topic, tp.partition)
                await producer.start()
            owned = _Partition(tp, producer)
            if tp.topic == self.requests:
                owned.state = await self._restore(tp.partition)
            self._owned[tp] = owned
        log.info("executor assigned %s", sorted(f"{t.topic}-{t.partition}" for t in assigned))

    async def _revoked(self, revoked: list[TopicPartition]) -> None:
        await self._release(revoked)
        log.info("executor revoked %s", sorted(f"{t.topic}-{t.partition}" for t in revoked))

    async def _release(self, partitions: Iterable[TopicPartition]) -> None:
        released = [self._owned.pop(tp) for tp in list(partitions) if tp in self._owned]
        for owned in released:
            owned.revoked = True
        tasks = [owned.task for owned in released if owned.task is not None]
        grace = self.settings.shutdown_grace_s
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                _, stuck = await asyncio.wait(late, timeout=grace)
                for owned in released:
                    if owned.task in stuck:
                        # a handler that ignores its cancellation is left behind: it can no
                        # longer hold the group's rebalance or the executor's stop, and nothing
                        # it does is recorded (`run_handler`)
                        log.error(
                            "executor: a handler on %s-%d ignores its cancellation; left behind",
                            owned.tp.topic,
                            owned.tp.partition,
                        )
        for owned in released:
            if owned.producer is not None:
                with contextlib.suppress(KafkaError):
                    await owned.producer.stop()

    async def _restore(self, partition: int) -> dict[str, Execution]:
        """The latest record of each key of a partition of the executions topic."""
        read = await self._kafka.read_to_end([(self.executions, partition)])
        state: dict[str, Execution] = {}
        for record in read[(self.executions, partition)]:
            key = record.key.decode() if record.key is not None else ""
            if record.value is None:
                state.pop(key, None)
                continue
            try:
                state[key] = Execution.decode(record.value)
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(
                    f"{self.executions}-{partition} offset {record.offset} is not an "
                    f"execution record: {exc}"
                ) from None
        return state

    # -- the work --------------------------------------------------------------------------

    async def _work(self, owned: _Partition, records: Sequence[Any]) -> None:
        since = interrupts()
        try:
            if owned.tp.topic == self.validated:
                await self._route(owned, records)
            else:
                for record in records:
                    if owned.revoked:
                        return
                    await self._execute(owned, record)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and executor_cancelling():
                raise
            # SIGINT: the process stops (asyncio stops its loop on it), nothing recorded
            raise_if_interrupted(since)
            # a bug or the broker: stopped, never a partition left paused in silence
            log.error("executor: %s-%d failed", owned.tp.topic, owned.tp.partition, exc_info=exc)
            self._failure = exc
            self._stop.set()
            return
        if not owned.revoked and self._consumer is not None:
            self._consumer.resume(owned.tp)

    async def _route(self, owned: _Partition, records: Sequence[Any]) -> None:
        """Stage 1: each accepted call to the requests topic, keyed by its execution key."""
        routed: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
        for record in records:
            event = self._call(record)
            if event is not None:
                key = contract.execution_key(event).encode()
                routed.append((key, record.value, list(record.headers or ())))
        sends = [(self.requests, None, key, value, headers) for key, value, headers in routed]
        await self._write(owned, [sends], records[-1].offset + 1)
        self.stats["routed"] += len(routed)

    async def _execute(self, owned: _Partition, record: Any) -> None:
        """Stage 2 for one request (the module docstring's steps)."""
        offset = record.offset + 1
        event = self._call(record)
        if event is None:
            await self._write(owned, [], offset)
            return
        spec, typed, refusal = self._judged(event)
        retry_safe = spec is not None and spec.retry_safe
        answer = contract.answer(event, owned.state, refusal=refusal, retry_safe=retry_safe)
        if answer.step is Step.RUN:
            assert answer.begun is not None
            assert spec is not None
            assert isinstance(typed, BaseModel)
            await self._write(owned, [[self._record_of(owned, answer.begun)]], None)
            owned.state[answer.begun.key] = answer.begun
            await self._run(owned, spec, event, typed, begun=answer.begun, offset=offset)
            return
        result = answer.to_write(
            exactly_once=self._exactly_once, delivered=event.event_id in owned.delivered
        )
        if result is None:
            await self._write(owned, [], offset)
        else:
            await self._finish(owned, event, result, offset, records=answer.records)
        self._count(event, _STATS[answer.step])

    def _judged(
        self, event: Accepted
    ) -> tuple[HandlerSpec | None, BaseModel | ResultError | None, ResultError | None]:
        """The handler of a call (None: none), its arguments as the handler's type reads them
        (or why they cannot be), and why the call may not run (`contract.refusal`, held to the
        executor's own contract of the call's schema id and version: None when it may)."""
        spec = self._handlers.find(event)
        typed = typed_arguments(spec, event) if spec is not None else None
        found = self._contract(event)
        refusal = contract.refusal(
            event,
            handled=spec is not None,
            contracted=found is not None,
            contract_requires_approval=found is not None and found.meta.requires_approval,
            allowed_principals=found.meta.allowed_principals if found is not None else None,
            argument_error=typed if isinstance(typed, ResultError) else None,
        )
        return spec, typed, refusal

    async def _run(
        self,
        owned: _Partition,
        spec: HandlerSpec,
        event: Accepted,
        arguments: BaseModel,
        *,
        begun: Execution,
        offset: int,
    ) -> None:
        call: Call[Any] = Call(
            arguments=arguments,
            event=event,
            idempotency_key=event.idempotency_key,
            execution_key=begun.key,
            traceparent=event.traceparent,
            deadline=time.time() + spec.timeout_s,
            attempt=begun.attempts,
        )
        contract_ = self._contract(event)
        output_check = contract_.output_check if contract_ is not None else None
        outcome = await run_handler(spec, call, output_check, self.settings.limits.max_depth)
        await self._still_owned(owned, offset - 1)
        answer = contract.ran(
            event,
            begun,
            outcome,
            max_bytes=self.settings.limits.max_event_bytes,
            max_id_bytes=self.settings.limits.max_id_bytes,
            emitted=call.emitted,
            own_topics=(self.validated, self.requests, self.executions, self.results),
        )
        assert answer.result is not None
        await self._finish(
            owned, event, answer.result, offset, records=answer.records, emitted=answer.emitted
        )
        self.stats["executed"] += 1
        self._count(event, outcome.status.value)

    async def _still_owned(self, owned: _Partition, position: int) -> None:
        """Under at_least_once, before a run is recorded: whether the group still counts this
        member as the partition's owner, asked by committing the request's own offset (no step
        forward). A member the group expelled while the handler ran (its event loop blocked past
        the session) is refused, and stops (`BrokerError`) without writing: the partition's next
        owner answers the call from its `started` record, and nothing can fence a member that
        writes without transactions. Under exactly_once the next owner's producer fenced it."""
        if owned.producer is not None:
            return
        consumer = self._consumer
        assert consumer is not None
        try:
            await consumer.commit({owned.tp: position})
        except KafkaError as exc:
            raise BrokerError(
                f"{owned.tp.topic}-{owned.tp.partition}: no longer this member's, a run not "
                f"recorded: {exc!r}"
            ) from exc

    def _call(self, record: Any) -> Accepted | None:
        """The call a record holds, to answer; None (logged) for a record that holds none
        (`_accepted`) or an accepted event that is no call to run (`contract.not_to_run`: an MCP
        tool result, a call of a kind the client does not run), which is counted `passed_over`
        and gets no result."""
        event = _accepted(record)
        if event is None:
            return None
        why = contract.not_to_run(event)
        if why is None:
            return event
        log.info(
            "executor: %s-%d offset %d is %s; passed over, with no result",
            record.topic,
            record.partition,
            record.offset,
            why,
        )
        self._count(event, "passed_over")
        return None

    def _count(self, event: Accepted, outcome: str) -> None:
        self.stats[outcome] += 1
        self.metrics.executor_call(event.tool, outcome)

    def _contract(self, event: Accepted) -> Contract | None:
        found = self._registry.resolve(event.schema_ref.id, event.schema_ref.version)
        return found if isinstance(found, Contract) else None

    async def _finish(
        self,
        owned: _Partition,
        event: Accepted,
        result: ToolResult,
        offset: int,
        *,
        records: Sequence[Execution],
        emitted: Sequence[Emitted] = (),
    ) -> None:
        """The call's emitted records, then its records (`done`, `answered`), then its result,
        then its offset: each acknowledged before the next under at_least_once (a record is
        never behind its result), all in one transaction under exactly_once."""
        value = encode_result(result)
        headers = [("status", result.status.value.encode()), ("tool", (event.tool or "").encode())]
        stages: list[list[_Send]] = [
            [(e.topic, None, e.key, e.value, []) for e in emitted],
            [self._record_of(owned, execution) for execution in records],
            [(self.results, None, event.call_id.encode(), value, headers)],
        ]
        await self._write(owned, stages, offset)
        for execution in records:
            owned.state[execution.key] = execution
        if not self._exactly_once:
            owned.delivered.add(event.event_id)
        if self._on_result is not None:
            since = interrupts()
            try:
                self._on_result(result)
            except BaseException as exc:  # the application's callback: never the executor's stop
                raise_if_interrupted(since)
                log.error("executor: on_result failed on call %s", event.call_id, exc_info=exc)

    def _record_of(self, owned: _Partition, execution: Execution) -> _Send:
        return (self.executions, owned.tp.partition, execution.key.encode(), execution.encode(), [])

    async def _write(
        self, owned: _Partition, stages: Sequence[Sequence[_Send]], offset: int | None
    ) -> None:
        """`stages` of sends, then the partition's next offset (None: none): under
        exactly_once in one transaction of the partition's producer, else each stage
        acknowledged before the next, then the offset committed."""
        tp = owned.tp
        try:
            await self._topics_exist(owned.producer or self._producer, stages)
            if owned.producer is not None:
                async with owned.producer.transaction():
                    for stage in stages:
                        for topic, partition, key, value, headers in stage:
                            await owned.producer.send(
                                topic, value, key=key, partition=partition, headers=headers
                            )
                    if offset is not None:
                        await owned.producer.send_offsets_to_transaction(
                            {tp: offset}, self.settings.kafka.group_id
                        )
                return
            producer, consumer = self._producer, self._consumer
            assert producer is not None
            assert consumer is not None
            for stage in stages:
                acks = [
                    await producer.send(topic, value, key=key, partition=partition, headers=headers)
                    for topic, partition, key, value, headers in stage
                ]
                await asyncio.gather(*acks)
            if offset is not None:
                await consumer.commit({tp: offset})
        except KafkaError as exc:
            raise BrokerError(f"{tp.topic}-{tp.partition}: write failed: {exc!r}") from exc

    async def _topics_exist(self, producer: Any, stages: Sequence[Sequence[_Send]]) -> None:
        """Raise `BrokerError` naming the topics of `stages` the cluster does not have, before
        anything is written. Asked (by name, a request that never creates a topic) only of
        those the producer knows no partitions of: its own wait for a topic's metadata may
        make the topic (a broker that creates topics on demand) or never end (tansu)."""
        cluster = producer.client.cluster
        unknown = {
            topic
            for stage in stages
            for topic, *_ in stage
            if not cluster.partitions_for_topic(topic)
        }
        missing = await self._kafka.missing_topics(unknown) if unknown else []
        if missing:
            named = (
                f"topic {missing[0]} does not exist"
                if len(missing) == 1
                else (f"topics {', '.join(missing)} do not exist")
            )
            raise BrokerError(
                f"{named}: nothing of the call was written; create it, then start the executor "
                f"again (it makes its own topics, {self.results} among them, when it starts)"
            )


_Send = tuple[str, int | None, bytes | None, bytes, list[tuple[str, bytes]]]


def _accepted(record: Any) -> Accepted | None:
    """The accepted event a record holds; None (logged) for anything else."""
    try:
        event = parse_event(record.value or b"")
    except ValidationError:
        log.warning(
            "executor: %s-%d offset %d is not an outcome event; skipped",
            record.topic,
            record.partition,
            record.offset,
        )
        return None
    if not isinstance(event, Accepted):
        log.warning(
            "executor: %s-%d offset %d is a %s event, not an accepted one; skipped",
            record.topic,
            record.partition,
            record.offset,
            event.outcome,
        )
        return None
    why = contract.unreadable(event)
    if why is not None:
        log.warning(
            "executor: %s-%d offset %d is an accepted event whose request cannot be read (%s); "
            "skipped",
            record.topic,
            record.partition,
            record.offset,
            why,
        )
        return None
    return event
