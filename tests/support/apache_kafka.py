"""A real Apache Kafka broker for the tests: one single-node KRaft process on loopback ports.

`fetch_libs` runs `tools/kafka/fetch` (which assembles the broker's jars from Maven Central into
the checkout's `.cache/`, and only prints where they are once they are there). `ApacheKafka`
owns exactly one broker process: it writes its `server.properties` and log4j2 configuration into
the directory it is given, formats the storage (`kafka.tools.StorageTool format --standalone`),
starts `kafka.Kafka`, waits (bounded) until the broker answers a Kafka metadata request naming
itself, and stops only that pid. A start that fails raises `ApacheKafkaError` with the tail of
the broker's log.

Given `security=Scram(...)`, the broker is a secured one: its only client listener is SASL_SSL
with SCRAM-SHA-512 (the users' credentials written into the metadata when the storage is
formatted), its certificate signed by a CA the harness makes with openssl (`Certificates`, in the
work directory, with 127.0.0.1 in its names), and KRaft's StandardAuthorizer denies whatever no
ACL allows. The admin user is a super user (and the controller listener's ANONYMOUS, which only
the node itself talks to). `client_options(user)` are aiokafka's arguments for a user,
`client_properties(user)` a Java client's properties file for the Kafka tools, and
`acls(*args)` runs `kafka-acls.sh` (`org.apache.kafka.tools.AclCommand`) as the admin.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context

from tests.support.processes import (
    ChildWait,
    accepts,
    file_tail,
    free_port,
    stop_process,
    wait_until,
)
from tests.support.tools import KAFKA, ToolError, built

LOOPBACK = "127.0.0.1"
NODE_ID = 1
BROKER_HEAP = "-Xmx512m"
#: a command-line tool's JVM (the storage format, kafka-acls.sh) lives a few seconds: the
#: quick compiler alone and the serial collector halve its start (wall and CPU) on 2 busy cores
TOOL_JVM = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
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


@dataclass(frozen=True)
class Certificates:
    """A CA made for one broker, and the broker's key and certificate signed by it."""

    ca: Path  # the CA's certificate: what clients trust
    keystore: Path  # the broker's private key (PKCS#8) and its certificate chain, PEM

    @classmethod
    def make(cls, directory: Path, host: str) -> Certificates:
        """New keys and certificates (valid for two days) under `directory`, with openssl."""
        directory.mkdir(parents=True, exist_ok=True)
        ca_key, ca = directory / "ca.key", directory / "ca.pem"
        key, csr, cert = (
            directory / "broker.key",
            directory / "broker.csr",
            directory / "broker.pem",
        )
        names = directory / "broker.ext"
        names.write_text(f"subjectAltName=IP:{host},DNS:localhost\n")
        for command in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
             "-days", "2", "-subj", "/CN=callgate test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/CN={host}"],
            ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", names],
        ):  # fmt: skip
            done = subprocess.run(
                ["openssl", *map(str, command)], capture_output=True, timeout=60, check=False
            )
            if done.returncode != 0:
                raise ApacheKafkaError(f"openssl {command[0]} failed: {done.stderr.decode()}")
        keystore = directory / "broker-keystore.pem"
        keystore.write_text(key.read_text() + cert.read_text() + ca.read_text())
        return cls(ca=ca, keystore=keystore)


@dataclass(frozen=True)
class Scram:
    """A secured broker's users: name -> password; `admin` is a super user."""

    users: Mapping[str, str]
    admin: str = "admin"
    mechanism: str = "SCRAM-SHA-512"


class ApacheKafka:
    """One Apache Kafka broker+controller (KRaft, node 1) on free 127.0.0.1 ports.

    `work_dir` receives `server.properties`, `log4j2.properties`, the data (`data/`) and the log
    (`broker.log`: the broker's log4j2 output, the storage tool's and both JVMs' own output).
    Use as a context manager or call `start` and `stop`. `start` blocks (it runs its probe in an
    event loop of its own), so call it from synchronous code.
    """

    def __init__(
        self, libs: Path, work_dir: Path, *, host: str = LOOPBACK, security: Scram | None = None
    ) -> None:
        if security is not None and security.admin not in security.users:
            raise ApacheKafkaError(f"the admin user {security.admin!r} needs a password")
        self.libs = libs
        self.work_dir = work_dir
        self.host = host
        self.security = security
        self.certificates: Certificates | None = None
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
    def formatted(self) -> bool:
        """Whether its storage was formatted (by a first `start`)."""
        return (self.work_dir / "data" / "meta.properties").is_file()

    @property
    def config_file(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def log4j2_file(self) -> Path:
        return self.work_dir / "log4j2.properties"

    def server_properties(self) -> dict[str, str]:
        """The broker's configuration: one combined KRaft node, everything on loopback."""
        listener = "SASL_SSL" if self.security else "PLAINTEXT"
        clients = f"{listener}://{self.host}:{self.port}"
        controller = f"CONTROLLER://{self.host}:{self.controller_port}"
        return {
            "node.id": str(NODE_ID),
            "process.roles": "broker,controller",
            "controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}",
            "listeners": f"{clients},{controller}",
            "advertised.listeners": f"{clients},{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
            **self._security_properties(),
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

    def _security_properties(self) -> dict[str, str]:
        """SASL_SSL with SCRAM for clients and between brokers, PEM files, the authorizer."""
        if self.security is None:
            return {}
        assert self.certificates is not None, "made in start()"
        scram, admin = self.security, self.security.admin
        login = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{admin}" password="{scram.users[admin]}";'
        )
        return {
            "sasl.enabled.mechanisms": scram.mechanism,
            "sasl.mechanism.inter.broker.protocol": scram.mechanism,
            f"listener.name.sasl_ssl.{scram.mechanism.lower()}.sasl.jaas.config": login,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certificates.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certificates.ca),
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # the admin, and the node itself on its PLAINTEXT controller listener
            "super.users": f"User:{admin};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def client_options(self, user: str | None = None) -> dict[str, Any]:
        """aiokafka's connection arguments for `user` (the admin when None) on this broker."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers}
        if self.security is None:
            return options
        assert self.certificates is not None, "made in start()"
        name = user or self.security.admin
        return {
            **options,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": self.security.mechanism,
            "sasl_plain_username": name,
            "sasl_plain_password": self.security.users[name],
            "ssl_context": create_ssl_context(cafile=str(self.certificates.ca)),
        }

    def client_properties(self, user: str | None = None) -> Path:
        """A Java client's properties file for `user` (the admin when None): `--command-config`
        of the Kafka tools."""
        path = self.work_dir / f"client-{user or 'admin'}.properties"
        values = {"bootstrap.servers": self.bootstrap_servers}
        if self.security is not None:
            assert self.certificates is not None, "made in start()"
            name = user or self.security.admin
            values |= {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": self.security.mechanism,
                "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                f'required username="{name}" password="{self.security.users[name]}";',
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.certificates.ca),
            }
        _write_properties(path, values)
        return path

    def acls(self, *args: str, timeout_s: float = 60.0) -> str:
        """`kafka-acls.sh --bootstrap-server <this> --command-config <admin> ARGS`: its output.
        Raises `ApacheKafkaError` with what it printed when it fails."""
        return self.tool(
            "org.apache.kafka.tools.AclCommand",
            "--bootstrap-server",
            self.bootstrap_servers,
            "--command-config",
            str(self.client_properties()),
            *args,
            timeout_s=timeout_s,
        )

    def tool(self, main_class: str, *args: str, timeout_s: float = 60.0) -> str:
        """Run one of Kafka's command-line tools (`main_class`) with this broker's jars."""
        command = [
            _java(),
            *TOOL_JVM,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j2_file}",
            "-cp",
            str(self.libs / "*"),
            main_class,
            *args,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise ApacheKafkaError(
                f"{main_class} did not finish within {timeout_s:.0f} s"
            ) from None
        if done.returncode != 0:
            raise ApacheKafkaError(
                f"{main_class} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}"
            )
        return done.stdout

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
        """Format the storage (the first time), start the broker, return once it answers as a
        registered broker. A broker stopped (`stop`) starts again on the same ports with the
        same data: a broker restart, as a test of its clients needs."""
        if self._process is not None:
            raise ApacheKafkaError("this Apache Kafka broker is already started")
        deadline = time.monotonic() + timeout_s
        java = _java()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.security is not None and self.certificates is None:
            self.certificates = Certificates.make(self.work_dir / "tls", self.host)
        _write_properties(self.config_file, self.server_properties())
        _write_properties(self.log4j2_file, self.log4j2_properties())
        if not self.formatted:  # started again after `stop`: its data, topics and groups kept
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
        return file_tail(self.log_file, lines)

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
            *TOOL_JVM,
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
            *self._scram_credentials(),
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

    def _scram_credentials(self) -> list[str]:
        """The storage tool's `--add-scram` of every user: credentials in the first metadata."""
        if self.security is None:
            return []
        mechanism = self.security.mechanism
        return [
            arg
            for name, password in self.security.users.items()
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]

    def _serves(self) -> bool:
        """The broker answers a metadata request, and names itself among the live brokers."""
        if not accepts(self.host, self.port):
            return False
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self._registered())
        except (KafkaError, OSError, TimeoutError):
            return False
        finally:
            loop.close()

    async def _registered(self) -> bool:
        admin = AIOKafkaAdminClient(**self.client_options(), request_timeout_ms=PROBE_TIMEOUT_MS)
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
