"""`callgate run` as real processes against the embedded broker: kill -9, rebalance, SIGTERM.

Each test produces thousands of interleaved calls up front (hundreds open at any offset), runs
`python -m worker run` subprocesses with settings from the environment, disturbs them mid-run,
and then checks that every call has at least one outcome event, the expected one, and that any
replay carries the same event_id. The figures are printed (`pytest -s`) for the report.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.runtime.kafka_helpers import (
    ASSIGNED,
    OutcomeTail,
    check_outcomes,
    committed,
    create,
    load_of_calls,
    produce,
    produce_paced,
    start_worker,
    unique,
    wait_for_log,
    worker_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PARTITIONS = 4


def _alive(*processes: subprocess.Popen[bytes]) -> bool:
    return all(p.poll() is None for p in processes)


def _log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


async def _setup(bootstrap: str, name: str, streams: int, calls: int) -> tuple[str, str, dict]:
    run = unique(name)
    input_topic, output_topic = f"{run}.in", f"{run}.out"
    await create(bootstrap, {input_topic: PARTITIONS, output_topic: 2})
    records, expected = load_of_calls(run, streams, calls)
    await produce(bootstrap, input_topic, records)
    return input_topic, output_topic, expected


def _stop(
    process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 15
) -> int:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
        raise


@pytest.mark.timeout(300)
async def test_kill_9_at_random_points_loses_no_call(bootstrap: str, tmp_path: Path) -> None:
    run = unique("crash")
    input_topic, output_topic = f"{run}.in", f"{run}.out"
    await create(bootstrap, {input_topic: PARTITIONS, output_topic: 2})
    records, expected = load_of_calls(run, streams=800, calls_per_stream=5)
    # live traffic for about 25 s, so that every kill lands while records are still arriving
    feeder = asyncio.create_task(
        produce_paced(bootstrap, input_topic, records, per_second=len(records) / 25)
    )
    group = unique("g")
    env = worker_env(bootstrap, group, input_topic, output_topic, KAFKA__FETCH_MAX_RECORDS="100")
    log = tmp_path / "worker.log"
    seed = int(os.environ.get("CALLGATE_TEST_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    total = len(expected)
    kills = 0
    started = time.monotonic()
    async with OutcomeTail(bootstrap, [output_topic]) as tail:
        while kills < 6 and not feeder.done():
            worker = start_worker(env, log)
            try:
                # kill -9 after a random 0.2 to 2 s of judging, once this run has joined
                alive = lambda w=worker: _alive(w)  # noqa: E731
                joined = await wait_for_log(log, ASSIGNED, kills + 1, timeout_s=60, alive=alive)
                assert joined, f"run {kills} did not join the group\n{_log_tail(log)}"
                await asyncio.sleep(rng.uniform(0.2, 2.0))
            finally:
                worker.kill()
                worker.wait(10)
            assert worker.returncode == -signal.SIGKILL
            kills += 1
        await feeder
        worker = start_worker(env, log)
        try:
            finished = await tail.wait_calls(total, timeout_s=90, alive=lambda: _alive(worker))
            assert finished, f"only {tail.calls}/{total} calls judged\n{_log_tail(log)}"
            await tail.settle()
        finally:
            status = _stop(worker)
        assert status == 0, _log_tail(log)
        figures = check_outcomes(tail.outcomes, expected)
    figures.update(kills=kills, seed=seed, seconds=round(time.monotonic() - started, 1))
    print(f"\ncrash figures: {figures}")
    assert kills >= 4, "the traffic ended before the worker was killed often enough"
    assert figures["calls"] >= 3000


@pytest.mark.timeout(300)
async def test_rebalance_one_worker_leaves_one_joins(bootstrap: str, tmp_path: Path) -> None:
    run = unique("rebalance")
    input_topic, output_topic = f"{run}.in", f"{run}.out"
    await create(bootstrap, {input_topic: PARTITIONS, output_topic: 2})
    records, expected = load_of_calls(run, streams=600, calls_per_stream=5)
    feeder = asyncio.create_task(
        produce_paced(bootstrap, input_topic, records, per_second=len(records) / 20)
    )
    group = unique("g")
    env = worker_env(bootstrap, group, input_topic, output_topic, KAFKA__FETCH_MAX_RECORDS="50")
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    total = len(expected)
    started = time.monotonic()
    async with OutcomeTail(bootstrap, [output_topic]) as tail:
        first, second = start_worker(env, logs[0]), start_worker(env, logs[1])
        third = None
        try:
            both = lambda: _alive(first, second)  # noqa: E731
            for log in logs[:2]:
                assert await wait_for_log(log, ASSIGNED, 1, timeout_s=60, alive=both)
            await asyncio.sleep(2)
            assert not feeder.done(), "traffic ended before the rebalance"
            assert _stop(first) == 0, _log_tail(logs[0])  # leaves: its partitions move
            third = start_worker(env, logs[2])  # joins mid-run: another rebalance
            others = lambda: _alive(second, third)  # noqa: E731
            assert await wait_for_log(logs[2], ASSIGNED, 1, timeout_s=60, alive=others)
            assert not feeder.done(), "traffic ended before the third worker joined"
            await feeder
            assert await tail.wait_calls(total, timeout_s=120, alive=others), (
                f"only {tail.calls}/{total}\n{_log_tail(logs[1])}\n{_log_tail(logs[2])}"
            )
            await tail.settle()
        finally:
            statuses = [_stop(p) for p in (second, third) if p is not None]
            if first.poll() is None:
                first.kill()
        assert statuses == [0, 0]
        figures = check_outcomes(tail.outcomes, expected)
    assignments = [log.read_text().count(ASSIGNED) for log in logs]
    figures.update(
        workers=3, assignments=sum(assignments), seconds=round(time.monotonic() - started, 1)
    )
    print(f"\nrebalance figures: {figures}")


@pytest.mark.timeout(180)
async def test_sigterm_drains_commits_and_exits_within_the_grace_period(
    bootstrap: str, tmp_path: Path
) -> None:
    run = unique("term")
    input_topic, output_topic = f"{run}.in", f"{run}.out"
    await create(bootstrap, {input_topic: PARTITIONS, output_topic: 2})
    records, expected = load_of_calls(run, streams=400, calls_per_stream=5)
    feeder = asyncio.create_task(
        produce_paced(bootstrap, input_topic, records, per_second=len(records) / 12)
    )
    group = unique("g")
    grace_s = 8.0
    env = worker_env(
        bootstrap,
        group,
        input_topic,
        output_topic,
        KAFKA__FETCH_MAX_RECORDS="100",
        SHUTDOWN_GRACE_S=str(grace_s),
    )
    log = tmp_path / "worker.log"
    total = len(expected)
    async with OutcomeTail(bootstrap, [output_topic]) as tail:
        worker = start_worker(env, log)
        try:
            alive = lambda: _alive(worker)  # noqa: E731
            assert await wait_for_log(log, ASSIGNED, 1, timeout_s=60, alive=alive)
            await asyncio.sleep(2)
            assert not feeder.done(), "traffic ended before SIGTERM"
            asked = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            status = await asyncio.to_thread(worker.wait, grace_s + 5)
            took = time.monotonic() - asked
        finally:
            if worker.poll() is None:
                worker.kill()
        assert status == 0, _log_tail(log)
        assert took <= grace_s, f"took {took:.1f} s to stop"
        stopped = re.search(r"stopped: (\d+) records, (\d+) events, (\d+) commits", log.read_text())
        assert stopped, _log_tail(log)
        emitted, commits = int(stopped[2]), int(stopped[3])
        assert emitted > 0
        assert commits > 0
        # every event the stopped worker emitted was flushed to the topic before it exited
        assert await tail.wait_calls(emitted, timeout_s=10)
        await tail.settle(0.5)
        assert len(tail.outcomes.events) == emitted
        offsets = await committed(bootstrap, group, input_topic, PARTITIONS)
        assert any(offsets.values()), offsets

        await feeder
        worker = start_worker(env, log)
        try:
            assert await tail.wait_calls(total, timeout_s=90, alive=lambda: _alive(worker))
            await tail.settle()
        finally:
            assert _stop(worker) == 0, _log_tail(log)
        figures = check_outcomes(tail.outcomes, expected)
    figures.update(stop_seconds=round(took, 2), emitted_before_stop=emitted)
    print(f"\nsigterm figures: {figures}")
