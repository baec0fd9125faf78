"""The reference judge of a Google Gemini `streamGenerateContent` stream (`google.gemini`).

Written from the README ("Vendor formats", "A stream ends once", "A malformed piece never
changes what is accepted", "`stream_corrupt` for what the adapter cannot place", "Strict JSON
everywhere") and the format as Gemini streams it (each record one `GenerateContentResponse`):

- a record is read strictly, as every vendor event (a number that is not exactly what it says,
  a key twice, anywhere in it, `args` too: the record is malformed);
- a chunk's `candidates` each name their `index`, a candidate seen before or the next one;
  a candidate's `content` has the role `model` and `parts`; a `functionCall` part is a whole
  call (a non-empty `name`, `args` an object, absent or `null` for none: `{}`, perhaps an
  `id`; names and ids within
  `CALLGATE_LIMITS__MAX_ID_BYTES`), judged as its `args` (the tool its name, at its latest
  version); its call id is the part's `id` (with `:k` for candidate k > 0), else
  `<stream id>:<k>:<n>`, `n` counting the candidate's calls from 0;
- a candidate ends at its `finishReason` (`CONTINUATION` does not end it): `STOP` releases its
  calls; `MAX_TOKENS` releases those a later part of the candidate came after, the last call
  `incomplete` `max_tokens`; the content filters are `content_filter`;
  `MALFORMED_FUNCTION_CALL` and `UNEXPECTED_TOOL_CALL` release nothing and are each a rejected
  record (`response_classification`, `malformed_tool_call` / `unexpected_tool_call`); any other
  reason releases nothing; a call released nothing is `stream_ended`;
- the stream ends once every candidate it has seen has ended, and the calls are decided then
  (held till then); a blocked prompt (`promptFeedback.blockReason`) ends it, its calls
  `content_filter`; an `error` chunk ends it as a vendor error: a rejected `model_error`
  (`response_classification`) under the call id `<stream id>:error`, its calls `stream_ended`;
  the end of the input before the end ends every call `stream_ended`;
- after the end, a chunk that carries nothing (usage alone: no candidate content, no finish
  reason, no error, no blocked prompt) is dropped; any other chunk, and any chunk that cannot be
  placed before it (a candidate index out of order, another role, a call without its name, or
  with `args` that is no object, content or a finish for a candidate that ended) is a
  `malformed_record`, taken not at all (a call only it would open never opens), every call the
  stream holds `incomplete` `stream_corrupt`, the stream's later records dropped;
- a stream whose first record cannot be read (not JSON, not an object) gives each
  `functionCall` with its own id among its later records an `incomplete` `stream_corrupt`,
  once per id.

Unmodeled (the README does not settle them, and the traffic does not make them on purpose):
streamed `partialArgs` calls; a vendor id another call has; a text part
without text; how a whole call's bytes count against `CALLGATE_LIMITS__MAX_BYTES` when its
`args` hold a number that is no integer and the count is within a few bytes of the bound (the
README says `args` is written as JSON, not how a number is spelt there).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tests.reference import exact
from tests.reference.envelope import (
    MALFORMED,
    Call,
    Contracts,
    Expected,
    Limits,
    Unmodeled,
    verdict,
)
from tests.reference.vendor import named_call, rejected_record, unnamed_call, vendor_error

FILTERS = (
    "SAFETY",
    "RECITATION",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
    "MODEL_ARMOR",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION",
)
REJECTS = {
    "MALFORMED_FUNCTION_CALL": "malformed_tool_call",
    "UNEXPECTED_TOOL_CALL": "unexpected_tool_call",
}
CONTINUES = "CONTINUATION"


@dataclass
class _Candidate:
    calls: list[Call] = field(default_factory=list)
    last_is_call: bool = False
    reason: str | None = None


class _Unplaceable(Exception):
    """A chunk the stream cannot place."""


def _ident(value: Any, limits: Limits) -> bool:
    return isinstance(value, str) and bool(value) and len(value.encode()) <= limits.max_id_bytes


def _number(value: Decimal) -> str:
    if exact.EXACT.remainder(value, 1) == 0:
        return str(int(value))
    return str(value)


def _compact(value: Any) -> str:
    """`value` as compact JSON (strings as `json.dumps` writes them, UTF-8 raw)."""
    if isinstance(value, Decimal):
        return _number(value)
    if isinstance(value, dict):
        return "{" + ",".join(_compact(k) + ":" + _compact(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _fractions(value: Any) -> bool:
    if isinstance(value, Decimal):
        return exact.EXACT.remainder(value, 1) != 0
    if isinstance(value, dict):
        return any(_fractions(v) for v in value.values())
    if isinstance(value, list):
        return any(_fractions(v) for v in value)
    return False


def _call_of(args: dict[str, Any], call: Call, limits: Limits) -> Call:
    text = _compact(args)
    if _fractions(args) and abs(len(text.encode()) - limits.max_bytes) <= 12:
        raise Unmodeled("how a whole call's number counts against the byte bound")
    call.deltas = [text]
    return call


def judge(
    values: list[bytes], stream_id: str, contracts: Contracts, limits: Limits
) -> list[Expected]:
    """The events of one Gemini stream's records (one `GenerateContentResponse` each)."""
    events: list[Expected] = []
    candidates: list[_Candidate] = []
    vendor_ids: set[str] = set()
    ended = corrupt = False

    def calls() -> list[Call]:
        return [call for c in candidates for call in c.calls]

    def incomplete(call: Call, reason: str) -> None:
        events.append(Expected(stream_id, call.call_id, "incomplete", "assembly", reason))

    def malformed() -> None:
        nonlocal corrupt
        events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
        if not ended:
            for call in calls():
                incomplete(call, "stream_corrupt")
        corrupt = True

    def place(chunk: dict[str, Any]) -> list[tuple[_Candidate, str]]:
        """Take one chunk before the end; the finish reasons it names, by candidate."""
        finishes: list[tuple[_Candidate, str]] = []
        raw = chunk.get("candidates")
        if raw is not None and not isinstance(raw, list):
            raise _Unplaceable
        for position, candidate in enumerate(raw or []):
            if not isinstance(candidate, dict):
                raise _Unplaceable
            index = candidate.get("index", Decimal(position))
            if not isinstance(index, Decimal) or exact.EXACT.remainder(index, 1) != 0:
                raise _Unplaceable
            index = int(index)
            if index == len(candidates):
                candidates.append(_Candidate())
            elif not 0 <= index < len(candidates):
                raise _Unplaceable
            held = candidates[index]
            content, reason = candidate.get("content"), candidate.get("finishReason")
            if held.reason is not None and (content or reason):
                raise _Unplaceable  # a candidate that ended
            if content is not None:
                _content(content, index, held)
            if reason is not None:
                if not isinstance(reason, str):
                    raise _Unplaceable
                if reason != CONTINUES:
                    finishes.append((held, reason))
        return finishes

    def _content(content: Any, index: int, held: _Candidate) -> None:
        if not isinstance(content, dict) or content.get("role", "model") != "model":
            raise _Unplaceable
        parts = content.get("parts", [])
        if not isinstance(parts, list):
            raise _Unplaceable
        for part in parts:
            if not isinstance(part, dict):
                raise _Unplaceable
            call = part.get("functionCall")
            if call is None:
                if part.get("text") == "":
                    raise Unmodeled("a text part without text")
                held.last_is_call = False
                continue
            if not isinstance(call, dict) or not _ident(call.get("name"), limits):
                raise _Unplaceable
            if "partialArgs" in call or "willContinue" in call:
                raise Unmodeled("a streamed call (partialArgs)")
            args = call.get("args")
            if args is None:
                args = {}  # absent or null (protobuf's JSON default): a call without arguments
            if not isinstance(args, dict):
                raise _Unplaceable
            if "id" in call:
                if not _ident(call["id"], limits):
                    raise _Unplaceable
                call_id = named_call(call["id"], index)
                if call_id in vendor_ids:
                    raise Unmodeled("a vendor id another call has")
                vendor_ids.add(call_id)
            else:
                call_id = unnamed_call(stream_id, index, len(held.calls))
            made = Call(stream_id, call_id, "tool_call", call["name"], None)
            held.calls.append(_call_of(args, made, limits))
            held.last_is_call = True

    def end() -> None:
        nonlocal ended
        ended = True
        for held in candidates:
            for n, call in enumerate(held.calls):
                if held.reason in FILTERS:
                    incomplete(call, "content_filter")
                elif held.reason == "MAX_TOKENS" and n == len(held.calls) - 1 and held.last_is_call:
                    incomplete(call, "max_tokens")
                elif held.reason in ("STOP", "MAX_TOKENS"):
                    events.append(verdict(call, contracts, limits))
                else:
                    incomplete(call, "stream_ended")

    for position, value in enumerate(values):
        try:
            chunk = exact.read(value)
        except exact.Fault:
            chunk = None
        if not isinstance(chunk, dict):
            if position == 0:
                _unreadable_first(values[1:], stream_id, limits, events)
                return sorted(events, key=Expected.sort_key)
            if not corrupt:
                malformed()
            continue
        if corrupt:
            continue
        if ended:
            if not _carries_nothing(chunk):
                malformed()
            continue
        if "error" in chunk:
            events.append(vendor_error(stream_id))
            for call in calls():
                incomplete(call, "stream_ended")
            ended = True
            continue
        feedback = chunk.get("promptFeedback")
        if feedback is not None and not isinstance(feedback, dict):
            malformed()
            continue
        before = copy.deepcopy((candidates, vendor_ids))
        try:
            finishes = place(chunk)
        except _Unplaceable:
            candidates[:], vendor_ids = before[0], before[1]  # the chunk is taken not at all
            malformed()
            continue
        for held, reason in finishes:
            held.reason = reason
            if reason in REJECTS:
                events.append(rejected_record(stream_id, REJECTS[reason]))
        if feedback and feedback.get("blockReason"):
            for held in candidates:
                held.reason = FILTERS[0]
            end()
        elif candidates and all(c.reason is not None for c in candidates):
            end()
    if not ended and not corrupt:
        for call in calls():
            incomplete(call, "stream_ended")
    return sorted(events, key=Expected.sort_key)


def _carries_nothing(chunk: dict[str, Any]) -> bool:
    if "error" in chunk or chunk.get("promptFeedback"):
        return False
    raw = chunk.get("candidates")
    return raw is None or (
        isinstance(raw, list)
        and all(
            isinstance(c, dict) and not c.get("finishReason") and not c.get("content") for c in raw
        )
    )


def _unreadable_first(
    later: list[bytes], stream_id: str, limits: Limits, events: list[Expected]
) -> None:
    """A stream whose first record cannot be read: a `malformed_record`, and each call with
    its own id one of its later records makes `incomplete` `stream_corrupt`, once."""
    events.append(Expected(stream_id, MALFORMED, "rejected", "assembly", "malformed_record"))
    seen: set[str] = set()
    for value in later:
        try:
            chunk = exact.read(value)
        except exact.Fault:
            continue
        raw = chunk.get("candidates") if isinstance(chunk, dict) else None
        for position, candidate in enumerate(raw if isinstance(raw, list) else []):
            if not isinstance(candidate, dict):
                continue
            index = candidate.get("index", Decimal(position))
            if not isinstance(index, Decimal) or exact.EXACT.remainder(index, 1) != 0:
                continue
            content = candidate.get("content")
            parts = content.get("parts") if isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else []:
                call = part.get("functionCall") if isinstance(part, dict) else None
                if not isinstance(call, dict):
                    continue
                if _ident(call.get("id"), limits) and _ident(call.get("name"), limits):
                    call_id = named_call(call["id"], index)
                    if call_id not in seen:
                        seen.add(call_id)
                        events.append(
                            Expected(stream_id, call_id, "incomplete", "assembly", "stream_corrupt")
                        )
