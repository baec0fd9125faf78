"""`python -m tests.support.shop_executor`: an executor process for the delivery tests.

Settings come from `CALLGATE_*` as for `callgate run` (the executor tests' contracts); `SHOP_DB`
names the SQLite file of the payments (`callgate_demo.shop.Payments`, unique on the idempotency
key). Its `pay` handler is safe to retry: it inserts the payment unless its key is there, then
waits `SHOP_LATENCY_MS` (the bank's answer), so a kill -9 lands in handlers as well as between
them. Each run of it logs `paid <key> attempt <n> new|existing`. Two calls block for good, so
that a test kills the process during them: a payment to recipient `block` (its first attempt,
before it pays) and a `lookup` of sku `block` (not safe to retry); each logs `blocking in ...`.
Its `wire` handler (the tool requires approval) logs `wired <key>` when it runs. A `lookup` of
sku `hog` blocks the process's event loop for `SHOP_HOG_S` seconds (a handler that blocks instead
of awaiting: no heartbeat reaches the group meanwhile), logging `hogging` and `hogged`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from callgate_demo.shop import Payments
from callgate_executor import Call, Executor
from worker.settings import load_settings

log = logging.getLogger("shop")


class Pay(BaseModel):
    amount_minor: int
    currency: str
    recipient: str
    idempotency_key: str


class Lookup(BaseModel):
    sku: str


class Wire(BaseModel):
    amount_minor: int
    idempotency_key: str


def build(payments: Payments, latency_s: float, hog_s: float = 0.0) -> Executor:
    executor = Executor(load_settings())

    @executor.tool("pay", arguments=Pay, retry_safe=True)
    async def pay(call: Call[Pay]) -> dict[str, Any]:
        args = call.arguments
        if args.recipient == "block" and call.attempt == 1:
            await _block(args.idempotency_key)
        payment, new = payments.pay(
            args.idempotency_key, args.amount_minor, args.currency, args.recipient,
            call.event.event_id,
        )  # fmt: skip
        log.info(
            "paid %s attempt %d %s",
            args.idempotency_key,
            call.attempt,
            "new" if new else "existing",
        )
        await asyncio.sleep(latency_s)
        return {"payment_id": payment.id, "status": "paid"}

    @executor.tool("lookup", arguments=Lookup, retry_safe=False, timeout_s=600)
    async def lookup(call: Call[Lookup]) -> dict[str, Any]:
        if call.arguments.sku == "block":
            await _block(call.arguments.sku)
        if call.arguments.sku == "hog":
            log.info("hogging")
            time.sleep(hog_s)  # blocks the loop, as the test means it to
            log.info("hogged")
        return {"sku": call.arguments.sku}

    @executor.tool("wire", arguments=Wire, retry_safe=False)
    async def wire(call: Call[Wire]) -> dict[str, Any]:
        log.info("wired %s", call.arguments.idempotency_key)
        return {}

    return executor


async def _block(what: str) -> None:
    """Never returns: the test kills the process while this runs."""
    log.info("blocking in %s", what)
    await asyncio.Event().wait()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    payments = Payments(Path(os.environ["SHOP_DB"]))
    latency_s = int(os.environ.get("SHOP_LATENCY_MS", "0")) / 1000
    hog_s = float(os.environ.get("SHOP_HOG_S", "0"))
    asyncio.run(build(payments, latency_s, hog_s).serve())


if __name__ == "__main__":
    main()
