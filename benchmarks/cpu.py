"""CPU per wall second of a child process, and of the machine, over a window (Linux `/proc`).

A sampler reads `/proc/<pid>/stat` (the process's user + system time, all its threads) and the
first line of `/proc/stat` (the machine's busy time, every core) every `PERIOD_S`, each sample
stamped with the wall clock (`time.time()`, the clock the broker's record timestamps are in).
Over a window (in the e2e benchmark: from the first output record's timestamp to the last
one's, while the contender drains a backlog) the figure is the CPU seconds between the first
and the last sample inside the window over the wall seconds between them: 1.0 is one core busy
all the time; the machine's figure is in busy cores (2.0: both cores of this machine).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: how often a process is sampled (the kernel counts CPU time in ticks of 10 ms here)
PERIOD_S = 0.02
#: `/proc/stat`'s cpu fields counted as idle: idle and iowait (the rest is busy; guest time
#: is inside user time already, so it is not counted twice)
_IDLE_FIELDS = (3, 4)
_GUEST_FIELDS = (8, 9)


def ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


def process_cpu_s(stat: str, ticks: int) -> float:
    """User + system seconds from a `/proc/<pid>/stat` line. The command name (field 2) is in
    parentheses and may hold spaces or parentheses itself: fields are counted after its last
    `)`; utime and stime are fields 14 and 15."""
    after_name = stat[stat.rindex(")") + 2 :].split()
    # after the name, field 3 (state) is index 0: utime (14) is index 11, stime (15) index 12
    return (int(after_name[11]) + int(after_name[12])) / ticks


def machine_busy_s(stat: str, ticks: int) -> float:
    """Busy seconds of every core from `/proc/stat`'s first (`cpu `) line."""
    line = stat.splitlines()[0]
    if not line.startswith("cpu "):
        raise ValueError(f"not /proc/stat's total cpu line: {line!r}")
    fields = [int(value) for value in line.split()[1:]]
    counted = [
        value
        for index, value in enumerate(fields)
        if index not in _IDLE_FIELDS and index not in _GUEST_FIELDS
    ]
    return sum(counted) / ticks


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading: the wall clock, the process's CPU seconds, the machine's busy seconds."""

    wall: float
    process_s: float
    machine_s: float


def per_wall(samples: Sequence[Sample], start: float, end: float) -> dict[str, Any] | None:
    """The process's CPU seconds and the machine's busy cores per wall second between the first
    and the last sample inside [start, end]; None when fewer than two samples fall in it (a
    window shorter than the sampling period)."""
    inside = [s for s in samples if start <= s.wall <= end]
    if len(inside) < 2 or inside[-1].wall <= inside[0].wall:
        return None
    first, last = inside[0], inside[-1]
    wall = last.wall - first.wall
    return {
        "cpu_per_wall_s": round((last.process_s - first.process_s) / wall, 3),
        "machine_busy_cores": round((last.machine_s - first.machine_s) / wall, 3),
        "sampled_s": round(wall, 3),
        "samples": len(inside),
    }


def read(pid: int, ticks: int) -> Sample | None:
    """A sample of `pid` now; None once the process is gone."""
    try:
        process = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    machine = Path("/proc/stat").read_text()
    return Sample(time.time(), process_cpu_s(process, ticks), machine_busy_s(machine, ticks))


async def sample(pid: int, into: list[Sample], period_s: float = PERIOD_S) -> None:
    """Append a sample of `pid` to `into` every `period_s` until it is gone or this is
    cancelled."""
    ticks = ticks_per_s()
    while (reading := read(pid, ticks)) is not None:
        into.append(reading)
        await asyncio.sleep(period_s)
