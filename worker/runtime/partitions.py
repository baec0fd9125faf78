"""The partitions this worker owns (`Assignment`), and their state (`State`): the state topics,
the restore, the checkpoints.

A partition assigned is opened for writing (`Delivery.open`: under exactly_once, its producer),
then paused until its state is restored, then fetched from where that state ends. A partition
revoked has what is in flight for it finished (bounded) and its state dropped; one the delivery
can no longer write for is restored again from its committed state, or, fenced, given up until
the group assigns it again. Every partition is restored again when a topic written to is found
deleted, and a state topic found deleted stops the worker (`act_on`).

Every input topic has a compacted changelog with a partition for each of the input's
(`worker.runtime.topics`); the idempotency requests have the compacted key store
`<group>-idempotency-keys`, the pending-approval topic the compacted approvals store
`<group>-approvals`. Named inputs get their changelog at start; those an input pattern
matches, when first assigned, and again when a partition beyond their changelog's is (the input
grew). Each state topic is watched from then on (`worker.runtime.topic_watch`: a state topic
deleted stops the worker).

`restore` reads the state of partitions assigned: an input partition's checkpoint (the chain of
frames its owners wrote, `worker.runtime.checkpoints`) goes back into the processor, and the
partition resumes right after the offset it reflects; an idempotency or pending-approval
partition's store is rebuilt from its changelog, and resumes at its committed offset. A state
that cannot be read stops the worker rather than have it judge without it. `checkpoint` writes
the next frame of an input partition's state, under the writer id its owner drew when it
restored it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka.errors import KafkaError

from worker.core.processor import Processor
from worker.errors import BrokerError, ConfigError, InfrastructureError, StateError
from worker.metrics import Metrics
from worker.runtime.approvals import ApprovalOwners
from worker.runtime.checkpoints import ChangelogRecord, Writer, new_writer_id, restore
from worker.runtime.delivery import Delivery, Lost, Partition
from worker.runtime.fetcher import Batch, Fetcher
from worker.runtime.kafka import Kafka
from worker.runtime.keys import KeyOwners
from worker.runtime.topic_watch import Found, TopicWatch
from worker.runtime.topics import TopicSpec, changelog_topic, state_topics_deleted

log = logging.getLogger("callgate.worker")


class State:
    """The state of the partitions this worker owns, restored and checkpointed."""

    def __init__(
        self,
        kafka: Kafka,
        processor: Processor,
        owners: KeyOwners,
        topics: TopicWatch,
        metrics: Metrics,
        *,
        approvals: ApprovalOwners,
        group: str,
        requests_topic: str,
        keys_topic: str,
        pending_topic: str,
        approvals_topic: str,
        stores: Sequence[TopicSpec],
        checkpoint_record_bytes: int,
        changelog_max_bytes: int,
    ) -> None:
        self._kafka = kafka
        self._processor = processor
        self._owners = owners
        self._approvals = approvals
        self._pending = pending_topic
        self._approvals_topic = approvals_topic
        #: the topics whose partitions have a store (not a checkpoint), and its changelog
        self._stored = {requests_topic: keys_topic, pending_topic: approvals_topic}
        self._topics = topics
        self._metrics = metrics
        self._group = group
        self._requests = requests_topic
        self._keys = keys_topic
        #: the idempotency and approval topics as they are made when missing
        self._stores = stores
        #: the `max.message.bytes` a changelog is made with: a checkpoint part's batch
        self._changelog_max_bytes = changelog_max_bytes
        self._record_bytes = checkpoint_record_bytes
        #: input topic -> how many partitions its changelog was made sure to have
        self._changelog_partitions: dict[str, int] = {}
        #: each owned input partition's checkpoint writer
        self._writers: dict[Partition, Writer] = {}
        # the state topics: the keys', and each input's changelog once made sure of
        topics.watch_state([keys_topic, approvals_topic])

    def changelog(self, topic: str) -> str:
        """The changelog topic of an input topic."""
        return changelog_topic(self._group, topic)

    async def prepare(self, inputs: Iterable[str]) -> None:
        """The idempotency and approval topics, and the changelogs of the inputs named, made
        sure of, in one `ensure_topics` (on a fresh group: one creation and one wait for the
        cluster to list them, not one after the other)."""
        await self._ensure_changelogs(dict.fromkeys(inputs, 0), with_topics=self._stores)

    async def _ensure_changelogs(
        self, inputs: Mapping[str, int], *, with_topics: Sequence[TopicSpec] = ()
    ) -> None:
        """Each input topic's changelog exists, compacted, with a partition for each of the
        input's; it is watched from then on. `inputs`: input topic -> the partitions it has at
        least (those its assignment shows: the cluster's answer may lag the assignment).
        `with_topics` are made sure of in the same request. Raises `ConfigError` for a topic
        that cannot serve, `BrokerError` or `KafkaError` from the broker."""
        listed = await self._kafka.partition_counts(inputs)
        counts: dict[str, int] = {}
        for name, at_least in inputs.items():
            count = max(listed.get(name, 0), at_least)
            if count:  # a named input not made yet gets its changelog when first assigned
                counts[name] = count
        specs = [
            TopicSpec(
                self.changelog(name),
                count,
                compacted=True,
                grows=True,
                max_message_bytes=self._changelog_max_bytes,
            )
            for name, count in counts.items()
        ]
        await self._kafka.ensure_topics([*with_topics, *specs])
        self._changelog_partitions.update(counts)
        self._topics.watch_state(spec.name for spec in specs)

    async def restore(self, assigned: list[Partition]) -> dict[Partition, int | None]:
        """Each partition's state restored; where each resumes: right after its checkpoint,
        or None (its committed offset, else its start). Raises `StateError` for a state that
        cannot be read or kept, `BrokerError` when the broker fails."""
        unprepared: dict[str, int] = {}  # input topic -> partitions its assignment shows
        for topic, partition in assigned:
            made = self._changelog_partitions.get(topic, 0)
            if topic not in self._stored and partition >= made:
                unprepared[topic] = max(unprepared.get(topic, 0), partition + 1)
        state_of = {
            where: self._stored.get(where[0]) or self.changelog(where[0]) for where in assigned
        }
        try:
            if unprepared:
                await self._ensure_changelogs(unprepared)
            logs = await self._kafka.read_to_end(
                [(topic, partition) for (_, partition), topic in state_of.items()]
            )
            resume: dict[Partition, int | None] = {}
            for where in assigned:
                records = logs.get((state_of[where], where[1]), [])
                if where[0] == self._requests:
                    self._owners.restore(where[1], records)
                    resume[where] = None
                elif where[0] == self._pending:
                    self._approvals.restore(where[1], records)
                    resume[where] = None
                else:
                    resume[where] = self._restore_input(where, records)
        except (BrokerError, StateError):
            raise
        except ConfigError as exc:  # a changelog that cannot serve the input assigned
            raise StateError(str(exc)) from exc
        except KafkaError as exc:
            raise BrokerError(
                f"cannot read the state of {len(assigned)} partitions: {exc!r}"
            ) from exc
        except Exception as exc:  # a state it cannot read stops the worker
            # raised into the consumer's rebalance listener, this would be logged and the
            # partitions left paused for good: stop instead, and say why
            named = ", ".join(f"{topic}[{partition}]" for topic, partition in assigned)
            raise StateError(
                f"cannot restore the checkpointed state of {named}: {exc}; the worker "
                "stops rather than judge their calls without it"
            ) from exc
        self._metrics.set_idempotency_keys(len(self._owners))
        self._metrics.set_pending_approvals(len(self._approvals))
        return resume

    def _restore_input(self, where: Partition, records: list[Any]) -> int | None:
        """An input partition's state from its changelog; the offset it reflects, if any."""
        restored = restore(
            ((r.key, r.value, list(r.headers or ())) for r in records),
            self._record_bytes,
            new_writer_id(),
        )
        self._writers[where] = restored.writer
        self._processor.drop(*where)
        if not restored.frames:
            return None
        self._processor.restore(where[0], where[1], restored.frames)
        log.info(
            "%s[%d]: restored from %d checkpoint frames; fetching from %d",
            *where,
            len(restored.frames),
            restored.offset,
        )
        return restored.offset

    def checkpoint(self, where: Partition) -> tuple[list[ChangelogRecord], int]:
        """The records of the input partition's next frame (its state as fed so far), and the
        offset it reflects: the partition's next to read."""
        writer = self._writers.get(where)
        if writer is None:
            writer = self._writers[where] = Writer(self._record_bytes, new_writer_id())
        full = writer.wants_full()
        body = self._processor.checkpoint(*where, full=full)
        offset = self._processor.next_offset(*where)
        assert offset is not None, "checkpoint after feeding"
        return writer.frame(body, full=full, offset=offset), offset

    def is_input(self, where: Partition) -> bool:
        """Whether the partition is an input's (else the idempotency requests' or the
        pending-approval topic's)."""
        return where[0] not in self._stored

    def tombstones(self, where: Partition) -> list[ChangelogRecord]:
        """Once the partition's newest full frame is acknowledged: the older keys to delete."""
        writer = self._writers.get(where)
        return [] if writer is None else writer.tombstones()

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Drop the partitions' state (revoked, fenced, or about to be restored again)."""
        for topic, partition in partitions:
            if topic == self._requests:
                self._owners.drop(partition)
            elif topic == self._pending:
                self._approvals.drop(partition)
            else:
                self._processor.drop(topic, partition)
                self._writers.pop((topic, partition), None)
            self._metrics.forget_partition(topic, partition)
        self._metrics.set_idempotency_keys(len(self._owners))
        self._metrics.set_pending_approvals(len(self._approvals))


class Assignment:
    """The partitions this worker judges: assigned, opened, restored, and fetched."""

    def __init__(
        self,
        state: State,
        fetcher: Fetcher,
        delivery: Delivery,
        metrics: Metrics,
        stop_fatally: Callable[[InfrastructureError], None],
    ) -> None:
        self._state = state
        self._fetcher = fetcher
        self._delivery = delivery
        self._metrics = metrics
        self._stop_fatally = stop_fatally
        #: the partitions restored and judged
        self.owned: set[Partition] = set()
        #: whether a partition was ever restored (the worker has joined its group)
        self.joined = False
        #: fetching is paused for every partition (`throttle`)
        self.throttled = False
        #: the worker is closing: nothing is restored any more
        self.closed = False

    async def open(self, partitions: list[Partition]) -> None:
        """Open the partitions for writing (exactly_once: their transactions), then restore
        them. A failure stops the worker."""
        if self.closed or not partitions:
            return
        log.info("given %d partitions by the group; opening and restoring them", len(partitions))
        self._fetcher.pause(partitions)
        try:
            await self._delivery.open(partitions)
        except BrokerError as exc:
            self._stop_fatally(exc)
            return
        await self.restore(partitions)

    async def restore(self, partitions: list[Partition]) -> None:
        """Restore each partition's state, and fetch it from where that state ends. Nothing
        is fetched from a partition before its state is back (it stays paused until then). A
        state that cannot be read stops the worker."""
        if self.closed or not partitions:
            return
        self._fetcher.pause(partitions)
        try:
            await self._fetcher.place(await self._state.restore(partitions))
        except InfrastructureError as exc:
            self._stop_fatally(exc)
            return
        if self.closed:
            return
        self.owned |= set(partitions)
        self.joined = True
        self._metrics.set_assigned_partitions(len(self.owned))
        if not self.throttled:
            self._fetcher.resume(partitions)
        log.info("assigned %d partitions", len(partitions))

    async def release(self, partitions: list[Partition]) -> None:
        """The group takes the partitions away: what is in flight for them is finished
        (bounded), then they are forgotten."""
        await self._delivery.release(partitions)
        self.forget(partitions)
        log.info("revoked %d partitions", len(partitions))

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Drop the partitions' state and whatever is queued or owed for them."""
        gone = set(partitions)
        self._fetcher.drop(gone)
        self._state.forget(gone)
        self._delivery.forget(gone)
        self.owned -= gone

    async def rewind(self, partitions: Iterable[Partition] | None = None) -> None:
        """Drop what was judged of the partitions (all by default) and not committed, and
        restore their state as committed; fetch from there."""
        again = list(self.owned if partitions is None else partitions)
        if self.closed or not again:
            return
        self.forget(again)
        self._fetcher.pause(again)
        try:
            await self._delivery.rewind(again)
        except BrokerError as exc:
            self._stop_fatally(exc)
            return
        await self.restore(again)

    def judgeable(self, batch: Batch) -> Batch:
        """What of a fetched batch is still this worker's to judge: a partition revoked,
        rewound or no longer writable since the batch was fetched is elsewhere now."""
        return {
            tp: records
            for tp, records in self._fetcher.current(batch).items()
            if (tp.topic, tp.partition) in self.owned
            and self._delivery.writable((tp.topic, tp.partition))
        }

    async def act_on(self, found: Found | None) -> None:
        """Act on a finished check of the written topics (`worker.runtime.topic_watch`). A
        broker may acknowledge writes to a deleted topic and drop them: when one is found gone,
        the outputs since the last checkpoint may be too, so every partition is rewound to its
        checkpoint, once (the calls are judged and sent again once the topic is back), and
        nothing is judged until it is. A deleted state topic (a changelog, the idempotency
        keys) took the state with it: the worker stops."""
        if found is None:
            return
        if found.state_gone:
            self._stop_fatally(state_topics_deleted(found.state_gone))
        elif found.newly_missing:
            await self.rewind()

    async def recover(self, lost: Lost) -> None:
        """Partitions the delivery can no longer write for: fenced ones are given up (paused,
        forgotten), the others rewound."""
        if lost.fenced:
            self._fetcher.pause(lost.fenced)
            self.forget(lost.fenced)
        if lost.rewind:
            await self.rewind(lost.rewind)

    def throttle(self, on: bool) -> None:
        """Pause fetching every partition (`on`), or resume it."""
        self.throttled = on
        if on:
            self._fetcher.pause(self.owned)
        else:
            self._fetcher.resume(self.owned)
