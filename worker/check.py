"""`callgate check`: the chain offline; JSON lines (or recorded SSE) in, one event per call out.

It runs the same `Processor` as the Kafka worker: each input line is a record of a single
partition of a topic named after the input, at the line's number as offset.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from worker.adapters.decoder import ENVELOPE
from worker.adapters.input import read_records
from worker.core.processor import Emission, InboundRecord, Processor
from worker.model import Outcome
from worker.settings import Settings


def _records(
    source: BinaryIO, name: str, fmt: str, stream_id: str, extra: Mapping[str, str]
) -> Iterator[InboundRecord]:
    headers = dict(extra) if fmt == ENVELOPE else {**extra, "content-format": fmt}
    key = None if fmt == ENVELOPE else stream_id.encode()
    if fmt == ENVELOPE:
        values: Iterator[bytes] = (line.rstrip(b"\r\n") for line in source)
    else:
        values = read_records(source, fmt)
    for offset, value in enumerate(values):
        if fmt == ENVELOPE and not value.strip():
            continue
        yield InboundRecord(name, 0, offset, key, value, headers)


def run_check(
    settings: Settings,
    source: BinaryIO,
    out: BinaryIO,
    *,
    name: str = "-",
    fmt: str = ENVELOPE,
    stream_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Counter[tuple[str, str, str]]:
    """Judge every call in `source`, write one event per line to `out`; return the tallies."""
    processor = Processor.from_settings(settings)
    tally: Counter[tuple[str, str, str]] = Counter()

    def write(emissions: list[Emission]) -> None:
        for emission in emissions:
            verdict = emission.verdict
            detail = verdict.code or verdict.reason
            tally[(verdict.outcome.value, verdict.phase or "", detail or "")] += 1
            out.write(emission.value + b"\n")

    stream = stream_id or Path(name).stem or "stream"
    for record in _records(source, name, fmt, stream, headers or {}):
        write(processor.feed(record, now=0.0))
    write(processor.flush())
    out.flush()
    return tally


def format_summary(tally: Counter[tuple[str, str, str]]) -> str:
    total = sum(tally.values())
    by_outcome = Counter[str]()
    for (outcome, _, _), count in tally.items():
        by_outcome[outcome] += count
    lines = [f"{total} calls: " + ", ".join(f"{by_outcome[o.value]} {o.value}" for o in Outcome)]
    rows = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    width = max((len(f"{p} / {d}") for (o, p, d), _ in rows if d), default=0)
    for (outcome, phase, detail), count in rows:
        if detail:
            lines.append(f"  {outcome:<10} {f'{phase} / {detail}':<{width}}  {count:>6}")
    return "\n".join(lines)


def main_check(
    settings: Settings,
    path: str,
    fmt: str,
    stream_id: str | None,
    headers: Mapping[str, str] | None = None,
) -> int:
    with contextlib.ExitStack() as stack:
        source = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
        tally = run_check(
            settings,
            source,
            sys.stdout.buffer,
            name=path,
            fmt=fmt,
            stream_id=stream_id,
            headers=headers,
        )
    print(format_summary(tally), file=sys.stderr)
    return 0
