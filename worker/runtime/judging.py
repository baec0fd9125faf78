"""Judging a round: what a fetched batch makes, as records to write.

Each input partition's records are fed to the processor (`worker.core.processor`); every call
they close becomes one record: its outcome event, or (a call with an idempotency key that passed
every other phase) a request to the owner of its key, or (a call whose contract requires
approval) its pending event. Each idempotency-requests partition's records are decided by its
owner (`worker.runtime.keys`) into outcome events (or pending events) and key-store changes; each
pending-approval partition's records are taken by its owner (`worker.runtime.approvals`): pending
calls held, decisions ruled on into outcome events, refusal records and store changes. The
records go to the delivery (`worker.runtime.delivery`) as they are made, each with its
`Origin`; the metrics are updated from the outcomes here, once per call.

A record a topic refuses for good is replaced by a bounded rejection naming the error
(`substitute`, which keeps the record's `traceparent` header), written to the rejected topic; one
refused there has no place left.

With tracing (`worker.runtime.tracing`), each call is judged inside its spans and its record
carries the gate span's `traceparent`; without it, the rounds run exactly the untraced loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from worker.core.approval import PENDING_OUTCOME, RECORD_HEADER, REFUSAL_RECORD, Ruling
from worker.core.events import TRACEPARENT, Headers, record_headers
from worker.core.processor import Emission, Processor, Route
from worker.metrics import Metrics
from worker.model import Code, Outcome, Phase
from worker.runtime.approvals import ApprovalOwners
from worker.runtime.delivery import Judged, Kind, Origin, Partition, Stats
from worker.runtime.keys import KeyOwners
from worker.runtime.outbox import Record
from worker.settings import Settings

if TYPE_CHECKING:  # imported only when tracing is on (the otel extra)
    from worker.runtime.tracing import CallTracing

log = logging.getLogger("callgate.worker")


class Judge:
    """Turns fetched batches into rounds of records."""

    def __init__(
        self,
        settings: Settings,
        processor: Processor,
        owners: KeyOwners,
        metrics: Metrics,
        stats: Stats,
        *,
        approvals: ApprovalOwners,
        requests_topic: str,
        keys_topic: str,
        tracing: CallTracing | None = None,
        approvals_topic: str,
    ) -> None:
        self._processor = processor
        self._tracing = tracing
        self._owners = owners
        self._approvals = approvals
        self._approvals_topic = approvals_topic
        self._metrics = metrics
        self._stats = stats
        self._requests = requests_topic
        self._keys = keys_topic
        topics = settings.topics
        self._rejected = topics.rejected
        self._topic_of: dict[str, str] = {
            Route.ACCEPTED: topics.accepted,
            Route.REJECTED: topics.rejected,
            Route.INCOMPLETE: topics.incomplete,
            Route.IDEMPOTENCY: requests_topic,
            Route.PENDING_APPROVAL: topics.pending_approval,
        }
        self._pending = topics.pending_approval
        self._dropped = (0, 0, 0)  # the reassembler's dropped-chunk counts already reported
        self._shadow_topic = settings.shadow.topic

    def round(
        self,
        round_id: int,
        batch: Mapping[TopicPartition, list[Any]],
        add: Callable[[Record], None],
    ) -> Judged:
        """The batch judged: each record made handed to `add` as it is made."""
        judged = Judged(round_id)
        for tp, fetched in batch.items():
            if not fetched:
                continue
            where = (tp.topic, tp.partition)
            self._stats.records += len(fetched)
            judged.offsets[where] = fetched[-1].offset + 1
            if tp.topic == self._requests:
                judged.records[where] = self._decide_keys(judged.id, tp.partition, fetched, add)
                continue
            if tp.topic == self._pending:
                judged.records[where] = self._take_approvals(judged.id, tp.partition, fetched, add)
                continue
            judged.records[where] = self._feed(judged.id, where, fetched, add)
        assembler = self._processor.assembler
        self._metrics.set_open_calls(assembler.open_calls)
        self._metrics.set_buffered_bytes(assembler.buffered_bytes)
        dropped = (
            assembler.duplicate_chunks,
            assembler.late_chunks,
            assembler.early_dropped_chunks,
        )
        self._metrics.add_dropped_chunks(
            *(now - was for now, was in zip(dropped, self._dropped, strict=True))
        )
        self._dropped = dropped
        return judged

    def _feed(
        self, round_id: int, where: Partition, fetched: list[Any], add: Callable[[Record], None]
    ) -> int:
        """An input partition's records fed to the processor; its calls closed, as records.
        (The untraced loop is written out, not shared with the traced one: a call pays for
        nothing of tracing while it is off; `benchmarks/tracing.py` counts it.)"""
        if self._tracing is not None:
            return self._feed_traced(self._tracing, round_id, where, fetched, add)
        self._metrics.add_records(len(fetched))
        made = 0
        for emission in self._processor.feed(where[0], where[1], fetched):
            add(
                Record(
                    round_id,
                    self._topic_of[emission.route],
                    emission.key,
                    emission.value,
                    emission.headers,
                    origin=Origin(Kind.OUTPUT, where, emission),
                )
            )
            # a keyed call's phases and repairs count here; its outcome where its key's owner
            # decides
            self._metrics.observe(emission.verdict, emission.call.tool)
            made += 1
            if emission.shadow is not None:
                made += self._shadowed(round_id, where, emission, add)
        self._stats.emitted += made
        return made

    def _feed_traced(
        self,
        tracing: CallTracing,
        round_id: int,
        where: Partition,
        fetched: list[Any],
        add: Callable[[Record], None],
    ) -> int:
        """`_feed` with each call judged inside its spans (`CallTracing.judge`)."""
        self._metrics.add_records(len(fetched))
        fed_ns = time.time_ns()
        processor = self._processor

        def deliver(emission: Emission, headers: Headers) -> int:
            add(
                Record(
                    round_id,
                    self._topic_of[emission.route],
                    emission.key,
                    emission.value,
                    headers,
                    origin=Origin(Kind.OUTPUT, where, emission),
                )
            )
            self._metrics.observe(emission.verdict, emission.call.tool)
            if emission.shadow is not None:
                return 1 + self._shadowed(round_id, where, emission, add)
            return 1

        made = 0
        for call in processor.assemble(where[0], where[1], fetched):
            made += tracing.judge(processor.emit, call, fed_ns, deliver, fetched)
        self._stats.emitted += made
        return made

    def _shadowed(
        self, round_id: int, where: Partition, emission: Emission, add: Callable[[Record], None]
    ) -> int:
        """Shadow mode (the call judged under the candidate contracts too): counted, and a flip
        written to the shadow topic when there is one. The records made."""
        compared = emission.shadow
        assert compared is not None
        self._metrics.shadow(compared)
        if self._shadow_topic is None or not compared.kind.is_flip:
            return 0
        key = emission.call.call_id.encode()
        origin = Origin(Kind.SHADOW, where)
        add(
            Record(
                round_id,
                self._shadow_topic,
                key,
                compared.encode(),
                compared.headers(),
                origin=origin,
            )
        )
        return 1

    def _decide_keys(
        self, round_id: int, partition: int, fetched: list[Any], add: Callable[[Record], None]
    ) -> int:
        """The owner's decisions on idempotency requests: events, and key-store changes."""
        where = (self._requests, partition)
        count = 0
        for decided in self._owners.decide(partition, fetched):
            resolution = decided.resolution
            schema = resolution.schema
            version = schema.version if schema is not None else None
            if resolution.pending:  # held for approval, keyed by its event id
                headers = record_headers(PENDING_OUTCOME, resolution.tool, version)
                topic, key = self._pending, resolution.event_id.encode()
            else:
                headers = record_headers(resolution.outcome, resolution.tool, version)
                topic, key = self._topic_of[resolution.outcome], resolution.call_id.encode()
            if self._tracing is not None:
                headers = self._tracing.decided(resolution, decided.request, headers)
            add(
                Record(
                    round_id,
                    topic,
                    key,
                    resolution.event,
                    headers,
                    None,
                    Origin(Kind.OUTPUT, where),
                )
            )
            for key, value in decided.changes:
                origin = Origin(Kind.KEY_CHANGE, where)
                add(Record(round_id, self._keys, key, value, [], partition, origin))
            count += 1 + len(decided.changes)
            self._metrics.idempotency_decision(resolution.decision)
            if not resolution.pending:  # a call held for approval is counted once decided
                self._metrics.decided(
                    resolution.outcome,
                    resolution.tool,
                    Phase.IDEMPOTENCY if resolution.code is not None else None,
                    resolution.code,
                )
        self._metrics.set_idempotency_keys(len(self._owners))
        return count

    def _take_approvals(
        self, round_id: int, partition: int, fetched: list[Any], add: Callable[[Record], None]
    ) -> int:
        """The owner's rulings on a pending-approval partition's records: outcome events of
        calls decided, refusal records, store changes."""
        where = (self._pending, partition)
        count = 0
        for taken in self._approvals.take(partition, fetched):
            ruled = taken.ruled
            if ruled is None:
                self._metrics.approval("held")
            else:
                version = ruled.schema.version if ruled.schema is not None else None
                if ruled.event is not None and ruled.outcome is not None:
                    assert ruled.call_id is not None
                    add(
                        Record(
                            round_id,
                            self._topic_of[ruled.outcome],
                            ruled.call_id.encode(),
                            ruled.event,
                            record_headers(ruled.outcome, ruled.tool, version),
                            None,
                            Origin(Kind.OUTPUT, where),
                        )
                    )
                    count += 1
                    self._metrics.decided(
                        ruled.outcome,
                        ruled.tool,
                        Phase.APPROVAL if ruled.code is not None else None,
                        ruled.code,
                    )
                if ruled.refusal_record is not None:
                    key = ruled.event_id.encode() if ruled.event_id is not None else None
                    refused = [(RECORD_HEADER, REFUSAL_RECORD.encode())]
                    add(
                        Record(
                            round_id,
                            self._pending,
                            key,
                            ruled.refusal_record,
                            refused,
                            partition,
                            Origin(Kind.OUTPUT, where),
                        )
                    )
                    count += 1
                    log.warning(
                        "%s[%d]: a decision on %s refused: %s",
                        self._pending,
                        partition,
                        ruled.event_id,
                        ruled.refusal,
                    )
                if ruled.detail is not None:
                    log.error(
                        "%s[%d]: a record that is no approval decision: %s",
                        self._pending,
                        partition,
                        ruled.detail,
                    )
                self._metrics.approval(ruled.ruling.value)
                if ruled.refusal is not None and ruled.ruling is not Ruling.REFUSED:
                    self._metrics.approval(Ruling.REFUSED.value)
            for key, value in taken.changes:
                origin = Origin(Kind.KEY_CHANGE, where)
                add(Record(round_id, self._approvals_topic, key, value, [], partition, origin))
            count += len(taken.changes)
        self._metrics.set_pending_approvals(len(self._approvals))
        return count

    def substitute(self, record: Record, error: KafkaError) -> Record | None:
        """An outcome record refused for good: the rejection to write in its place, or None
        (it was a rejection already, or has no call to reject: it is dropped, and counted)."""
        origin: Origin = record.origin
        emission = origin.emission
        if emission is None or record.topic == self._rejected:
            self._stats.dropped += 1
            self._metrics.event_dropped()
            log.error(
                "an event for %s was refused for good, with no place for a substitute: %r",
                record.topic,
                error,
            )
            return None
        detail = f"{record.topic} refused the event ({type(error).__name__})"
        call = emission.call
        value, written = self._processor.substitute(
            call, emission.verdict, Code.OUTPUT_REFUSED, detail
        )
        self._stats.substituted += 1
        self._metrics.event_substituted()
        version = written.schema.version if written.schema is not None else None
        headers = record_headers(Outcome.REJECTED, call.tool, version)
        traced = [(name, value) for name, value in record.headers if name == TRACEPARENT]
        return Record(
            record.round_id,
            self._rejected,
            call.call_id.encode(),
            value,
            [*headers, *traced] if traced else headers,
            None,
            Origin(Kind.OUTPUT, origin.partition),
        )
