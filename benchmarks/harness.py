"""The two contenders of a run: callgate's Processor and the seed's gate, on one schema dir.

The schema compilation happens once per contender, outside any timed region; each timed run gets
fresh per-run state (a new reassembler and decoder on the same compiled gate, a new seed buffer
map), so repeats do not see each other's closed calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.baseline import SeedGate, load_validators
from worker.adapters.decoder import Decoder
from worker.assembly.reassembler import Reassembler
from worker.core.processor import InboundRecord, Processor
from worker.settings import load_settings

Run = Callable[[], int]


def processor_factory(schema_dir: Path, engine: str, **overrides: Any) -> Callable[[], Processor]:
    """A maker of fresh Processors that share one compiled gate (compiled here, once)."""
    settings = load_settings(schemas={"dir": schema_dir, "engine": engine}, **overrides)
    first = Processor.from_settings(settings)
    gate, limits = first.gate, first.reassembler.limits
    max_streams = settings.limits.max_open_calls_per_partition * 8

    def make() -> Processor:
        return Processor(gate, Reassembler(limits), Decoder(max_streams=max_streams))

    return make


_BATCH = 2000


def callgate_run(
    make: Callable[[], Processor],
    records: Sequence[InboundRecord],
    observe: Callable[[Any, str | None], None] | None = None,
) -> Run:
    def run() -> int:
        # as the runner does: one feed_many per fetched batch (fetch_max_records = 2000)
        processor = make()
        feed_many = processor.feed_many
        emitted = 0
        for start in range(0, len(records), _BATCH):
            emissions = feed_many(records[start : start + _BATCH], 0.0)
            emitted += len(emissions)
            if observe is not None:
                for emission in emissions:
                    observe(emission.verdict, emission.call.tool)
        return emitted

    return run


def seed_run(schema_dir: Path, records: Sequence[InboundRecord]) -> Run:
    validators = load_validators(schema_dir)

    def run() -> int:
        return SeedGate(validators).run(records)

    return run


def outcomes(make: Callable[[], Processor], records: Sequence[InboundRecord]) -> dict[str, int]:
    """How callgate judged the workload (checked once, untimed: a benchmark of wrong answers
    would be worthless)."""
    processor = make()
    counts: Counter[str] = Counter()
    for record in records:
        for emission in processor.feed(record, 0.0):
            verdict = emission.verdict
            counts[verdict.code.value if verdict.code else verdict.outcome.value] += 1
    for emission in processor.flush():
        counts["flushed:" + emission.verdict.outcome.value] += 1
    return dict(sorted(counts.items()))
