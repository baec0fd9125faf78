"""Benchmark: early verdicts, what they save on invalid calls and what they cost on valid ones.

On the core workload (`benchmarks.workload`: the small get_weather v1 and the large place_order
contracts, 10 and 100 chunks per call), in one run:

- invalid calls (every defect the workload rotates through: schema violations, a truncated text,
  a duplicate key): the share of each call's argument bytes still unread when its verdict was
  reached (0 for a call judged at its end), its median over the calls, and how many calls were
  decided early;
- valid calls: the time per chunk of callgate's processor (decode, reassembly, gate, event) and
  of the native reassembler alone (decode and reassembly: where the early judge runs), each with
  early verdicts on against off (`CALLGATE_ASSEMBLY__EARLY_VERDICT=false`), fresh state per
  repeat, interleaved, on the same compiled contracts. A ratio is the median of per-repeat
  `on / off`: what reading every chunk as it comes costs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import workload
from benchmarks.common import (
    BATCH,
    BENCH_SCHEMAS,
    SEED_SCHEMAS,
    Prepare,
    alternate,
    median,
    one_core,
    paired_ratio,
)
from benchmarks.harness import Callgate, callgate_run
from benchmarks.workload import TOPIC, Record, batches
from worker.compose import build_assembler, build_early_rules

SCHEMA_DIRS = {"small": SEED_SCHEMAS, "large": BENCH_SCHEMAS}
CHUNKS = (10, 100)
RECORDS = 40_000


def assembly_with_rules(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    """The native reassembler alone, with the early rules the settings give (none when off)."""
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        decode = callgate.processor().decoder.decode
        rules = build_early_rules(callgate.settings, callgate.registry)
        assembler = build_assembler(callgate.settings, rules)

        def run() -> int:
            closed = 0
            for batch in fetched:
                closed += len(assembler.feed_records(TOPIC, 0, batch, decode))
            return closed

        return run

    return prepare


def unread(callgate: Callgate, work: list[workload.Call], chunks: int) -> dict[str, Any]:
    """Per invalid call, the share of its argument bytes unread at its verdict."""
    processor = callgate.processor()
    size = {call.call_id: len(call.arguments.encode()) for call in work}
    defects = {call.call_id: call.defect for call in work}
    shares: dict[str, float] = {}
    early_by_defect: dict[str, int] = {}
    emissions = [
        emission
        for batch in batches(workload.records(work, chunks), BATCH)
        for emission in processor.feed(TOPIC, 0, batch)
    ] + processor.flush()
    for emission in emissions:
        call = emission.call
        total = size[call.call_id]
        read = call.nbytes if call.early is not None else total
        shares[call.call_id] = (total - read) / total if total else 0.0
        if call.early is not None:
            defect = str(defects[call.call_id])
            early_by_defect[defect] = early_by_defect.get(defect, 0) + 1
    values = list(shares.values())
    decided = [v for v in values if v > 0]
    return {
        "invalid_calls": len(values),
        "decided_early": sum(early_by_defect.values()),
        "decided_early_by_defect": dict(sorted(early_by_defect.items())),
        "invalid_by_defect": dict(sorted(Counter(map(str, defects.values())).items())),
        "median_unread_share": round(median(values), 3),
        "median_unread_share_of_early": round(median(decided), 3) if decided else 0.0,
    }


def row(label: str, chunks: int, calls: int, repeats: int) -> dict[str, Any]:
    schema = workload.SCHEMAS[label]
    directory: Path = SCHEMA_DIRS[label]
    on = Callgate(directory, "fastjsonschema")
    off = Callgate(directory, "fastjsonschema", assembly={"early_verdict": False})
    invalid = workload.calls(schema, calls, 1.0)
    valid = workload.records(workload.calls(schema, calls, 0.0), chunks)
    seconds = alternate(
        {
            "processor_on": callgate_run(on, valid),
            "processor_off": callgate_run(off, valid),
            "assembly_on": assembly_with_rules(on, valid),
            "assembly_off": assembly_with_rules(off, valid),
        },
        repeats,
    )
    per_chunk = {name: median(s) / len(valid) * 1e9 for name, s in seconds.items()}
    return {
        "schema": label,
        "tool": schema.tool,
        "chunks_per_call": chunks,
        "invalid": unread(on, invalid, chunks),
        "valid": {
            "records": len(valid),
            "ns_per_chunk": {name: round(ns) for name, ns in per_chunk.items()},
            "processor_on_over_off": round(
                paired_ratio(seconds["processor_on"], seconds["processor_off"]), 3
            ),
            "assembly_on_over_off": round(
                paired_ratio(seconds["assembly_on"], seconds["assembly_off"]), 3
            ),
        },
    }


def run(*, records: int = RECORDS, repeats: int = 7) -> dict[str, Any]:
    rows = []
    with one_core() as cpu:
        for label in workload.SCHEMAS:
            for chunks in CHUNKS:
                rows.append(row(label, chunks, max(10, records // chunks), repeats))
    return {
        "description": __doc__.split("\n\n")[0],
        "repeats": repeats,
        "pinned_cpu": cpu,
        "statistic": "median of repeats; ratio = median of per-repeat on / off",
        "rows": rows,
    }
