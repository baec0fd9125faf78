"""Every Prometheus metric callgate exposes, declared here and nowhere else.

A `Metrics` owns its own `CollectorRegistry` (never the global one), so tests and benchmarks can
make as many as they like. The shell feeds it outcome values: `observe(verdict, tool)` once per
judged call, and small setters for gauges and infrastructure counters. With metrics disabled the
same object is updated and simply not served.

Cost on the hot path: the per-call series (calls, rejections, incomplete, repairs, chunks, phase
durations) are plain integers in dictionaries, exposed by a custom collector at scrape time. That
is about ten times cheaper than a `prometheus_client` histogram child (which takes three locks and
scans its buckets linearly per observation), and durations stay integer microseconds until a
scrape. The writer is the one thread that runs the event loop; the scrape thread only copies
(`dict.copy()` and `list()` are single C calls under the GIL, so a scrape sees a consistent
snapshot of each series). Rare events (commit errors, rebalances, gauges) use ordinary
`prometheus_client` metrics.

Label sets stay bounded: `tool` values are the registry's tool names plus `_unknown` (a tool the
registry does not know) and `_none` (a call without a tool, e.g. a refusal); every other label
value comes from a `worker.model` enum, or, for `consumer_lag`, from the assigned partitions.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from worker import __version__
from worker.model import Code, IncompleteReason, Outcome, Phase, RepairKind, Verdict

PREFIX = "callgate_"
UNKNOWN_TOOL = "_unknown"
NO_TOOL = "_none"
NO_LABEL = "_none"

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


class _HotPathCollector(Collector):
    """The per-call series as plain integers; turned into metric families only when scraped."""

    def __init__(self, known_tools: frozenset[str]) -> None:
        self.records = 0
        self.calls: dict[tuple[str, str], int] = {
            (outcome, tool): 0 for outcome in Outcome for tool in known_tools
        }
        self.rejections: dict[tuple[str, str], int] = {}
        self.incomplete: dict[str, int] = dict.fromkeys(IncompleteReason, 0)
        self.repairs: dict[str, int] = dict.fromkeys(RepairKind, 0)
        # Per phase: one count per bucket, the +Inf slot, then the sum in microseconds (last).
        self.buckets: dict[str, list[int]] = {
            phase: [0] * (len(PHASE_BUCKETS_US) + 2) for phase in Phase
        }

    def describe(self) -> Iterable[Metric]:
        return self._families(empty=True)

    def collect(self) -> Iterable[Metric]:
        return self._families(empty=False)

    def _families(self, *, empty: bool) -> Iterator[Metric]:
        records = CounterMetricFamily(_RECORDS, "Input records consumed (chunks, vendor events).")
        calls = CounterMetricFamily(
            _CALLS, "Calls judged, by outcome and tool.", labels=("outcome", "tool")
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
        yield from (records, calls, rejections, incomplete, repairs, durations)


class Metrics:
    """callgate's metrics, bound to `self.registry`. Update from the event-loop thread only."""

    def __init__(
        self,
        tool_labels: Mapping[str, str] | None = None,
        *,
        engine: str = "fastjsonschema",
        version: str = __version__,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        #: every name a call may give a tool (its name, its schema id) -> the tool's label
        self.tool_labels: Mapping[str, str] = tool_labels or {}
        known_tools = frozenset(self.tool_labels.values())
        self.known_tools = known_tools
        self._hot = _HotPathCollector(known_tools)
        self.registry.register(self._hot)
        registry = self.registry
        self._open_calls = Gauge(
            PREFIX + "open_calls", "Calls being assembled (not yet judged).", registry=registry
        )
        self._buffered_bytes = Gauge(
            PREFIX + "buffered_bytes", "Bytes held by calls being assembled.", registry=registry
        )
        self._consumer_lag = Gauge(
            PREFIX + "consumer_lag",
            "Records between the consumed position and the high-water mark, per partition.",
            ("topic", "partition"),
            registry=registry,
        )
        self._assigned_partitions = Gauge(
            PREFIX + "assigned_partitions",
            "Input partitions currently assigned to this worker.",
            registry=registry,
        )
        self._commit_errors = Counter(
            PREFIX + "commit_errors", "Failed offset commits.", registry=registry
        )
        self._produce_errors = Counter(
            PREFIX + "produce_errors",
            "Outcome events the broker did not acknowledge.",
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
        self._poison_records = Counter(
            PREFIX + "poison_records",
            "Input records that could not be read at all, by code.",
            ("code",),
            registry=registry,
        )
        self._poison_children = {
            code: self._poison_records.labels(code.value)
            for code in (Code.MALFORMED_RECORD, Code.INTERNAL_ERROR)
        }
        self._checkpoints = Counter(
            PREFIX + "checkpoints",
            "Checkpoints of input partitions written to their changelog, by kind.",
            ("kind",),
            registry=registry,
        )
        self._checkpoint_bytes = Counter(
            PREFIX + "checkpoint_bytes",
            "Bytes of checkpoints written to the changelogs, by kind.",
            ("kind",),
            registry=registry,
        )
        self._idempotency_decisions = Counter(
            PREFIX + "idempotency_decisions",
            "Decisions of this worker's key owners, by decision.",
            ("decision",),
            registry=registry,
        )
        self._idempotency_keys = Gauge(
            PREFIX + "idempotency_keys",
            "Idempotency keys remembered by this worker's key owners.",
            registry=registry,
        )
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
        Gauge(
            PREFIX + "build_info",
            "Always 1; the labels say which build and schema engine run.",
            ("version", "engine"),
            registry=registry,
        ).labels(version, engine).set(1)

    # -- hot path ------------------------------------------------------------------------------

    def observe(self, verdict: Verdict, tool: str | None) -> None:
        """Count one judged call and record how long each of its phases took."""
        # Keys are the enum members themselves: a StrEnum hashes and compares as its str value,
        # while `.value` is a Python-level property that would triple this method's cost.
        hot = self._hot
        label = NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL)
        outcome = verdict.outcome
        key = (outcome, label)
        calls = hot.calls
        calls[key] = calls.get(key, 0) + 1
        if outcome is Outcome.REJECTED:
            code = verdict.code or NO_LABEL
            rkey = (verdict.phase or NO_LABEL, code)
            rejections = hot.rejections
            rejections[rkey] = rejections.get(rkey, 0) + 1
            poison = self._poison_children.get(code)  # type: ignore[call-overload]
            if poison is not None and verdict.phase is Phase.ASSEMBLY:
                poison.inc()
        elif outcome is Outcome.INCOMPLETE:
            reason = verdict.reason or NO_LABEL
            incomplete = hot.incomplete
            incomplete[reason] = incomplete.get(reason, 0) + 1
        if verdict.repairs:
            repairs = hot.repairs
            for repair in verdict.repairs:
                repairs[repair] = repairs.get(repair, 0) + 1
        buckets, bounds, find = hot.buckets, PHASE_BUCKETS_US, bisect_left
        for phase, micros in verdict.phases_us.items():
            counts = buckets[phase]
            counts[find(bounds, micros)] += 1
            counts[-1] += micros

    def add_records(self, count: int) -> None:
        self._hot.records += count

    def decided(self, outcome: str, tool: str | None, phase: str | None, code: str | None) -> None:
        """Count a call whose outcome its idempotency key's owner decided."""
        hot = self._hot
        label = NO_TOOL if tool is None else self.tool_labels.get(tool, UNKNOWN_TOOL)
        key = (outcome, label)
        hot.calls[key] = hot.calls.get(key, 0) + 1
        if outcome == Outcome.REJECTED:
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
        self._produce_errors.inc(count)

    def rebalance(self) -> None:
        self._rebalances.inc()

    def add_dropped_chunks(self, duplicate: int, late: int) -> None:
        if duplicate:
            self._duplicate_chunks.inc(duplicate)
        if late:
            self._late_chunks.inc(late)

    def checkpoint(self, nbytes: int, *, full: bool) -> None:
        kind = "full" if full else "delta"
        self._checkpoints.labels(kind).inc()
        self._checkpoint_bytes.labels(kind).inc(nbytes)

    def idempotency_decision(self, decision: str) -> None:
        self._idempotency_decisions.labels(decision).inc()

    def set_idempotency_keys(self, count: int) -> None:
        self._idempotency_keys.set(count)

    def event_substituted(self) -> None:
        self._events_substituted.inc()

    def event_dropped(self) -> None:
        self._events_dropped.inc()

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
