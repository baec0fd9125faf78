"""The real parts the tests build or assemble from registries, through the project's own scripts.

Each script under `tools/` puts one part into the checkout's `.cache/` the first time (Apache
Kafka's jars from Maven Central, kustomize and an OpenTelemetry Collector from the Go module
proxy) and prints where it is; once it is there, it only prints that. `make test` runs them all
before the tests; `built` runs one from a test's fixture, bounded in time, so a fresh checkout
gets the part either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.datafiles import REPO

TOOLS = REPO / "tools"
KAFKA = TOOLS / "kafka" / "fetch"
KUSTOMIZE = TOOLS / "kustomize" / "install"
OTELCOL = TOOLS / "otelcol" / "build"
TAIL_LINES = 40


class ToolError(RuntimeError):
    """A tool script failed, or did not finish in time, or printed no path."""


def built(script: Path, timeout_s: float) -> Path:
    """The path `script` prints last (the part, made first if missing).

    The script runs in its own process group, so a run that outlasts `timeout_s` is stopped
    whole (Maven or the Go toolchain included): SIGTERM to that group, SIGKILL if it lingers.
    """
    try:
        process = subprocess.Popen(
            [str(script)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot run {script}: {exc}") from None
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        raise ToolError(f"{script} did not finish within {timeout_s:.0f} s") from None
    if process.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-TAIL_LINES:])
        raise ToolError(f"{script} failed with status {process.returncode}:\n{tail}")
    lines = out.decode().strip().splitlines()
    path = Path(lines[-1]) if lines else None
    if path is None or not path.exists():
        raise ToolError(f"{script} printed no path that exists (got {out!r})")
    return path


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop the process group that `process` leads (it was started in a session of its own)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            continue
        return
