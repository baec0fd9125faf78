"""Benchmark: the cost of observability, the same core run with metrics on and off.

"On" is what the worker does per fetched batch (`worker.runtime.judging.Judge.round`):
`Metrics.add_records`, `Metrics.observe(verdict, tool)` per outcome, and the open-call and
buffered-byte gauges, on a real `worker.metrics.Metrics` (its own Prometheus registry); "off"
feeds the same records through the same processor and observes nothing. One core, valid and
mixed workloads, small and large schemas, jsonschema-rs. The figures are the throughput ratio
on/off and, steadier on a noisy machine, the metrics work alone (the same updates on verdicts
judged beforehand) as a share of the core run, in the same run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import workload
from benchmarks.common import BATCH, Prepare, alternate, median, one_core, paired_ratio
from benchmarks.core import SCHEMA_DIRS
from benchmarks.harness import Callgate
from benchmarks.workload import TOPIC, Record, batches
from worker.compose import tool_labels
from worker.metrics import Metrics

ENGINE = "jsonschema-rs"


def _metrics(callgate: Callgate) -> Metrics:
    return Metrics(tool_labels(callgate.registry), engine=ENGINE)


def _with_metrics(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        processor, metrics = callgate.processor(), _metrics(callgate)
        feed, observe, assembler = processor.feed, metrics.observe, processor.assembler

        def run() -> int:
            emitted = 0
            for batch in fetched:
                metrics.add_records(len(batch))
                for emission in feed(TOPIC, 0, batch):
                    observe(emission.verdict, emission.call.tool)
                    emitted += 1
                metrics.set_open_calls(assembler.open_calls)
                metrics.set_buffered_bytes(assembler.buffered_bytes)
            return emitted

        return run

    return prepare


def _without(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        feed = callgate.processor().feed
        return lambda: sum(len(feed(TOPIC, 0, batch)) for batch in fetched)

    return prepare


def _metrics_alone(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    """Only the metrics work of a run, on verdicts judged once beforehand: the same updates the
    "on" run makes, without the core around them, so their share is not lost in the noise."""
    fetched = batches(records, BATCH)
    processor = callgate.processor()
    judged = [
        [(e.verdict, e.call.tool) for e in processor.feed(TOPIC, 0, batch)] for batch in fetched
    ]

    def prepare() -> Callable[[], int]:
        metrics = _metrics(callgate)
        observe = metrics.observe

        def run() -> int:
            for batch, outcomes in zip(fetched, judged, strict=True):
                metrics.add_records(len(batch))
                for verdict, tool in outcomes:
                    observe(verdict, tool)
                metrics.set_open_calls(0)
                metrics.set_buffered_bytes(0)
            return len(judged)

        return run

    return prepare


def run(*, calls: int = 4000, repeats: int = 7, fragments: int = 10) -> dict[str, Any]:
    rows = []
    with one_core() as cpu:
        for label, schema in workload.SCHEMAS.items():
            callgate = Callgate(SCHEMA_DIRS[label], ENGINE)
            for mix in ("valid", "mixed"):
                records = workload.records(
                    workload.calls(schema, calls, workload.MIXES[mix]), fragments
                )
                seconds = alternate(
                    {
                        "off": _without(callgate, records),
                        "on": _with_metrics(callgate, records),
                        "metrics_alone": _metrics_alone(callgate, records),
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
