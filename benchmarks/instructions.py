"""Benchmark 1, counted: the core ratios in CPU instructions (valgrind's callgrind).

Seconds on this shared 2-core machine move by tens of percent between repeats; an instruction
count does not (the same binary, input and `PYTHONHASHSEED` give the same count whatever else
the machine is doing). So each contender of the core table (the seed, callgate on both engines,
the floors) runs in a child process under callgrind, twice: with `calls` and with `2 * calls` of
the same workload. The difference is the cost of `calls` calls, start-up and set-up (imports,
schema compilation, building the workload) cancelled out. Ratios are seed instructions per call
over the contender's. Instructions are not seconds (the interpreter and orjson's C code retire
them at different rates), so this is a second opinion on the timed table, not a replacement.

`python -m benchmarks instructions` needs valgrind (Debian's `valgrind` package).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import workload
from benchmarks.common import ENGINES, ROOT
from benchmarks.core import SCHEMA_DIRS, TARGETS
from benchmarks.floors import bare_python_gate, envelope_parse_only
from benchmarks.harness import Run, callgate_run, processor_factory, seed_run

CONTENDERS = (
    "seed",
    *(f"callgate:{engine}" for engine in ENGINES),
    *(f"bare:{engine}" for engine in ENGINES),
    "envelope_parse_only",
)
_COLLECTED = re.compile(r"Collected : (\d+)")


def child_run(contender: str, label: str, mix: str, calls: int, total: int) -> Run:
    """The contender's run over the first `calls` of a `total`-call workload (same set-up)."""
    schema = workload.SCHEMAS[label]
    directory = SCHEMA_DIRS[label]
    records = workload.records(workload.calls(schema, total, workload.MIXES[mix]), 10)
    records = records[: calls * 10]
    kind, _, engine = contender.partition(":")
    if kind == "seed":
        return seed_run(directory, records)
    if kind == "callgate":
        return callgate_run(processor_factory(directory, engine), records)
    if kind == "bare":
        schema_file = schema.schema_file(directory)
        return bare_python_gate(schema_file, engine, records)
    if kind == "envelope_parse_only":
        return envelope_parse_only(records)
    raise ValueError(f"unknown contender {contender!r}")


def _count(contender: str, label: str, mix: str, calls: int, total: int) -> int:
    """Instructions one child process executes, start to end, under callgrind."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.instructions",
        contender,
        label,
        mix,
        str(calls),
        str(total),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {contender} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def run(
    *,
    calls: int = 800,
    rows: tuple[tuple[str, str], ...] | None = None,
    contenders: tuple[str, ...] = CONTENDERS,
    jobs: int = 2,
) -> dict[str, Any]:
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    if "seed" not in contenders:
        raise ValueError("the seed is the baseline of every ratio: it must be a contender")
    rows = rows or tuple((label, mix) for label in workload.SCHEMAS for mix in ("valid", "mixed"))
    jobs_list = [
        (contender, label, mix, n)
        for label, mix in rows
        for contender in contenders
        for n in (calls, 2 * calls)
    ]
    # an instruction count does not depend on what else runs: the children share the cores
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        counted = pool.map(lambda job: _count(*job, total=2 * calls), jobs_list)
        counts = dict(zip(jobs_list, counted, strict=True))
    out_rows: list[dict[str, Any]] = []
    for label, mix in rows:
        per_call = {
            c: (counts[(c, label, mix, 2 * calls)] - counts[(c, label, mix, calls)]) / calls
            for c in contenders
        }
        seed = per_call["seed"]
        out_rows.append(
            {
                "schema": label,
                "mix": mix,
                "instructions_per_call": {c: round(n) for c, n in per_call.items()},
                "ratio_vs_seed": {
                    c: round(seed / n, 2) for c, n in per_call.items() if c != "seed"
                },
                "targets": {
                    f"callgate:{engine}": target
                    for engine, target in TARGETS.items()
                    if f"callgate:{engine}" in contenders
                },
            }
        )
    return {
        "description": __doc__.split("\n\n")[0],
        "calls": calls,
        "statistic": "instructions per call = (count at 2 * calls - count at calls) / calls",
        "rows": out_rows,
    }


if __name__ == "__main__":
    contender, label, mix, calls, total = sys.argv[1:6]
    child_run(contender, label, mix, int(calls), int(total))()
