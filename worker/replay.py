"""`callgate replay`: recorded traffic judged under the current contracts and candidate ones.

Every call is assembled once and judged by both gates (`Processor` with a shadow gate); the
verdicts are compared by the one comparison the worker's shadow mode uses too
(`worker.core.flips.compare`). Each side decides idempotency keys as `callgate check` does, in
this process, with a key store of its own that starts empty: a side accepts a key once and
rejects its later calls as `duplicate` or `idempotency_conflict`, as a worker group running
those contracts would have, whatever the other side decided. So a candidate that rejects a
key's first call can accept its second, and that shows as a flip.

The report counts, per tool and schema version, every `Kind` (the flips and the unchanged),
with the first few flips of each kind as examples (`Comparison.record`: ids, outcomes, codes,
the retry feedback's own violations; never an argument value). It is printed as a table, or as
JSON with `--json` (`Report.to_json`). Exit status: `NO_FLIPS_OVER` none or no more flips than
`--fail-on-flips` allows, `FLIPS_OVER` more; the command line's 2 when the input, a setting, a
contract or the cluster cannot be used.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from worker.core.flips import FLIPS, Comparison, Kind, compare
from worker.core.idempotency import KeyStore, decide_here
from worker.core.processor import Emission
from worker.errors import ConfigError
from worker.schemas.registry import SchemaRegistry

#: exit statuses: no more flips than `--fail-on-flips` allows; more
NO_FLIPS_OVER, FLIPS_OVER = 0, 1
#: flips of each kind shown as examples, by default
EXAMPLES = 3
#: what a call without a tool, or without a schema version, is listed under
NONE = "-"


@dataclass(slots=True)
class Replay:
    """The comparisons of one replay, tallied as they come."""

    baseline_keys: KeyStore
    candidate_keys: KeyStore
    registries: Sequence[SchemaRegistry]
    max_feedback_bytes: int
    examples_per_kind: int = EXAMPLES
    counts: dict[tuple[str, str], Counter[Kind]] = field(default_factory=dict)
    examples: dict[Kind, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, emissions: Iterable[Emission]) -> None:
        for emission in emissions:
            compared = emission.shadow
            assert compared is not None, "a replay's processor judges with a shadow gate"
            self.count(self.settle(compared))

    def settle(self, compared: Comparison) -> Comparison:
        """The comparison once each side's key owner has decided its keyed acceptances."""
        call, limit = compared.call, self.max_feedback_bytes
        baseline = decide_here(self.baseline_keys, call, compared.baseline, limit)
        candidate = decide_here(self.candidate_keys, call, compared.candidate, limit)
        if baseline is compared.baseline and candidate is compared.candidate:
            return compared
        return Comparison(call, baseline, candidate, compare(baseline, candidate))

    def count(self, compared: Comparison) -> None:
        key = (self._tool(compared.call.tool), compared.version or NONE)
        self.counts.setdefault(key, Counter())[compared.kind] += 1
        if compared.kind in _SHOWN:
            shown = self.examples.setdefault(compared.kind, [])
            if len(shown) < self.examples_per_kind:
                shown.append(compared.record())

    def _tool(self, name: str | None) -> str:
        """The tool's own name when a registry knows it (a call may name its schema id)."""
        if name is None:
            return NONE
        for registry in self.registries:
            known = registry.tool_name(name)
            if known is not None:
                return known
        return name

    def report(self, *, baseline: str, candidate: str, source: str) -> Report:
        return Report(baseline, candidate, source, dict(self.counts), dict(self.examples))


#: kinds whose calls are shown as examples: the flips, and rejections for another reason
_SHOWN = FLIPS | {Kind.REJECTED_CHANGED}


@dataclass(frozen=True, slots=True)
class Report:
    baseline: str
    candidate: str
    source: str
    counts: dict[tuple[str, str], Counter[Kind]]
    examples: dict[Kind, list[dict[str, Any]]]

    def total(self) -> Counter[Kind]:
        total: Counter[Kind] = Counter()
        for counts in self.counts.values():
            total.update(counts)
        return total

    @property
    def calls(self) -> int:
        return sum(self.total().values())

    @property
    def flips(self) -> int:
        return sum(count for kind, count in self.total().items() if kind in FLIPS)

    def rows(self) -> list[tuple[str, str, Counter[Kind]]]:
        return [(tool, version, self.counts[(tool, version)]) for tool, version in _order(self)]

    def to_json(self) -> dict[str, Any]:
        total = self.total()
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "source": self.source,
            "calls": self.calls,
            "flips": self.flips,
            "kinds": {kind.value: total[kind] for kind in Kind},
            "tools": [
                {
                    "tool": tool,
                    "version": version,
                    "calls": sum(counts.values()),
                    "flips": _flips(counts),
                    "kinds": {kind.value: counts[kind] for kind in Kind if counts[kind]},
                }
                for tool, version, counts in self.rows()
            ],
            "examples": {kind.value: self.examples[kind] for kind in Kind if kind in self.examples},
        }

    def encode(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2)

    def table(self) -> str:
        """The report for a person: totals, one row per tool and version, the examples."""
        total = self.total()
        flips = ", ".join(
            f"{total[kind]} {_LABELS[kind]}" for kind in Kind if kind in FLIPS and total[kind]
        )
        lines = [
            f"{self.calls} calls from {self.source}",
            f"judged under {self.baseline} (baseline) and {self.candidate} (candidate)",
            f"{self.flips} flips" + (f": {flips}" if flips else ""),
            "",
        ]
        columns = [kind for kind in Kind if kind in _ALWAYS or total[kind]]
        header = ["tool", "version", "calls", "flips", *(_LABELS[kind] for kind in columns)]
        body = [
            [tool, version, str(sum(c.values())), str(_flips(c)), *(str(c[k]) for k in columns)]
            for tool, version, c in self.rows()
        ]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        for row in [header, *body]:
            cells = [
                cell.ljust(width) if i < 2 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        for kind in Kind:
            shown = self.examples.get(kind, [])
            if shown:
                lines += ["", f"{_LABELS[kind]} ({total[kind]}; {len(shown)} shown):"]
                for example in shown:
                    lines += _example(example)
        return "\n".join(lines)


_LABELS: dict[Kind, str] = {
    Kind.ACCEPTED_TO_REJECTED: "accepted -> rejected",
    Kind.REJECTED_TO_ACCEPTED: "rejected -> accepted",
    Kind.ACCEPTED_CHANGED: "accepted, changed",
    Kind.ACCEPTED_TO_INCOMPLETE: "accepted -> incomplete",
    Kind.INCOMPLETE_TO_ACCEPTED: "incomplete -> accepted",
    Kind.REJECTED_TO_INCOMPLETE: "rejected -> incomplete",
    Kind.INCOMPLETE_TO_REJECTED: "incomplete -> rejected",
    Kind.ACCEPTED_UNCHANGED: "accepted",
    Kind.REJECTED_UNCHANGED: "rejected",
    Kind.REJECTED_CHANGED: "rejected, other code",
    Kind.INCOMPLETE_UNCHANGED: "incomplete",
}
#: the table's columns even when no call has them (the first three flips, the unchanged)
_ALWAYS = frozenset(
    {
        Kind.ACCEPTED_TO_REJECTED,
        Kind.REJECTED_TO_ACCEPTED,
        Kind.ACCEPTED_CHANGED,
        Kind.ACCEPTED_UNCHANGED,
        Kind.REJECTED_UNCHANGED,
        Kind.INCOMPLETE_UNCHANGED,
    }
)


def _flips(counts: Counter[Kind]) -> int:
    return sum(count for kind, count in counts.items() if kind in FLIPS)


def _order(report: Report) -> list[tuple[str, str]]:
    def key(item: tuple[str, str]) -> tuple[str, int, str]:
        tool, version = item
        return (tool, int(version) if version.isdigit() else -1, version)

    return sorted(report.counts, key=key)


def _example(example: dict[str, Any]) -> list[str]:
    """One example: which call, then each side's verdict."""
    source = example["source"]
    where = f"{source['topic']}[{source['partition']}] offset {source['first_offset']}"
    lines = [
        f"  call {example['call_id']} of stream {example['stream_id']} ({where}, "
        f"event {example['event_id']})"
    ]
    for side in ("baseline", "candidate"):
        lines += _side(f"{side}:", example[side])
    if example.get("changed"):
        lines.append(f"    changed:   {', '.join(example['changed'])}")
    return lines


def _side(label: str, side: dict[str, Any]) -> list[str]:
    schema = side["schema"]
    text = f"    {label:<10} {side['outcome']}"
    if schema is not None:
        text += f" by {schema['id']} v{schema['version']}"
    if side["code"]:
        text += f", {side['phase']} / {side['code']}"
    lines = [text]
    for violation in side.get("violations") or []:
        lines.append(
            f"{'':15}{violation['path'] or '/'} {violation['keyword']}: {violation['message']}"
        )
    if side.get("violations_omitted"):
        lines.append(f"{'':15}({side['violations_omitted']} more not shown)")
    return lines


def exit_status(report: Report, fail_on_flips: int | None) -> int:
    if fail_on_flips is not None and report.flips > fail_on_flips:
        return FLIPS_OVER
    return NO_FLIPS_OVER


_EPOCH_MS = re.compile(r"^[0-9]+$")


def parse_time(text: str, option: str) -> int:
    """`--since` / `--until`: milliseconds since the epoch, or an ISO 8601 date or time (UTC
    unless it names its offset). Raises `ConfigError` naming the option."""
    if _EPOCH_MS.match(text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{option} takes an ISO 8601 time (2025-06-01T12:00:00Z) or milliseconds since "
            f"the epoch, not {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)
