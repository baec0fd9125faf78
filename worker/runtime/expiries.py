"""The `expire` decisions a worker writes for calls held for approval past their expiry.

The core never reads a clock, so the worker's wall clock says when a held call's expiry has
passed (`ApprovalOwners.due`); it then writes an `expire` decision for that call to the
pending-approval topic, which the call's owner rules on by the decision's record time
(`worker.core.approval`). A decision that is lost is asked again after `ASK_AGAIN_MS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiokafka.errors import KafkaError

from worker.core.approval import CALLGATE, DECISION_RECORD, RECORD_HEADER, Decision, decision_record
from worker.runtime.approvals import ApprovalOwners
from worker.runtime.kafka import Kafka, close_within

log = logging.getLogger("callgate.worker")

#: how often the held calls are looked at, and after how long one asked is asked again
CHECK_EVERY_S = 1.0
ASK_AGAIN_MS = 30_000


class Expiries:
    """`ask()` between rounds (it looks once every `CHECK_EVERY_S`); `close()` at the end."""

    def __init__(
        self,
        kafka: Kafka,
        approvals: ApprovalOwners,
        pending_topic: str,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._kafka = kafka
        self._approvals = approvals
        self._pending = pending_topic
        self._clock = clock
        self._wall = wall
        self._checked = float("-inf")
        self._producer: Any = None  # made when the first call expires

    async def ask(self) -> None:
        """An `expire` decision for each held call whose expiry the wall clock has passed."""
        now = self._clock()
        if now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        due = self._approvals.due(round(self._wall() * 1000), again_after_ms=ASK_AGAIN_MS)
        if not due:
            return
        try:
            if self._producer is None:
                self._producer = self._kafka.producer()
                await self._producer.start()
            for partition, event_id, found in due:
                value = decision_record(event_id, found, Decision.EXPIRE, CALLGATE)
                await self._producer.send(
                    self._pending,
                    value,
                    key=event_id.encode(),
                    partition=partition,
                    headers=[(RECORD_HEADER, DECISION_RECORD.encode())],
                )
            log.info("asked to expire %d calls pending approval", len(due))
        except KafkaError as exc:  # asked again later: the calls stay pending until then
            log.warning("cannot write expire decisions: %r", exc)

    async def close(self, timeout_s: float) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        await close_within(producer.stop(), timeout_s, "the expiry producer")
