"""Nesting: a record of any format is read when it nests `MAX_DEPTH` levels, and is a
`malformed_record` one level deeper (README: "Everything is bounded"), on every path: the
envelope (decoded natively) and every vendor format (decoded in Python).

Each stream of the vendor collection (`test_integrity.STREAMS`: recorded and generated streams
of every streaming format), an envelope stream and each MCP result get one unknown member added
to one record (the first, the middle and the last), in the object that record's format leaves
open to unknown members (the event itself, or its one member's object where the event's only
key says its kind), nesting the record exactly `MAX_DEPTH` levels: every verdict is the
unchanged stream's. One level deeper, that record is a `malformed_record`, and the verdicts
differ. (The envelope once stopped at 65 levels, a second limit the README did not state.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from tests.adapters.oracles import MCP, Gate, encode, permissive_contracts, records
from tests.adapters.test_integrity import STREAMS, _tools
from tests.datafiles import data_files
from worker.adapters.decoder import ENVELOPE
from worker.adapters.input import read_records
from worker.model import MAX_DEPTH, Code

Event = dict[str, Any]
Judged = list[tuple[str, str, str | None]]

MCP_TOOL = "weather.get_weather_data"


def _envelope_stream() -> list[Event]:
    """Two calls of one stream, each in two chunks, and its end."""
    base = {"stream_id": "s1", "kind": "tool_call", "tool_version": "1"}
    return [
        {**base, "call_id": "a", "seq": 0, "tool": "tool_0", "delta": '{"x":'},
        {**base, "call_id": "b", "seq": 0, "tool": "tool_1", "delta": '{"y":['},
        {**base, "call_id": "a", "seq": 1, "delta": "1}", "final": True},
        {**base, "call_id": "b", "seq": 1, "delta": "2]}", "final": True},
    ]


CASES = [(name, fmt, events) for name, fmt, events in STREAMS] + [
    ("envelopes", ENVELOPE, _envelope_stream())
]


def _mcp_results() -> list[tuple[str, Event]]:
    """The recorded MCP messages that are JSON-RPC responses (the others are their parts)."""
    found = []
    for path in data_files("streams", "mcp/*.json"):
        with path.open("rb") as fp:
            (value,) = read_records(fp, MCP)
        message = orjson.loads(value)
        if "jsonrpc" in message:
            found.append((path.name, message))
    return found


MCP_RESULTS = _mcp_results()


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    tools = _tools() | {"tool_0": "function_call", "tool_1": "function_call"}
    return Gate(permissive_contracts(tmp_path_factory.mktemp("contracts"), tools))


def deepened(event: Event, depth: int) -> bytes:
    """`event` with an unknown member whose array value makes the record nest `depth` levels:
    in the event itself, or in its one member's object (where the only key is the event's kind,
    as Bedrock's are). Written by hand: no encoder writes past `MAX_DEPTH`."""
    (kind, inner), *more = event.items()
    if not more and isinstance(inner, dict) and inner:
        host = orjson.dumps(inner)
        return b"{" + orjson.dumps(kind) + b":" + _with_member(host, depth - 1) + b"}"
    return _with_member(orjson.dumps(event), depth)


def _with_member(host: bytes, depth: int) -> bytes:
    """The non-empty object `host` with a member nesting it `depth` levels deep."""
    levels = depth - 1
    return host[:-1] + b',"x-depth":' + b"[" * levels + b"]" * levels + b"}"


def judged(gate: Gate, fmt: str, values: Sequence[bytes], **headers: str) -> Judged:
    emissions = gate.run([records(fmt, values, headers=headers or None)])
    return [(e.call.call_id, str(e.verdict.outcome), e.verdict.code) for e in emissions]


def malformed(verdicts: Judged) -> bool:
    return any(code == Code.MALFORMED_RECORD for _, _, code in verdicts)


@pytest.mark.parametrize(("name", "fmt", "events"), CASES, ids=[c[0] for c in CASES])
def test_a_record_is_read_at_the_deepest_nesting_and_malformed_past_it(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    values = encode(events)
    unchanged = judged(gate, fmt, values)  # none for a stream without calls
    for at in sorted({0, len(events) // 2, len(events) - 1}):

        def with_record(depth: int, at: int = at) -> Judged:
            changed = [*values[:at], deepened(events[at], depth), *values[at + 1 :]]
            return judged(gate, fmt, changed)

        assert with_record(3) == unchanged, f"record {at}: an unknown member changed a verdict"
        assert with_record(MAX_DEPTH) == unchanged, f"record {at} at {MAX_DEPTH} levels"
        past = with_record(MAX_DEPTH + 1)
        assert malformed(past), f"record {at} at {MAX_DEPTH + 1} levels: read"
        assert past != unchanged, f"record {at} at {MAX_DEPTH + 1} levels: no verdict changed"


@pytest.mark.parametrize(("name", "result"), MCP_RESULTS, ids=[n for n, _ in MCP_RESULTS])
def test_an_mcp_result_is_read_at_the_deepest_nesting_and_malformed_past_it(
    gate: Gate, name: str, result: Event
) -> None:
    """A result's own content is judged at `CALLGATE_LIMITS__MAX_DEPTH` (a rejection, `too_deep`,
    not a record that cannot be read): the record is read to `MAX_DEPTH` all the same."""
    unchanged = judged(gate, MCP, [orjson.dumps(result)], tool=MCP_TOOL)
    assert unchanged, "no verdict"
    assert not malformed(unchanged), unchanged
    read = judged(gate, MCP, [deepened(result, MAX_DEPTH)], tool=MCP_TOOL)
    assert read, "no verdict"
    assert not malformed(read), read
    assert malformed(judged(gate, MCP, [deepened(result, MAX_DEPTH + 1)], tool=MCP_TOOL))
