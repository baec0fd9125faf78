"""What every benchmark shares: timing by repeats, the median, pinning, and the results file.

Every figure a benchmark reports is a ratio against a baseline measured in the same process, in
the same repeat loop (the two alternate, so a noisy neighbour slows both), and the median of the
repeats. Results go to `benchmarks/results/<name>.json` with the command that produced them.
"""

from __future__ import annotations

import gc
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

from worker.settings import KafkaSettings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
BENCH_SCHEMAS = Path(__file__).resolve().parent / "schemas"
SEED_SCHEMAS = ROOT / "schemas"
ENGINES = ("fastjsonschema", "jsonschema-rs")
#: records per fetched batch, as the worker fetches them (`CALLGATE_KAFKA__FETCH_MAX_RECORDS`)
BATCH = KafkaSettings().fetch_max_records


def median(values: list[float]) -> float:
    return float(statistics.median(values))


#: A contender: called once per repeat, untimed, it returns the run to time (fresh state each
#: repeat: a new processor, a new seed buffer map, so repeats never see each other's calls).
Prepare = Callable[[], Callable[[], object]]


def timed(run: Callable[[], object]) -> float:
    """Seconds one run takes. The collector stays on (the real worker has it on), but what exists
    before the run (the prepared input) is frozen out of it, as a consumer's input would be
    short-lived rather than a heap of 100,000 records."""
    gc.collect()
    gc.freeze()
    try:
        started = time.perf_counter()
        run()
        return time.perf_counter() - started
    finally:
        gc.unfreeze()


def alternate(runs: dict[str, Prepare], repeats: int) -> dict[str, list[float]]:
    """Each contender `repeats` times, interleaved (a, b, a, b, ...): seconds per run, by name."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, prepare in runs.items():
            seconds[name].append(timed(prepare()))
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


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return done.stdout if done.returncode == 0 else ""


def code_under_test() -> dict[str, Any]:
    """The commit, the tracked files that differ from it outside the benchmarks (the code
    measured is the commit's only when that list is empty), and the native build's digest."""
    changed = [
        line[3:]
        for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not line[3:].startswith(("benchmarks/", "tests/benchmarks/"))
    ]
    commit = _git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return {"commit": commit, "changed": changed, "native": native_build()}


def native_build() -> str:
    """The first 16 hex digits of the SHA-256 of the `worker._native` extension imported."""
    import worker._native  # noqa: PLC0415

    path = Path(worker._native.__file__ or "")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "unknown"


def environment() -> dict[str, Any]:
    return {
        "code": code_under_test(),
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
