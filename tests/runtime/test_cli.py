"""`callgate run` command line: the settings reference and start-up errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.datafiles import REPO
from worker.settings import setting_fields


def _callgate(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env={**clean, "PYTHONPATH": str(REPO), "CALLGATE_METRICS__PORT": "0", **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_run_help_lists_every_setting_with_its_environment_name() -> None:
    result = _callgate("run", "--help")
    assert result.returncode == 0, result.stderr
    names = [env for env, _ in setting_fields()]
    assert len(names) > 30
    missing = [name for name in names if f"  {name}=" not in result.stdout]
    assert missing == []
    assert "CALLGATE_KAFKA__MAX_IN_FLIGHT_RECORDS=20000" in result.stdout
    assert "--settings FILE" in result.stdout


def test_the_command_line_builds_the_published_model_only_for_a_decision() -> None:
    # `callgate run` starts through the whole command line; the pydantic model of the published
    # events (about 17 ms to build) serves `approve` and `deny`, and is built when they look
    # for the call, not at every start
    code = (
        "import sys\n"
        "from worker.cli import build_parser\n"
        "build_parser().parse_args(['run'])\n"
        "assert 'worker.published.model' not in sys.modules\n"
        "from worker.runtime.approve_cli import find\n"
        "assert 'worker.published.model' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CALLGATE_KAFKA__SECURITY_PROTOCOL": "BOGUS"}, "CALLGATE_KAFKA__SECURITY_PROTOCOL"),
        ({}, "CALLGATE_KAFKA__BOOTSTRAP_SERVERS is empty"),
        (
            {"CALLGATE_KAFKA__BOOTSTRAP_SERVERS": "k:9092", "CALLGATE_TOPICS__INPUT": "^(bad"},
            "CALLGATE_TOPICS__INPUT",
        ),
        (
            {
                "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": "k:9092",
                "CALLGATE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            },
            "needs sasl_mechanism, sasl_username, sasl_password",
        ),
        (
            {
                "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": "k:9092",
                "CALLGATE_SCHEMAS__DIR": "/nonexistent",
            },
            "/nonexistent",
        ),
    ],
)
def test_a_wrong_setting_stops_start_up_with_one_message_and_status_2(
    env: dict[str, str], message: str
) -> None:
    result = _callgate("run", **{"CALLGATE_METRICS__ENABLED": "false", **env})
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_settings_file_is_read_and_a_broken_one_is_named(tmp_path: os.PathLike[str]) -> None:
    broken = os.path.join(tmp_path, "settings.json")
    with open(broken, "w") as fp:
        fp.write("{not json")
    result = _callgate("run", "--settings", broken)
    assert result.returncode == 2
    assert "settings.json" in result.stderr
    good = os.path.join(tmp_path, "good.json")
    with open(good, "w") as fp:
        fp.write(
            '{"kafka": {"bootstrap_servers": "k:9092", "security_protocol": "SSL",'
            ' "ssl_cafile": "/no/such/ca.pem"}}'
        )
    result = _callgate("run", "--settings", good, CALLGATE_METRICS__ENABLED="false")
    assert result.returncode == 2
    # the file's key is named, not an environment variable that nobody set
    assert f"{good}: kafka.ssl_cafile: no such file: /no/such/ca.pem" in result.stderr
    assert "CALLGATE_KAFKA__SSL_CAFILE" not in result.stderr


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("CALLGATE_LOGLEVEL", "CALLGATE_LOG_LEVEL"),
        ("CALLGATE_KAFKA_BOOTSTRAP_SERVERS", "CALLGATE_KAFKA__BOOTSTRAP_SERVERS"),
        ("CALLGATE_TOPICS__INPUTS", "CALLGATE_TOPICS__INPUT"),
    ],
)
def test_an_unknown_variable_refuses_start_naming_the_closest_setting(
    name: str, closest: str
) -> None:
    result = _callgate("run", CALLGATE_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:1", **{name: "x"})
    assert result.returncode == 2, result.stderr
    assert f"{name} is not a setting (did you mean {closest}?)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_broker_is_an_infrastructure_failure_status_1() -> None:
    result = _callgate(
        "run",
        CALLGATE_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:1",
        CALLGATE_METRICS__ENABLED="false",
    )
    assert result.returncode == 1, result.stderr
    assert "cannot work with Kafka at 127.0.0.1:1" in result.stderr
    assert "Unclosed" not in result.stderr


@pytest.mark.integration
def test_a_missing_input_topic_is_named_with_how_to_create_it(broker: str) -> None:
    """On tansu and Apache Kafka: the outcome topics exist, the input does not. The worker
    stops at start with status 1 and one line naming the input and `callgate topics create`
    (which then makes it: the same settings run)."""
    run = uuid.uuid4().hex[:8]
    env = {
        "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": broker,
        "CALLGATE_KAFKA__GROUP_ID": f"missing-{run}",
        "CALLGATE_TOPICS__INPUT": f"in-{run}",
        "CALLGATE_TOPICS__ACCEPTED": f"ok-{run}",
        "CALLGATE_TOPICS__REJECTED": f"no-{run}",
        "CALLGATE_TOPICS__INCOMPLETE": f"partial-{run}",
        "CALLGATE_IDEMPOTENCY__PARTITIONS": "1",
        "CALLGATE_METRICS__ENABLED": "false",
    }
    made = _callgate("topics", "create", "--input-partitions", "1", **env)
    assert made.returncode == 0, made.stdout + made.stderr
    deleted = _delete_topic(broker, f"in-{run}")
    assert deleted
    result = _callgate("run", **env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert f"topics do not exist: in-{run} (input)" in line
    assert "callgate topics create" in line
    assert "UnknownTopicOrPartition" not in result.stderr


def _delete_topic(bootstrap: str, topic: str) -> bool:
    async def delete() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
            for _ in range(200):  # a bounded poll until the cluster no longer lists it
                if topic not in await admin.list_topics():
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await admin.close()

    return asyncio.run(delete())
