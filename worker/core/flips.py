"""One call judged under two contract sets: what changed between the verdicts, and how to say it.

`compare(baseline, candidate)` is the one comparison: `callgate replay` (history re-judged) and
the worker's shadow mode (live traffic judged a second time) both call it, on the verdicts of
the same assembled call under the current contracts (the baseline) and under candidate ones,
each as its event is written (an accepted call whose event cannot be written under the event
bound is the `event_too_large` rejection the worker emits, see `Processor`).
Its answer is a `Kind`:

- a *flip*, a change in what would run: `accepted_to_rejected`, `rejected_to_accepted`, any
  other change of outcome (`accepted_to_incomplete`, `incomplete_to_rejected`, ...), and
  `accepted_changed`, accepted under both but with a different accepted event: another schema
  version, other normalized arguments (compared as JSON values in canonical form, so spelling
  never counts), another effective idempotency key, or approval required under one only;
- or no flip: `accepted_unchanged`, `rejected_unchanged`, `rejected_changed` (rejected under
  both, in another phase or with another code: what the model is told changes, what runs does
  not) and `incomplete_unchanged`.

`compare` is symmetric: swapping the two sides gives `Kind.reversed` of the answer, and a verdict
compared with an equal one is never a flip.

A `Comparison` is the call, both verdicts and their kind. Its `record` is the one form a flip is
shown in, on the shadow topic and as the replay's examples: the call's ids, and per side the
outcome, phase, code, schema and the violations of the side's own retry feedback, which names
only declared properties and never holds a value from the input. Arguments and keys are never
shown; `changed` names the fields of an `accepted_changed` that differ.

A call the reassembler already decided (incomplete, or an assembly error) gets its verdict
before any contract or plugin is read, so `judge_both` gives the candidate the baseline's
verdict for it instead of judging it twice; any other call is judged by the `candidate`
function it is given (the processor's: the candidate gate's verdict as its event is written).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from worker._native import AssembledCall, ParseError, parse_json
from worker.core.canonical import canonical
from worker.model import Outcome, Verdict

#: how deep an accepted call's arguments may nest when compared (their parse already held them
#: to the settings' depth bound, which is lower)
_COMPARE_DEPTH = 512


class Kind(StrEnum):
    """What a call's two verdicts show (the `kind` label of the shadow metric)."""

    ACCEPTED_TO_REJECTED = "accepted_to_rejected"
    REJECTED_TO_ACCEPTED = "rejected_to_accepted"
    ACCEPTED_CHANGED = "accepted_changed"
    ACCEPTED_TO_INCOMPLETE = "accepted_to_incomplete"
    INCOMPLETE_TO_ACCEPTED = "incomplete_to_accepted"
    REJECTED_TO_INCOMPLETE = "rejected_to_incomplete"
    INCOMPLETE_TO_REJECTED = "incomplete_to_rejected"
    ACCEPTED_UNCHANGED = "accepted_unchanged"
    REJECTED_UNCHANGED = "rejected_unchanged"
    REJECTED_CHANGED = "rejected_changed"
    INCOMPLETE_UNCHANGED = "incomplete_unchanged"

    @property
    def is_flip(self) -> bool:
        return self in FLIPS

    @property
    def reversed(self) -> Kind:
        """The kind of the same two verdicts compared the other way round."""
        return _REVERSED.get(self, self)


FLIPS = frozenset(
    {
        Kind.ACCEPTED_TO_REJECTED,
        Kind.REJECTED_TO_ACCEPTED,
        Kind.ACCEPTED_CHANGED,
        Kind.ACCEPTED_TO_INCOMPLETE,
        Kind.INCOMPLETE_TO_ACCEPTED,
        Kind.REJECTED_TO_INCOMPLETE,
        Kind.INCOMPLETE_TO_REJECTED,
    }
)
_CHANGES: dict[tuple[Outcome, Outcome], Kind] = {
    (Outcome.ACCEPTED, Outcome.REJECTED): Kind.ACCEPTED_TO_REJECTED,
    (Outcome.REJECTED, Outcome.ACCEPTED): Kind.REJECTED_TO_ACCEPTED,
    (Outcome.ACCEPTED, Outcome.INCOMPLETE): Kind.ACCEPTED_TO_INCOMPLETE,
    (Outcome.INCOMPLETE, Outcome.ACCEPTED): Kind.INCOMPLETE_TO_ACCEPTED,
    (Outcome.REJECTED, Outcome.INCOMPLETE): Kind.REJECTED_TO_INCOMPLETE,
    (Outcome.INCOMPLETE, Outcome.REJECTED): Kind.INCOMPLETE_TO_REJECTED,
}
_REVERSED = {kind: _CHANGES[(b, a)] for (a, b), kind in _CHANGES.items()}
_UNCHANGED = {
    Outcome.ACCEPTED: Kind.ACCEPTED_UNCHANGED,
    Outcome.REJECTED: Kind.REJECTED_UNCHANGED,
    Outcome.INCOMPLETE: Kind.INCOMPLETE_UNCHANGED,
}


def compare(baseline: Verdict, candidate: Verdict) -> Kind:
    """What changed from `baseline` to `candidate`, two verdicts on the same call."""
    outcome = baseline.outcome
    if outcome is not candidate.outcome:
        return _CHANGES[(outcome, candidate.outcome)]
    if outcome is Outcome.ACCEPTED:
        return Kind.ACCEPTED_CHANGED if changes(baseline, candidate) else Kind.ACCEPTED_UNCHANGED
    if outcome is Outcome.REJECTED and (
        baseline.phase != candidate.phase or baseline.code != candidate.code
    ):
        return Kind.REJECTED_CHANGED
    return _UNCHANGED[outcome]


def changes(baseline: Verdict, candidate: Verdict) -> tuple[str, ...]:
    """What differs between two acceptances of one call, by field name, in a fixed order."""
    found = []
    if baseline.schema != candidate.schema:
        found.append("schema")
    if not _same_json(baseline.arguments_json, candidate.arguments_json):
        found.append("arguments")
    if baseline.idempotency_key != candidate.idempotency_key:
        found.append("idempotency_key")
    if baseline.requires_approval != candidate.requires_approval:
        found.append("requires_approval")
    return tuple(found)


def _same_json(one: bytes | None, other: bytes | None) -> bool:
    """Equal JSON texts, or two that read as equal values (compared in canonical form)."""
    if one == other:
        return True
    if one is None or other is None:
        return False
    first, second = parse_json(one, _COMPARE_DEPTH), parse_json(other, _COMPARE_DEPTH)
    if isinstance(first, ParseError) or isinstance(second, ParseError):
        return False  # an accepted call's arguments always parse; if not, they are not equal
    return canonical(first) == canonical(second)


@dataclass(frozen=True, slots=True)
class Comparison:
    """One call, its verdict under each contract set, and what changed."""

    call: AssembledCall
    baseline: Verdict
    candidate: Verdict
    kind: Kind

    @property
    def version(self) -> str | None:
        """The schema version the call was judged under (the baseline's, else the candidate's)."""
        schema = self.baseline.schema or self.candidate.schema
        return schema.version if schema is not None else None

    def record(self) -> dict[str, Any]:
        """The flip as shown on the shadow topic and among a replay's examples (see above)."""
        call = self.call
        shown: dict[str, Any] = {
            "event_id": call.event_id,
            "kind": self.kind.value,
            "stream_id": call.stream_id,
            "call_id": call.call_id,
            "tool": call.tool,
            "source": {
                "topic": call.topic,
                "partition": call.partition,
                "first_offset": call.first_offset,
                "last_offset": call.last_offset,
            },
            "baseline": _side(self.baseline),
            "candidate": _side(self.candidate),
        }
        if self.kind is Kind.ACCEPTED_CHANGED:
            shown["changed"] = list(changes(self.baseline, self.candidate))
        return shown

    def encode(self) -> bytes:
        return orjson.dumps(self.record())

    def headers(self) -> list[tuple[str, bytes]]:
        """The shadow topic record's headers: its kind, the call's tool, the schema version
        (so a reader filters without parsing)."""
        version = self.version
        return [
            ("kind", self.kind.value.encode()),
            ("tool", (self.call.tool or "").encode()),
            ("schema-version", version.encode() if version is not None else b""),
        ]


def _side(verdict: Verdict) -> dict[str, Any]:
    schema = verdict.schema
    side: dict[str, Any] = {
        "outcome": verdict.outcome.value,
        "phase": verdict.phase.value if verdict.phase is not None else None,
        "code": (verdict.code or verdict.reason or None),
        "schema": {"id": schema.id, "version": schema.version} if schema is not None else None,
    }
    feedback = verdict.retry_feedback
    if feedback is not None:  # sanitized: declared names only, no value from the input
        side["violations"] = feedback.get("violations", [])
        if feedback.get("violations_omitted"):
            side["violations_omitted"] = feedback["violations_omitted"]
    if verdict.outcome is Outcome.ACCEPTED:
        side["requires_approval"] = verdict.requires_approval
    return side


def judge_both(
    call: AssembledCall, baseline: Verdict, candidate: Callable[[AssembledCall], Verdict]
) -> Comparison:
    """`call`, judged `baseline` under the current contracts, judged again by `candidate`."""
    if call.incomplete is not None or call.assembly_error is not None:
        second = baseline  # decided by the reassembler, before any contract is read
    else:
        second = candidate(call)
    return Comparison(call, baseline, second, compare(baseline, second))
