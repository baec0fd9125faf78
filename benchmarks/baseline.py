"""The baseline: the seed's design, what a user would otherwise run, measured in the same process.

Per chunk `json.loads` of the envelope; the deltas of a call joined when its final chunk arrives;
`json.loads` of the arguments; a `jsonschema.Draft202012Validator` built once per tool; every
error it reports collected; the outcome encoded with `json.dumps`. No duplicate-key detection, no
sequence checks, no limits: it does less than callgate, which only makes the comparison kind to it.

`python -m benchmarks.baseline SCHEMAS FILE` is the seed as a whole process (the offline
benchmark's baseline): the envelopes of FILE, one per line, in; one event per call out, a line
each, on stdout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema

from benchmarks.workload import TOPIC, Record


def load_validators(directory: Path) -> dict[str, jsonschema.Draft202012Validator]:
    """One validator per `<domain>/<tool>.v<N>.schema.json`, keyed by tool name and version."""
    validators: dict[str, jsonschema.Draft202012Validator] = {}
    for path in sorted(directory.glob("*/*.schema.json")):
        tool, _, rest = path.name.partition(".v")
        version = rest.split(".", 1)[0]
        schema = json.loads(path.read_text(encoding="utf-8"))
        validators[f"{tool}\0{version}"] = jsonschema.Draft202012Validator(schema)
    return validators


class SeedGate:
    """The seed's whole path in one class: reassemble, parse, validate, encode."""

    def __init__(self, validators: dict[str, jsonschema.Draft202012Validator]) -> None:
        self.validators = validators
        self.open: dict[tuple[str, str], dict[str, Any]] = {}

    def feed(self, record: Record) -> bytes | None:
        envelope = json.loads(record.value or b"")
        key = (envelope["stream_id"], envelope["call_id"])
        state = self.open.get(key)
        if state is None:
            state = self.open[key] = {
                "tool": envelope.get("tool"),
                "version": envelope.get("tool_version"),
                "parts": [],
            }
        state["parts"].append(envelope.get("delta") or "")
        if not envelope.get("final"):
            return None
        del self.open[key]
        return self.judge(key, state)

    def judge(self, key: tuple[str, str], state: dict[str, Any]) -> bytes:
        event: dict[str, Any] = {"stream_id": key[0], "call_id": key[1], "tool": state["tool"]}
        try:
            arguments = json.loads("".join(state["parts"]))
        except ValueError as exc:
            event.update(outcome="rejected", error_code="invalid_json", message=str(exc))
            return json.dumps(event).encode()
        validator = self.validators.get(f"{state['tool']}\0{state['version']}")
        if validator is None:
            event.update(outcome="rejected", error_code="unknown_tool")
            return json.dumps(event).encode()
        errors = [
            {
                "path": "".join(f"/{part}" for part in error.absolute_path),
                "keyword": error.validator,
                "message": error.message,
            }
            for error in validator.iter_errors(arguments)
        ]
        if errors:
            event.update(outcome="rejected", error_code="schema_violation", violations=errors)
        else:
            event.update(outcome="accepted", arguments=arguments)
        return json.dumps(event).encode()

    def run(self, records: Iterable[Record]) -> int:
        events = 0
        for record in records:
            if self.feed(record) is not None:
                events += 1
        return events

    def events(self, records: Iterable[Record]) -> list[dict[str, Any]]:
        """The decoded events of `records` (for checks, untimed)."""
        return [json.loads(event) for r in records if (event := self.feed(r)) is not None]


def main(schemas: str, source: str) -> int:
    gate = SeedGate(load_validators(Path(schemas)))
    out = sys.stdout.buffer
    with open(source, "rb") as lines:
        for offset, line in enumerate(lines):
            event = gate.feed(Record(TOPIC, 0, offset, None, None, line))
            if event is not None:
                out.write(event + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
