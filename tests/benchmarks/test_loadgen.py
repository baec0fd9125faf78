"""The latency runs' load generator (`benchmarks.loadgen`) as the e2e benchmark runs it, in a
process of its own: against the session's embedded broker, what it reports is what it sent and
had acknowledged, on the topic in order; a generator that fails, or does not end, is an error
naming its log. No timing is asserted beyond what the schedule makes certain."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from benchmarks import e2e, loadgen

#: 300 records at 200 a second: a schedule of 1.5 s, two records a tick
LOAD = loadgen.Load(
    calls=30,
    prefix="lg",
    rate=200.0,
    partitions=e2e.PARTITIONS,
    fragments=e2e.FRAGMENTS,
    invalid_share=e2e.INVALID_SHARE,
    tick_s=e2e.TICK_S,
)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_generator_s_own_process_sends_its_load_in_order_and_reports_each_call(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = f"bench.loadgen.{uuid.uuid4().hex[:8]}"
    asyncio.run(e2e._create(bootstrap, topic))
    report_file = tmp_path / "report.json"
    before = time.monotonic()
    report = asyncio.run(
        e2e._generate(
            LOAD.command(bootstrap, topic, report_file),
            report_file,
            tmp_path / "generator.log",
            timeout_s=90,
        )
    )
    after = time.monotonic()
    records = LOAD.records()
    call_ids = {orjson.loads(r.value or b"")["call_id"] for r in records}
    assert len(call_ids) == report["calls"] == LOAD.calls
    assert report["records"] == len(records)
    sent, acked = report["sent"], report["acked"]
    assert set(sent) == set(acked) == call_ids
    # one clock for both processes: the generator's readings fall within this process's
    assert all(before <= sent[c] <= acked[c] <= after for c in call_ids)
    written = asyncio.run(e2e._read_all(bootstrap, topic))
    assert e2e._check_passthrough(written, e2e.partitioned(records))
    assert len(written) == len(records)
    assert 0 <= report["behind_s"] < math.inf
    # the ticks it was late at: the worst first, the worst of all the figure above
    assert report["ticks"] == len(loadgen.ticks(LOAD))
    assert 0 <= report["late_ticks"] <= report["ticks"]
    worst = report["worst_ticks"]
    assert len(worst) == min(report["late_ticks"], loadgen.WORST_TICKS)
    lateness = [tick["behind_s"] for tick in worst]
    assert lateness == sorted(lateness, reverse=True)
    assert lateness[:1] == ([report["behind_s"]] if report["late_ticks"] else [])
    assert all(tick["behind_s"] > 0 and tick["sending_s"] >= 0 for tick in worst)
    assert all(1 <= tick["tick"] <= report["ticks"] for tick in worst)
    # the generator sleeps to the end of its last tick: it cannot beat its schedule
    assert report["seconds"] >= LOAD.scheduled_s() - 0.001
    assert 0 < report["achieved_records_per_s"] <= LOAD.rate * 1.001
    assert report["achieved_records_per_s"] == pytest.approx(len(records) / report["seconds"])


def test_the_generator_s_command_carries_its_whole_load(tmp_path: Path) -> None:
    command = LOAD.command("127.0.0.1:9092", "in", tmp_path / "report.json")
    assert command[:3] == [sys.executable, "-m", "benchmarks.loadgen"]
    assert loadgen.Load(**orjson.loads(command[-1])) == LOAD


def test_a_generator_that_exits_with_an_error_is_an_error_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "generator.log"
    failing = [sys.executable, "-c", "import sys; sys.exit('no broker')"]
    with pytest.raises(RuntimeError, match="exited with 1") as raised:
        asyncio.run(e2e._generate(failing, tmp_path / "report.json", log, timeout_s=60))
    assert str(log) in str(raised.value)
    assert "no broker" in log.read_text()


def test_a_generator_that_does_not_end_is_stopped_and_an_error(tmp_path: Path) -> None:
    log = tmp_path / "generator.log"
    endless = [
        sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)",
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="did not end") as raised:
        asyncio.run(e2e._generate(endless, tmp_path / "report.json", log, timeout_s=2))
    assert str(log) in str(raised.value)
    with pytest.raises(ProcessLookupError):
        os.kill(int(log.read_text()), 0)
