"""Benchmark 3: checkpoints, their bytes (full against delta) and what taking them costs.

The worker checkpoints every input partition it fed in a round (one fetched batch): a full
frame starts a generation, deltas follow (`worker.runtime.checkpoints.Writer`). Here, on one
core, the same records are fed a batch (2,000 records) at a time to a processor that takes no
checkpoint, one that takes a delta after every batch (a full one first, as the worker does), and
one that takes a full checkpoint after every batch; they alternate within each repeat. Figures:
the throughput of each as a ratio to the processor that takes none; steadier on this noisy
machine, the checkpoint calls' own time (timed inside the run) per checkpoint and as a share of
the rest of the run; and the bytes of each checkpoint (median over the batches, and per call
open at that moment).

Two shapes of traffic, small get_weather calls of 10 chunks (20 % invalid): 8 calls in flight
(a few calls open at any batch's end) and 1,000 calls in flight (about 1,000 open at every
batch's end, each holding part of its text).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from benchmarks import workload
from benchmarks.common import (
    BATCH,
    SEED_SCHEMAS,
    Prepare,
    alternate,
    median,
    one_core,
    paired_ratio,
)
from benchmarks.harness import Callgate
from benchmarks.workload import TOPIC, Record, batches

ENGINE = "jsonschema-rs"
FRAGMENTS = 10
LANES = (8, 1000)
MODES = ("none", "delta", "full")


def _run(
    callgate: Callgate, records: list[Record], mode: str, spent: dict[str, list[float]]
) -> Prepare:
    """A run of `mode`; the seconds its checkpoint calls took are appended to `spent[mode]`."""
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        processor = callgate.processor()
        feed, checkpoint = processor.feed, processor.checkpoint

        def run() -> int:
            emitted = 0
            first = True
            clock = perf_counter
            taking = 0.0
            for batch in fetched:
                emitted += len(feed(TOPIC, 0, batch))
                if mode != "none":
                    started = clock()
                    checkpoint(TOPIC, 0, full=first or mode == "full")
                    taking += clock() - started
                    first = False
            spent[mode].append(taking)
            return emitted

        return run

    return prepare


def sizes(callgate: Callgate, records: list[Record]) -> dict[str, Any]:
    """Bytes of each batch's checkpoint, full and delta, with the calls open at that moment.
    Two processors are fed the same batches: one takes a delta after each (a full one first),
    the other a full one after each (taking a full one starts the deltas afresh)."""
    by_delta, by_full = callgate.processor(), callgate.processor()
    deltas: list[float] = []
    fulls: list[float] = []
    open_calls: list[float] = []
    for n, batch in enumerate(batches(records, BATCH)):
        by_delta.feed(TOPIC, 0, batch)
        by_full.feed(TOPIC, 0, batch)
        delta = by_delta.checkpoint(TOPIC, 0, full=n == 0)
        if n:
            deltas.append(len(delta))
        fulls.append(len(by_full.checkpoint(TOPIC, 0, full=True)))
        open_calls.append(by_full.assembler.open_calls)
    per_open = [f / n for f, n in zip(fulls, open_calls, strict=True) if n]
    full, delta_median = median(fulls), median(deltas) if deltas else None
    return {
        "checkpoints": len(fulls),
        "open_calls_median": median(open_calls),
        "full_bytes_median": round(full),
        "delta_bytes_median": None if delta_median is None else round(delta_median),
        "full_bytes_per_open_call": round(median(per_open)) if per_open else None,
        "delta_vs_full": None if delta_median is None else round(delta_median / full, 3),
    }


def _share(taking: list[float], runs: list[float]) -> float:
    """The median of each run's checkpoint seconds over its other seconds."""
    return median([t / (total - t) for t, total in zip(taking, runs, strict=True)])


def row(callgate: Callgate, lanes: int, calls: int, repeats: int) -> dict[str, Any]:
    work = workload.calls(workload.SMALL, calls, workload.MIXES["mixed"])
    records = workload.records(work, FRAGMENTS, lanes=lanes)
    spent: dict[str, list[float]] = {mode: [] for mode in MODES}
    seconds = alternate({mode: _run(callgate, records, mode, spent) for mode in MODES}, repeats)
    return {
        "calls_in_flight": lanes,
        "calls": calls,
        "records": len(records),
        "calls_per_s": {mode: round(calls / median(seconds[mode])) for mode in MODES},
        "throughput_vs_none": {
            mode: round(paired_ratio(seconds["none"], seconds[mode]), 3) for mode in MODES[1:]
        },
        # steadier than the throughput ratio: the checkpoint calls' own seconds, timed inside
        # the run, as a share of the run's other work
        "checkpoint_share_of_run": {
            mode: round(_share(spent[mode], seconds[mode]), 4) for mode in MODES[1:]
        },
        "checkpoint_us": {
            mode: round(median(spent[mode]) / len(batches(records, BATCH)) * 1e6, 1)
            for mode in MODES[1:]
        },
        "bytes": sizes(callgate, records),
    }


def run(*, calls: int = 8000, repeats: int = 7) -> dict[str, Any]:
    callgate = Callgate(SEED_SCHEMAS, ENGINE)
    with one_core() as cpu:
        rows = [row(callgate, lanes, calls, repeats) for lanes in LANES]
    return {
        "description": __doc__.split("\n\n")[0],
        "engine": ENGINE,
        "fragments_per_call": FRAGMENTS,
        "batch_records": BATCH,
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; throughput ratio = median of per-repeat none_s / mode_s",
        "rows": rows,
    }
