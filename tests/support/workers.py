"""`python -m worker run` as child processes: settings through `CALLGATE_*`, one log file each,
and the signals the delivery tests send (kill -9, SIGTERM, SIGSTOP/SIGCONT) to that pid only.

Every wait here is a bounded poll (of the child's log or its exit), never a sleep to let
something happen.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.datafiles import REPO
from worker.settings import Settings

POLL_S = 0.05
#: what the worker logs when it was given partitions (and has restored their state)
ASSIGNED = "callgate.worker: assigned"
REVOKED = "callgate.worker: revoked"


def env_of(config: Mapping[str, Any], prefix: str = "CALLGATE_") -> dict[str, str]:
    """A settings mapping as the environment variables `callgate run` reads."""
    env: dict[str, str] = {}
    for name, value in config.items():
        key = f"{prefix}{name.upper()}"
        if isinstance(value, Mapping):
            env.update(env_of(value, key + "__"))
        elif isinstance(value, list | tuple):
            env[key] = ",".join(str(item) for item in value)
        elif isinstance(value, bool):
            env[key] = "true" if value else "false"
        else:
            env[key] = str(value)
    return env


def merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class WorkerProcess:
    """One worker child. `start()`; the signals; `wait_log` / `wait_exit` poll with a bound."""

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any],
        log_dir: Path,
        *,
        argv: Sequence[str] = ("-m", "worker", "run"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`argv`: what the child's Python runs (`callgate run`, or another entry point that
        reads the same settings); `env`: more variables for it (not `CALLGATE_*` ones)."""
        Settings.model_validate(config)  # a wrong setting fails here, not in the child's log
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._argv = list(argv)
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
        self._env.update(env_of(config))
        self._env.update(env or {})
        self._env["PYTHONPATH"] = str(REPO)
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        #: stopped or killed on purpose (no longer expected to run)
        self.gone = False

    def start(self) -> WorkerProcess:
        assert self.process is None, "one process per WorkerProcess"
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, *self._argv],
                env=self._env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def count(self, needle: str) -> int:
        return self.text().count(needle)

    def tail(self, lines: int = 25) -> str:
        return f"--- {self.name} (pid {self.process and self.process.pid}) ---\n" + "\n".join(
            self.text().splitlines()[-lines:]
        )

    async def wait_log(self, needle: str, count: int = 1, *, timeout_s: float) -> None:
        """Until `needle` is in the log `count` times; AssertionError on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while self.count(needle) < count:
            if not self.alive and not self.paused:
                raise AssertionError(f"{self.name} exited ({self.returncode})\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {needle!r} x{count} within {timeout_s:.0f} s\n{self.tail()}"
                )
            await asyncio.sleep(POLL_S)

    def kill(self) -> None:
        """kill -9 this pid, and reap it."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.paused = False
        self.gone = True

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.gone = True

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None if still running at the deadline."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(POLL_S / 5)
        return self.process.returncode

    async def stop(self, timeout_s: float) -> int:
        """SIGTERM and its exit status; AssertionError (after a kill -9) if it does not exit."""
        self.terminate()
        status = await self.wait_exit(timeout_s)
        if status is None:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout_s} s\n{self.tail()}")
        return status

    def cleanup(self) -> None:
        """Whatever happened: this child does not outlive the test."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


async def until(
    done: Callable[[], bool | Awaitable[bool]],
    what: str,
    *,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
    interval_s: float = POLL_S,
    context: Callable[[], str] = lambda: "",
) -> None:
    """Poll `done()` (plain or awaitable) until it holds; AssertionError at the deadline or as
    soon as `alive()` turns false."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = done()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if not alive():
            raise AssertionError(f"a worker died while waiting for {what}\n{context()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s\n{context()}")
        await asyncio.sleep(interval_s)
