"""Every Prometheus metric callgate exposes, declared here and nowhere else.

A `Metrics` owns its own `CollectorRegistry` (never the global one), so tests and benchmarks can
make as many as they like. The shell feeds it outcome values: `observe(verdict, tool)` once per
judged call, `decided(...)` once per call its idempotency key's owner decided, and small setters
for gauges and infrastructure counters. With metrics disabled the same object is updated and
simply not served.

Cost on the hot path: the per-call series (calls, rejections, incomplete, repairs, records, phase
durations) are plain integers in dictionaries, exposed by a custom collector at scrape time. That
is about ten times cheaper than a `prometheus_client` histogram child (which takes three locks and
scans its buckets linearly per observation), and durations stay integer microseconds until a
scrape. The writer is the one thread that runs the event loop; the scrape thread only copies
(`dict.copy()` and `list()` are single C calls under the GIL, so a scrape sees a consistent
snapshot of each series). Rare events (commit errors, rebalances, checkpoints, gauges) use
ordinary `prometheus_client` metrics.

Label sets stay bounded: `tool` values are the registry's tool labels plus `_unknown` (a name the
registry does not know) and `_none` (a call without a tool, e.g. a refusal); every other label
value comes from an enum (`worker.model`, `Decision`, `worker.core.flips.Kind`) or a fixed pair
(`full`/`delta`), or, for `consumer_lag`, from the assigned partitions, or, for the shadow
series' `version`, from the contracts' own versions. Nothing from a record ever becomes a label
value.

Series a rate or an alert must see from their first increment exist, at zero, from the start:
every (outcome, tool), reason, kind, decision, the poison codes, and `internal_error` in every
phase where the chain can fail (`rate()` and `increase()` miss the increment that creates a
series).
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from worker import __version__
from worker.core.flips import Comparison, Kind
from worker.core.idempotency import Decision
from worker.model import Code, IncompleteReason, Outcome, Phase, RepairKind, Verdict
from worker.settings import SchemaSettings

PREFIX = "callgate_"
UNKNOWN_TOOL = "_unknown"
NO_TOOL = "_none"
NO_LABEL = "_none"

#: what an approval owner did: a call held, or a decision's ruling (`worker.core.approval.Ruling`)
APPROVAL_RESULTS = ("held", "approved", "denied", "expired", "refused")
#: what came of a call at an executor (`callgate_executor`): its handler's run (succeeded, failed,
#: timed_out), or an answer without one; redelivered: a call answered before, delivered again;
#: passed_over: an accepted event that is no call to run (an MCP tool result, a call of a kind
#: the client does not run), which gets no result
EXECUTOR_OUTCOMES = (
    "succeeded",
    "failed",
    "timed_out",
    "interrupted",
    "replayed",
    "conflict",
    "refused",
    "redelivered",
    "passed_over",
)
#: the `kind` of a checkpoint: the whole state of a partition, or what changed since the last
CHECKPOINT_KINDS = ("full", "delta")
#: rejections of phase `assembly` with these codes are records that could not be read at all
POISON_CODES = (Code.MALFORMED_RECORD, Code.INTERNAL_ERROR)
#: phases the chain can fail in with `internal_error` (delivery only substitutes events)
INTERNAL_ERROR_PHASES = tuple(phase for phase in Phase if phase is not Phase.DELIVERY)

# Upper bounds of the phase-duration buckets, in microseconds (1 µs .. 1 s).
PHASE_BUCKETS_US: tuple[int, ...] = (
    1,
    2,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
)
PHASE_BUCKETS_S: tuple[float, ...] = tuple(us / 1_000_000 for us in PHASE_BUCKETS_US)
_LE = tuple(repr(bound) for bound in PHASE_BUCKETS_S)

_CALLS = PREFIX + "calls"
_REJECTIONS = PREFIX + "rejections"
_INCOMPLETE = PREFIX + "incomplete"
_REPAIRS = PREFIX + "repairs"
_RECORDS = PREFIX + "records"
_PHASE_DURATION = PREFIX + "phase_duration_seconds"
_SHADOW_CALLS = PREFIX + "shadow_calls"

# the hot path's enum members, bound once (a global is cheaper than a class attribute)
_ACCEPTED, _REJECTED, _INCOMPLETE_OUTCOME = Outcome.ACCEPTED, Outcome.REJECTED, Outcome.INCOMPLETE
_ASSEMBLY = Phase.ASSEMBLY

# the one place the engine's default is defined is the settings object
_DEFAULT_ENGINE: str = SchemaSettings.model_fields["engine"].default


class _HotPathCollector(Collector):
    """The per-call series as plain integers; turned into metric families only when scraped."""

    def __init__(
        self, tool_labels: frozenset[str], shadow_series: Iterable[tuple[str, str]]
    ) -> None:
        self.records = 0
        self.calls: dict[tuple[str, str], int] = {
            (outcome, tool): 0
            for outcome in Outcome
            for tool in sorted(tool_labels | {UNKNOWN_TOOL, NO_TOOL})
        }
        self.rejections: dict[tuple[str, str], int] = {
            (phase, Code.INTERNAL_ERROR): 0 for phase in INTERNAL_ERROR_PHASES
        }
        self.incomplete: dict[str, int] = dict.fromkeys(IncompleteReason, 0)
        self.repairs: dict[str, int] = dict.fromkeys(RepairKind, 0)
        # Per phase: one count per bucket, the +Inf slot, then the sum in microseconds (last).
        self.buckets: dict[str, list[int]] = {
            phase: [0] * (len(PHASE_BUCKETS_US) + 2) for phase in Phase
        }
        self.shadow: dict[tuple[str, str, str], int] = {
            (tool, version, kind): 0 for tool, version in shadow_series for kind in Kind
        }

    def describe(self) -> Iterable[Metric]:
        return self._families(empty=True)

    def collect(self) -> Iterable[Metric]:
        return self._families(empty=False)

    def _families(self, *, empty: bool) -> Iterator[Metric]:
        records = CounterMetricFamily(
            _RECORDS, "Input records consumed (envelope chunks and vendor events)."
        )
        calls = CounterMetricFamily(
            _CALLS,
            "Calls judged, by outcome and tool (a keyed call when its key's owner decides).",
            labels=("outcome", "tool"),
        )
        rejections = CounterMetricFamily(
            _REJECTIONS, "Rejected calls, by failing phase and code.", labels=("phase", "code")
        )
        incomplete = CounterMetricFamily(
            _INCOMPLETE, "Incomplete calls, by reason.", labels=("reason",)
        )
        repairs = CounterMetricFamily(
            _REPAIRS, "Lossless repairs applied, by kind.", labels=("kind",)
        )
        durations = HistogramMetricFamily(
            _PHASE_DURATION, "Time spent in each phase of the chain, per call.", labels=("phase",)
        )
        shadow = CounterMetricFamily(
            _SHADOW_CALLS,
            "Calls judged again under the candidate contracts (shadow mode), by tool, schema "
            "version and kind: a flip (accepted_to_rejected, rejected_to_accepted, "
            "accepted_changed, ...) or none (accepted_unchanged, rejected_changed, ...).",
            labels=("tool", "version", "kind"),
        )
        if not empty:
            records.add_metric((), self.records)
            for (outcome, tool), value in self.calls.copy().items():
                calls.add_metric((str(outcome), str(tool)), value)
            for (phase, code), value in self.rejections.copy().items():
                rejections.add_metric((str(phase), str(code)), value)
            for reason, value in self.incomplete.copy().items():
                incomplete.add_metric((str(reason),), value)
            for kind, value in self.repairs.copy().items():
                repairs.add_metric((str(kind),), value)
            for phase, counts in self.buckets.items():
                *per_bucket, sum_us = list(counts)
                cumulative = 0
                buckets: list[tuple[str, float]] = []
                for bound, count in zip((*_LE, "+Inf"), per_bucket, strict=True):
                    cumulative += count
                    buckets.append((bound, cumulative))
                durations.add_metric((str(phase),), buckets, sum_value=sum_us / 1_000_000)
            for (tool, version, kind), value in self.shadow.copy().items():
                shadow.add_metric((tool, version, str(kind)), value)
        yield from (records, calls, rejections, incomplete, repairs, durations, shadow)


class Metrics:
    """callgate's metrics, bound to `self.registry`. Update from the event-loop thread only.

    `tool_labels` maps every name a call may give a tool (its name, its schema id) to the tool's
    label. `max_idempotency_keys` is how many keys the idempotency store may hold in all
    (`max_keys` per partition times the partitions of the idempotency topics); when given it is
    exposed as `callgate_idempotency_keys_limit`, which the alert on a store near its bound needs.
    `shadow_series` are the (tool label, version) pairs of the shadow series to expose at zero
    from the start (every contract of both sets, when shadow mode is on).
    """

    def __init__(
        self,
        tool_labels: Mapping[str, str],
        *,
        engine: str = _DEFAULT_ENGINE,
        version: str = __version__,
        max_idempotency_keys: int | None = None,
        shadow_series: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tool_labels: Mapping[str, str] = dict(tool_labels)
        self.known_tools = frozenset(self.tool_labels.values())
        self._hot = _HotPathCollector(self.known_tools, shadow_series)
        self.registry.register(self._hot)
        registry = self.registry
        # process_*: CPU seconds, resident and virtual memory, open and maximum file
        # descriptors, start time (read from /proc at scrape time; nothing where there is none)
        ProcessCollector(registry=registry)
        self._open_calls = Gauge(
            PREFIX + "open_calls", "Calls being assembled (not yet judged).", registry=registry
        )
        self._buffered_bytes = Gauge(
            PREFIX + "buffered_bytes", "Bytes held by calls being assembled.", registry=registry
        )
        self._consumer_lag = Gauge(
            PREFIX + "consumer_lag",
            "Records between the next one to judge and the end of the log (read_committed: the "
            "last stable offset), per assigned partition, idle ones at 0.",
            ("topic", "partition"),
            registry=registry,
        )
        self._assigned_partitions = Gauge(
            PREFIX + "assigned_partitions",
            "Partitions currently assigned to this worker (input and idempotency requests).",
            registry=registry,
        )
        self._commit_errors = Counter(
            PREFIX + "commit_errors", "Failed offset commits.", registry=registry
        )
        self._produce_errors = Counter(
            PREFIX + "produce_errors",
            "Writes a topic failed to acknowledge (retried until it does).",
            registry=registry,
        )
        self._rebalances = Counter(
            PREFIX + "rebalances",
            "Consumer-group rebalances this worker took part in.",
            registry=registry,
        )
        self._duplicate_chunks = Counter(
            PREFIX + "duplicate_chunks",
            "Chunks dropped as retransmissions of a piece already taken.",
            registry=registry,
        )
        self._late_chunks = Counter(
            PREFIX + "late_chunks",
            "Chunks dropped because their call already has its verdict (after a timeout, an "
            "eviction, a gap...).",
            registry=registry,
        )
        self._early_dropped_chunks = Counter(
            PREFIX + "early_dropped_chunks",
            "Chunks dropped unread because their call was already rejected early.",
            registry=registry,
        )
        poison_records = Counter(
            PREFIX + "poison_records",
            "Input records that could not be read at all, by code.",
            ("code",),
            registry=registry,
        )
        self._poison: dict[Code, Counter] = {
            code: poison_records.labels(code.value) for code in POISON_CODES
        }
        checkpoints = Counter(
            PREFIX + "checkpoints",
            "Checkpoints of input partitions written to their changelog, by kind.",
            ("kind",),
            registry=registry,
        )
        checkpoint_bytes = Counter(
            PREFIX + "checkpoint_bytes",
            "Bytes of checkpoints written to the changelogs, by kind.",
            ("kind",),
            registry=registry,
        )
        self._checkpoints = {
            full: (checkpoints.labels(kind), checkpoint_bytes.labels(kind))
            for full, kind in zip((True, False), CHECKPOINT_KINDS, strict=True)
        }
        decisions = Counter(
            PREFIX + "idempotency_decisions",
            "Decisions of this worker's key owners, by decision.",
            ("decision",),
            registry=registry,
        )
        self._decisions = {decision: decisions.labels(decision.value) for decision in Decision}
        self._idempotency_keys = Gauge(
            PREFIX + "idempotency_keys",
            "Idempotency keys remembered by this worker's key owners.",
            registry=registry,
        )
        approvals = Counter(
            PREFIX + "approvals",
            "What this worker's approval owners did: calls held for approval, and decisions "
            "approved, denied, expired or refused.",
            ("result",),
            registry=registry,
        )
        self._approvals = {result: approvals.labels(result) for result in APPROVAL_RESULTS}
        executor_calls = Counter(
            PREFIX + "executor_calls",
            "Calls an executor answered, by tool and outcome: its handler's run (succeeded, "
            "failed, timed_out), interrupted, replayed (an equal request's recorded result), "
            "conflict, refused, redelivered (answered before, delivered again), or passed_over "
            "(no call to run: an MCP tool result, a call of a kind the client does not run).",
            ("tool", "outcome"),
            registry=registry,
        )
        self._executor_calls = {
            (tool, outcome): executor_calls.labels(tool, outcome)
            for tool in self.known_tools | {UNKNOWN_TOOL, NO_TOOL}
            for outcome in EXECUTOR_OUTCOMES
        }
        self._pending_approvals = Gauge(
            PREFIX + "pending_approvals",
            "Calls waiting for a decision in the partitions this worker's approval owners hold.",
            registry=registry,
        )
        if max_idempotency_keys is not None:
            Gauge(
                PREFIX + "idempotency_keys_limit",
                "Keys the idempotency store may hold in all (max_keys per partition times the "
                "partitions of the idempotency topics); the oldest are forgotten beyond it.",
                registry=registry,
            ).set(max_idempotency_keys)
        self._events_substituted = Counter(
            PREFIX + "events_substituted",
            "Events a topic refused for good, replaced by a rejection that says so.",
            registry=registry,
        )
        self._events_dropped = Counter(
            PREFIX + "events_dropped",
            "Events refused for good with no substitute possible (see the log).",
            registry=registry,
        )
        self._input_records_deleted = Counter(
            PREFIX + "input_records_deleted",
            "Input records deleted before they were judged (retention shorter than the lag): "
            "their calls have no verdict, or one from what is left (see the log).",
            registry=registry,
        )
        client_log_records = Counter(
            PREFIX + "kafka_client_log_records",
            "Warnings and errors of the Kafka client (aiokafka), and the worker's own repeated "
            "broker errors, by level: the log writes each kind once per reminder interval, and "
            "none while Kafka is unreachable (it says that once).",
            ("level",),
            registry=registry,
        )
        self._client_log_records = {
            level: client_log_records.labels(level) for level in ("warning", "error")
        }
        Gauge(
            PREFIX + "build_info",
            "Always 1; the labels say which build and schema engine run.",
            ("version", "engine"),
            registry=registry,
        ).labels(version, engine).set(1)

    # -- hot path ------------------------------------------------------------------------------

    def observe(self, verdict: Verdict, tool: str | None) -> None:
        """Count one judged call and record how long each of its phases took.

        An accepted call pending its key's owner (`idempotency_digest` set) or a person's
        approval (`requires_approval`) has its phases and repairs recorded here; its outcome is
        counted by `decided`, once the owner decides.
        """
        # Keys are the enum members themselves: a StrEnum hashes and compares as its str value,
        # while `.value` is a Python-level property that would triple this method's cost.
        hot = self._hot
        outcome = verdict.outcome
        if outcome is not _ACCEPTED or (
            verdict.idempotency_digest is None and not verdict.requires_approval
        ):
            key = (outcome, NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL))
            calls = hot.calls
            calls[key] = calls.get(key, 0) + 1
        if outcome is _REJECTED:
            phase, code = verdict.phase, verdict.code
            rkey = (phase or NO_LABEL, code or NO_LABEL)
            rejections = hot.rejections
            rejections[rkey] = rejections.get(rkey, 0) + 1
            if phase is _ASSEMBLY and code is not None:
                poison = self._poison.get(code)
                if poison is not None:
                    poison.inc()
        elif outcome is _INCOMPLETE_OUTCOME:
            reason = verdict.reason or NO_LABEL
            incomplete = hot.incomplete
            incomplete[reason] = incomplete.get(reason, 0) + 1
        if verdict.repairs:
            repairs = hot.repairs
            for repair in verdict.repairs:
                repairs[repair] = repairs.get(repair, 0) + 1
        buckets, bounds, find = hot.buckets, PHASE_BUCKETS_US, bisect_left
        for phase_name, micros in verdict.phases_us.items():
            counts = buckets[phase_name]
            counts[find(bounds, micros)] += 1
            counts[-1] += micros

    def shadow(self, compared: Comparison) -> None:
        """Count one call judged again under the candidate contracts, by what changed."""
        tool = compared.call.tool
        label = NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL)
        key = (label, compared.version or NO_LABEL, compared.kind)
        shadow = self._hot.shadow
        shadow[key] = shadow.get(key, 0) + 1

    def add_records(self, count: int) -> None:
        self._hot.records += count

    def decided(
        self, outcome: Outcome, tool: str | None, phase: Phase | None, code: Code | None
    ) -> None:
        """Count a call whose outcome its idempotency key's owner, or its approval's, decided."""
        hot = self._hot
        key = (outcome, NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL))
        hot.calls[key] = hot.calls.get(key, 0) + 1
        if outcome is Outcome.REJECTED:
            rkey = (phase or NO_LABEL, code or NO_LABEL)
            hot.rejections[rkey] = hot.rejections.get(rkey, 0) + 1

    # -- per round / per event -----------------------------------------------------------------

    def set_open_calls(self, count: int) -> None:
        self._open_calls.set(count)

    def set_buffered_bytes(self, nbytes: int) -> None:
        self._buffered_bytes.set(nbytes)

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self._consumer_lag.labels(topic, str(partition)).set(lag)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop a revoked partition's lag series, so it does not linger at its last value."""
        with contextlib.suppress(KeyError):
            self._consumer_lag.remove(topic, str(partition))

    def set_assigned_partitions(self, count: int) -> None:
        self._assigned_partitions.set(count)

    def commit_error(self) -> None:
        self._commit_errors.inc()

    def produce_error(self, count: int = 1) -> None:
        if count > 0:
            self._produce_errors.inc(count)

    def rebalance(self) -> None:
        self._rebalances.inc()

    def add_dropped_chunks(self, duplicate: int, late: int, early: int = 0) -> None:
        """Chunks the reassembler dropped since the last call (a counter never goes down)."""
        if duplicate > 0:
            self._duplicate_chunks.inc(duplicate)
        if late > 0:
            self._late_chunks.inc(late)
        if early > 0:
            self._early_dropped_chunks.inc(early)

    def checkpoint(self, nbytes: int, *, full: bool) -> None:
        count, size = self._checkpoints[full]
        count.inc()
        if nbytes > 0:
            size.inc(nbytes)

    def idempotency_decision(self, decision: Decision) -> None:
        self._decisions[decision].inc()

    def set_idempotency_keys(self, count: int) -> None:
        self._idempotency_keys.set(count)

    def approval(self, result: str) -> None:
        """Count what an approval owner did (one of `APPROVAL_RESULTS`)."""
        self._approvals[result].inc()

    def executor_call(self, tool: str | None, outcome: str) -> None:
        """Count a call an executor answered (`outcome`: one of `EXECUTOR_OUTCOMES`)."""
        label = NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL)
        self._executor_calls[(label, outcome)].inc()

    def set_pending_approvals(self, count: int) -> None:
        self._pending_approvals.set(count)

    def event_substituted(self) -> None:
        self._events_substituted.inc()

    def event_dropped(self) -> None:
        self._events_dropped.inc()

    def client_log_record(self, error: bool) -> None:
        """One warning (or, `error`, an error or worse) of the Kafka client, or a repeat of the
        worker's."""
        self._client_log_records["error" if error else "warning"].inc()

    def input_records_deleted(self, count: int) -> None:
        if count > 0:
            self._input_records_deleted.inc(count)

    # -- introspection -------------------------------------------------------------------------

    def series_names(self) -> frozenset[str]:
        """Every sample name a scrape of this registry can contain (what PromQL refers to)."""
        return series_names(self.registry)


_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def series_names(registry: CollectorRegistry) -> frozenset[str]:
    """Sample names of every family in `registry`, labelled or not, observed yet or not."""
    names: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)
