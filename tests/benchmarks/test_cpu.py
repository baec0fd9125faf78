"""CPU per wall second from /proc samples: the readings of a stat line, the window's figure, and
a real child process sampled while it spins."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import cpu

TICKS = 100

#: a process's command name as the kernel shows it: anything but a newline, up to 15 bytes
names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\x00"),
    max_size=15,
)
ticks = st.integers(min_value=0, max_value=10**9)


def _stat(pid: int, name: str, utime: int, stime: int) -> str:
    """A /proc/<pid>/stat line with every field after the name (52 fields in all)."""
    rest = ["S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0"]
    rest += [str(utime), str(stime), "7", "9"]  # utime, stime, and the children's (not counted)
    rest += ["20", "0", "1", "0", "12345", "1000", "200"] + ["0"] * 30
    return f"{pid} ({name}) " + " ".join(rest) + "\n"


@given(pid=st.integers(1, 4_194_304), name=names, utime=ticks, stime=ticks)
def test_a_process_s_cpu_time_is_its_user_and_system_time_whatever_its_name(
    pid: int, name: str, utime: int, stime: int
) -> None:
    assert cpu.process_cpu_s(_stat(pid, name, utime, stime), TICKS) == (utime + stime) / TICKS


@given(fields=st.lists(ticks, min_size=10, max_size=10))
def test_the_machine_s_busy_time_leaves_out_idle_iowait_and_the_guest_time_in_user(
    fields: list[int],
) -> None:
    user, nice, system, _idle, _iowait, irq, softirq, steal, _guest, _guest_nice = fields
    stat = "cpu  " + " ".join(map(str, fields)) + "\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"
    busy = user + nice + system + irq + softirq + steal
    assert cpu.machine_busy_s(stat, TICKS) == busy / TICKS
    with pytest.raises(ValueError, match="total cpu line"):
        cpu.machine_busy_s("cpu0 " + " ".join(map(str, fields)), TICKS)


def test_the_real_stat_files_read() -> None:
    sample = cpu.read(os.getpid(), cpu.ticks_per_s())
    assert sample is not None
    assert sample.process_s > 0  # this interpreter has run for a while
    assert sample.machine_s > sample.process_s


@given(
    steps=st.lists(
        st.tuples(st.floats(0.001, 1.0), st.floats(0.0, 2.0), st.floats(0.0, 4.0)),
        min_size=0,
        max_size=30,
    ),
    start=st.floats(0.0, 10.0),
    length=st.floats(0.0, 10.0),
)
def test_the_figure_is_of_the_first_and_last_samples_inside_the_window(
    steps: list[tuple[float, float, float]], start: float, length: float
) -> None:
    samples, wall, process, machine = [], 0.0, 0.0, 0.0
    for seconds, process_share, machine_cores in steps:
        wall += seconds
        process += seconds * process_share
        machine += seconds * machine_cores
        samples.append(cpu.Sample(wall, process, machine))
    figure = cpu.per_wall(samples, start, start + length)
    inside = [s for s in samples if start <= s.wall <= start + length]
    if len(inside) < 2:
        assert figure is None
        return
    assert figure is not None
    first, last = inside[0], inside[-1]
    span = last.wall - first.wall
    assert figure["samples"] == len(inside)
    assert figure["sampled_s"] == round(span, 3)
    assert figure["cpu_per_wall_s"] == round((last.process_s - first.process_s) / span, 3)
    assert figure["machine_busy_cores"] == round((last.machine_s - first.machine_s) / span, 3)
    # each step's shares are bounded, so the window's are too
    assert 0 <= figure["cpu_per_wall_s"] <= 2.0 + 1e-3
    assert 0 <= figure["machine_busy_cores"] <= 4.0 + 1e-3


def test_a_spinning_child_is_sampled_until_it_is_gone() -> None:
    """A child busy on one core: its samples show CPU time growing, and a figure between 0 and
    one core per wall second; the sampler ends by itself once the child is gone."""

    async def scenario() -> None:
        child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        samples: list[cpu.Sample] = []
        sampler = asyncio.create_task(cpu.sample(child.pid, samples, period_s=0.01))
        try:
            deadline = time.monotonic() + 60
            while (not samples or samples[-1].process_s < 0.2) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert samples, "the child was never sampled"
            assert samples[-1].process_s >= 0.2, "the child never ran 0.2 s"
        finally:
            child.kill()
            child.wait(10)
        # reaped, its /proc entry is gone: the sampler returns without being cancelled
        await asyncio.wait_for(sampler, timeout=10)
        figure = cpu.per_wall(samples, samples[0].wall, samples[-1].wall)
        assert figure is not None
        assert 0 < figure["cpu_per_wall_s"] <= 1.05  # one thread: at most one core
        assert figure["machine_busy_cores"] >= figure["cpu_per_wall_s"] - 0.05

    asyncio.run(scenario())
