"""Benchmark 1, counted: the core ratios in CPU instructions (valgrind's callgrind).

Seconds on this shared 2-core machine move by tens of percent between repeats; an instruction
count does not (the same binary, input and `PYTHONHASHSEED` give the same count whatever else
the machine is doing). So each contender of the core table (the seed, callgate on both engines,
the native reassembler alone, the floors) runs in a child process under callgrind, twice: with
`n` and with `2 n` calls of the same workload. Instrumentation is off at start (`--instr-
atstart=no`) and the child turns it on (`callgrind_control -i on`) only around its run, after
the imports, the schema compilation and the workload are built; the difference of the two
counts is the cost of `n` calls, the toggling itself cancelled out. Ratios are seed instructions
per call over the contender's. Instructions are not seconds (the interpreter and native code
retire them at different rates), so this is a second opinion on the timed table.

`python -m benchmarks instructions` needs valgrind (Debian's `valgrind` package).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import workload
from benchmarks.common import ENGINES, ROOT, Prepare
from benchmarks.core import SCHEMA_DIRS, TARGETS
from benchmarks.floors import bare_python_gate, envelope_parse_only
from benchmarks.harness import Callgate, assembly_run, callgate_run, seed_run

CONTENDERS = (
    "seed",
    *(f"callgate:{engine}" for engine in ENGINES),
    "assembly_only",
    *(f"bare:{engine}" for engine in ENGINES),
    "envelope_parse_only",
)
QUICK_CONTENDERS = ("seed", "callgate:jsonschema-rs")
ROWS = tuple((label, chunks, "mixed") for label in workload.SCHEMAS for chunks in (10, 100))
#: records per row at the smaller of the two sizes (the calls follow from the chunks per call)
RECORDS = 8_000
_COLLECTED = re.compile(r"Collected : (\d+)")
#: callgrind with instrumentation off until the child turns it on (`_toggle`), no output file
CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null")


def child_run(contender: str, label: str, chunks: int, mix: str, calls: int) -> Prepare:
    """The contender's run over the first `calls` calls of the workload."""
    schema = workload.SCHEMAS[label]
    directory = SCHEMA_DIRS[label]
    records = workload.records(workload.calls(schema, calls, workload.MIXES[mix]), chunks)
    kind, _, engine = contender.partition(":")
    if kind == "seed":
        return seed_run(directory, records)
    if kind == "callgate":
        return callgate_run(Callgate(directory, engine), records)
    if kind == "assembly_only":
        return assembly_run(Callgate(directory, ENGINES[-1]), records)
    if kind == "bare":
        return bare_python_gate(schema.schema_file(directory), engine, records)
    if kind == "envelope_parse_only":
        return envelope_parse_only(records)
    raise ValueError(f"unknown contender {contender!r}")


def _toggle(state: str) -> None:
    """Turn callgrind's instrumentation of this process on or off."""
    done = subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"callgrind_control -i {state} failed: {done.stderr or done.stdout}")


def _count(contender: str, label: str, chunks: int, mix: str, calls: int) -> int:
    """Instructions one child process executes while its instrumentation is on."""
    command = [
        *CALLGRIND,
        sys.executable,
        "-m",
        "benchmarks.instructions",
        contender,
        label,
        str(chunks),
        mix,
        str(calls),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {contender} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def run(
    *,
    records: int = RECORDS,
    rows: tuple[tuple[str, int, str], ...] = ROWS,
    contenders: tuple[str, ...] = CONTENDERS,
    jobs: int = 2,
) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    if "seed" not in contenders:
        raise ValueError("the seed is the baseline of every ratio: it must be a contender")
    # whole groups of the workload's interleaved calls, so that both sizes close every call
    lanes = 8
    sizes = {
        (label, chunks): max(lanes, records // chunks // lanes * lanes) for label, chunks, _ in rows
    }
    jobs_list = [
        (contender, label, chunks, mix, n)
        for label, chunks, mix in rows
        for contender in contenders
        for n in (sizes[(label, chunks)], 2 * sizes[(label, chunks)])
    ]

    # an instruction count does not depend on what else runs: the children share the cores
    def count(job: tuple[str, str, int, str, int]) -> int:
        contender, label, chunks, mix, n = job
        return _count(contender, label, chunks, mix, n)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        counts = dict(zip(jobs_list, pool.map(count, jobs_list), strict=True))
    out_rows: list[dict[str, Any]] = []
    for label, chunks, mix in rows:
        n = sizes[(label, chunks)]
        per_call = {
            c: (counts[(c, label, chunks, mix, 2 * n)] - counts[(c, label, chunks, mix, n)]) / n
            for c in contenders
        }
        seed = per_call["seed"]
        out_rows.append(
            {
                "schema": label,
                "chunks_per_call": chunks,
                "mix": mix,
                "calls": n,
                "instructions_per_call": {c: round(i) for c, i in per_call.items()},
                "ratio_vs_seed": {
                    c: round(seed / i, 2) for c, i in per_call.items() if c != "seed"
                },
                "target": TARGETS[(label, chunks)],
            }
        )
    return {
        "description": __doc__.split("\n\n")[0],
        "statistic": "instructions per call = (count at 2 n calls - count at n calls) / n",
        "rows": out_rows,
    }


def main(argv: list[str]) -> int:
    contender, label, chunks, mix, calls = argv
    go = child_run(contender, label, int(chunks), mix, int(calls))()
    # the garbage of building the workload, collected now: else it is the 2 n run that
    # happens to pass the collector's threshold, and a full pass is charged to its calls
    gc.collect()
    _toggle("on")
    go()
    _toggle("off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
