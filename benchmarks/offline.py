"""Offline: `callgate check` as a whole process against the seed's design as a whole process.

Both read the same JSON-lines file of canonical envelopes (50,000 `get_weather` calls of 10
chunks, valid and mixed with 20 % invalid, 8 calls interleaved) and write one event per call to a
file; each is a fresh interpreter, so the figure includes what a user waits for: start-up
(imports, compiling the contracts), reading, judging and writing. The seed is
`python -m benchmarks.baseline` (`SeedGate`: `json.loads` per envelope, `jsonschema` built once,
`json.dumps` per event); callgate is `python -m worker check --schemas schemas --engine E`.
Contenders alternate in each repeat, pinned to one CPU (children inherit it). Wall time is the
figure (CPU time, from the children's rusage, beside it); a process of each on a one-call file
says how much of it is start-up. Both outputs are read back: the run counts only if each wrote
one event per call and they accept the same calls (save the duplicate keys the seed cannot see).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks import workload
from benchmarks.common import ENGINES, ROOT, SEED_SCHEMAS, median, one_core, paired_ratio
from benchmarks.harness import agreement, outcomes

CALLS = 50_000
CHUNKS = 10
MIXES = ("valid", "mixed")
#: the issue's target: callgate check's speed over the seed's, as a whole process
TARGET = 4.0


def _commands(schemas: Path, source: Path) -> dict[str, list[str]]:
    commands = {"seed": [sys.executable, "-m", "benchmarks.baseline", str(schemas), str(source)]}
    for engine in ENGINES:
        commands[engine] = [
            sys.executable,
            *("-m", "worker", "check", "--schemas", str(schemas), "--engine", engine),
            *("--format", "callgate.envelope", str(source)),
        ]
    return commands


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one process, its events written to `out`."""
    cpu = _children_cpu()
    started = time.perf_counter()
    with out.open("wb") as sink:
        done = subprocess.run(
            command, cwd=ROOT, stdout=sink, stderr=subprocess.PIPE, check=False, timeout=1800
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[2:4]} exited {done.returncode}: {done.stderr[-2000:]!r}")
    return wall, _children_cpu() - cpu


def _judged(events: Path) -> dict[str, str]:
    """call_id -> error code or outcome, from one contender's events."""
    judged: dict[str, str] = {}
    for line in events.read_bytes().splitlines():
        event = orjson.loads(line)
        if event["call_id"] in judged:
            raise RuntimeError(f"{events.name}: two events for call {event['call_id']!r}")
        judged[event["call_id"]] = event.get("error_code") or event["outcome"]
    return judged


def _write(records: list[workload.Record], path: Path) -> None:
    path.write_bytes(b"".join((record.value or b"") + b"\n" for record in records))


def row(*, mix: str, calls: int, repeats: int, scratch: Path) -> dict[str, Any]:
    work = workload.calls(workload.SCHEMAS["small"], calls, workload.MIXES[mix])
    source = scratch / f"{mix}.jsonl"
    _write(workload.records(work, CHUNKS), source)
    one_call = scratch / f"{mix}-one.jsonl"
    _write(workload.records(work[:1], CHUNKS), one_call)
    commands = _commands(SEED_SCHEMAS, source)
    startup_commands = _commands(SEED_SCHEMAS, one_call)
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    startup: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            startup[name].append(_timed(startup_commands[name], scratch / f"{name}.one")[0])
            seconds, used = _timed(command, scratch / f"{name}.events")
            wall[name].append(seconds)
            cpu[name].append(used)
    defects = {call.call_id: call.defect for call in work}
    seed_judged = _judged(scratch / "seed.events")
    out: dict[str, Any] = {
        "schema": "small",
        "chunks_per_call": CHUNKS,
        "mix": mix,
        "invalid_share": workload.MIXES[mix],
        "calls": calls,
        "records": calls * CHUNKS,
        "target": TARGET,
        "seed": {
            "wall_s": round(median(wall["seed"]), 3),
            "cpu_s": round(median(cpu["seed"]), 3),
            "startup_s": round(median(startup["seed"]), 3),
            "outcomes": outcomes(seed_judged),
        },
        "engines": {},
    }
    for engine in ENGINES:
        judged = _judged(scratch / f"{engine}.events")
        ratio = paired_ratio(wall["seed"], wall[engine])
        # the ratio with each side's one-call process subtracted: judging alone (None where a
        # tiny run is all start-up)
        judging = median(wall[engine]) - median(startup[engine])
        beyond_startup = (
            round((median(wall["seed"]) - median(startup["seed"])) / judging, 2)
            if judging > 0
            else None
        )
        out["engines"][engine] = {
            "wall_s": round(median(wall[engine]), 3),
            "cpu_s": round(median(cpu[engine]), 3),
            "startup_s": round(median(startup[engine]), 3),
            "ratio_vs_seed": round(ratio, 2),
            "cpu_ratio_vs_seed": round(paired_ratio(cpu["seed"], cpu[engine]), 2),
            "ratio_beyond_startup": beyond_startup,
            "meets_target": ratio >= TARGET,
            "outcomes": outcomes(judged),
            "agreement_with_seed": agreement(judged, seed_judged, defects),
        }
    return out


def run(*, calls: int = CALLS, repeats: int = 3) -> dict[str, Any]:
    with one_core() as cpu, tempfile.TemporaryDirectory(prefix="callgate-offline-") as scratch:
        rows = [row(mix=mix, calls=calls, repeats=repeats, scratch=Path(scratch)) for mix in MIXES]
    return {
        "description": __doc__.split("\n\n")[0],
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; ratio = median of per-repeat seed_s / callgate_s",
        "target": TARGET,
        "rows": rows,
    }
