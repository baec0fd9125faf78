"""The demo's approver: decides its run's calls pending approval as a person would, with
`callgate approve EVENT_ID` / `callgate deny EVENT_ID` (`worker.runtime.approve_cli`).

Each call's decision is named by its call id (`traffic.REFUND_DECISIONS`). Once the call's
`pending_approval` event is read, the approver runs the installed `callgate` command (the entry
point beside this Python; `python -m worker` where it is not installed) as a subprocess, pointed
at the demo's cluster and topics through `CALLGATE_*` variables, and prints what it printed: the
call, its fingerprint, and the decision written. The worker then rules on the decision: the
approved call reaches the validated topic (and the executor) once, the denied one ends
`approval_denied`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from callgate_demo.traffic import REFUND_DECISIONS
from worker.settings import Settings

#: how long one `callgate approve` / `deny` may take, start to exit
DECISION_TIMEOUT_S = 30.0


def callgate_command() -> list[str]:
    """The `callgate` command as installed beside this Python (else its module)."""
    script = Path(sys.executable).with_name("callgate")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "worker"]


class Approver:
    """Decides this run's calls pending approval through the command line."""

    def __init__(self, settings: Settings, out: TextIO) -> None:
        kafka, topics = settings.kafka, settings.topics
        self._env = {
            **os.environ,
            "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka.bootstrap_servers),
            "CALLGATE_TOPICS__PENDING_APPROVAL": topics.pending_approval,
            "CALLGATE_TOPICS__ACCEPTED": topics.accepted,
            "CALLGATE_TOPICS__REJECTED": topics.rejected,
        }
        self._out = out
        self._asked: set[str] = set()
        self._tasks: list[asyncio.Task[int]] = []
        #: decisions whose command exited 0 (written), and those that did not
        self.written = 0
        self.failed = 0

    def see(self, event: dict[str, Any]) -> None:
        """A `pending_approval` event of this run: its decision is started, once."""
        event_id = str(event.get("event_id"))
        decision = REFUND_DECISIONS.get(str(event.get("call_id", "")).rsplit(":", 1)[-1])
        if decision is None or event_id in self._asked:
            return
        self._asked.add(event_id)
        self._tasks.append(asyncio.create_task(self._decide(decision, event_id)))

    @property
    def settled(self) -> bool:
        """Every decision started has ended (written or failed)."""
        return all(task.done() for task in self._tasks)

    async def _decide(self, decision: str, event_id: str) -> int:
        argv = [*callgate_command(), decision, event_id, "--by", "callgate-demo"]
        argv += ["--reason", f"the demo's {decision} of a refund"]
        print(f"$ callgate {decision} {event_id} --by callgate-demo", file=self._out, flush=True)
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=self._env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            printed, _ = await asyncio.wait_for(process.communicate(), DECISION_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            printed = f"(no exit after {DECISION_TIMEOUT_S:.0f} s: stopped)\n".encode()
        except asyncio.CancelledError:
            process.kill()
            await process.wait()
            raise
        for line in printed.decode("utf-8", "replace").splitlines():
            print(f"  {line}", file=self._out, flush=True)
        status = process.returncode if process.returncode is not None else -1
        if status == 0:
            self.written += 1
        else:
            self.failed += 1
            print(f"  callgate {decision} exited with status {status}", file=self._out)
        return status

    async def close(self) -> None:
        """Wait for (or, past the demo's end, stop) the decisions still running."""
        for task in self._tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
