"""The contenders of the core runs: callgate's processor, the seed, and how each judged a workload.

Schemas are compiled once per contender (`Contenders`), outside any timed region; each repeat
gets fresh per-run state, prepared untimed (a processor from `worker.compose.build_processor` on
the same compiled registry, a new seed buffer map), so repeats never see each other's calls.
callgate is fed as the worker feeds it: one partition's fetched batch (2,000 records) at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.baseline import SeedGate, load_validators
from benchmarks.common import BATCH, Prepare
from benchmarks.workload import TOPIC, Record, batches
from worker.compose import build_assembler, build_processor, build_registry
from worker.core.processor import Processor
from worker.schemas.registry import SchemaRegistry
from worker.settings import Settings, load_settings


class Callgate:
    """Fresh processors on one compiled registry: the settings, the registry, and a maker."""

    def __init__(self, schema_dir: Path, engine: str, **overrides: Any) -> None:
        self.settings: Settings = load_settings(
            schemas={"dir": schema_dir, "engine": engine}, **overrides
        )
        self.registry: SchemaRegistry = build_registry(self.settings)

    def processor(self) -> Processor:
        return build_processor(self.settings, self.registry)


def callgate_run(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    """A fresh processor fed `records` a fetched batch at a time; returns the emission count."""
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        feed = callgate.processor().feed

        def run() -> int:
            emitted = 0
            for batch in fetched:
                emitted += len(feed(TOPIC, 0, batch))
            return emitted

        return run

    return prepare


def assembly_run(callgate: Callgate, records: Sequence[Record]) -> Prepare:
    """The native reassembler alone (envelope decode + reassembly, no gate, no event): the part
    of callgate's cost that is paid per chunk, in Rust."""
    fetched = batches(records, BATCH)

    def prepare() -> Callable[[], int]:
        processor = callgate.processor()
        assembler = build_assembler(callgate.settings)
        decode = processor.decoder.decode

        def run() -> int:
            closed = 0
            for batch in fetched:
                closed += len(assembler.feed_records(TOPIC, 0, batch, decode))
            return closed

        return run

    return prepare


def seed_run(schema_dir: Path, records: Sequence[Record]) -> Prepare:
    validators = load_validators(schema_dir)

    def prepare() -> Callable[[], int]:
        gate = SeedGate(validators)
        return lambda: gate.run(records)

    return prepare


def verdicts(callgate: Callgate, records: Sequence[Record]) -> dict[str, str]:
    """call_id -> outcome or error code, as callgate judged `records` (untimed)."""
    processor = callgate.processor()
    judged: dict[str, str] = {}
    for batch in batches(records, BATCH):
        for emission in processor.feed(TOPIC, 0, batch):
            verdict = emission.verdict
            judged[emission.call.call_id] = str(verdict.code or verdict.outcome)
    for emission in processor.flush():
        judged[emission.call.call_id] = f"flushed:{emission.verdict.outcome}"
    return judged


def seed_verdicts(schema_dir: Path, records: Sequence[Record]) -> dict[str, str]:
    """call_id -> outcome or error code, as the seed judged `records` (untimed)."""
    events = SeedGate(load_validators(schema_dir)).events(records)
    return {e["call_id"]: e.get("error_code") or e["outcome"] for e in events}


def outcomes(judged: dict[str, str]) -> dict[str, int]:
    """How many calls got each outcome or code (a benchmark of wrong answers is worthless)."""
    return dict(sorted(Counter(judged.values()).items()))


def agreement(
    callgate: dict[str, str], seed: dict[str, str], defects: dict[str, str | None]
) -> dict[str, Any]:
    """Whether the seed and callgate accept the same calls. The one expected difference: a
    duplicate key, which the seed cannot see (its `json.loads` keeps the last value)."""
    accepted = {c for c, v in callgate.items() if v == "accepted"}
    seed_accepted = {c for c, v in seed.items() if v == "accepted"}
    blind = {c for c, d in defects.items() if d == "duplicate_key"}
    return {
        "calls": len(defects),
        "judged_by_both": len(callgate.keys() & seed.keys()),
        "accepted_by_both": len(accepted & seed_accepted),
        "accepted_by_callgate_only": sorted(accepted - seed_accepted),
        "accepted_by_seed_only_duplicate_key": len((seed_accepted - accepted) & blind),
        "accepted_by_seed_only_other": sorted((seed_accepted - accepted) - blind),
        "agree": accepted == seed_accepted - blind and callgate.keys() == seed.keys(),
    }
