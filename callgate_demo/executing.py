"""The demo's executor: `callgate_executor` running the accepted calls of the demo's run.

Three handlers: `create_payment` writes each payment to SQLite, unique on its idempotency key
(`callgate_demo.shop`: safe to retry), `refund_payment` (its contract requires approval: the
executor runs only a call approved for its exact arguments) writes each refund there the same
way, and `get_weather` answers with a made-up reading. The
executor has a group of its own per demo run and reads the validated topic from its start; the
demo counts the results of its own run's calls only (`stream_id` starting with the run's name).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from callgate_demo.shop import Payments
from callgate_executor import Call, Executor
from callgate_executor.contract import APPROVAL_MISMATCH, APPROVAL_MISSING
from worker.published.model import ResultStatus, ToolResult
from worker.settings import Settings

APPROVAL_REFUSALS = (APPROVAL_MISSING.type, APPROVAL_MISMATCH.type)


class CreatePayment(BaseModel):
    amount_minor: int
    currency: str
    recipient: str
    description: str | None
    idempotency_key: str


class RefundPayment(BaseModel):
    payment_id: str
    amount_minor: int
    currency: str
    reason: str | None
    idempotency_key: str


class GetWeather(BaseModel):
    city: str
    units: str
    days: int = 1


class DemoExecutor:
    """The executor, its handlers, and this run's results by call id."""

    def __init__(self, settings: Settings, database: Path, run: str, partitions: int) -> None:
        executor = settings.executor.model_copy(
            update={
                "group_id": f"{settings.executor.group_id}-demo-{uuid.uuid4().hex[:8]}",
                "partitions": partitions,
            }
        )
        self.payments = Payments(database)
        self.executor = Executor(
            settings.model_copy(update={"executor": executor}), on_result=self._result
        )
        self.executor.tool("create_payment", arguments=CreatePayment, retry_safe=True)(self.pay)
        self.executor.tool("refund_payment", arguments=RefundPayment, retry_safe=True)(self.refund)
        self.executor.tool("get_weather", arguments=GetWeather, retry_safe=True)(self.weather)
        self._run = run
        self.results: dict[str, ToolResult] = {}
        self._task: asyncio.Task[None] | None = None

    async def pay(self, call: Call[CreatePayment]) -> dict[str, Any]:
        args = call.arguments
        payment, _ = self.payments.pay(
            args.idempotency_key, args.amount_minor, args.currency, args.recipient,
            call.event.event_id,
        )  # fmt: skip
        return {"payment_id": payment.id, "status": "paid"}

    async def refund(self, call: Call[RefundPayment]) -> dict[str, Any]:
        args = call.arguments
        refund, _ = self.payments.refund(
            args.idempotency_key, args.payment_id, args.amount_minor, args.currency,
            call.event.event_id,
        )  # fmt: skip
        return {"refund_id": refund.id, "status": "refunded"}

    async def weather(self, call: Call[GetWeather]) -> dict[str, Any]:
        args = call.arguments
        celsius = 18 + len(args.city) % 7
        temperature = celsius if args.units == "celsius" else round(celsius * 9 / 5 + 32)
        return {"city": args.city, "temperature": temperature, "units": args.units}

    def _result(self, result: ToolResult) -> None:
        if result.stream_id.startswith(self._run):
            self.results[result.call_id] = result

    async def start(self) -> None:
        await self.executor.start()
        self._task = asyncio.create_task(self.executor.run())

    async def stop(self) -> None:
        self.executor.request_stop()
        if self._task is not None:
            await self._task
        await self.executor.close()

    def tally(self) -> Counter[str]:
        """This run's results: `executed` (a handler ran), `replayed`, `conflict`, `refused`
        and `approval_missing` (refused for want of an approval, or of one naming its
        arguments), by status and by tool too (`tool:<name>` for what ran)."""
        counts: Counter[str] = Counter()
        for result in self.results.values():
            if result.replayed:
                counts["replayed"] += 1
            elif result.status is ResultStatus.CONFLICT:
                counts["conflict"] += 1
            elif result.status is ResultStatus.REFUSED:
                counts["refused"] += 1
                if result.error is not None and result.error.type in APPROVAL_REFUSALS:
                    counts["approval_missing"] += 1
            else:
                counts["executed"] += 1
                counts[result.status.value] += 1
                counts[f"tool:{result.tool}"] += 1
        return counts


def executor_summary(
    results: Counter[str], gate: Counter[tuple[str, str, str]], payments: int, refunds: int
) -> str:
    """The executor's lines of the demo's summary: what ran and what did not, the gate's own
    duplicates and conflicts counted with the executor's (either one stops a repeat)."""

    def gate_count(code: str) -> int:
        return sum(n for (outcome, _, detail), n in gate.items() if detail == code)

    executed = results["executed"]
    statuses = ", ".join(
        f"{results[s.value]} {s.value}" for s in ResultStatus if results[s.value] and s.value in
        ("succeeded", "failed", "timed_out", "interrupted")
    )  # fmt: skip
    pending = sum(n for (outcome, _, _), n in gate.items() if outcome == "pending_approval")
    denied = sum(n for (_, _, detail), n in gate.items() if detail in ("denied", "approval_denied"))
    return "\n".join(
        [
            f"executor: {executed} executed ({statuses or 'none'}), "
            f"{gate_count('duplicate') + results['replayed']} deduplicated, "
            f"{gate_count('idempotency_conflict') + results['conflict']} conflicting, "
            f"{pending + results['approval_missing']} awaiting approval, {denied} denied "
            f"({results['tool:refund_payment']} approved refunds executed)",
            f"payments database (SQLite, unique on the idempotency key): {payments} rows, "
            f"{refunds} refunds",
        ]
    )
