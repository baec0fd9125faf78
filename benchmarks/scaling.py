"""Benchmark 3: cost as the work grows, each point against the seed at the same point.

- argument size (100 B to 1 MB, 10 fragments per call): us per call and ns per argument byte;
- chunk count (1 to 1,000 chunks per call, 10 kB of arguments): us per call and per chunk;
- schema load: 1,000 generated schemas in a temp dir, `SchemaRegistry.load` with each engine
  against building 1,000 `jsonschema.Draft202012Validator`s.

The benchmark-only schema `bench.store_records` (benchmarks/schemas/) takes an array of records,
so one contract serves every size; limits are raised so that 1 MB and 1,000 chunks are legal.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import orjson

from benchmarks import workload
from benchmarks.baseline import load_validators
from benchmarks.common import (
    BENCH_SCHEMAS,
    ENGINES,
    Prepare,
    alternate,
    median,
    one_core,
    paired_ratio,
)
from benchmarks.harness import Callgate, callgate_run, seed_run
from worker.compose import violation_limits
from worker.schemas.registry import SchemaRegistry
from worker.settings import LimitSettings

ENGINE = "jsonschema-rs"
LIMITS = {"max_bytes": 2 * 1024 * 1024, "max_event_bytes": 4 * 1024 * 1024, "max_chunks": 2000}
STORE = workload.Schema(
    "store",
    "store_records",
    "1",
    lambda i: {"records": []},
    lambda i: {"records": "nope"},
)


def _record(n: int) -> dict[str, object]:
    return {"id": n, "name": f"item-{n:06d}", "tags": ["a", "b"], "score": 0.5, "ok": True}


_RECORD_BYTES = len(orjson.dumps(_record(0))) + 1


def _store_calls(count: int, size: int, prefix: str) -> list[workload.Call]:
    per_call = max(0, (size - 14) // _RECORD_BYTES)
    text = orjson.dumps({"records": [_record(n) for n in range(per_call)]}).decode()
    return [
        workload.Call(f"{prefix}s{i}", f"{prefix}{i}", STORE.tool, STORE.version, text)
        for i in range(count)
    ]


def _calls_for(size: int) -> int:
    return max(4, min(2000, 2_000_000 // size))


def _compare(work: list[workload.Call], fragments: int, repeats: int) -> dict[str, Any]:
    records = workload.records(work, fragments)
    callgate = Callgate(BENCH_SCHEMAS, ENGINE, limits=LIMITS)
    seconds = alternate(
        {"seed": seed_run(BENCH_SCHEMAS, records), "callgate": callgate_run(callgate, records)},
        repeats,
    )
    calls = len(work)
    return {
        "calls": calls,
        "argument_bytes": len(work[0].arguments.encode()),
        "chunks_per_call": fragments,
        "callgate_us_per_call": round(median(seconds["callgate"]) / calls * 1e6, 2),
        "seed_us_per_call": round(median(seconds["seed"]) / calls * 1e6, 2),
        "ratio_vs_seed": round(paired_ratio(seconds["seed"], seconds["callgate"]), 2),
    }


def argument_size(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        row = _compare(_store_calls(_calls_for(size), size, f"z{size}-"), 10, repeats)
        row["callgate_ns_per_byte"] = round(
            row["callgate_us_per_call"] * 1000 / row["argument_bytes"], 2
        )
        rows.append(row)
    return rows


def chunk_count(counts: list[int], size: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        calls = max(4, min(1000, 20_000 // count))
        row = _compare(_store_calls(calls, size, f"k{count}-"), count, repeats)
        row["callgate_us_per_chunk"] = round(row["callgate_us_per_call"] / count, 3)
        rows.append(row)
    return rows


def _generate_schemas(directory: Path, count: int) -> None:
    template = json.loads((BENCH_SCHEMAS / "bench" / "place_order.v1.schema.json").read_text())
    for n in range(count):
        domain = directory / f"d{n % 20}"
        domain.mkdir(exist_ok=True)
        (domain / f"tool_{n}.v1.schema.json").write_text(json.dumps(template))


def schema_load(count: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="callgate-bench-schemas-") as tmp:
        directory = Path(tmp)
        _generate_schemas(directory, count)
        limits = violation_limits(LimitSettings())
        runs: dict[str, Prepare] = {
            engine: (lambda e=engine: lambda: SchemaRegistry.load(directory, e, limits=limits))
            for engine in ENGINES
        }
        runs["seed"] = lambda: lambda: load_validators(directory)
        seconds = alternate(runs, repeats)
    out: dict[str, Any] = {"schemas": count, "seed_s": round(median(seconds["seed"]), 3)}
    for engine in ENGINES:
        out[engine] = {
            "seconds": round(median(seconds[engine]), 3),
            "ms_per_schema": round(median(seconds[engine]) / count * 1000, 3),
            "ratio_vs_seed": round(paired_ratio(seconds["seed"], seconds[engine]), 3),
        }
    return out


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
    sizes = [100, 1000] if quick else [100, 1_000, 10_000, 100_000, 1_000_000]
    counts = [1, 10] if quick else [1, 10, 100, 1000]
    with one_core() as cpu:
        body = {
            "argument_size": argument_size(sizes, repeats),
            "chunk_count": chunk_count(counts, 1000 if quick else 10_000, repeats),
            "schema_load": schema_load(20 if quick else 1000, repeats),
        }
    return {
        "description": __doc__.split("\n\n")[0],
        "engine": ENGINE,
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; ratio_vs_seed = seed time / callgate time",
        **body,
    }
