"""Benchmark 1: core throughput on one core, no Kafka, against the seed's design.

Calls/s of decode + reassembly + strict parse (duplicate keys detected) + validation + event
encoding, 10 fragments per call fed as canonical envelope bytes through `Processor.feed`, for the
small (get_weather v1) and large (benchmark-only place_order, 17 properties) schemas, for the
valid / mixed (20 % invalid) / invalid mixes, for both engines; the seed (`json.loads` per chunk,
join, `json.loads`, `jsonschema.Draft202012Validator` built once) runs in the same repeat loop, and
so do the floors (`benchmarks.floors`) that bound what any per-record Python design can reach.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import workload
from benchmarks.common import (
    BENCH_SCHEMAS,
    ENGINES,
    SEED_SCHEMAS,
    alternate,
    median,
    one_core,
    paired_ratio,
)
from benchmarks.floors import bare_python_gate, envelope_parse_only
from benchmarks.harness import callgate_run, outcomes, processor_factory, seed_run

TARGETS = {"fastjsonschema": 10.0, "jsonschema-rs": 20.0}
SCHEMA_DIRS = {"small": SEED_SCHEMAS, "large": BENCH_SCHEMAS}


def run(*, calls: int = 4000, repeats: int = 5, fragments: int = 10) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with one_core() as cpu:
        for label, schema in workload.SCHEMAS.items():
            directory: Path = SCHEMA_DIRS[label]
            for mix, share in workload.MIXES.items():
                records = workload.records(workload.calls(schema, calls, share), fragments)
                schema_file = schema.schema_file(directory)
                runs = {
                    "seed": seed_run(directory, records),
                    "floor": envelope_parse_only(records),
                }
                makers = {}
                for engine in ENGINES:
                    makers[engine] = processor_factory(directory, engine)
                    runs[engine] = callgate_run(makers[engine], records)
                    runs[f"bare:{engine}"] = bare_python_gate(schema_file, engine, records)
                seconds = alternate(runs, repeats)
                seed_rate = calls / median(seconds["seed"])
                row: dict[str, Any] = {
                    "schema": label,
                    "tool": schema.tool,
                    "mix": mix,
                    "invalid_share": share,
                    "calls": calls,
                    "fragments_per_call": fragments,
                    "seed_calls_per_s": round(seed_rate),
                    # the best ratio any per-record design could reach: orjson.loads per
                    # envelope and nothing else (no reassembly, parse, validation or event)
                    "ceiling_ratio_envelope_parse_only": round(
                        paired_ratio(seconds["seed"], seconds["floor"]), 1
                    ),
                    "engines": {},
                }
                for engine in ENGINES:
                    rate = calls / median(seconds[engine])
                    ratio = paired_ratio(seconds["seed"], seconds[engine])
                    row["engines"][engine] = {
                        "calls_per_s": round(rate),
                        "chunks_per_s": round(rate * fragments),
                        "ratio_vs_seed": round(ratio, 2),
                        # the least any Python gate could do on this engine (benchmarks.floors)
                        "bare_python_gate_ratio": round(
                            paired_ratio(seconds["seed"], seconds[f"bare:{engine}"]), 1
                        ),
                        "target": TARGETS[engine],
                        "meets_target": ratio >= TARGETS[engine],
                        "outcomes": outcomes(makers[engine], records),
                    }
                rows.append(row)
    return {
        "description": __doc__.split("\n\n")[0],
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; ratio = median of per-repeat seed_s / callgate_s",
        "rows": rows,
    }
