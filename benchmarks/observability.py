"""Benchmark 4: the cost of observability, the same core run with metrics on and off.

"On" is what the runner does per outcome: `Metrics.observe(verdict, tool)` on a real
`worker.metrics.Metrics` (its own Prometheus registry), plus `add_chunks` per record; "off" feeds
the same records through the same Processor and observes nothing. One core, valid and mixed
workloads, small and large schemas, jsonschema-rs. The figures are the slowdown ratio off/on and,
steadier on a noisy machine, the metrics work alone (the same updates on verdicts judged
beforehand) as a share of the core run, in the same run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import workload
from benchmarks.common import alternate, median, one_core, paired_ratio
from benchmarks.core import SCHEMA_DIRS
from benchmarks.harness import Run, processor_factory
from worker.core.processor import InboundRecord, Processor
from worker.metrics import Metrics

ENGINE = "jsonschema-rs"


def _with_metrics(make: Callable[[], Processor], records: Sequence[InboundRecord]) -> Run:
    def run() -> int:
        processor = make()
        metrics = Metrics(processor.tool_names, engine=ENGINE)
        observe, add_chunks = metrics.observe, metrics.add_chunks
        emitted = 0
        for record in records:
            emissions = processor.feed(record, 0.0)
            add_chunks()
            for emission in emissions:
                observe(emission.verdict, emission.call.tool)
                emitted += 1
        return emitted

    return run


def _without(make: Callable[[], Processor], records: Sequence[InboundRecord]) -> Run:
    def run() -> int:
        processor = make()
        emitted = 0
        for record in records:
            emitted += len(processor.feed(record, 0.0))
        return emitted

    return run


def _metrics_alone(make: Callable[[], Processor], records: Sequence[InboundRecord]) -> Run:
    """Only the metrics work of a run, on verdicts judged once beforehand: the same updates the
    "on" run makes, without the core around them, so their share is not lost in the noise."""
    processor = make()
    emissions = [e for record in records for e in processor.feed(record, 0.0)]
    tools = processor.tool_names

    def run() -> int:
        metrics = Metrics(tools, engine=ENGINE)
        observe, add_chunks = metrics.observe, metrics.add_chunks
        for _ in records:
            add_chunks()
        for emission in emissions:
            observe(emission.verdict, emission.call.tool)
        return len(emissions)

    return run


def run(*, calls: int = 4000, repeats: int = 7, fragments: int = 10) -> dict[str, Any]:
    rows = []
    with one_core() as cpu:
        for label, schema in workload.SCHEMAS.items():
            make = processor_factory(SCHEMA_DIRS[label], ENGINE)
            for mix in ("valid", "mixed"):
                records = workload.records(
                    workload.calls(schema, calls, workload.MIXES[mix]), fragments
                )
                seconds = alternate(
                    {
                        "off": _without(make, records),
                        "on": _with_metrics(make, records),
                        "metrics_alone": _metrics_alone(make, records),
                    },
                    repeats,
                )
                rows.append(
                    {
                        "schema": label,
                        "mix": mix,
                        "calls": calls,
                        "calls_per_s_metrics_off": round(calls / median(seconds["off"])),
                        "calls_per_s_metrics_on": round(calls / median(seconds["on"])),
                        "throughput_on_vs_off": round(
                            paired_ratio(seconds["off"], seconds["on"]), 3
                        ),
                        "overhead_us_per_call": round(
                            (median(seconds["on"]) - median(seconds["off"])) / calls * 1e6, 2
                        ),
                        "metrics_alone_us_per_call": round(
                            median(seconds["metrics_alone"]) / calls * 1e6, 2
                        ),
                        "metrics_share_of_core": round(
                            paired_ratio(seconds["metrics_alone"], seconds["off"]), 3
                        ),
                    }
                )
    return {
        "description": __doc__.split("\n\n")[0],
        "engine": ENGINE,
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; throughput_on_vs_off = median of per-repeat off_s / on_s",
        "rows": rows,
    }
