"""Benchmark 4: end to end, on the embedded broker (tansu) and on Apache Kafka.

Per broker, one input topic of 3 partitions is loaded once with the same workload for every
contender: canonical envelopes of small get_weather calls (20 % invalid), 10 chunks each, many
streams interleaved, each stream's records in one partition (Kafka's default partitioner on the
stream id). Then, one after the other and in a fresh consumer group each, three child processes
drain it from offset 0, with the worker's own client options:

- consume-only (`benchmarks.consume`): reads every record, writes nothing: the read ceiling;
- pass-through (`benchmarks.passthrough`): copies every record to an output topic with batched
  produce, acks=all, offsets committed past acknowledged records, the next fetch overlapping the
  acknowledgements: the ceiling of a correct worker on this stack;
- `python -m worker run`, settings by environment (`CALLGATE_*`): one outcome event per call,
  its checkpoints, its commits;
- the same in shadow mode (`CALLGATE_SHADOW__SCHEMAS`): every call judged again under candidate
  contracts, the shipped ones with get_weather's units narrowed to celsius, so the workload's
  fahrenheit calls flip (counted in the metrics; its events must still be the current
  contracts'). Its rate over callgate's, round by round, is shadow mode's cost.

Those are the `at_least_once` contenders. Under `exactly_once` (`--delivery`; Apache Kafka only:
tansu has no transactions, so that pairing is skipped there, said in the results) the
pass-through runs `--transactional` (a transactional producer, a `read_committed` consumer, the
input offsets sent into the transaction, a commit every `commit_interval_ms`, callgate's commit
interval under exactly_once) and callgate runs with `CALLGATE_DELIVERY__GUARANTEE=exactly_once`;
their outputs are read `read_committed`. No shadow mode there (its cost is the judging's, not
the delivery's). Within a round the contenders run back to back, consume-only first, each
mode's pass-through just before its callgate: each share is of a pair measured together.

Rates are input records per second. For the two that write, the window runs from the first
output record's broker timestamp to the last one's, which keeps process start and the group join
out of it; consume-only times itself from its first non-empty fetch. A writer is done when its
group's committed offsets reach the end of every input partition (polled every 0.5 s). The
figure is callgate's rate as a share of the pass-through's (target 60 % on tansu, 75 % on
Apache Kafka); the outputs are checked: the pass-through wrote every record, callgate judged
every call once, as the in-process processor judges the same workload.

CPU per wall second (`benchmarks.cpu`): each writer's process is sampled from `/proc` every
20 ms while it runs; over its drain window (the first output record's timestamp to the last's,
a backlog waiting all along: the contender saturated) its CPU seconds per wall second (target
0.9 for callgate: the worker busy, not waiting), and the machine's busy cores in the same
window (2 cores here, shared with the broker, the benchmark and whatever else runs), and the
broker's own CPU per wall second in it.

Latency: a fresh worker on fresh topics, warm-up calls answered, then calls produced paced at
half of callgate's measured rate (each 10 ms tick's records in one batch per partition,
acks=all, no linger). Per call, from its last chunk's acknowledgement (and from its send) to its
outcome event read by a tail consumer: p50, p90, p99, max (target p99 25 ms). The load generator
(`benchmarks.loadgen`) runs in a process of its own, started once the warm-up is answered; the
tail runs in this one, and both read the one system-wide monotonic clock. The generator reports
when it sent and saw acknowledged each call's last chunk, how far it fell behind its schedule at
worst and the rate it achieved; a run where it fell behind (by more than 100 ms at any tick, or
an achieved rate under 95 % of the target) is void: its load was not the rate asked for. A
generator that fails is an error, not a void run. The pass-through runs the same paced traffic
(its copy of a call's last chunk is what the tail waits for): the stack's own latency at that
rate, two hops and no work. Both again at a quarter and at a twentieth of the rate, to show how
the latency moves with the load, and (full size only) two more callgate runs with one setting
changed each (`VARIANTS`), which show what bounds the latency. Under exactly_once at half rate
only, the tail reading `read_committed`: an event is readable once its transaction commits,
every `commit_interval_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from benchmarks import cpu, loadgen, workload
from benchmarks.common import ROOT, SEED_SCHEMAS, median
from benchmarks.harness import Callgate, verdicts
from benchmarks.workload import Record
from callgate_demo.broker import EmbeddedBroker

FRAGMENTS = 10
PARTITIONS = 3
INVALID_SHARE = 0.2
ENGINE = "fastjsonschema"  # the settings' default: what `callgate run` uses unless told
BROKERS = ("tansu", "apache")
#: callgate's records/s over the pass-through's, by broker
TARGET_SHARE = {"tansu": 0.6, "apache": 0.75}
TARGET_P99_MS = 25.0
#: callgate's CPU seconds per wall second while it drains a backlog
TARGET_CPU_PER_WALL = 0.9
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once"
DELIVERIES = (AT_LEAST_ONCE, EXACTLY_ONCE)
#: brokers without transactions, and why exactly_once is not run on them
NO_TRANSACTIONS = {
    "tansu": "skipped: tansu (the embedded broker) has no transactions; exactly_once needs a "
    "broker with them (Apache Kafka)"
}
#: a latency run whose load generator achieved less than this share of its rate, or was
#: behind its schedule by more than this at any tick (ten ticks' records sent at once), is void
KEPT_RATE = 0.95
MAX_BEHIND_S = 0.1


def fell_behind(rate: float, achieved: float, behind_s: float) -> bool:
    """Whether a paced load generator failed its schedule: a void latency run."""
    return achieved < KEPT_RATE * rate or behind_s > MAX_BEHIND_S


PYTHON = sys.executable
POLL_S = 0.5
TICK_S = 0.01
#: the issue's latency is measured at half of callgate's maximum rate
HALF = 0.5
#: callgate's latency runs: the defaults, and two settings that show what bounds the latency
#: (the check that the topics written to exist runs every 100 ms while checkpoints wait for
#: it, so the 60 s variant also sends checkpoints and commits that rarely; the producer waits
#: `linger_ms` before sending a batch)
VARIANTS: dict[str, dict[str, str]] = {
    "callgate": {},
    "callgate, topic check every 60 s": {"CALLGATE_KAFKA__TOPIC_CHECK_INTERVAL_MS": "60000"},
    # the default before it was 0: the outbox batches a round itself, so lingering only waits
    "callgate, linger 5 ms": {"CALLGATE_KAFKA__LINGER_MS": "5"},
}


@contextlib.contextmanager
def running_broker(kind: str, logs: Path) -> Iterator[tuple[str, int | None]]:
    """A fresh broker of `kind` for the duration: its bootstrap servers and its process."""
    if kind == "tansu":
        with EmbeddedBroker(log_file=logs / "tansu.log") as tansu:
            yield tansu.bootstrap_servers, tansu.pid
        return
    # Apache Kafka: the jars from Maven Central (tools/kafka/fetch), one KRaft node on loopback
    from tests.support.apache_kafka import ApacheKafka, fetch_libs  # noqa: PLC0415

    kafka = ApacheKafka(fetch_libs(timeout_s=300), logs / "apache-kafka")
    try:  # a start that fails half way (not only by its timeout) still stops its process
        kafka.start(timeout_s=90)
        yield kafka.bootstrap_servers, kafka.pid
    finally:
        kafka.stop()


@contextlib.contextmanager
def broker(kind: str, logs: Path) -> Iterator[str]:
    """A fresh broker of `kind` for the duration: its bootstrap servers."""
    with running_broker(kind, logs) as (bootstrap, _):
        yield bootstrap


#: the contender that runs callgate in shadow mode (its candidate contracts in the logs directory)
SHADOW = "callgate_shadow"


def candidate_contracts(logs: Path) -> Path:
    """The shadow contender's candidate: the shipped contracts with get_weather's units narrowed
    to celsius (made once per run, in the logs directory)."""
    target = logs / "candidate"
    if not target.exists():
        shutil.copytree(SEED_SCHEMAS, target)
        for path in (target / "weather").glob("get_weather.v*.schema.json"):
            schema = orjson.loads(path.read_bytes())
            schema["properties"]["units"]["enum"] = ["celsius"]
            path.write_bytes(orjson.dumps(schema))
    return target


def _worker_env(bootstrap: str, group: str, source: str, target: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "CALLGATE_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "CALLGATE_KAFKA__GROUP_ID": group,
            "CALLGATE_TOPICS__INPUT": source,
            "CALLGATE_TOPICS__ACCEPTED": target,
            "CALLGATE_TOPICS__REJECTED": target,
            "CALLGATE_TOPICS__INCOMPLETE": target,
            "CALLGATE_SCHEMAS__DIR": str(SEED_SCHEMAS),
            "CALLGATE_SCHEMAS__ENGINE": ENGINE,
            "CALLGATE_METRICS__PORT": "0",
            "CALLGATE_LOG_LEVEL": "WARNING",
        }
    )
    return env


def _contender(
    kind: str, delivery: str, *, bootstrap: str, group: str, source: str, target: str, logs: Path
) -> tuple[list[str], dict[str, str]]:
    """How a writer is started: the pass-through (transactional under exactly_once), or
    callgate under `delivery` (in shadow mode for `SHADOW`, with `VARIANTS[kind]`'s settings
    otherwise)."""
    if kind == "passthrough":
        command = [PYTHON, "-m", "benchmarks.passthrough", bootstrap, group, source, target]
        if delivery == EXACTLY_ONCE:
            command.append("--transactional")
        return command, {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {
        **_worker_env(bootstrap, group, source, target),
        "CALLGATE_DELIVERY__GUARANTEE": delivery,
    }
    if kind == SHADOW:
        env["CALLGATE_SHADOW__SCHEMAS"] = str(candidate_contracts(logs))
    else:
        env.update(VARIANTS[kind])
    return [PYTHON, "-m", "worker", "run"], env


def _label(kind: str, delivery: str) -> str:
    """A contender's name in its group, topics and log: the kind, and the mode unless
    at_least_once."""
    return kind if delivery == AT_LEAST_ONCE else f"{kind}-{delivery.replace('_', '-')}"


def _start(
    command: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to this one child, SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def partitioned(records: list[Record]) -> dict[int, list[Record]]:
    """Each record in its stream's partition (Kafka's default partitioner on the key)."""
    return loadgen.partitioned(records, PARTITIONS)


async def _create(bootstrap: str, *topics: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in topics]
        )
    finally:
        await admin.close()


async def _send_batches(
    producer: AIOKafkaProducer, topic: str, partition: int, records: list[Record]
) -> list[asyncio.Future[Any]]:
    futures = []
    batch = producer.create_batch()
    for r in records:
        if batch.append(key=r.key, value=r.value, timestamp=None, headers=[]) is None:
            futures.append(await producer.send_batch(batch, topic, partition=partition))
            batch = producer.create_batch()
            batch.append(key=r.key, value=r.value, timestamp=None, headers=[])
    futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


async def _load(bootstrap: str, topic: str, by_partition: dict[int, list[Record]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        step = 20_000
        for start in range(0, max(len(r) for r in by_partition.values()), step):
            futures = []
            for partition, records in by_partition.items():
                futures += await _send_batches(
                    producer, topic, partition, records[start : start + step]
                )
            await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _committed_to_end(bootstrap: str, group: str, topic: str) -> bool:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            if ((await consumer.committed(tp)) or 0) < ends[tp]:
                return False
        return True
    finally:
        await consumer.stop()


async def _wait_done(
    bootstrap: str, group: str, topic: str, process: subprocess.Popen[bytes], timeout_s: float
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if await _committed_to_end(bootstrap, group, topic):
            return True
        await asyncio.sleep(POLL_S)
    return False


def _isolation(delivery: str) -> str:
    """How a reader of a contender's output reads it: committed transactions only under
    exactly_once."""
    return "read_committed" if delivery == EXACTLY_ONCE else "read_uncommitted"


async def _read_all(bootstrap: str, topic: str, delivery: str = AT_LEAST_ONCE) -> list[Any]:
    """Every record of `topic` now, all partitions (committed ones only under exactly_once)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=_isolation(delivery),
    )
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not await _reached(consumer, ends):
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for records in batch.values():
                out.extend(records)
    finally:
        await consumer.stop()
    return out


async def _reached(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return False
    return True


#: the resolution of record timestamps: a window measured by them is at least this long (a
#: quick run may write everything within one millisecond)
TIMESTAMP_RESOLUTION_S = 0.001


def _window(records: list[Any]) -> float:
    """Seconds from the first record's timestamp to the last's, at least their resolution."""
    if not records:
        raise RuntimeError("no records written: no window to measure")
    stamps = [r.timestamp for r in records]
    return max((max(stamps) - min(stamps)) / 1000, TIMESTAMP_RESOLUTION_S)


async def _drain(
    bootstrap: str,
    kind: str,
    source: str,
    total: int,
    logs: Path,
    *,
    delivery: str = AT_LEAST_ONCE,
    watch: Callable[[int], None] | None = None,
    broker_pid: int | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """One contender drains `source` in a fresh group: its figures, and what it wrote.
    `watch` is given the pid of a writer's process once it is started (a profiler attaches);
    the broker's process, when given, is sampled for its CPU in the same window."""
    run = uuid.uuid4().hex[:8]
    label = _label(kind, delivery)
    group, target = f"bench-{label}-{run}", f"bench.out.{label}.{run}"
    log = logs / f"{label}-{run}.log"
    if kind == "consume":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [PYTHON, "-m", "benchmarks.consume", bootstrap, group, source, str(total)]
        done = await asyncio.to_thread(
            subprocess.run, command, env=env, cwd=ROOT, capture_output=True, timeout=600
        )
        log.write_bytes(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"consume-only failed; see {log}")
        figures = orjson.loads(done.stdout.splitlines()[-1])
        window = max(figures["window_s"], TIMESTAMP_RESOLUTION_S)
        # the rate after the first batch (the group's join is not reading); a quick run may
        # read everything in that batch
        counted = (figures["records"] - figures["first_batch"]) or figures["records"]
        return {
            "records_in": total,
            "records_read": figures["records"],
            "window_s": round(window, 3),
            "records_per_s": round(counted / window),
        }, []
    await _create(bootstrap, target)
    command, env = _contender(
        kind, delivery, bootstrap=bootstrap, group=group, source=source, target=target, logs=logs
    )
    process = _start(command, env, log)
    watched = [process.pid] if broker_pid is None else [process.pid, broker_pid]
    samples: list[list[cpu.Sample]] = [[] for _ in watched]
    samplers = [
        asyncio.create_task(cpu.sample(pid, into))
        for pid, into in zip(watched, samples, strict=True)
    ]
    if watch is not None:
        watch(process.pid)
    try:
        done_ok = await _wait_done(bootstrap, group, source, process, timeout_s=600)
    finally:
        for sampler in samplers:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        _stop(process)
    if not done_ok:
        raise RuntimeError(f"{label} did not drain {source}; see {log}")
    written = await _read_all(bootstrap, target, delivery)
    window = _window(written)
    first = min(r.timestamp for r in written) / 1000
    # None when the window is shorter than the sampling period (a quick run)
    figures = [cpu.per_wall(taken, first, first + window) for taken in samples]
    broker_figures = figures[1] if len(figures) > 1 else None
    return {
        "records_in": total,
        "records_out": len(written),
        "window_s": round(window, 3),
        "records_per_s": round(total / window),
        "cpu": figures[0],
        "broker_cpu_per_wall_s": broker_figures and broker_figures["cpu_per_wall_s"],
    }, written


def _check_passthrough(written: list[Any], by_partition: dict[int, list[Record]]) -> bool:
    """Every input record copied once, to its own partition, in its order."""
    for partition, records in by_partition.items():
        copied = [r.value for r in written if r.partition == partition]
        if copied != [r.value for r in records]:
            return False
    return True


def _check_callgate(written: list[Any], expected: dict[str, str]) -> dict[str, Any]:
    """callgate's events against the in-process processor's verdicts on the same workload."""
    judged: dict[str, str] = {}
    repeats = 0
    for record in written:
        event = orjson.loads(record.value)
        call_id = event["call_id"]
        repeats += call_id in judged
        judged[call_id] = event.get("error_code") or event["outcome"]
    return {
        "events": len(written),
        "calls": len(judged),
        "repeated_events": repeats,
        "outcomes": dict(sorted(Counter(judged.values()).items())),
        "same_as_in_process": judged == expected,
    }


@contextlib.asynccontextmanager
async def tail_reader(
    bootstrap: str, topic: str, delivery: str = AT_LEAST_ONCE
) -> AsyncIterator[AIOKafkaConsumer]:
    """A reader of every partition of `topic` from its start, whose fetches wait 10 ms at most
    (committed transactions only under exactly_once)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
        isolation_level=_isolation(delivery),
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        yield consumer
    finally:
        await consumer.stop()


async def _tail(
    bootstrap: str, topic: str, delivery: str, seen: dict[str, float], stop: asyncio.Event
) -> None:
    async with tail_reader(bootstrap, topic, delivery) as consumer:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=50)
            now = time.monotonic()
            for records in batch.values():
                for record in records:
                    value = orjson.loads(record.value)
                    # an outcome event, or the pass-through's copy of a call's last chunk
                    if "outcome" in value or value.get("final"):
                        seen.setdefault(value["call_id"], now)


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


async def _topic_count(bootstrap: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return len(await admin.list_topics())
    finally:
        await admin.close()


#: how long a load generator may run past its schedule before it is stopped: its start (the
#: interpreter, its workload, its producer), and a schedule it fell behind (it still ends, and
#: its report says by how much)
GENERATOR_GRACE_S = 60.0


async def _generate(
    command: list[str], report: Path, log: Path, timeout_s: float
) -> dict[str, Any]:
    """Runs a load generator's `command` to its end (stopped past `timeout_s`): its report."""
    process = _start(command, {**os.environ, "PYTHONPATH": str(ROOT)}, log)
    try:
        code = await asyncio.to_thread(process.wait, timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the load generator did not end within {timeout_s:.0f} s; see {log}"
        ) from None
    finally:
        _stop(process)
    if code != 0:
        raise RuntimeError(f"the load generator exited with {code}; see {log}")
    figures: dict[str, Any] = orjson.loads(report.read_bytes())
    return figures


async def _warm_up(bootstrap: str, source: str, prefix: str) -> int:
    """Warm-up calls (three per partition) for a fresh worker to join and answer: how many."""
    warm = workload.calls(workload.SMALL, 3 * PARTITIONS, 0.0, prefix=prefix)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    await producer.start()
    try:
        for partition, records in partitioned(workload.records(warm, FRAGMENTS)).items():
            await asyncio.gather(*await _send_batches(producer, source, partition, records))
    finally:
        await producer.stop()
    return len(warm)


async def _latency(
    bootstrap: str, kind: str, rate: float, seconds: float, logs: Path, *, delivery: str
) -> dict[str, Any]:
    """`kind` (passthrough, or callgate with the settings of `VARIANTS[kind]`) under
    `delivery` on fresh topics, fed paced calls by a load generator in its own process: per
    call, the time from its last chunk to its outcome event (or the pass-through's copy of that
    chunk) read by a tail in this process."""
    run = uuid.uuid4().hex[:8]
    source, target, group = f"bench.lat.in.{run}", f"bench.lat.out.{run}", f"bench-lat-{run}"
    await _create(bootstrap, source, target)
    topics = await _topic_count(bootstrap)
    command, env = _contender(
        kind, delivery, bootstrap=bootstrap, group=group, source=source, target=target, logs=logs
    )
    process = _start(command, env, logs / f"latency-{run}.log")
    # the tail's readings are time.monotonic(), as the generator's are (one clock system-wide)
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    follower = asyncio.create_task(_tail(bootstrap, target, delivery, seen, stop))
    try:
        warm = await _warm_up(bootstrap, source, prefix=f"w{run}")
        deadline = time.monotonic() + 120
        while len(seen) < warm and time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the worker exited; see {logs}")
            await asyncio.sleep(0.05)
        if len(seen) < warm:
            raise RuntimeError(f"the worker did not answer the warm-up calls; see {logs}")
        load = loadgen.Load(
            calls=max(1, int(rate * seconds / FRAGMENTS)),
            prefix=f"l{run}",
            rate=rate,
            partitions=PARTITIONS,
            fragments=FRAGMENTS,
            invalid_share=INVALID_SHARE,
            tick_s=TICK_S,
        )
        report = logs / f"latency-{run}-generator.json"
        generator_log = logs / f"latency-{run}-generator.log"
        generated = await _generate(
            load.command(bootstrap, source, report),
            report,
            generator_log,
            timeout_s=3 * load.scheduled_s() + GENERATOR_GRACE_S,
        )
        sent: dict[str, float] = generated["sent"]
        acked: dict[str, float] = generated["acked"]
        if len(acked) != load.calls:
            raise RuntimeError(
                f"the load generator reported {len(acked)} of {load.calls} calls; "
                f"see {generator_log}"
            )
        deadline = time.monotonic() + 60
        while any(c not in seen for c in acked) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        _stop(process)
    answered = [c for c in acked if c in seen]
    if not answered:
        raise RuntimeError(f"no outcome seen; see {logs}")
    achieved, behind = generated["achieved_records_per_s"], generated["behind_s"]
    return {
        "delivery": delivery,
        "settings": VARIANTS.get(kind, {}),
        "topics_in_cluster": topics,
        "load_generator": "own process",
        "target_records_per_s": round(rate),
        "achieved_records_per_s": round(achieved),
        "load_generator_max_behind_ms": round(behind * 1000, 1),
        "load_generator_late_ticks": f"{generated['late_ticks']} of {generated['ticks']}",
        # each: how late, and how much of its own tick it spent handing batches to the producer
        "load_generator_worst_ticks_ms": [
            [round(t["behind_s"] * 1000, 1), round(t["sending_s"] * 1000, 1)]
            for t in generated["worst_ticks"]
        ],
        "void": fell_behind(rate, achieved, behind),
        "seconds": round(generated["seconds"], 1),
        "calls": len(acked),
        "answered": len(answered),
        "from_last_chunk_acknowledged": _percentiles(
            [(seen[c] - acked[c]) * 1000 for c in answered]
        ),
        "from_last_chunk_sent": _percentiles([(seen[c] - sent[c]) * 1000 for c in answered]),
        "target_p99_ms": TARGET_P99_MS,
    }


@dataclass(frozen=True, slots=True)
class Plan:
    """How much: calls per round, rounds, latency seconds, and the latency rate's cap."""

    calls: int
    repeats: int
    latency_s: float
    max_latency_rate: float
    #: the rates of the at_least_once latency runs, as fractions of callgate's measured maximum
    #: (exactly_once: half only)
    latency_fractions: tuple[float, ...]
    #: callgate's settings in the at_least_once latency runs (`VARIANTS`): the defaults first
    latency_variants: tuple[str, ...] = ("callgate",)
    deliveries: tuple[str, ...] = DELIVERIES


#: the contenders that write after each mode's pass-through, in a round
WRITERS = {AT_LEAST_ONCE: ("callgate", SHADOW), EXACTLY_ONCE: ("callgate",)}


@dataclass(frozen=True, slots=True)
class Loaded:
    """A broker's input, loaded once: its topic, its records by partition, how many, and
    callgate's verdicts on them in process (what every drain must have written)."""

    source: str
    by_partition: dict[int, list[Record]]
    records: int
    expected: dict[str, str]


async def _mode_round(
    bootstrap: str,
    delivery: str,
    loaded: Loaded,
    consume: dict[str, Any],
    logs: Path,
    *,
    broker_pid: int | None,
) -> dict[str, Any]:
    """One round of a delivery mode: its pass-through, then its callgate contenders, back to
    back; their figures, checks and shares."""
    out: dict[str, Any] = {}
    passthrough, copied = await _drain(
        bootstrap,
        "passthrough",
        loaded.source,
        loaded.records,
        logs,
        delivery=delivery,
        broker_pid=broker_pid,
    )
    passthrough["copied_every_record"] = _check_passthrough(copied, loaded.by_partition)
    del copied
    out["passthrough"] = passthrough
    for kind in WRITERS[delivery]:
        figures, events = await _drain(
            bootstrap,
            kind,
            loaded.source,
            loaded.records,
            logs,
            delivery=delivery,
            broker_pid=broker_pid,
        )
        figures["check"] = _check_callgate(events, loaded.expected)
        del events
        out[kind] = figures
    rate = out["callgate"]["records_per_s"]
    out["share_of_passthrough"] = round(rate / passthrough["records_per_s"], 3)
    out["share_of_consume_only"] = round(rate / consume["records_per_s"], 3)
    if SHADOW in out:
        out["shadow_share_of_callgate"] = round(out[SHADOW]["records_per_s"] / rate, 3)
    return out


def _median_of(rounds: list[dict[str, Any]], *path: str) -> float | None:
    """The median of a figure over the rounds that have it (a CPU figure is None in a window
    shorter than the sampling period), or None."""
    values = []
    for round_ in rounds:
        value: Any = round_
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(value)
    return round(median(values), 3) if values else None


def _us_per_record(figures: dict[str, Any]) -> float | None:
    """A writer's CPU microseconds per input record over its drain window, or None."""
    if figures["cpu"] is None:
        return None
    return float(figures["cpu"]["cpu_per_wall_s"] / figures["records_per_s"] * 1e6)


def cpu_per_record(mode: list[dict[str, Any]]) -> dict[str, float | None]:
    """A delivery mode's CPU per input record over its rounds (`rounds[i][delivery]`):
    callgate's and the pass-through's (medians), and callgate's over the pass-through's, round
    by round (median). Unlike the rates, this moves little with what else the machine runs."""
    pairs = [(_us_per_record(r["callgate"]), _us_per_record(r["passthrough"])) for r in mode]
    gate = [g for g, _ in pairs if g is not None]
    floor = [f for _, f in pairs if f is not None]
    ratios = [g / f for g, f in pairs if g is not None and f is not None and f > 0]
    return {
        "callgate_cpu_us_per_record": round(median(gate), 2) if gate else None,
        "passthrough_cpu_us_per_record": round(median(floor), 2) if floor else None,
        "callgate_over_passthrough_cpu_per_record": round(median(ratios), 2) if ratios else None,
    }


def summary(broker: str, delivery: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A delivery mode's figures over the rounds (`rounds[i][delivery]`), against the targets."""
    mode = [round_[delivery] for round_ in rounds]
    share = median([r["share_of_passthrough"] for r in mode])
    gate_cpu = _median_of(mode, "callgate", "cpu", "cpu_per_wall_s")
    out: dict[str, Any] = {
        "delivery": delivery,
        "passthrough": "transactional" if delivery == EXACTLY_ONCE else "acknowledged",
        "passthrough_records_per_s": round(
            median([r["passthrough"]["records_per_s"] for r in mode])
        ),
        "callgate_records_per_s": round(median([r["callgate"]["records_per_s"] for r in mode])),
        "share_of_passthrough": round(share, 3),
        "share_of_consume_only": round(median([r["share_of_consume_only"] for r in mode]), 3),
        "target_share": TARGET_SHARE[broker],
        "meets_share_target": share >= TARGET_SHARE[broker],
        "callgate_cpu_per_wall_s": gate_cpu,
        "passthrough_cpu_per_wall_s": _median_of(mode, "passthrough", "cpu", "cpu_per_wall_s"),
        "machine_busy_cores_callgate": _median_of(mode, "callgate", "cpu", "machine_busy_cores"),
        "machine_busy_cores_passthrough": _median_of(
            mode, "passthrough", "cpu", "machine_busy_cores"
        ),
        "broker_cpu_per_wall_s_callgate": _median_of(mode, "callgate", "broker_cpu_per_wall_s"),
        "broker_cpu_per_wall_s_passthrough": _median_of(
            mode, "passthrough", "broker_cpu_per_wall_s"
        ),
        "target_cpu_per_wall_s": TARGET_CPU_PER_WALL,
        "meets_cpu_target": gate_cpu is not None and gate_cpu >= TARGET_CPU_PER_WALL,
        **cpu_per_record(mode),
    }
    if SHADOW in WRITERS[delivery]:
        out["callgate_shadow_records_per_s"] = round(
            median([r[SHADOW]["records_per_s"] for r in mode])
        )
        out["shadow_share_of_callgate"] = round(
            median([r["shadow_share_of_callgate"] for r in mode]), 3
        )
    return out


async def _latencies(
    bootstrap: str, delivery: str, callgate_rate: float, plan: Plan, logs: Path
) -> dict[str, Any]:
    """A delivery mode's latency runs (at_least_once: every fraction and variant of the plan;
    exactly_once: half rate, the defaults), and the half-rate figures against the target."""
    fractions = plan.latency_fractions if delivery == AT_LEAST_ONCE else (HALF,)
    variants = plan.latency_variants if delivery == AT_LEAST_ONCE else ("callgate",)
    curve = []
    for fraction in fractions:
        rate = min(callgate_rate * fraction, plan.max_latency_rate)
        seconds = plan.latency_s if fraction == HALF else plan.latency_s / 2
        point: dict[str, Any] = {"fraction_of_callgate_max": fraction}
        # the pass-through at the same rate: the stack's own latency, two hops and no work
        for kind in ("passthrough", *variants):
            point[kind] = await _latency(bootstrap, kind, rate, seconds, logs, delivery=delivery)
        curve.append(point)
    (half,) = (point for point in curve if point["fraction_of_callgate_max"] == HALF)
    latency, floor = half["callgate"], half["passthrough"]
    return {
        "latency_at_half_rate": latency,
        "passthrough_latency_at_the_same_rate": floor,
        "latency_by_rate": curve,
        "meets_latency_target": latency["from_last_chunk_acknowledged"]["p99_ms"] <= TARGET_P99_MS,
        # the load generator fell behind for callgate: the figure says nothing of the target
        "latency_void": latency["void"],
    }


async def _on_broker(
    broker_kind: str, bootstrap: str, broker_pid: int | None, plan: Plan, logs: Path
) -> dict[str, Any]:
    work = workload.calls(workload.SMALL, plan.calls, INVALID_SHARE, prefix="e")
    records = workload.records(work, FRAGMENTS)
    by_partition = partitioned(records)
    source = f"bench.in.{uuid.uuid4().hex[:8]}"
    await _create(bootstrap, source)
    await _load(bootstrap, source, by_partition)
    expected = verdicts(Callgate(SEED_SCHEMAS, ENGINE), records)
    loaded = Loaded(source, by_partition, len(records), expected)
    deliveries = [
        d for d in plan.deliveries if d == AT_LEAST_ONCE or broker_kind not in NO_TRANSACTIONS
    ]
    rounds = []
    for _ in range(plan.repeats):
        consume, _ = await _drain(bootstrap, "consume", source, len(records), logs)
        round_: dict[str, Any] = {"consume_only": consume}
        for delivery in deliveries:
            round_[delivery] = await _mode_round(
                bootstrap, delivery, loaded, consume, logs, broker_pid=broker_pid
            )
        rounds.append(round_)
    out: dict[str, Any] = {
        "records": len(records),
        "records_per_partition": {str(p): len(r) for p, r in by_partition.items()},
        "rounds": rounds,
        "consume_only_records_per_s": round(
            median([r["consume_only"]["records_per_s"] for r in rounds])
        ),
    }
    for delivery in plan.deliveries:
        if delivery not in deliveries:
            out[delivery] = {"delivery": delivery, "skipped": NO_TRANSACTIONS[broker_kind]}
            continue
        figures = summary(broker_kind, delivery, rounds)
        figures.update(
            await _latencies(bootstrap, delivery, figures["callgate_records_per_s"], plan, logs)
        )
        out[delivery] = figures
    return out


def _run(brokers: tuple[str, ...], plan: Plan, logs: Path) -> dict[str, Any]:
    out = {}
    for kind in brokers:
        print(f"   e2e on {kind}", file=sys.stderr, flush=True)
        if EXACTLY_ONCE in plan.deliveries and kind in NO_TRANSACTIONS:
            print(
                f"   {EXACTLY_ONCE} on {kind} {NO_TRANSACTIONS[kind]}", file=sys.stderr, flush=True
            )
        # a broker starts outside any event loop (Apache Kafka's start probes with its own)
        with running_broker(kind, logs) as (bootstrap, pid):
            out[kind] = asyncio.run(_on_broker(kind, bootstrap, pid, plan, logs))
    return out


def run(
    *,
    quick: bool = False,
    repeats: int = 3,
    brokers: tuple[str, ...] = BROKERS,
    deliveries: tuple[str, ...] = DELIVERIES,
) -> dict[str, Any]:
    # a quick run's rates mean nothing: its latency phase only checks the machinery
    plan = (
        Plan(
            300,
            repeats,
            2.0,
            max_latency_rate=1000.0,
            latency_fractions=(HALF,),
            deliveries=deliveries,
        )
        if quick
        else Plan(
            20_000,
            repeats,
            20.0,
            max_latency_rate=float("inf"),
            latency_fractions=(HALF, 0.25, 0.05),
            latency_variants=tuple(VARIANTS),
            deliveries=deliveries,
        )
    )
    calls = plan.calls
    logs = Path(tempfile.mkdtemp(prefix="callgate-bench-e2e-"))
    body = _run(brokers, plan, logs)
    return {
        "description": __doc__.split("\n\n")[0],
        "calls": calls,
        "fragments_per_call": FRAGMENTS,
        "records": calls * FRAGMENTS,
        "partitions": PARTITIONS,
        "invalid_share": INVALID_SHARE,
        "engine": ENGINE,
        "repeats": repeats,
        "deliveries": list(deliveries),
        "statistic": "median of rounds; share = callgate records/s / pass-through records/s of "
        "the same delivery mode, round by round; CPU per wall second over each drain window",
        "logs": str(logs),
        "brokers": body,
    }
