"""A real Apache Kafka broker for the tests: one single-node KRaft process on loopback ports.

`fetch_libs` runs `tools/kafka/fetch` (which assembles the broker's jars from Maven Central into
the checkout's `.cache/`, and only prints where they are once they are there). `ApacheKafka`
owns exactly one broker process: it writes its `server.properties` and log4j2 configuration into
the directory it is given, formats the storage (`kafka.tools.StorageTool format --standalone`),
starts `kafka.Kafka`, waits (bounded) until the broker answers a Kafka metadata request naming
itself, and stops only that pid. A start that fails raises `ApacheKafkaError` with the tail of
the broker's log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.support.processes import ChildWait, free_port, stop_process, wait_until
from tests.support.tools import KAFKA, ToolError, built

LOOPBACK = "127.0.0.1"
NODE_ID = 1
BROKER_HEAP = "-Xmx512m"
TOOL_HEAP = "-Xmx256m"
LOG_TAIL_LINES = 40
PROBE_TIMEOUT_MS = 2000


class ApacheKafkaError(RuntimeError):
    """The Apache Kafka broker could not be assembled, formatted or started."""


def fetch_libs(timeout_s: float) -> Path:
    """The directory of the broker's jars, assembled first by `tools/kafka/fetch` if missing."""
    try:
        libs = built(KAFKA, timeout_s)
    except ToolError as exc:
        raise ApacheKafkaError(str(exc)) from None
    if not libs.is_dir():
        raise ApacheKafkaError(f"{KAFKA} printed {libs}, not a directory")
    return libs


def cluster_id() -> str:
    """A fresh KRaft cluster id: 16 random bytes in Kafka's unpadded URL-safe base64.

    The first bit is cleared so the id never starts with '-' (which the tool would read as a flag).
    """
    raw = bytearray(uuid.uuid4().bytes)
    raw[0] &= 0x7F
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


class ApacheKafka:
    """One Apache Kafka broker+controller (KRaft, node 1) on free 127.0.0.1 ports.

    `work_dir` receives `server.properties`, `log4j2.properties`, the data (`data/`) and the log
    (`broker.log`: the broker's log4j2 output, the storage tool's and both JVMs' own output).
    Use as a context manager or call `start` and `stop`. `start` blocks (it runs its probe in an
    event loop of its own), so call it from synchronous code.
    """

    def __init__(self, libs: Path, work_dir: Path, *, host: str = LOOPBACK) -> None:
        self.libs = libs
        self.work_dir = work_dir
        self.host = host
        self.port = free_port(host)
        self.controller_port = free_port(host)
        while self.controller_port == self.port:
            self.controller_port = free_port(host)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_file(self) -> Path:
        return self.work_dir / "broker.log"

    @property
    def config_file(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def log4j2_file(self) -> Path:
        return self.work_dir / "log4j2.properties"

    def server_properties(self) -> dict[str, str]:
        """The broker's configuration: one combined KRaft node, everything on loopback."""
        plain = f"PLAINTEXT://{self.host}:{self.port}"
        controller = f"CONTROLLER://{self.host}:{self.controller_port}"
        return {
            "node.id": str(NODE_ID),
            "process.roles": "broker,controller",
            "controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}",
            "listeners": f"{plain},{controller}",
            "advertised.listeners": f"{plain},{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            # The tests write record times from 1970 (the reassembler decides by record time,
            # not the clock): retention by age would delete their input while they run, so a
            # rewind or a second worker would find it gone. Records are kept for ever, and the
            # retention pass runs every second from the start, so a test that loses records to
            # it fails every time rather than once in a few runs.
            "log.retention.ms": "-1",
            "log.retention.check.interval.ms": "1000",
            "log.initial.task.delay.ms": "0",
            # the cleaner's dedupe buffer defaults to 128 MiB of the small heap
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        }

    def log4j2_properties(self) -> dict[str, str]:
        """Everything to `log_file`, appended; no shutdown hook, so the last words land too."""
        return {
            "status": "warn",
            "shutdownHook": "disable",
            "appender.file.type": "File",
            "appender.file.name": "file",
            "appender.file.fileName": str(self.log_file),
            "appender.file.append": "true",
            "appender.file.layout.type": "PatternLayout",
            "appender.file.layout.pattern": "[%d] %p %m (%c)%n",
            "rootLogger.level": "INFO",
            "rootLogger.appenderRef.file.ref": "file",
        }

    def start(self, timeout_s: float) -> None:
        """Format the storage, start the broker, return once it answers as a registered broker."""
        if self._process is not None:
            raise ApacheKafkaError("this Apache Kafka broker is already started")
        deadline = time.monotonic() + timeout_s
        java = _java()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        _write_properties(self.config_file, self.server_properties())
        _write_properties(self.log4j2_file, self.log4j2_properties())
        self._format(java, deadline)
        command = [
            java,
            BROKER_HEAP,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j2_file}",
            "-cp",
            str(self.libs / "*"),
            "kafka.Kafka",
            str(self.config_file),
        ]
        with self.log_file.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                raise ApacheKafkaError(f"cannot run {java}: {exc}") from None
        waited = wait_until(
            self._serves, max(0.0, deadline - time.monotonic()), process=self._process
        )
        if waited is ChildWait.EXITED:
            code, self._process = self._process.returncode, None
            raise ApacheKafkaError(
                f"Apache Kafka exited with status {code} before serving {self.bootstrap_servers}"
                f"; {self.log_file} ends:\n{self.log_tail()}"
            )
        if waited is ChildWait.TIMED_OUT:
            self.stop()
            raise ApacheKafkaError(
                f"Apache Kafka did not serve {self.bootstrap_servers} within {timeout_s:.0f} s"
                f"; {self.log_file} ends:\n{self.log_tail()}"
            )

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop this broker's process and only it: SIGTERM (a clean shutdown), then SIGKILL."""
        process, self._process = self._process, None
        stop_process(process, timeout_s)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the broker's log ("" before it has one)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return _tail(text, lines)

    def __enter__(self) -> ApacheKafka:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _format(self, java: str, deadline: float) -> None:
        """`kafka-storage format --standalone`: a fresh cluster whose only voter is this node."""
        command = [
            java,
            TOOL_HEAP,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j2_file}",
            "-cp",
            str(self.libs / "*"),
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(self.config_file),
            "--cluster-id",
            cluster_id(),
            "--standalone",
        ]
        with self.log_file.open("ab") as log:
            try:
                status = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=max(0.0, deadline - time.monotonic()),
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                raise ApacheKafkaError(
                    f"formatting the storage did not finish in time; {self.log_file} ends:\n"
                    f"{self.log_tail()}"
                ) from None
            except OSError as exc:
                raise ApacheKafkaError(f"cannot run {java}: {exc}") from None
        if status != 0:
            raise ApacheKafkaError(
                f"formatting the storage failed with status {status}; {self.log_file} ends:\n"
                f"{self.log_tail()}"
            )

    def _serves(self) -> bool:
        """The broker answers a metadata request, and names itself among the live brokers."""
        if not _accepts(self.host, self.port):
            return False
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self._registered())
        except (KafkaError, OSError, TimeoutError):
            return False
        finally:
            loop.close()

    async def _registered(self) -> bool:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, request_timeout_ms=PROBE_TIMEOUT_MS
        )
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
        finally:
            await admin.close()
        return any(broker["node_id"] == NODE_ID for broker in cluster["brokers"])


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).is_file():
        raise ApacheKafkaError("no java found (tools/setup-system installs it)")
    return java


def _write_properties(path: Path, values: Mapping[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))


def _accepts(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
