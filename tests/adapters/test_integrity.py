"""Integrity under hostile input: one changed event never makes an accepted call lie.

Every recorded stream under `tests/data/streams/` and every generated one (the committed files
under `tests/data/generated/`, and random ones from `streamgen`) is changed in one event: every
single deletion, duplication and adjacent swap, and hypothesis-generated mutations (a value
replaced by another JSON type, a nearby integer, an edited string, a value found elsewhere in
the stream such as an index, an id or a name; a member deleted or added; an event moved or
copied elsewhere before the stream's end). The changed stream goes through the whole path the
worker runs (`worker.compose`: decoder, native reassembler, gate), with contracts that accept
any JSON object for every tool the streams name, so that only the stream can keep a call from
being accepted. The oracle is the vendor's own SDK accumulator fed the same changed stream, as
its streaming client feeds it (`tests/adapters/oracles.py`). What must hold:

- every call that ends accepted has the tool name and the argument text that the SDK holds for
  that call id: never other text, never a call the SDK does not have;
- when the SDK raises on event k (it cannot place the stream from there on), no call closed by
  event k or a later one is accepted, and a call accepted before has the text the SDK held
  before k.

What this cannot show, and why:

- A lost delta in a format without sequence numbers (Chat Completions, Messages, Responses
  streams without `sequence_number` whose final texts went missing too) cannot be detected by
  anyone: the stream without it is a well-formed stream of a call with other text. The oracle
  defines what the changed stream carried, and the SDK holds that other text too; the gate then
  judges it (here any object passes; a real contract may still accept it). Where the vendor sends
  a final form of the text (Responses), a lost delta is caught: the texts differ
  (`stream_corrupt`), or the numbering has a hole (`sequence_gap`).
- An event after the one that ended the stream (every choice finished, the final message, ...)
  arrives after the stream's calls were released: the adapter refuses it (a malformed record)
  but cannot take a verdict back, while the SDK would still append it. So the oracle is fed the
  changed stream up to the event our adapter ended it at, and the mutations keep moved and
  copied events before the end.
- Anthropic's SDK also parses each tool block's partial JSON and raises when the text cannot
  begin a JSON value. That judges the model's text, which the gate does per call (a call whose
  text is not JSON is never accepted); the oracle goes on accumulating (see `sdk_anthropic`).
- A stricter adapter is always allowed: an event the SDK would place but the adapter refuses
  (an event out of the order the API streams in, a replayed sequence number, a final response
  without a call it streamed) only costs calls, never accepts a wrong one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapters import streamgen
from tests.adapters.mutations import mutated, single_event_changes
from tests.adapters.oracles import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    FOLDERS,
    GEMINI,
    GENERATED_PATTERNS,
    MCP,
    RECORDING_PATTERNS,
    RESPONSES,
    Gate,
    assemble,
    decoder,
    encode,
    permissive_contracts,
    records,
    sdk_calls,
)
from tests.datafiles import data_files
from worker.adapters.input import read_records
from worker.model import ChunkKind, Outcome

Event = dict[str, Any]
MUTATIONS_PER_STREAM = 120


def _streams() -> list[tuple[str, str, list[Event]]]:
    found = [
        (FOLDERS[path.parent.name], path)
        for pattern in RECORDING_PATTERNS
        for path in data_files("streams", pattern)
        if path.parent.name in FOLDERS
    ]
    for pattern in GENERATED_PATTERNS:
        for path in data_files("generated", pattern):
            found.append((next(f for k, f in FOLDERS.items() if path.name.startswith(k)), path))
    out = []
    for fmt, path in found:
        with path.open("rb") as fp:
            out.append((path.name, fmt, [orjson.loads(v) for v in read_records(fp, fmt)]))
    return out


STREAMS = _streams()
NAMES = [name for name, _, _ in STREAMS]


def _tools() -> dict[str, str]:
    """Every tool the streams call, with the kind of call that calls it."""
    tools = {f"tool_{i}": "function_call" for i in range(4)}
    for _, fmt, events in STREAMS:
        tools |= {call.name: call.kind for call in sdk_calls(fmt, events).calls.values()}
    return tools


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    return Gate(permissive_contracts(tmp_path_factory.mktemp("contracts"), _tools()))


def lies(gate: Gate, fmt: str, events: Sequence[Event], stream_id: str = "s1") -> list[str]:
    """Every accepted call of the changed stream that the SDK does not hold as accepted."""
    sdk = sdk_calls(fmt, events[: end_of(fmt, events) + 1], stream_id)
    found = []
    for emission in gate.run([records(fmt, encode(events), stream_id)]):
        call = emission.call
        if emission.verdict.outcome is not Outcome.ACCEPTED:
            continue
        ours = (call.tool, call.arguments.decode())
        if sdk.raised_at is not None and call.last_offset >= sdk.raised_at:
            found.append(f"{call.call_id} {ours} accepted at {call.last_offset}: {sdk.error}")
        elif call.tool is None or not sdk.holds(fmt, call.call_id, *ours):
            found.append(f"{call.call_id} {ours} but the SDK has {sdk.calls.get(call.call_id)}")
    return found


def accepted(gate: Gate, fmt: str, events: Sequence[Event]) -> int:
    emissions = gate.run([records(fmt, encode(events))])
    return sum(e.verdict.outcome is Outcome.ACCEPTED for e in emissions)


def end_of(fmt: str, events: Sequence[Event]) -> int:
    """The position of the event that ends the stream (its END chunk)."""
    dec = decoder()
    for index, record in enumerate(records(fmt, encode(events))):
        if any(chunk.kind == ChunkKind.END for chunk in dec.decode(record, fmt)):
            return index
    return len(events) - 1


@pytest.mark.parametrize(("name", "fmt", "events"), STREAMS, ids=NAMES)
def test_no_single_deletion_duplication_or_swap_makes_an_accepted_call_lie(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    lying = {}
    kept = refused = 0
    whole = accepted(gate, fmt, events)
    for what, changed in single_event_changes(events):
        found = lies(gate, fmt, changed)
        if found:
            lying[what] = found
        count = accepted(gate, fmt, changed)
        kept += count
        refused += count < whole
    assert lying == {}
    if whole:  # not vacuous: calls are still accepted after harmless changes, and refused
        assert kept > 0
        assert refused > 0


@pytest.mark.parametrize(("name", "fmt", "events"), STREAMS, ids=NAMES)
def test_no_generated_mutation_makes_an_accepted_call_lie(
    gate: Gate, name: str, fmt: str, events: list[Event]
) -> None:
    @settings(
        max_examples=MUTATIONS_PER_STREAM,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(mutated(events, end_of(fmt, events)))
    def check(change: tuple[str, list[Event]]) -> None:
        what, changed = change
        assert lies(gate, fmt, changed) == [], what

    check()


def _random_stream(seed: int) -> tuple[str, list[Event]]:
    rng = random.Random(seed)
    calls = [
        (f"call_{seed}_{i}", f"tool_{i}", streamgen.arguments(rng))
        for i in range(rng.randint(1, 3))
    ]
    kind = seed % 5
    if kind == 4:
        events = streamgen.bedrock_stream(
            calls,
            rng,
            stop_reason=rng.choice(
                ["tool_use", "tool_use", "max_tokens", "end_turn", "malformed_tool_use"]
            ),
            cut_last_after=rng.choice([None, None, 2]),
            server_tool=rng.random() < 0.5,
            metadata=rng.random() < 0.5,
        )
        return BEDROCK, events
    if kind == 3:
        events = streamgen.gemini_stream(
            f"gen_{seed}",
            calls,
            rng,
            partial=rng.random() < 0.5,
            with_ids=rng.random() < 0.5,
            finish=rng.choice(["STOP", "STOP", "MAX_TOKENS", "MALFORMED_FUNCTION_CALL", "SAFETY"]),
            cut_after=rng.choice([None, None, 4]),
        )
        return GEMINI, events
    if kind == 0:
        events = streamgen.responses_stream(
            f"resp_{seed}",
            calls,
            rng,
            numbered=rng.random() < 0.5,
            parallel=rng.random() < 0.5,
            cut_after=rng.choice([None, None, 3]),
        )
        return RESPONSES, events
    if kind == 1:
        choices = [calls, calls[:1]] if rng.random() < 0.5 else [calls]
        return CHAT, streamgen.chat_stream(f"chat_{seed}", choices, rng, usage=rng.random() < 0.5)
    return ANTHROPIC, streamgen.anthropic_stream(
        f"msg_{seed}",
        calls,
        rng,
        server_tool=rng.random() < 0.5,
        stop_reason=rng.choice(["tool_use", "max_tokens", "end_turn"]),
        cut_last_after=rng.choice([None, None, 2]),
    )


@st.composite
def _changed_random_stream(draw: st.DrawFn) -> tuple[str, str, list[Event]]:
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    fmt, events = _random_stream(seed)
    what, changed = draw(mutated(events, end_of(fmt, events)))
    return fmt, f"seed {seed}, {what}", changed


@settings(
    max_examples=600,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_changed_random_stream())
def test_no_mutation_of_a_random_generated_stream_makes_an_accepted_call_lie(
    gate: Gate, change: tuple[str, str, list[Event]]
) -> None:
    fmt, what, changed = change
    assert lies(gate, fmt, changed) == [], what


def _mcp_responses() -> list[tuple[str, Event]]:
    found = []
    for path in data_files("streams", "mcp/*.json", at_least=10):
        with path.open("rb") as fp:
            for value in read_records(fp, MCP):
                message = orjson.loads(value)
                if isinstance(message, dict) and message.get("jsonrpc") == "2.0":
                    found.append((path.name, message))
    return found


MCP_RESPONSES = _mcp_responses()


@pytest.mark.parametrize(
    ("name", "message"), MCP_RESPONSES, ids=[name for name, _ in MCP_RESPONSES]
)
def test_an_mcp_result_carries_exactly_the_record_it_came_from(name: str, message: Event) -> None:
    @settings(max_examples=40, derandomize=True, deadline=None)
    @given(mutated([message]))
    def check(change: tuple[str, list[Event]]) -> None:
        what, (changed,) = change
        for call in assemble(MCP, [orjson.dumps(changed)], headers={"tool": "t"}):
            if call.channel == ChunkKind.MCP_RESULT and call.incomplete is None:
                assert orjson.loads(call.arguments) == changed, what

    check()
    (call,) = assemble(MCP, [orjson.dumps(message)], headers={"tool": "t"})
    assert orjson.loads(call.arguments) == message  # not vacuous: the message itself passes
