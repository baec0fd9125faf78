"""Child processes: a free loopback port, a bounded wait for readiness, a stop of one pid.

Nothing here is tansu-specific: the embedded broker uses these, and so do the tests' other child
services (Apache Kafka, Prometheus), so that none of them grows a second copy of the same poll or
stop.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from enum import StrEnum

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def accepts(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on `host:port` now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


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
