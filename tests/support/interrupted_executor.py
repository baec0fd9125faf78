"""`python -m tests.support.interrupted_executor`: an executor process that a test interrupts
with Ctrl-C (SIGINT) twice while a handler runs.

Settings come from `CALLGATE_*` (the executor tests' contracts). `INTERRUPTED_MAIN` says how
it runs: `serve` (`Executor.serve`, which stops on SIGINT), or `run` (`start`, `run` and `close`
under `asyncio.run`, as an application that handles no signal itself: asyncio's first Ctrl-C
cancels it, the second raises `KeyboardInterrupt` wherever the process is). Its `lookup`
handler computes in slices, its loop turning between them, until it is stopped, logging
`computing` as it begins; the executor logs `closing` as its `close` begins.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from pydantic import BaseModel

from callgate_executor import Call, Executor
from worker.settings import load_settings

log = logging.getLogger("interrupted")

#: how long each slice of the handler's work holds the loop
SLICE_S = 0.01


class Lookup(BaseModel):
    sku: str


class Logged(Executor):
    async def close(self) -> None:
        log.info("closing")
        await super().close()


def build() -> Executor:
    executor = Logged(load_settings())

    @executor.tool("lookup", arguments=Lookup, retry_safe=False, timeout_s=600)
    async def lookup(call: Call[Lookup]) -> dict[str, Any]:
        log.info("computing")
        while True:
            until = time.monotonic() + SLICE_S
            while time.monotonic() < until:  # Python code running: where a signal lands
                pass
            await asyncio.sleep(0)

    return executor


async def _run(executor: Executor) -> None:
    await executor.start()
    try:
        await executor.run()
    finally:
        await executor.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    executor = build()
    if os.environ["INTERRUPTED_MAIN"] == "serve":
        asyncio.run(executor.serve())
    else:
        asyncio.run(_run(executor))


if __name__ == "__main__":
    main()
