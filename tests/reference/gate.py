"""The gate under test, driven as its users drive it, and its events read exactly.

Two paths the README says decide alike: `callgate check` (`worker.check.run_check`: a file's
lines as unkeyed records of one partition, idempotency keys decided in-process) and the
worker's (`Processor.feed` with each envelope keyed by its stream id, as "One Kafka record per
chunk, key `stream_id`" has it), both built by the composition root from the settings.

Each gate is built twice from the same settings: with early verdicts off (every call judged
whole: its events are what the reference derives) and on (the shipped default: its events are
the whole judgement's, except that a call may be rejected before its end, and only a call the
whole judgement never accepts; `early_sound`).
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.reference import exact
from tests.reference.envelope import MALFORMED, Contracts, Expected, Limits
from worker.adapters.decoder import ENVELOPE
from worker.check import FileRecord, run_check
from worker.compose import build_key_store, build_processor, build_registry
from worker.core.processor import Route
from worker.settings import load_settings


def write_contracts(directory: Path, schemas: dict[str, dict[str, dict[str, Any]]]) -> Path:
    """A contracts directory holding `schemas` (one domain, `ref`)."""
    domain = directory / "ref"
    domain.mkdir(parents=True, exist_ok=True)
    for tool, versions in schemas.items():
        for version, schema in versions.items():
            (domain / f"{tool}.v{version}.schema.json").write_text(json.dumps(schema))
    return directory


class RealGate:
    def __init__(
        self, contracts: Path, schemas: dict[str, dict[str, dict[str, Any]]], **limits: Any
    ) -> None:
        self.settings = load_settings(
            schemas={"dir": contracts}, limits=limits, assembly={"early_verdict": False}
        )
        self.early_settings = load_settings(schemas={"dir": contracts}, limits=limits)
        assert self.early_settings.assembly.early_verdict, "early verdicts are the default"
        self.registry = build_registry(self.settings)
        own = self.settings.limits
        self.limits = Limits(own.max_bytes, own.max_chunks, own.max_depth, own.max_id_bytes)
        self.contracts = Contracts(
            {
                tool: {v: exact.read(json.dumps(s)) for v, s in versions.items()}
                for tool, versions in schemas.items()
            }
        )

    def check(
        self, values: list[bytes], fmt: str = ENVELOPE, *, early: bool = False
    ) -> list[bytes]:
        """`callgate check` on a file of these records (JSON lines; server-sent events for a
        vendor format, as `stream.sse`, so its stream id is `stream`), early verdicts on or
        off: each event as written."""
        settings = self.early_settings if early else self.settings
        if fmt == ENVELOPE:
            text, name = b"\n".join(values), "traffic.jsonl"
        else:
            text, name = b"".join(b"data: " + v + b"\n\n" for v in values), "stream.sse"
        out = io.BytesIO()
        run_check(
            build_processor(settings, self.registry),
            build_key_store(settings),
            io.BytesIO(text),
            out,
            name=name,
            fmt=fmt,
            max_feedback_bytes=settings.limits.max_feedback_bytes,
        )
        lines = out.getvalue().split(b"\n")
        assert lines.pop() == b"", "the output ends with a line break"
        for line in lines:  # JSON Lines: one whole event a line, whatever the arguments held
            assert isinstance(exact.read(line, bounded=False), dict), line
        return lines

    def keyed(
        self,
        values: list[bytes],
        fmt: str = ENVELOPE,
        cuts: Sequence[int] = (),
        *,
        early: bool = False,
    ) -> list[bytes]:
        """The worker's processor on these records keyed by their stream id (a vendor
        format's: `stream`), fed as fetched batches cut at `cuts`, then the end of input, early
        verdicts on or off: each event as written."""
        processor = build_processor(self.early_settings if early else self.settings, self.registry)
        headers = () if fmt == ENVELOPE else (("content-format", fmt.encode()),)
        records = []
        for offset, value in enumerate(values):
            key: bytes | None = b"stream"
            if fmt == ENVELOPE:
                try:
                    key = json.loads(value)["stream_id"].encode()
                except (ValueError, KeyError, TypeError, AttributeError):
                    key = None
            records.append(FileRecord("traffic", 0, offset, None, key, value, headers))
        emissions = []
        bounds = [0, *sorted({c for c in cuts if 0 < c < len(records)}), len(records)]
        for start, stop in itertools.pairwise(bounds):
            emissions += processor.feed("traffic", 0, records[start:stop])
        emissions += processor.flush()
        assert all(e.route is not Route.IDEMPOTENCY for e in emissions), "no keyed calls here"
        assert all(b"\n" not in e.value for e in emissions), "an event is one line, on Kafka too"
        return [e.value for e in emissions]


#: the codes of a rejected record (not a call): its call id is the gate's to choose
RECORD_CODES = ("malformed_record", "malformed_tool_call", "unexpected_tool_call")


def observed(events: list[bytes]) -> list[Expected]:
    """The gate's events in the fields the reference compares (`Expected`), read exactly."""
    out = []
    for raw in events:
        event = exact.read(raw, bounded=False)
        outcome = event["outcome"]
        code = event["error_code"] if outcome == "rejected" else event["reason"]
        call_id = event["call_id"] if code not in RECORD_CODES else MALFORMED
        accepted = outcome == "accepted"
        out.append(
            Expected(
                event["stream_id"],
                call_id,
                outcome,
                event["phase"],
                code,
                event["schema"]["version"] if accepted else None,
                event["arguments"] if accepted else None,
            )
        )
    return sorted(out, key=Expected.sort_key)


def early_sound(early: list[bytes], whole: list[bytes]) -> None:
    """The README's rule for early verdicts, on one input judged with them (`early`) and
    without (`whole`): the same calls get the same events, except that a call rejected early
    (`"early": true`) is one the whole judgement never accepts (it rejects the call, maybe for
    another defect found later such as a bound, or finds it incomplete: the stream would have
    ended first); no event is early without being a rejection."""
    by_call: dict[tuple[str, str], Expected] = {}
    for event in observed(whole):
        by_call[(event.stream_id, event.call_id)] = event
    decided_early = set()
    for raw in early:
        event = exact.read(raw, bounded=False)
        if event.get("early"):
            assert event["outcome"] == "rejected", event
            offset = event["early_offset"]
            assert offset == int(offset), event
            assert offset >= event["source"]["first_offset"], event
            key = (event["stream_id"], event["call_id"])
            assert key in by_call, (event, "the whole judgement has no event for this call")
            assert by_call[key].outcome != "accepted", (event, by_call[key])
            decided_early.add(key)
        else:
            assert "early_offset" not in event, event
    rest = [e for e in observed(early) if (e.stream_id, e.call_id) not in decided_early]
    whole_rest = [e for e in observed(whole) if (e.stream_id, e.call_id) not in decided_early]
    assert same(rest, whole_rest), (rest, whole_rest)


def event_ids(events: list[bytes]) -> list[str]:
    return [exact.read(e, bounded=False)["event_id"] for e in events]


def decided_as_reference(
    expected: list[Expected],
    whole: list[bytes],
    paths: dict[tuple[str, bool], list[bytes]],
) -> None:
    """Each path's events (named by path and whether early verdicts were on), against the
    reference's `expected` with early verdicts off and against the whole judgement (`whole`,
    `callgate check` with them off) with them on; no `event_id` twice on any path."""
    for (path, early), events in paths.items():
        ids = event_ids(events)
        assert len(set(ids)) == len(ids), (path, early, ids)
        if early:
            early_sound(events, whole)
        else:
            got = observed(events)
            assert same(got, expected), (path, got, expected)


def same(a: list[Expected], b: list[Expected]) -> bool:
    """Equal lists of events, arguments compared as exact JSON values."""
    return len(a) == len(b) and all(
        x.sort_key() == y.sort_key()
        and x.version == y.version
        and exact.equal(x.arguments, y.arguments)
        for x, y in zip(a, b, strict=True)
    )
