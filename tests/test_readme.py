"""Every `callgate` command the README shows runs as written, from the repository's root.

The commands are read from the README's `sh` blocks, so a changed example is tested as changed.
A command's expected exit status is the one its comment names (`status N`), 0 otherwise. A
`check` that reads a file is judged too: no record of an example may be `malformed_record` (an
example that only shows a rejection of its own input would teach nothing). The commands that
need a Kafka cluster (`callgate run` and `callgate topics` but for `--help`) run against the
session's Apache Kafka broker in `test_the_deployment_commands_run_on_a_real_cluster`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.datafiles import REPO
from tests.support.apache_kafka import ApacheKafka
from tests.support.executor import Judge, ResultTail
from tests.support.workers import ASSIGNED, WorkerProcess, env_of
from worker.runtime.kafka import Kafka
from worker.runtime.topics import TopicSpec
from worker.settings import Settings

README = REPO / "README.md"
_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
_STATUS = re.compile(r"\bstatus (\d)\b")


def readme_commands() -> list[tuple[list[str], int]]:
    """Each `callgate ...` line of the README's sh blocks: its arguments and expected status."""
    found = []
    for block in _BLOCK.findall(README.read_text(encoding="utf-8")):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] != ["callgate"]:
                continue
            comment = line.partition(" #")[2]
            status = _STATUS.search(comment)
            found.append((words[1:], int(status[1]) if status else 0))
    return found


def needs_a_cluster(args: list[str]) -> bool:
    return args[:1] in (["run"], ["topics"]) and "--help" not in args


OFFLINE = [(args, status) for args, status in readme_commands() if not needs_a_cluster(args)]


def test_the_readme_shows_the_commands() -> None:
    shown = {tuple(args[:2]) for args, _ in readme_commands()}
    assert {("check", "--schemas"), ("schemas", "lint"), ("schemas", "test")} <= shown
    assert len(OFFLINE) >= 8


@pytest.mark.parametrize(("args", "status"), OFFLINE, ids=[" ".join(a) for a, _ in OFFLINE])
def test_an_offline_readme_command_runs_as_written(args: list[str], status: int) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=clean,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == status, result.stderr.decode()
    assert b"Traceback" not in result.stderr
    if args[0] == "check":
        events = [orjson.loads(line) for line in result.stdout.splitlines()]
        assert events, "an example with no call"
        assert all(event["error_code"] != "malformed_record" for event in events), events


CLUSTER = [args for args, _ in readme_commands() if needs_a_cluster(args)]


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_deployment_commands_run_on_a_real_cluster(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """The README's deployment commands, in its order, on a cluster with nothing made yet:
    `topics create` makes what `topics check` then passes, `topics acls` prints, and `run`
    starts a worker on those topics that joins its group, then stops on SIGTERM with status 0."""
    assert [args[:2] for args in CLUSTER] == [
        ["topics", "create"],
        ["topics", "check"],
        ["topics", "acls"],
        ["run"],
    ]
    run = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": apache_kafka.bootstrap_servers, "group_id": f"g-{run}"},
        "topics": {
            "input": f"model-output-{run}",
            "accepted": f"ok-{run}",
            "rejected": f"no-{run}",
            "incomplete": f"part-{run}",
            "replication_factor": 1,  # one broker here; the README's cluster has three
        },
        "metrics": {"port": 0},
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    for args in CLUSTER[:-1]:
        result = subprocess.run(
            [sys.executable, "-m", "worker", *args],
            cwd=REPO,
            env={**clean, **env_of(config)},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    worker = WorkerProcess("readme-run", config, tmp_path).start()
    try:
        await worker.wait_log(ASSIGNED, timeout_s=60)
        assert "created topic" not in worker.text()  # `topics create` made every one
        assert await worker.stop(timeout_s=30) == 0
    finally:
        worker.cleanup()


_PYTHON = re.compile(
    r"^### Executor quick start\n.*?^```python\n(.*?)^```", re.MULTILINE | re.DOTALL
)


def executor_quick_start() -> str:
    """The README's executor quick start, as written."""
    found = _PYTHON.search(README.read_text(encoding="utf-8"))
    assert found is not None, "the README has no executor quick start"
    return found[1]


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_executor_quick_start_runs_as_written(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """The quick start, run from the repository's root with its settings in `CALLGATE_*`,
    answers a call the gate accepted (the shipped contracts' get_weather) on the results topic,
    then stops on SIGTERM with status 0."""
    script = tmp_path / "quick_start.py"
    script.write_text(executor_quick_start(), encoding="utf-8")
    run = uuid.uuid4().hex[:8]
    bootstrap = apache_kafka.bootstrap_servers
    config: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000},
        "topics": {"accepted": f"validated-{run}"},
        "executor": {"group_id": f"quick-{run}", "results": f"results-{run}", "partitions": 1},
        "metrics": {"enabled": False},
    }
    settings = Settings.model_validate(config)
    await Kafka(settings).ensure_topics([TopicSpec(f"validated-{run}", 1, compacted=False)])
    judge = Judge(Settings.model_validate({"schemas": {"dir": str(REPO / "schemas")}}))
    event = judge.accepted(
        "get_weather", {"city": "Lisbon", "units": "celsius"}, call_id=f"{run}-weather"
    )
    executor = WorkerProcess("quick-start", config, tmp_path, argv=(str(script),)).start()
    tail = ResultTail(bootstrap, f"results-{run}", read_committed=False)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    try:
        await producer.start()  # the executor reads its topic from the start: no need to wait
        await producer.send_and_wait(f"validated-{run}", event, key=f"{run}-weather".encode())
        await tail.start(1)
        await tail.wait_for([f"{run}-weather"], timeout_s=120, alive=lambda: executor.alive)
        assert await executor.stop(timeout_s=30) == 0, executor.tail()
    finally:
        await producer.stop()
        await tail.stop()
        executor.cleanup()
    result = tail.only(f"{run}-weather")
    assert (result["status"], result["output"]) == (
        "succeeded",
        {"city": "Lisbon", "temperature": 21, "units": "celsius"},
    )
