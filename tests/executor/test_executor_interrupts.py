"""Ctrl-C twice while a handler runs, on tansu: the process stops, and the call gets no result
(its run is not recorded: the key's next owner answers it from its `started` record), whether
the executor runs under `serve` (the second Ctrl-C comes while it closes) or under an
application's `asyncio.run` (its first Ctrl-C cancels the run, its second raises
`KeyboardInterrupt` in whatever code runs: here the handler's). Before: the second was the
handler's failure, a `failed` result naming `KeyboardInterrupt`, written while the process
stopped."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.executor import CONTRACTS, Judge, produce
from tests.support.outcomes import read_records
from tests.support.workers import WorkerProcess, until
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

APP = "-m", "tests.support.interrupted_executor"
WAIT_S = 60.0
#: the handler's grace once the executor closes: the second Ctrl-C comes well within it
GRACE_S = 5.0


@pytest.mark.asyncio
@pytest.mark.parametrize("main", ["serve", "run"])
async def test_a_second_ctrl_c_is_never_a_calls_result(
    bootstrap: str, tmp_path: Path, main: str
) -> None:
    run = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap},
        "topics": {"accepted": f"validated-{run}"},
        "schemas": {"dir": str(CONTRACTS)},
        "executor": {"group_id": f"executor-{run}", "results": f"results-{run}", "partitions": 1},
        "metrics": {"enabled": False},
        "shutdown_grace_s": GRACE_S,
    }
    validated = config["topics"]["accepted"]
    await Kafka(Settings.model_validate(config)).ensure_topics(
        [TopicSpec(validated, 1, compacted=False)]
    )
    executor = WorkerProcess(
        f"executor-{main}", config, tmp_path, argv=APP, env={"INTERRUPTED_MAIN": main}
    )
    call_id = f"{run}-lookup"
    try:
        executor.start()
        await executor.wait_log("executor assigned", timeout_s=WAIT_S)
        event = Judge().accepted("lookup", {"sku": "s"}, call_id=call_id)
        await produce(bootstrap, validated, [(call_id, event)])
        await executor.wait_log("computing", timeout_s=WAIT_S)
        assert executor.process is not None
        executor.process.send_signal(signal.SIGINT)
        await executor.wait_log("closing", timeout_s=WAIT_S)
        executor.process.send_signal(signal.SIGINT)  # while the handler runs on
        await until(lambda: not executor.alive, "the executor stopped", timeout_s=WAIT_S)
    finally:
        executor.cleanup()
    results = await read_records(bootstrap, {f"results-{run}": 1})
    assert [r.value for r in results if r.key == call_id.encode()] == [], executor.tail(40)
    assert "handler of lookup failed" not in executor.text(), executor.tail(40)
    if main == "serve":
        assert executor.returncode == 0, executor.tail(40)
