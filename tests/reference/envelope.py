"""The reference judge of chunk envelopes: records in, the events the README promises out.

Written from the README ("Input: the canonical chunk envelope", "What callgate guarantees",
"The chain", "Design decisions"), one rule after another in plain Python, never from the
gate's code. Where the README is silent the rule taken is said at its line (`# silent:`).

A call is (stream_id, call_id). Its pieces are taken in the order they come:
- with `seq`, the next piece must be the next number: a smaller one equal to the piece taken
  there (its text and `final`) is a retransmission (dropped, counted), a different one
  corrupts the call (`stream_corrupt`), a larger one is a gap (`sequence_gap`); without
  `seq`, every piece is the next;
- a piece naming another channel (`kind`), tool or version than its call corrupts it;
- `final: true` closes the call and it is judged: `response_classification` (only a tool
  call is a call), `limits` (bytes, then nesting deeper than `max_depth`), `repair` (only a
  ```json fence around the whole text), `json_parse` (strict, exact; the object root checked
  after), `schema_validation` (the tool and version named, the latest when none is);
- an `end` record ends every open call of its stream `incomplete`, by its finish reason
  (`length`: `max_tokens`, `content_filter`: `content_filter`, otherwise `stream_ended`); the
  end of the input ends the rest `stream_ended`;
- a piece of a call that has its verdict is dropped when it equals a piece that call took
  (its text and `final`, at its number when numbered) or
  when the call ended without its final (the tail of a call already judged); otherwise it is a
  new call reusing the id, rejected `call_id_reused`;
- after a stream's `end`, a piece of a call the stream held is judged so (dropped, or
  `call_id_reused`); a piece of any other call is a `malformed_record` naming the stream and
  call, which ends the call it names (its later pieces are the tail of a call already judged,
  or reuse its id); another `end` ends what is open (only a call reusing an id can be);
- a malformed envelope whose stream and call can be read (a field of the wrong type, a key
  twice, an identifier past the bound) is a `malformed_record` naming them that ends that call
  alike (`stream_corrupt` when open);
- a record that names no stream (not JSON, not an object, no `stream_id`), which has no key
  on either path, is a `malformed_record` of its own and ends every envelope call open then
  `stream_corrupt` ("A malformed piece never changes what is accepted").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tests.reference import exact

#: a malformed record's call id as compared: the gate names it (`record:...`, or the call when
#: it can be read: issue 24 section 3), the README does not say how
MALFORMED = "<record>"
KINDS = ("tool_call", "text", "refusal", "error", "end")
FINISH_REASONS = {"length": "max_tokens", "content_filter": "content_filter"}
_CHANNEL_CODES = {"text": "unexpected_channel", "refusal": "refusal", "error": "model_error"}
#: silent: the README's "```json fence around the whole text" made precise: the opening fence
#: (language `json`, `JSON` or none) on a line of its own, the closing one after the text
_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\r?\n(.*?)\r?\n?[ \t]*```", re.DOTALL)
_IDS = ("stream_id", "call_id", "tool", "tool_version", "idempotency_key")
_TRACE = ("trace_id", "run_id", "step_id", "traceparent")


@dataclass(frozen=True)
class Expected:
    """What the README says a call's event holds, in the fields the judge compares.

    Compared: the call's ids, outcome, phase, the code (rejected) or reason (incomplete), the
    schema version judged (accepted), and the arguments as an exact JSON value (accepted).
    Not compared: `event_id` (a digest whose encoding the README leaves open: its uniqueness is
    checked instead), timings, `source` offsets, `metrics` and feedback texts."""

    stream_id: str
    call_id: str
    outcome: str
    phase: str | None
    code: str | None
    version: str | None = None
    arguments: Any = None

    def sort_key(self) -> tuple[str, ...]:
        return (self.stream_id, self.call_id, self.outcome, self.phase or "", self.code or "")


@dataclass(frozen=True)
class Contracts:
    """Each tool's schemas by version (read exactly), as the reference sees a contracts dir."""

    schemas: dict[str, dict[str, dict[str, Any]]]

    def find(self, tool: str | None, version: str | None) -> tuple[str | None, str | None]:
        """(the version judged, None) or (None, the schema_validation code)."""
        versions = self.schemas.get(tool or "")
        if not versions:
            return None, "unknown_tool"
        if version is None:
            return max(versions, key=int), None
        if version not in versions:
            return None, "unknown_schema_version"
        return version, None


@dataclass
class Call:
    stream_id: str
    call_id: str
    kind: str
    tool: str | None
    version: str | None
    pieces: list[dict[str, Any]] = field(default_factory=list)
    deltas: list[str] = field(default_factory=list)
    next_seq: int = 0
    reused: bool = False


@dataclass
class _Closed:
    pieces: list[dict[str, Any]]
    complete: bool


def _late(closed: _Closed, env: dict[str, Any], seq: int | None) -> bool | None:
    """A piece of a call that has its verdict: None when it is dropped (it equals a piece the
    call took, or it is a late piece of a call that ended incomplete), else a new call that
    reuses the id. silent: "the tail" of an incomplete call is every piece that does not open
    a call afresh (numbered 0 and unlike the piece taken there, or unnumbered and naming its
    tool)."""
    if seq is not None:  # the piece taken at that number (pieces count from the first taken)
        same_place = [p for i, p in enumerate(closed.pieces) if p.get("seq", i) == seq]
    else:
        same_place = list(closed.pieces)
    if any(_same_piece(env, piece) for piece in same_place):
        return None
    if closed.complete:
        return True
    if seq is not None:
        return True if seq == 0 and same_place else None
    return True if "tool" in env else None


def _same_piece(env: dict[str, Any], taken: dict[str, Any]) -> bool:
    """README, "Call ids": a copy equals the piece taken in its text and its `final`."""
    return env.get("delta", "") == taken.get("delta", "") and env.get("final", False) == taken.get(
        "final", False
    )


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_chunks: int
    max_depth: int
    max_id_bytes: int


class Unmodeled(Exception):
    """Traffic whose verdict the README leaves to a rule being rewritten (issue 24): the test
    generating it must not be taken as a judgement of it."""


def malformed(value: bytes, limits: Limits) -> dict[str, Any] | None:
    """The envelope a record holds, or None when it is not what an envelope must be: one
    strict JSON object, each known field of its type, identifiers within the bound."""
    try:
        env = exact.read(value)
    except exact.Fault:
        return None
    if not isinstance(env, dict):
        return None
    if not isinstance(env.get("stream_id"), str) or not env["stream_id"]:
        return None
    if env.get("kind") not in KINDS:
        return None
    if env["kind"] != "end" and (not isinstance(env.get("call_id"), str) or not env["call_id"]):
        return None
    for name in (*_IDS, *_TRACE):
        held = env.get(name)
        if held is not None and not isinstance(held, str):
            return None
        if isinstance(held, str) and len(held.encode()) > limits.max_id_bytes:
            return None
    seq = env.get("seq")
    if seq is not None and (
        not isinstance(seq, Decimal) or seq < 0 or exact.EXACT.remainder(seq, 1) != 0
    ):
        return None
    if not isinstance(env.get("final", False), bool) or not isinstance(env.get("delta", ""), str):
        return None
    return env


def _named(value: bytes, limits: Limits) -> tuple[str, str] | None:
    """The stream and call a malformed envelope names, when both can be read (the record is
    JSON up to them, each a non-empty string within the bound), else None."""
    try:
        fields = json.loads(value, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    ids = fields.get("stream_id"), fields.get("call_id")
    if all(isinstance(i, str) and i and len(i.encode()) <= limits.max_id_bytes for i in ids):
        return ids[0], ids[1]
    return None


def _names_another(call: Call, env: dict[str, Any]) -> bool:
    """A piece naming another tool or version than its call already has."""
    tool, version = env.get("tool"), env.get("tool_version")
    return (tool is not None and call.tool is not None and tool != call.tool) or (
        version is not None and call.version is not None and version != call.version
    )


def judge(values: list[bytes], contracts: Contracts, limits: Limits) -> list[Expected]:
    """The events of one partition's envelope records, in any order (sorted)."""
    events: list[Expected] = []
    open_calls: dict[tuple[str, str], Call] = {}
    closed: dict[tuple[str, str], _Closed] = {}
    ended: set[str] = set()

    def close(call: Call, outcome: str, code: str | None) -> None:
        del open_calls[(call.stream_id, call.call_id)]
        closed[(call.stream_id, call.call_id)] = _Closed(call.pieces, call.reused)
        if call.reused:  # however it ends, a reused id is its own rejected call
            outcome, code = "rejected", "call_id_reused"
        events.append(Expected(call.stream_id, call.call_id, outcome, "assembly", code))

    for value in values:
        env = malformed(value, limits)
        if env is None and b"stream_id" not in value:
            # it names no stream, and has no key (`check`'s records; the worker's, keyed by a
            # stream id that cannot be read): it could belong to any envelope call, and every
            # one still open ends
            events.append(Expected("", MALFORMED, "rejected", "assembly", "malformed_record"))
            for call in list(open_calls.values()):
                close(call, "incomplete", "stream_corrupt")
            continue
        if env is None:
            named = _named(value, limits)
            if named is None:
                raise Unmodeled("a malformed envelope naming its stream, its call unreadable")
            # README: a malformed envelope whose stream and call can be read is its own
            # rejection naming them, and ends that call: an open one `stream_corrupt`, one not
            # open yet never opens without it (its later pieces: a tail, or a reused id)
            events.append(Expected(named[0], MALFORMED, "rejected", "assembly", "malformed_record"))
            if named in open_calls:
                close(open_calls[named], "incomplete", "stream_corrupt")
            elif named not in closed:
                closed[named] = _Closed([], complete=False)
            continue
        stream = env["stream_id"]
        if env["kind"] == "end":
            reason = FINISH_REASONS.get(env.get("finish_reason") or "", "stream_ended")
            for call in [c for c in open_calls.values() if c.stream_id == stream]:
                close(call, "incomplete", reason)
            ended.add(stream)
            continue
        ident = (stream, env["call_id"])
        seq = env.get("seq")
        seq = int(seq) if seq is not None else None
        reused = False
        if ident in closed and ident not in open_calls:
            late = _late(closed[ident], env, seq)
            if late is None:
                continue  # a retransmission, or a late piece of a call already judged
            reused = True  # even after its stream's end: a rejection all the same
        call = open_calls.get(ident)
        if call is None and stream in ended and not reused:
            # README, "A stream ends once": after its end, a piece of a call the stream did not
            # hold cannot be placed: its own rejection, naming the stream and call, which never
            # opens without it
            events.append(Expected(stream, MALFORMED, "rejected", "assembly", "malformed_record"))
            closed[ident] = _Closed([], complete=False)
            continue
        if call is None:
            call = Call(
                stream, env["call_id"], env["kind"], env.get("tool"), env.get("tool_version")
            )
            call.reused = reused
            call.next_seq = seq if reused and seq is not None else 0
            open_calls[ident] = call
        elif env["kind"] != call.kind or _names_another(call, env):
            close(call, "incomplete", "stream_corrupt")
            continue
        # silent: a call that has not named its tool (or version) yet takes the first one named
        call.tool = call.tool if call.tool is not None else env.get("tool")
        call.version = call.version if call.version is not None else env.get("tool_version")
        if seq is not None:
            if seq < call.next_seq:
                taken = next((p for p in call.pieces if p.get("seq") == seq), None)
                if taken is None:
                    raise Unmodeled("a reused id numbered back past its first piece")
                if _same_piece(env, taken):
                    continue  # a retransmission (dropped, counted)
                close(call, "incomplete", "stream_corrupt")  # differing in text or `final`
                continue
            if seq > call.next_seq:
                close(call, "incomplete", "sequence_gap")
                continue
            call.next_seq = seq + 1
        call.pieces.append(env)
        call.deltas.append(env.get("delta", ""))
        if env.get("final", False):
            if call.reused:
                close(call, "rejected", "call_id_reused")
                continue
            del open_calls[ident]
            closed[ident] = _Closed(call.pieces, True)
            events.append(verdict(call, contracts, limits))
    for call in list(open_calls.values()):
        close(call, "incomplete", "stream_ended")
    return sorted(events, key=Expected.sort_key)


def _overflow(deltas: list[str], limits: Limits) -> str | None:
    """The first bound a call's pieces passed, as they came: its bytes (UTF-8), or its
    number of pieces (silent: which one when one piece passes both; bytes, taken first)."""
    size = 0
    for count, delta in enumerate(deltas, start=1):
        size += len(delta.encode())
        if size > limits.max_bytes:
            return "too_large"
        if count > limits.max_chunks:
            return "too_many_chunks"
    return None


def verdict(call: Call, contracts: Contracts, limits: Limits) -> Expected:
    def rejected(phase: str, code: str) -> Expected:
        return Expected(call.stream_id, call.call_id, "rejected", phase, code)

    if call.kind != "tool_call":
        # silent: the README names no code per channel; these are the event schema's codes
        return rejected("response_classification", _CHANNEL_CODES[call.kind])
    overflow = _overflow(call.deltas, limits)
    if overflow is not None:
        return rejected("limits", overflow)
    text = "".join(call.deltas)
    if exact.text_depth(text) > limits.max_depth:
        return rejected("limits", "too_deep")
    fenced = _FENCE.fullmatch(text.strip(" \t\n\r\f\v"))
    if fenced:
        text = fenced.group(1)
    try:
        arguments = exact.read(text)
    except exact.Fault as fault:
        return rejected("json_parse", fault.code)
    if not isinstance(arguments, dict):
        return rejected("json_parse", "root_not_object")
    version, missing = contracts.find(call.tool, call.version)
    if version is None:
        assert missing is not None
        return rejected("schema_validation", missing)
    assert call.tool is not None
    schema = contracts.schemas[call.tool][version]
    if exact.errors(exact.validator(schema), arguments):
        return rejected("schema_validation", "schema_violation")
    return Expected(call.stream_id, call.call_id, "accepted", None, None, version, arguments)
