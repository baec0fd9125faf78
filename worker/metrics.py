"""Every Prometheus metric callgate exposes, declared here and nowhere else.

A `Metrics` owns its own `CollectorRegistry` (never the global one), so tests and benchmarks can
make as many as they like. The shell feeds it outcome values: `observe(verdict, tool)` once per
judged call, and small setters for gauges and infrastructure counters. `NullMetrics` has the same
methods and does nothing: that is what "metrics disabled" means.

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
from collections.abc import Iterable, Iterator

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
_CHUNKS = PREFIX + "chunks"
_PHASE_DURATION = PREFIX + "phase_duration_seconds"


class _HotPathCollector(Collector):
    """The per-call series as plain integers; turned into metric families only when scraped."""

    def __init__(self, known_tools: frozenset[str]) -> None:
        self.chunks = 0
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
        chunks = CounterMetricFamily(_CHUNKS, "Input records (chunks) consumed.")
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
            chunks.add_metric((), self.chunks)
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
        yield from (chunks, calls, rejections, incomplete, repairs, durations)


class Metrics:
    """callgate's metrics, bound to `self.registry`. Update from the event-loop thread only."""

    def __init__(
        self,
        known_tools: frozenset[str] = frozenset(),
        *,
        engine: str = "fastjsonschema",
        version: str = __version__,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
            "Chunks dropped because their (call, seq) was already seen.",
            registry=registry,
        )
        self._poison_records = Counter(
            PREFIX + "poison_records",
            "Input records that could not be decoded at all, by code.",
            ("code",),
            registry=registry,
        )
        self._poison_children = {
            code: self._poison_records.labels(code.value)
            for code in (Code.MALFORMED_RECORD, Code.UNKNOWN_FORMAT)
        }
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
        if tool is None:
            label = NO_TOOL
        elif tool in self.known_tools:
            label = tool
        else:
            label = UNKNOWN_TOOL
        outcome = verdict.outcome
        key = (outcome, label)
        calls = hot.calls
        calls[key] = calls.get(key, 0) + 1
        if outcome is Outcome.REJECTED:
            rkey = (verdict.phase or NO_LABEL, verdict.code or NO_LABEL)
            rejections = hot.rejections
            rejections[rkey] = rejections.get(rkey, 0) + 1
        elif outcome is Outcome.INCOMPLETE:
            reason = verdict.reason or NO_LABEL
            incomplete = hot.incomplete
            incomplete[reason] = incomplete.get(reason, 0) + 1
        if verdict.repairs:
            repairs = hot.repairs
            for repair in verdict.repairs:
                repairs[repair.kind] = repairs.get(repair.kind, 0) + 1
        buckets, bounds, find = hot.buckets, PHASE_BUCKETS_US, bisect_left
        for phase, micros in verdict.phases_us.items():
            counts = buckets[phase]
            counts[find(bounds, micros)] += 1
            counts[-1] += micros

    def add_chunks(self, count: int = 1) -> None:
        self._hot.chunks += count

    # -- per batch / per event -----------------------------------------------------------------

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

    def add_duplicate_chunks(self, count: int = 1) -> None:
        if count:
            self._duplicate_chunks.inc(count)

    def poison_record(self, code: Code = Code.MALFORMED_RECORD) -> None:
        child = self._poison_children.get(code)
        if child is None:
            child = self._poison_children[code] = self._poison_records.labels(code.value)
        child.inc()

    # -- introspection -------------------------------------------------------------------------

    def series_names(self) -> frozenset[str]:
        """Every sample name a scrape of this registry can contain (what PromQL refers to)."""
        return series_names(self.registry)


class NullMetrics(Metrics):
    """Metrics disabled: the same methods, no work, an empty registry."""

    def __init__(
        self,
        known_tools: frozenset[str] = frozenset(),
        *,
        engine: str = "fastjsonschema",
        version: str = __version__,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.known_tools = known_tools

    def observe(self, verdict: Verdict, tool: str | None) -> None:
        pass

    def add_chunks(self, count: int = 1) -> None:
        pass

    def set_open_calls(self, count: int) -> None:
        pass

    def set_buffered_bytes(self, nbytes: int) -> None:
        pass

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        pass

    def forget_partition(self, topic: str, partition: int) -> None:
        pass

    def set_assigned_partitions(self, count: int) -> None:
        pass

    def commit_error(self) -> None:
        pass

    def produce_error(self, count: int = 1) -> None:
        pass

    def rebalance(self) -> None:
        pass

    def add_duplicate_chunks(self, count: int = 1) -> None:
        pass

    def poison_record(self, code: Code = Code.MALFORMED_RECORD) -> None:
        pass


def build_metrics(enabled: bool, known_tools: frozenset[str], *, engine: str) -> Metrics:
    """The entry point's choice: real metrics, or the no-op twin when metrics are disabled."""
    if enabled:
        return Metrics(known_tools, engine=engine)
    return NullMetrics(known_tools, engine=engine)


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
