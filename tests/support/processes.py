"""Child processes the tests start: a free loopback port, a bounded wait, a stop of one pid.

The implementation is the one in `callgate_demo.processes` (the tansu launcher and the tests'
other services already share it); this module gives it the names the test-support code uses, so
that a test's child service never grows a second copy of the same poll or stop.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from callgate_demo.processes import ChildWait, accepts, free_port, stop_child, wait_for_child

__all__ = ["ChildWait", "accepts", "file_tail", "free_port", "stop_process", "wait_until"]


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    *,
    process: subprocess.Popen[bytes] | None = None,
    interval_s: float = 0.05,
) -> ChildWait:
    """Poll `predicate` until it holds (READY), `process` exits (EXITED) or time runs out."""
    return wait_for_child(process, predicate, timeout_s, interval_s=interval_s)


def stop_process(popen: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Stop this one child if it still runs: SIGTERM, then SIGKILL after `timeout_s`."""
    stop_child(popen, timeout_s)


def file_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a child's log file ("" before it has one)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
