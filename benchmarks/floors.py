"""The floors of the core table: what any Python design must pay, measured in the same run.

Two contenders that do less than any real gate could, so their ratios against the seed bound
every ratio a per-record Python design can reach on the same workload:

- `envelope_parse_only`: `orjson.loads` of each envelope and nothing more.
- `bare_python_gate`: the least a gate can do in Python. `orjson.loads` of each envelope, a dict
  of delta lists, `orjson.loads` of the joined arguments, the engine's own yes/no answer (the
  schema compiled straight by the library, no vetting), and an event of the ids, the yes/no
  and (when accepted) the arguments, written with `orjson.dumps`. It checks no duplicate keys,
  sequence, limits, channel or idempotency, keeps no violations, feedback, timings or offsets,
  and trusts every envelope's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema_rs
import orjson

from benchmarks.common import Prepare
from benchmarks.workload import Record


def envelope_parse_only(records: Sequence[Record]) -> Prepare:
    """`orjson.loads` per record, no more."""
    values = [record.value or b"" for record in records]

    def run() -> int:
        loads = orjson.loads
        for value in values:
            loads(value)
        return len(values)

    return lambda: run


def _is_valid(engine: str, schema: dict[str, Any]) -> Callable[[Any], bool]:
    if engine == "jsonschema-rs":
        is_valid: Callable[[Any], bool] = jsonschema_rs.validator_for(schema).is_valid
        return is_valid
    validate = fastjsonschema.compile(schema)

    def valid(value: Any) -> bool:
        try:
            validate(value)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return valid


class BarePythonGate:
    """The least a Python gate can do per call, for one tool's schema and engine."""

    def __init__(self, schema_file: Path, engine: str) -> None:
        self.is_valid = _is_valid(engine, orjson.loads(schema_file.read_bytes()))

    def judge_all(self, values: Sequence[bytes]) -> list[bytes]:
        """Envelope bytes in, one event per completed call out."""
        loads, dumps, is_valid = orjson.loads, orjson.dumps, self.is_valid
        open_calls: dict[tuple[str, str], list[str]] = {}
        events = []
        for value in values:
            envelope = loads(value)
            key = (envelope["stream_id"], envelope["call_id"])
            parts = open_calls.get(key)
            if parts is None:
                parts = open_calls[key] = []
            parts.append(envelope["delta"])
            if not envelope["final"]:
                continue
            del open_calls[key]
            event: dict[str, Any] = {"stream_id": key[0], "call_id": key[1], "accepted": False}
            try:
                arguments = loads("".join(parts))
            except orjson.JSONDecodeError:
                pass
            else:
                if is_valid(arguments):  # an executor needs the arguments it is to run
                    event["accepted"], event["arguments"] = True, arguments
            events.append(dumps(event))
        return events


def bare_python_gate(schema_file: Path, engine: str, records: Sequence[Record]) -> Prepare:
    gate = BarePythonGate(schema_file, engine)
    values = [record.value or b"" for record in records]

    def run() -> int:
        return len(gate.judge_all(values))

    return lambda: run
