"""`callgate check`: the chain offline; JSON lines (or recorded SSE) in, one event per call out.

It runs the same `Processor` as the Kafka worker: each input line is a record of partition 0 of
a topic named after the input, at the line's number as offset, with no timestamp (so no call
times out; the end of the input ends every call still open). Envelopes are records without a
key, as a producer that sets none sends them; vendor events are keyed by their stream id.
Idempotency keys are decided in the same process, by the same rule the key owners of a worker
group apply. So `check` and `run` give the same events for the same records.

A record that cannot be read (not UTF-8, not JSON, longer than the input bound) is its own
`malformed_record`, as in the worker, and the rest of the file is judged; why it could not be
read goes to the log.

Without a format, the input's own first records tell it (`worker.detect`). Exit status (what a
pipeline gates on): `PASSED` every call judged, none with an outcome `--fail-on` names;
`FAILED_ON` at least one has such an outcome; the command line's 2 when the input, a setting
or a contract cannot be used.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, NamedTuple

import orjson

from worker.adapters import mcp
from worker.adapters.decoder import ENVELOPE
from worker.adapters.input import Read, RecordFault, read_lines, read_records
from worker.core.approval import PENDING_OUTCOME
from worker.core.events import MAX_TOPIC_BYTES
from worker.core.idempotency import KeyStore, resolve
from worker.core.processor import Emission, Processor, Route
from worker.detect import detect, peek
from worker.errors import ConfigError
from worker.model import Outcome, Phase

log = logging.getLogger("callgate.check")

_BOM = b"\xef\xbb\xbf"
_BATCH = 1000
#: the longest record read from a file (Kafka's own default bound is 1 MiB)
MAX_RECORD_BYTES = 16 * 1024 * 1024

#: exit statuses: every call judged, none with an outcome `--fail-on` names; some had one
PASSED, FAILED_ON = 0, 1


class FileRecord(NamedTuple):
    """One input line as the record the worker would have fetched."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def _records(
    source: BinaryIO, name: str, fmt: str, stream_id: str, extra: Mapping[str, str]
) -> Iterator[FileRecord]:
    headers = dict(extra) if fmt == ENVELOPE else {**extra, "content-format": fmt}
    encoded = tuple((k, v.encode()) for k, v in headers.items())
    key = stream_id.encode() if fmt != ENVELOPE else None
    values: Iterator[Read]
    if fmt == ENVELOPE:  # every line, blank ones too: a record's offset is its line's number
        values = read_lines(b"", source, MAX_RECORD_BYTES)
    else:
        values = read_records(source, fmt, max_record_bytes=MAX_RECORD_BYTES)
    for offset, value in enumerate(values):
        if isinstance(value, RecordFault):
            log.warning("%s: record %d cannot be read: %s", name, offset, value.detail)
            # no text: the record's own strict parse rejects it, as any unreadable record
            yield FileRecord(name, 0, offset, None, key, b"", encoded)
            continue
        if fmt == ENVELOPE:
            if offset == 0:
                value = value.removeprefix(_BOM)  # noqa: PLW2901 (a file may start with a BOM)
            if not value.strip():
                continue
        yield FileRecord(name, 0, offset, None, key, value, encoded)


def feed_input(
    processor: Processor,
    source: BinaryIO,
    *,
    name: str = "-",
    fmt: str = ENVELOPE,
    stream_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Iterator[list[Emission]]:
    """What the processor makes of `source`, batch by batch; the last batch is what the end of
    the input makes of the calls still open."""
    stream = stream_id or Path(name).stem or "stream"
    topic = input_topic(name)
    batch: list[FileRecord] = []
    for record in _records(source, topic, fmt, stream, headers or {}):
        batch.append(record)
        if len(batch) >= _BATCH:
            yield processor.feed(topic, 0, batch)
            batch = []
    yield processor.feed(topic, 0, batch)
    yield processor.flush()


def run_check(
    processor: Processor,
    keys: KeyStore,
    source: BinaryIO,
    out: BinaryIO,
    *,
    name: str = "-",
    fmt: str = ENVELOPE,
    stream_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    max_feedback_bytes: int,
) -> Counter[tuple[str, str, str]]:
    """Judge every call in `source`, write one event per line to `out`; return the tallies."""
    tally: Counter[tuple[str, str, str]] = Counter()
    for emissions in feed_input(
        processor, source, name=name, fmt=fmt, stream_id=stream_id, headers=headers
    ):
        # one write per batch: stdout may be unbuffered (PYTHONUNBUFFERED), a system call a line
        lines: list[bytes] = []
        for emission in emissions:
            value = emission.value
            verdict = emission.verdict
            outcome = verdict.outcome.value
            detail = verdict.code or verdict.reason or ""
            phase = verdict.phase or ""
            if emission.route is Route.PENDING_APPROVAL:
                outcome, phase = PENDING_OUTCOME, Phase.APPROVAL.value
            if emission.route is Route.IDEMPOTENCY:
                resolution = resolve(keys, value, None, max_feedback_bytes)
                value, outcome = resolution.event, resolution.outcome
                if outcome == Outcome.REJECTED:
                    fields = orjson.loads(value)
                    phase, detail = fields["phase"], fields["error_code"]
                elif resolution.pending:
                    outcome, phase = PENDING_OUTCOME, Phase.APPROVAL.value
            tally[(outcome, phase, detail)] += 1
            lines.append(value)
        if lines:
            out.write(b"\n".join(lines) + b"\n")
    out.flush()
    return tally


def input_topic(name: str) -> str:
    """The input's name as the records' topic, cut to the longest topic name Kafka allows (the
    records are that topic's partition 0: two inputs of one topic would be one partition)."""
    cut = name.encode("utf-8", "replace")[:MAX_TOPIC_BYTES]
    return cut.decode("utf-8", "ignore")


def format_summary(tally: Counter[tuple[str, str, str]]) -> str:
    total = sum(tally.values())
    by_outcome = Counter[str]()
    for (outcome, _, _), count in tally.items():
        by_outcome[outcome] += count
    shown = [f"{by_outcome[o.value]} {o.value}" for o in Outcome]
    if by_outcome[PENDING_OUTCOME]:  # only where some call waits for approval
        shown.append(f"{by_outcome[PENDING_OUTCOME]} {PENDING_OUTCOME}")
    lines = [f"{total} calls: " + ", ".join(shown)]
    rows = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    width = max((len(f"{p} / {d}") for (o, p, d), _ in rows if d), default=0)
    for (outcome, phase, detail), count in rows:
        if detail:
            lines.append(f"  {outcome:<10} {f'{phase} / {detail}':<{width}}  {count:>6}")
    return "\n".join(lines)


def parse_fail_on(text: str) -> frozenset[Outcome]:
    """`--fail-on`'s comma-separated outcomes. Raises `ConfigError` naming a wrong one."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = {outcome.value: outcome for outcome in Outcome}
    wrong = [name for name in names if name not in known]
    if wrong or not names:
        raise ConfigError(
            f"--fail-on takes outcomes separated by commas ({', '.join(known)}), not {text!r}"
        )
    return frozenset(known[name] for name in names)


@contextlib.contextmanager
def open_input(
    path: str, fmt: str | None, headers: Mapping[str, str] | None, *, command: str = "check"
) -> Iterator[tuple[BinaryIO, str]]:
    """The input `path` names (`-`: stdin) and its format: `fmt`, or told from its first
    records. Raises `ConfigError` when it cannot be read or its format cannot be used."""
    with contextlib.ExitStack() as stack:
        try:
            source: BinaryIO = (
                sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            )
        except OSError as exc:  # the command line names a file that cannot be read: say so
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        if fmt is None:
            head, source = peek(source)
            shown = "stdin" if path == "-" else path
            detected = detect(head, name=shown)
            fmt = detected.format
            if fmt != ENVELOPE:
                print(
                    f"callgate {command}: reading {shown} as {fmt} ({detected.reason}; "
                    "--format chooses)",
                    file=sys.stderr,
                )
        if fmt == mcp.FORMAT and not (headers or {}).get("tool"):
            raise ConfigError(
                "an MCP result does not name its tool: give --header tool=<tool name>"
            )
        yield source, fmt


def main_check(
    processor: Processor,
    keys: KeyStore,
    *,
    path: str,
    fmt: str | None,
    stream_id: str | None,
    headers: Mapping[str, str] | None,
    max_feedback_bytes: int,
    fail_on: frozenset[Outcome] = frozenset(),
) -> int:
    """`callgate check`: judge the input, print the summary; the exit status."""
    with open_input(path, fmt, headers) as (source, known):
        tally = run_check(
            processor,
            keys,
            source,
            sys.stdout.buffer,
            name=path,
            fmt=known,
            stream_id=stream_id,
            headers=headers,
            max_feedback_bytes=max_feedback_bytes,
        )
    print(format_summary(tally), file=sys.stderr)
    failed = sum(count for (outcome, _, _), count in tally.items() if outcome in fail_on)
    if failed:
        named = " or ".join(sorted(fail_on))
        print(f"callgate check: {failed} call(s) {named} (--fail-on)", file=sys.stderr)
        return FAILED_ON
    return PASSED
