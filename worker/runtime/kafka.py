"""The one wrapper around aiokafka: clients built from the settings, and the few composite
operations the worker needs (make sure topics exist as needed, read a partition to its end).

Everything else in the runtime talks to the clients through this module's types, so fakes of
them test the worker without a broker. No private aiokafka API is used anywhere.

What topics exist, and with how many partitions, is asked of the cluster naming those topics
only (`_describe`), never by listing every topic: the worker checks its topics every
`topic_check_interval_ms`, and a full listing costs its event loop time in proportion to the
cluster's topics (`python -m benchmarks topic_check`: 2.6 ms of CPU a check at 60 topics, 97 ms
at 2,000, where the named request stays under 0.6 ms). The request never creates a topic it
names (tansu, and a broker with `auto.create.topics.enable`, would make a deleted one again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any, TypeVar

from aiokafka import (
    AIOKafkaClient,
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidPartitionsError,
    KafkaError,
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest

from worker.errors import BrokerError, ConfigError
from worker.runtime.kafka_options import connection_options, consumer_options, producer_options
from worker.runtime.topics import (
    TopicLayout,
    TopicSpec,
    state_policy_problem,
    state_topics_deleted,
)
from worker.settings import Settings

log = logging.getLogger("callgate.kafka")

READ_COMMITTED = "read_committed"

T = TypeVar("T")


async def close_within(closing: Awaitable[object], timeout_s: float, what: str) -> None:
    """Await a client's stop for at most `timeout_s` (at least 0.1 s). A failure or a timeout is
    logged (`closing <what>: ...`), never raised: what closes is given up either way."""
    try:
        await asyncio.wait_for(closing, timeout=max(0.1, timeout_s))
    except (TimeoutError, KafkaError) as exc:
        log.warning("closing %s: %r", what, exc)


class Requests:
    """A client's requests, each run to its end as a task of its own that no waiter cancels.

    aiokafka waits for a request's answer under `asyncio.shield` (an offset commit, a
    transaction's offsets, its commit), and Python 3.11's shield drops its own reader of what it
    shields once its caller is cancelled: a request cut off in flight (by a timeout, or by a
    deadline cancelling its caller) and failed afterwards left "Task exception was never
    retrieved" or "Future exception was never retrieved" with its traceback. So the caller waits
    for the task under a shield of its own (`wait`), and a request no longer waited for is read
    when it ends and said in one line: made, refused (a `KafkaError`, with what refused it:
    aiokafka's CommitFailedError is a paragraph of advice, its cause the refusal) or failed (a
    bug, with its traceback). A request pending on a stopped aiokafka client never ends: `close`
    stops the client, then gives the requests what is left of its time and cancels the rest."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        #: what a request is, in the line that says how one no longer waited for ended
        self._what = what
        self._log = logger
        self._running: set[asyncio.Future[Any]] = set()

    async def wait(self, request: Awaitable[T], timeout_s: float) -> T:
        """The request's outcome, within `timeout_s` (else `TimeoutError`); the request goes on
        when the caller stops waiting (its timeout, or its cancellation)."""
        task = asyncio.ensure_future(request)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            # not the request's own outcome (which the caller got): said once it ends
            if not (task.done() and not task.cancelled() and task.exception() is exc):
                task.add_done_callback(self._ended_unwaited)
            raise

    async def close(
        self,
        stopping: Awaitable[object],
        timeout_s: float,
        client: str,
        *,
        after_s: float | None = None,
    ) -> None:
        """Stop the client (`close_within`), then end the requests still running, all within
        `timeout_s`: those not done in what is left of it (at least 0.1 s), or in `after_s`
        when given, are cancelled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await close_within(stopping, timeout_s, client)
        running = set(self._running)
        if running:
            left_s = max(0.1, deadline - loop.time()) if after_s is None else after_s
            _, late = await asyncio.wait(running, timeout=left_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)

    def _ended_unwaited(self, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._log.info("%s no longer waited for was made", self._what)
        elif isinstance(exc, KafkaError):
            cause = exc.__cause__
            refusal = f"{type(exc).__name__} from {cause!r}" if cause is not None else repr(exc)
            self._log.info("%s no longer waited for was refused: %s", self._what, refusal)
        else:
            self._log.error("%s no longer waited for failed", self._what, exc_info=exc)


def transactional_id(settings: Settings, topic: str, partition: int) -> str:
    """exactly_once: the transactional id of an owned partition's producer."""
    prefix = settings.delivery.transactional_id_prefix or settings.kafka.group_id
    return f"{prefix}-{topic}-{partition}"


class Kafka:
    """Builds the worker's clients and runs its admin and restore operations."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._exactly_once = settings.delivery.guarantee == "exactly_once"
        self._connection = connection_options(settings.kafka)
        #: the connection the worker's frequent topic checks share (`start`)
        self._client: AIOKafkaClient | None = None

    async def start(self) -> None:
        """Open the connection the worker's frequent topic checks share."""
        self._client = await self._started_client()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    @contextlib.asynccontextmanager
    async def _metadata_client(self) -> AsyncIterator[AIOKafkaClient]:
        """The shared connection once `start` opened it; before, one for this request."""
        if self._client is not None:
            yield self._client
            return
        client = await self._started_client()
        try:
            yield client
        finally:
            await client.close()

    async def _started_client(self) -> AIOKafkaClient:
        client = AIOKafkaClient(
            **self._connection, request_timeout_ms=self._settings.kafka.request_timeout_ms
        )
        try:
            await client.bootstrap()
        except BaseException:
            await client.close()
            raise
        return client

    def consumer(self) -> AIOKafkaConsumer:
        """The group consumer: manual commits, read_committed under exactly_once."""
        options = consumer_options(self._settings)
        if self._exactly_once:
            options["isolation_level"] = READ_COMMITTED
        return AIOKafkaConsumer(**options)

    def producer(self) -> AIOKafkaProducer:
        """The at_least_once producer of every output."""
        return AIOKafkaProducer(**producer_options(self._settings))

    def transactional_producer(self, topic: str, partition: int) -> AIOKafkaProducer:
        """exactly_once: the producer of one owned partition's outputs, whose transactional id
        is the partition's (`worker.runtime.transactions` says why)."""
        delivery = self._settings.delivery
        options = producer_options(self._settings)
        options.update(
            enable_idempotence=True,
            transactional_id=transactional_id(self._settings, topic, partition),
            transaction_timeout_ms=delivery.transaction_timeout_ms,
        )
        return AIOKafkaProducer(**options)

    @contextlib.asynccontextmanager
    async def admin(self) -> AsyncIterator[AIOKafkaAdminClient]:
        client = AIOKafkaAdminClient(
            **self._connection, request_timeout_ms=self._settings.kafka.request_timeout_ms
        )
        await client.start()
        try:
            yield client
        finally:
            await client.close()

    async def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """How many partitions each existing topic has (missing topics are left out, and one
        whose partitions have no leader yet, just made)."""
        return {
            topic: layout.partitions
            for topic, layout in (await self.describe(topics)).items()
            if layout.partitions
        }

    async def missing_topics(self, topics: Iterable[str]) -> list[str]:
        """The topics the cluster does not have."""
        wanted = set(topics)
        return sorted(wanted - set(await self.describe(wanted)))

    async def describe(self, topics: Iterable[str]) -> dict[str, TopicLayout]:
        """Each of the topics the cluster has, with its partitions and replicas (none while
        its partitions have no leader yet); a topic the cluster does not have is left out.
        Raises the error the cluster gives for a topic otherwise (not authorized, an invalid
        name): a topic that cannot be seen is not taken for a deleted one."""
        wanted = sorted(set(topics))
        if not wanted:
            return {}
        request = MetadataRequest(wanted, allow_auto_topic_creation=False)
        async with self._metadata_client() as client:
            response = await client.send(client.get_random_node(), request)
        described: dict[str, TopicLayout] = {}
        for entry in response.to_object()["topics"]:
            code, topic = entry["error_code"], entry["topic"]
            if code == UnknownTopicOrPartitionError.errno:
                continue
            if code == TopicAuthorizationFailedError.errno:  # its args: the topic alone
                raise TopicAuthorizationFailedError(topic)
            if code not in (0, LeaderNotAvailableError.errno):
                raise for_code(code)(f"topic {topic}")
            partitions = entry["partitions"] if code == 0 else []
            replicas = min((len(p["replicas"]) for p in partitions), default=0)
            described[topic] = TopicLayout(len(partitions), replicas)
        return described

    async def topic_configs(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """Each topic's configuration as the cluster applies it (its own and the defaults)."""
        if not names:
            return {}
        async with self.admin() as admin:
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
            )
        configs: dict[str, dict[str, str]] = {}
        for response in responses:
            for code, message, _type, name, entries in response.resources:
                if code:
                    raise for_code(code)(f"topic {name}: {message}")
                configs[name] = {entry[0]: str(entry[1]) for entry in entries}
        return configs

    async def ensure_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create the internal topics that are missing; check those that exist, and add
        partitions to one that `grows` and has too few.

        Raises `ConfigError` when an existing topic cannot serve (too few partitions, not
        compacted where it must be): using it would lose state.
        """
        counts = await self.partition_counts(spec.name for spec in specs)
        missing = [spec for spec in specs if spec.name not in counts]
        if missing:
            async with self.admin() as admin:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [
                            NewTopic(
                                spec.name,
                                num_partitions=spec.partitions,
                                replication_factor=self._settings.topics.replication_factor,
                                topic_configs=spec.configs(),
                            )
                            for spec in missing
                        ]
                    )
            for spec in missing:
                log.info("created topic %s (%d partitions)", spec.name, spec.partitions)
            await self._until_listed({spec.name: spec.partitions for spec in missing})
        short = [s for s in specs if s.name in counts and counts[s.name] < s.partitions]
        grown = [spec for spec in short if spec.grows]
        if grown:
            async with self.admin() as admin:
                # another worker may have grown it first: the count is checked again below
                with contextlib.suppress(InvalidPartitionsError):
                    await admin.create_partitions(
                        {spec.name: NewPartitions(spec.partitions) for spec in grown}
                    )
            for spec in grown:
                log.info(
                    "added partitions to topic %s: %d -> %d",
                    spec.name,
                    counts[spec.name],
                    spec.partitions,
                )
            await self._until_listed({spec.name: spec.partitions for spec in grown})
            counts.update(await self.partition_counts(spec.name for spec in grown))
        for spec in specs:
            have = counts.get(spec.name)
            if have is not None and have < spec.partitions:
                raise ConfigError(
                    f"topic {spec.name} has {have} partitions; it needs {spec.partitions} "
                    "(one per input partition): add partitions or delete it"
                )
        await self._check_compacted([s.name for s in specs if s.compacted and s.name in counts])

    async def _until_listed(self, wanted: dict[str, int]) -> None:
        """Until the cluster lists each topic with at least its partitions. A broker's view of
        a topic just made (or grown) lags its controller's, and what reads or checks the topic
        next (the state reader, the topic check) must not find it missing."""
        timeout_s = self._settings.kafka.request_timeout_ms / 1000
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            counts = await self.partition_counts(wanted)
            short = sorted(name for name, count in wanted.items() if counts.get(name, 0) < count)
            if not short:
                return
            if asyncio.get_running_loop().time() >= deadline:
                raise BrokerError(
                    f"topics made are not listed as made within {timeout_s:.0f} s: "
                    f"{', '.join(short)}"
                )
            await asyncio.sleep(0.05)

    async def _check_compacted(self, names: list[str]) -> None:
        try:
            configs = await self.topic_configs(names)
        except KafkaError as exc:  # a broker without DescribeConfigs: nothing to check with
            log.warning("cannot read the cleanup.policy of %s: %r", ", ".join(names), exc)
            return
        for name, config in configs.items():
            problem = state_policy_problem(config)
            if problem:
                raise ConfigError(f"topic {name} {problem}")

    async def read_to_end(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], list[Any]]:
        """Every record of each partition of the group's state topics, from its start to its
        end as of now (the later of the cluster's answer and the first fetch's: see
        `_fetched_end`), in order (one reader for them all). Raises `StateError` when a topic
        is gone (the state it held with it), `BrokerError` when the broker fails."""
        if not partitions:
            return {}
        options: dict[str, Any] = {
            **self._connection,
            "request_timeout_ms": self._settings.kafka.request_timeout_ms,
            "enable_auto_commit": False,
            "group_id": None,
            "auto_offset_reset": "earliest",
            "max_poll_records": 10_000,
        }
        if self._exactly_once:
            options["isolation_level"] = READ_COMMITTED
        tps = [TopicPartition(topic, partition) for topic, partition in partitions]
        read: dict[tuple[str, int], list[Any]] = {key: [] for key in partitions}
        reader: AIOKafkaConsumer | None = None
        try:
            reader = AIOKafkaConsumer(**options)
            await reader.start()
            reader.assign(tps)
            ends = await reader.end_offsets(tps)
            todo = [tp for tp in tps if ends[tp] > 0]
            if todo:
                await reader.seek_to_beginning(*todo)
            fetched: set[TopicPartition] = set()
            while todo:
                batch = await reader.getmany(*todo, timeout_ms=1000)
                for tp, records in batch.items():
                    read[(tp.topic, tp.partition)].extend(records)
                for tp in todo:
                    if tp not in fetched:
                        end = _fetched_end(reader, tp, self._exactly_once)
                        if end is not None:
                            fetched.add(tp)
                            ends[tp] = max(ends[tp], end)
                todo = [tp for tp in todo if await reader.position(tp) < ends[tp]]
            return read
        except KafkaError as exc:
            # a topic gone is waited for until the request timeout, then named here
            with contextlib.suppress(KafkaError):
                missing = await self.missing_topics(topic for topic, _ in partitions)
                if missing:
                    raise state_topics_deleted(missing) from exc
            raise BrokerError(f"cannot read the state topics: {exc!r}") from exc
        finally:
            if reader is not None:
                await reader.stop()


def _fetched_end(reader: AIOKafkaConsumer, tp: TopicPartition, committed: bool) -> int | None:
    """The end of the partition's log as its first fetch answered it (None: not answered
    yet): the high-water mark, or under read_committed the last stable offset. A broker's
    ListOffsets answer may fall short of it (tansu 0.6 names the offset after the first record
    of the last batch): a reader stopping there, once a fetch gave it part of that batch (its
    `max_poll_records`), would lose the rest."""
    end = reader.last_stable_offset(tp) if committed else reader.highwater(tp)
    return end if isinstance(end, int) and end >= 0 else None


class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Hands the consumer's rebalance callbacks to the worker."""

    def __init__(self, revoked: Any, assigned: Any) -> None:
        self._revoked = revoked
        self._assigned = assigned

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._assigned(list(assigned))


__all__ = ["Kafka", "Listener", "TopicPartition"]
