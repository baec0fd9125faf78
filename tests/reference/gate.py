"""The gate under test, driven as its users drive it, and its events read exactly.

Two paths the README says decide alike: `callgate check` (`worker.check.run_check`: a file's
lines as unkeyed records of one partition, idempotency keys decided in-process) and the
worker's (`Processor.feed` with each envelope keyed by its stream id, as "One Kafka record per
chunk, key `stream_id`" has it), both built by the composition root from the settings.
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
        self.settings = load_settings(schemas={"dir": contracts}, limits=limits)
        self.registry = build_registry(self.settings)
        own = self.settings.limits
        self.limits = Limits(own.max_bytes, own.max_chunks, own.max_depth, own.max_id_bytes)
        self.contracts = Contracts(
            {
                tool: {v: exact.read(json.dumps(s)) for v, s in versions.items()}
                for tool, versions in schemas.items()
            }
        )

    def check(self, values: list[bytes], fmt: str = ENVELOPE) -> list[bytes]:
        """`callgate check` on a file of these records (JSON lines; server-sent events for a
        vendor format, as `stream.sse`, so its stream id is `stream`): each event as written."""
        if fmt == ENVELOPE:
            text, name = b"\n".join(values), "traffic.jsonl"
        else:
            text, name = b"".join(b"data: " + v + b"\n\n" for v in values), "stream.sse"
        out = io.BytesIO()
        run_check(
            build_processor(self.settings, self.registry),
            build_key_store(self.settings),
            io.BytesIO(text),
            out,
            name=name,
            fmt=fmt,
            max_feedback_bytes=self.settings.limits.max_feedback_bytes,
        )
        return out.getvalue().splitlines()

    def keyed(
        self, values: list[bytes], fmt: str = ENVELOPE, cuts: Sequence[int] = ()
    ) -> list[bytes]:
        """The worker's processor on these records keyed by their stream id (a vendor
        format's: `stream`), fed as fetched batches cut at `cuts`, then the end of input: each
        event as written."""
        processor = build_processor(self.settings, self.registry)
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
        return [e.value for e in emissions]


def observed(events: list[bytes]) -> list[Expected]:
    """The gate's events in the fields the reference compares (`Expected`), read exactly."""
    out = []
    for raw in events:
        event = exact.read(raw, bounded=False)
        outcome = event["outcome"]
        code = event["error_code"] if outcome == "rejected" else event["reason"]
        call_id = event["call_id"] if code != "malformed_record" else MALFORMED
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


def event_ids(events: list[bytes]) -> list[str]:
    return [exact.read(e, bounded=False)["event_id"] for e in events]


def same(a: list[Expected], b: list[Expected]) -> bool:
    """Equal lists of events, arguments compared as exact JSON values."""
    return len(a) == len(b) and all(
        x.sort_key() == y.sort_key()
        and x.version == y.version
        and exact.equal(x.arguments, y.arguments)
        for x, y in zip(a, b, strict=True)
    )
