"""What every benchmark shares: timing by repeats, the median, pinning, and the results file.

Every figure a benchmark reports is a ratio against a baseline measured in the same process, in
the same repeat loop (the two alternate, so a noisy neighbour slows both), and the median of the
repeats. Results go to `benchmarks/results/<name>.json` with the command that produced them.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
BENCH_SCHEMAS = Path(__file__).resolve().parent / "schemas"
SEED_SCHEMAS = ROOT / "schemas"
ENGINES = ("fastjsonschema", "jsonschema-rs")


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def timed(run: Callable[[], object]) -> float:
    """Seconds one run takes. The collector stays on (the real worker has it on), but what exists
    before the run (the prepared input) is frozen out of it, as a consumer's input would be
    short-lived rather than a heap of 100,000 records."""
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Each run `repeats` times, interleaved (a, b, a, b, ...): seconds per run, by name."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            seconds[name].append(timed(run))
    return seconds


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median of repeat-by-repeat ratios (each pair measured back to back)."""
    return median([n / d for n, d in zip(numerator, denominator, strict=True)])


@contextmanager
def one_core() -> Iterator[int | None]:
    """Pin this process to one CPU for the duration (Linux); yields the CPU or None."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    cpu = max(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "fastjsonschema": version("fastjsonschema"),
        "jsonschema_rs": version("jsonschema-rs"),
        "jsonschema": version("jsonschema"),
        "orjson": orjson.__version__,
    }


def command_line() -> str:
    return "python -m benchmarks " + " ".join(sys.argv[1:])


def write_results(name: str, body: dict[str, Any], out_dir: Path | None = None) -> Path:
    out = out_dir or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "command": command_line(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(),
        **body,
    }
    path = out / f"{name}.json"
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return path
