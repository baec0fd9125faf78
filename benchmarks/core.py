"""Benchmark 1: core throughput on one core, no Kafka, against the seed's design.

Calls/s of envelope decode + reassembly + strict parse (duplicate keys detected) + validation +
event encoding: `Processor.feed` (from `worker.compose.build_processor`) on canonical envelope
records, one fetched batch of 2,000 at a time, as the worker feeds it. Rows: the small
(get_weather v1) and large (benchmark-only place_order, 17 properties) schemas, at 10 and at 100
chunks per call, the valid and mixed (20 % invalid) workloads; both engines. In the same repeat
loop: the seed (`json.loads` per chunk, join, `json.loads`, `jsonschema.Draft202012Validator`
built once), the native reassembler alone (decode + reassembly, no gate, no event: the share of
callgate's time that is Rust per chunk) and the Python floors (`benchmarks.floors`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import workload
from benchmarks.common import (
    BENCH_SCHEMAS,
    ENGINES,
    SEED_SCHEMAS,
    Prepare,
    alternate,
    median,
    one_core,
    paired_ratio,
)
from benchmarks.floors import bare_python_gate, envelope_parse_only
from benchmarks.harness import (
    Callgate,
    agreement,
    assembly_run,
    callgate_run,
    outcomes,
    seed_run,
    seed_verdicts,
    verdicts,
)

SCHEMA_DIRS = {"small": SEED_SCHEMAS, "large": BENCH_SCHEMAS}
CHUNKS = (10, 100)
MIXES = ("valid", "mixed")
#: the issue's targets, callgate calls/s over the seed's, by (schema, chunks per call); both engines
TARGETS = {("small", 10): 5.0, ("small", 100): 10.0, ("large", 10): 12.0, ("large", 100): 12.0}
#: records per row (the calls per row follow from the chunks per call)
RECORDS = 40_000


def row(
    *,
    label: str,
    chunks: int,
    mix: str,
    calls: int,
    repeats: int,
    callgates: dict[str, Callgate],
) -> dict[str, Any]:
    schema = workload.SCHEMAS[label]
    directory: Path = SCHEMA_DIRS[label]
    work = workload.calls(schema, calls, workload.MIXES[mix])
    records = workload.records(work, chunks)
    schema_file = schema.schema_file(directory)
    runs: dict[str, Prepare] = {
        "seed": seed_run(directory, records),
        "envelope_parse_only": envelope_parse_only(records),
        "assembly_only": assembly_run(callgates[ENGINES[-1]], records),
    }
    for engine in ENGINES:
        runs[engine] = callgate_run(callgates[engine], records)
        runs[f"bare:{engine}"] = bare_python_gate(schema_file, engine, records)
    seconds = alternate(runs, repeats)
    seed_judged = seed_verdicts(directory, records)
    defects = {call.call_id: call.defect for call in work}
    target = TARGETS[(label, chunks)]
    out: dict[str, Any] = {
        "schema": label,
        "tool": schema.tool,
        "chunks_per_call": chunks,
        "mix": mix,
        "invalid_share": workload.MIXES[mix],
        "calls": calls,
        "records": len(records),
        "seed_calls_per_s": round(calls / median(seconds["seed"])),
        "seed_outcomes": outcomes(seed_judged),
        # what no per-record Python design can beat: orjson.loads per envelope, nothing else
        "envelope_parse_only_ratio": round(
            paired_ratio(seconds["seed"], seconds["envelope_parse_only"]), 2
        ),
        # the native reassembler alone: decode + reassembly, in Rust, no gate and no event
        "assembly_only_ratio": round(paired_ratio(seconds["seed"], seconds["assembly_only"]), 2),
        "target": target,
        "engines": {},
    }
    for engine in ENGINES:
        ratio = paired_ratio(seconds["seed"], seconds[engine])
        judged = verdicts(callgates[engine], records)
        out["engines"][engine] = {
            "calls_per_s": round(calls / median(seconds[engine])),
            "records_per_s": round(len(records) / median(seconds[engine])),
            "ratio_vs_seed": round(ratio, 2),
            "meets_target": ratio >= target,
            # the share of callgate's time spent in the native reassembler (the rest: the gate
            # and the event, per call, mostly Python)
            "assembly_share": round(paired_ratio(seconds["assembly_only"], seconds[engine]), 3),
            "bare_python_gate_ratio": round(
                paired_ratio(seconds["seed"], seconds[f"bare:{engine}"]), 2
            ),
            "outcomes": outcomes(judged),
            "agreement_with_seed": agreement(judged, seed_judged, defects),
        }
    return out


def run(*, records: int = RECORDS, repeats: int = 5) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with one_core() as cpu:
        for label in workload.SCHEMAS:
            callgates = {engine: Callgate(SCHEMA_DIRS[label], engine) for engine in ENGINES}
            for chunks in CHUNKS:
                calls = max(10, records // chunks)
                for mix in MIXES:
                    rows.append(
                        row(
                            label=label,
                            chunks=chunks,
                            mix=mix,
                            calls=calls,
                            repeats=repeats,
                            callgates=callgates,
                        )
                    )
    return {
        "description": __doc__.split("\n\n")[0],
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; ratio = median of per-repeat seed_s / contender_s",
        "targets": {f"{label}/{chunks}": t for (label, chunks), t in TARGETS.items()},
        "rows": rows,
    }
