"""Benchmark: start-up, from `callgate run`'s spawn to its first outcome event readable.

On each broker (tansu embedded, and Apache Kafka: one KRaft node from `tests.support`), an input
topic of 3 partitions is loaded with small get_weather calls of 10 chunks (20 % invalid), many
calls interleaved, and cut short: the last calls' remaining chunks are held back. Then, per
repeat, each contender is spawned as its own process, as an operator starts it:

- **fresh**: a new consumer group and an empty output topic; it drains the input and is stopped
  (SIGTERM) once its group's offsets are committed to the end. callgate has then written its
  checkpoint frames (the calls left open by the cut) to its changelog;
- **restart**: the held-back chunks are produced, and the same contender is spawned again in the
  same group: callgate restores its state from the changelog frames the first run wrote, the
  pass-through resumes from its committed offsets.

The figure is the wall time from the spawn (`subprocess.Popen`, this process's clock) to the
first record readable on the output topic (a reader assigned to it beforehand, polling every
10 ms or less). The baseline is the pass-through (`benchmarks.passthrough`: the worker's own
client options, reading and writing, no judging) timed the same way in the same repeat; the
ratio is callgate's time over its time. callgate's time is split into phases by its own log
lines (`CALLGATE_LOG__FORMAT=json`, `CALLGATE_LOG_LEVEL=INFO`), each the time from the previous
boundary (`PHASES` says which line ends each phase, and what it holds).

Apache Kafka's `group.initial.rebalance.delay.ms` (3 s by default) makes the first member of
an empty group wait before it is given partitions. The harness's broker sets it to 0 (as
`tests/support/apache_kafka.py` says), so no such wait is in these figures; on a broker left at
the default, a fresh group's join, and a restart's (the stopped member left the group empty),
take up to 3 s more.

Every contender's Python sources are compiled to bytecode before the first spawn (`compiled`),
as `pip install` compiles an installed callgate: a source checkout run with
`PYTHONDONTWRITEBYTECODE` set (as this machine's shells have it) compiles each module it imports
again at every start, about 100 ms of callgate's imports here against a few of the
pass-through's, which no installed worker pays.
"""

from __future__ import annotations

import asyncio
import compileall
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks import workload
from benchmarks.common import ROOT, median
from benchmarks.e2e import (
    BROKERS,
    FRAGMENTS,
    INVALID_SHARE,
    PARTITIONS,
    PYTHON,
    _committed_to_end,
    _create,
    _load,
    _start,
    _stop,
    _wait_done,
    _worker_env,
    broker,
    partitioned,
    tail_reader,
)

CONTENDERS = ("callgate", "passthrough")
#: the contender that runs another checkout's worker (`--baseline ROOT`): before a change
BEFORE = "callgate_before"
WORKERS = ("callgate", BEFORE)
CASES = ("fresh", "restart")
#: what the rebalance delay of the brokers measured here is (`tests.support.apache_kafka`)
APACHE_INITIAL_REBALANCE_DELAY_MS = 0
#: a call's chunks are interleaved with this many other calls' (so the cut leaves them open)
LANES = 500


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase of callgate's start: its name, the log line that ends it (a prefix of the
    message; None: its end is derived, see `split`), and what it holds."""

    name: str
    ends_at: str | None
    holds: str


#: the worker's first line: what loading the settings, compiling the contracts and building
#: the rest took, which places the first three boundaries before the line's own time
HEALTH = "health and metrics on "
PHASES = (
    Phase(
        "interpreter + imports",
        None,
        "Python starts, imports `worker` (pydantic, pydantic-settings, aiokafka, orjson, "
        "prometheus-client, the adapters, the native core)",
    ),
    Phase("settings", None, "the frozen settings read from the environment, logging set up"),
    Phase(
        "contract registry compile",
        None,
        "every contract in the schema directory loaded and compiled once (fastjsonschema)",
    ),
    Phase(
        "metrics + health server",
        HEALTH,
        "the metrics declared, the worker's parts built, the health server bound",
    ),
    Phase(
        "broker connect + metadata",
        "connected to ",
        "the event loop started; the admin connection bootstrapped and the cluster's metadata read",
    ),
    Phase(
        "topic checks",
        "topics checked",
        "one metadata request: the inputs named and the outcome topics exist",
    ),
    Phase(
        "topic provisioning",
        "internal topics made sure of",
        "the idempotency and approval topics and the changelogs created or checked "
        "(created on a fresh group)",
    ),
    Phase(
        "consumer + producer start",
        "started: group",
        "the consumer and the producer connected (each bootstraps its own connection)",
    ),
    Phase(
        "group join + assignment",
        "given ",
        "FindCoordinator, JoinGroup (a new member is asked for a member id and joins again), "
        "SyncGroup, the listener called; Apache Kafka's group.initial.rebalance.delay.ms is here "
        f"({APACHE_INITIAL_REBALANCE_DELAY_MS} on the brokers measured)",
    ),
    Phase(
        "restore",
        "assigned ",
        "each partition's changelog, idempotency keys and pending approvals read to their end; "
        "the input placed where its state ends",
    ),
    Phase(
        "first fetch",
        "first records fetched",
        "the partitions resumed; the first non-empty fetch answered",
    ),
    Phase(
        "first judged round",
        "first round judged",
        "the fetched batch reassembled, judged, encoded and handed to the producer",
    ),
    Phase(
        "first event acknowledged",
        "first events acknowledged",
        "the produce request acknowledged (acks=all), noticed between rounds",
    ),
    Phase(
        "event readable",
        None,
        "the reader's next fetch returns it (the worker notices its acknowledgement between "
        "rounds, so a reader may see the event first: then this is 0)",
    ),
)

_BUILT = re.compile(
    r"settings loaded in ([0-9.]+) ms, contracts compiled in ([0-9.]+) ms, "
    r"the rest built in ([0-9.]+) ms"
)
_FRAMES = re.compile(r"restored from (\d+) checkpoint frames")


def _lines(log: Iterable[str]) -> list[tuple[float, str]]:
    """(UNIX time, message) of each JSON log line of callgate's own loggers, in order."""
    out = []
    for text in log:
        try:
            line = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(line, dict) or not str(line.get("logger", "")).startswith("callgate"):
            continue
        when = datetime.fromisoformat(line["time"]).timestamp()
        out.append((when, str(line["message"])))
    return out


def split(spawned: float, log: Iterable[str], readable: float) -> list[dict[str, Any]]:
    """callgate's start, from its spawn to its first event readable (UNIX times), in `PHASES`:
    each with its seconds from the previous boundary. A boundary is its phase's first line after
    the previous one; the first three lie before the first line (`HEALTH`) by the durations it
    gives; the last is `readable`. Boundaries never go back in time nor past `readable` (a log
    time has a millisecond's resolution, and the worker notices acknowledgements between rounds,
    after a reader may have read the event). Raises `ValueError` naming a line the log lacks."""
    lines = _lines(log)
    bounds: list[float] = []
    found = 0
    for phase in PHASES:
        if phase.ends_at is None:
            continue
        for index in range(found, len(lines)):
            if lines[index][1].startswith(phase.ends_at):
                found = index + 1
                break
        else:
            raise ValueError(f"the worker's log has no line {phase.ends_at!r} for {phase.name}")
        when, message = lines[found - 1]
        if phase.ends_at == HEALTH:
            built = _BUILT.search(message)
            if built is None:
                raise ValueError(f"the worker's first line gives no durations: {message!r}")
            settings_ms, contracts_ms, rest_ms = (float(g) / 1000 for g in built.groups())
            contracts_end = when - rest_ms
            settings_end = contracts_end - contracts_ms
            bounds += [settings_end - settings_ms, settings_end, contracts_end]
        bounds.append(when)
    bounds.append(readable)
    phases, previous = [], spawned
    for phase, bound in zip(PHASES, bounds, strict=True):
        at = min(max(previous, bound), readable)
        phases.append({"phase": phase.name, "s": round(at - previous, 3)})
        previous = at
    return phases


def restored_frames(log: Iterable[str]) -> int:
    """The checkpoint frames the worker restored (its "restored from N checkpoint frames")."""
    return sum(int(m.group(1)) for _, text in _lines(log) if (m := _FRAMES.search(text)))


async def _spawn_to_first(
    bootstrap: str,
    command: list[str],
    env: dict[str, str],
    log: Path,
    *,
    cwd: Path,
    output: str,
    from_end: bool,
    source: str,
    group: str,
) -> tuple[float, float]:
    """Spawn the contender; the UNIX times of its spawn and of the first record past the
    output's present end read. Then it drains `source` and is stopped."""
    async with tail_reader(bootstrap, output) as reader:
        if from_end:
            await _read_to_end(reader)
        # the positions fixed before the spawn (a fetch may answer with a whole stored batch,
        # records before the position too: only those past it count)
        start = {tp: await reader.position(tp) for tp in reader.assignment()}
        spawned = time.time()
        process = _start(command, env, log, cwd)
        try:
            readable = await _first_read(reader, start, process, log)
            drained = await _wait_done(bootstrap, group, source, process, timeout_s=600)
        finally:
            _stop(process)
        if not drained:
            raise RuntimeError(f"{command} did not drain {source}; see {log}")
    return spawned, readable


async def _read_to_end(reader: AIOKafkaConsumer) -> None:
    """Read what the output holds (nothing is writing it) until polls come back empty.
    Not `seek_to_end`: tansu answers a ListOffsets for the latest offset with 1 here."""
    empty = 0
    while empty < EMPTY_POLLS_AT_END:
        batch = await reader.getmany(timeout_ms=200)
        empty = 0 if any(batch.values()) else empty + 1


#: empty polls (of 200 ms) after which an output nothing writes is taken as read to its end
EMPTY_POLLS_AT_END = 3


async def _first_read(
    reader: AIOKafkaConsumer,
    start: dict[TopicPartition, int],
    process: subprocess.Popen[bytes],
    log: Path,
) -> float:
    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the contender exited before its first output; see {log}")
        batch = await reader.getmany(timeout_ms=10)
        if any(r.offset >= start[tp] for tp, records in batch.items() for r in records):
            return time.time()
    raise RuntimeError(f"no output within {READ_TIMEOUT_S:g} s; see {log}")


#: how long a contender may take to write its first record (a hang, not a slow start)
READ_TIMEOUT_S = 120.0


async def _contender(
    bootstrap: str,
    kind: str,
    source: str,
    where: tuple[str, str],
    *,
    case: str,
    logs: Path,
    before: Path | None,
) -> dict[str, Any]:
    group, output = where
    log = logs / f"{kind}-{case}-{group}.log"
    cwd = ROOT
    if kind in WORKERS:
        command = [PYTHON, "-m", "worker", "run"]
        env = {
            **_worker_env(bootstrap, group, source, output),
            "CALLGATE_LOG_LEVEL": "INFO",
            "CALLGATE_LOG__FORMAT": "json",
        }
        if kind == BEFORE:  # the other checkout's `worker` (its directory first on the path)
            assert before is not None
            cwd = before
            env["PYTHONPATH"] = str(before)
    else:
        command = [PYTHON, "-m", "benchmarks.passthrough", bootstrap, group, source, output]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    spawned, readable = await _spawn_to_first(
        bootstrap,
        command,
        env,
        log,
        cwd=cwd,
        output=output,
        from_end=case == "restart",
        source=source,
        group=group,
    )
    figures: dict[str, Any] = {"spawn_to_first_event_s": round(readable - spawned, 3)}
    if kind in WORKERS:
        lines = log.read_text(errors="replace").splitlines()
        figures["phases"] = split(spawned, lines, readable)
        figures["restored_frames"] = restored_frames(lines)
    return figures


@dataclass(frozen=True, slots=True)
class Plan:
    calls: int
    lanes: int
    repeats: int


#: the share of the input's records loaded before the first start (the rest after it)
FIRST_SHARE = 0.9


async def _on_broker(bootstrap: str, plan: Plan, logs: Path, before: Path | None) -> dict[str, Any]:
    contenders = CONTENDERS if before is None else (*CONTENDERS, BEFORE)
    rounds = []
    for repeat in range(plan.repeats):
        run = uuid.uuid4().hex[:8]
        work = workload.calls(workload.SMALL, plan.calls, INVALID_SHARE, prefix=f"s{run}")
        records = workload.records(work, FRAGMENTS, lanes=plan.lanes)
        cut = int(len(records) * FIRST_SHARE)
        source = f"bench.start.in.{run}"
        await _create(bootstrap, source)
        await _load(bootstrap, source, _nonempty(partitioned(records[:cut])))
        where = {
            kind: (f"bench-start-{kind}-{run}", f"bench.start.out.{kind}.{run}")
            for kind in contenders
        }
        for _group, output in where.values():
            await _create(bootstrap, output)
        if not repeat:  # the broker's first group makes its offsets topic: no contender pays it
            await _committed_to_end(bootstrap, f"bench-start-warm-{run}", source)
        # they take turns at going first (a broker's or machine's state favours neither)
        order = contenders if repeat % 2 == 0 else contenders[::-1]
        one: dict[str, Any] = {}
        for case in CASES:
            if case == "restart":  # more input waits for the restarted contenders
                await _load(bootstrap, source, _nonempty(partitioned(records[cut:])))
            one[case] = {
                kind: await _contender(
                    bootstrap, kind, source, where[kind], case=case, logs=logs, before=before
                )
                for kind in order
            }
        rounds.append(one)
    return {
        case: _summary([r[case] for r in rounds]) | {"rounds": [r[case] for r in rounds]}
        for case in CASES
    }


def _checkout(root: Path) -> dict[str, str]:
    """Where the `callgate_before` contender's worker came from, and its commit."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    return {"root": str(root), "commit": done.stdout.strip() or "unknown"}


def _nonempty(by_partition: dict[int, list[workload.Record]]) -> dict[int, list[workload.Record]]:
    return {p: records for p, records in by_partition.items() if records}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats: each contender's time, callgate's over the pass-through's and
    (with a checkout before a change) over that checkout's, paired by repeat, and the phases."""
    seconds = {kind: [r[kind]["spawn_to_first_event_s"] for r in rounds] for kind in rounds[0]}

    def ratio(kind: str) -> float:
        pairs = zip(seconds["callgate"], seconds[kind], strict=True)
        return round(median([c / o for c, o in pairs]), 2)

    out: dict[str, Any] = {f"{kind}_s": round(median(s), 3) for kind, s in seconds.items()}
    out["callgate_over_passthrough"] = ratio("passthrough")
    if BEFORE in seconds:
        out["callgate_over_callgate_before"] = ratio(BEFORE)
    for kind in WORKERS:
        if kind in seconds:
            out[f"{kind}_phases_median_s"] = {
                phase.name: round(median([r[kind]["phases"][i]["s"] for r in rounds]), 3)
                for i, phase in enumerate(PHASES)
            }
    out["restored_frames"] = [r["callgate"]["restored_frames"] for r in rounds]
    return out


#: the packages each contender imports from a checkout (the rest is installed, compiled)
COMPILED = ("worker", "benchmarks")


def compiled(*roots: Path) -> None:
    """Each checkout's packages compiled to bytecode beside their sources, as an install
    compiles them (a source already compiled is left as it is). Raises `RuntimeError` naming
    a checkout whose sources do not compile."""
    for root in roots:
        for package in COMPILED:
            if (root / package).is_dir() and not compileall.compile_dir(root / package, quiet=1):
                raise RuntimeError(f"the sources of {root / package} do not compile")


def run(
    *,
    quick: bool = False,
    repeats: int = 3,
    brokers: tuple[str, ...] = BROKERS,
    before: Path | None = None,
) -> dict[str, Any]:
    plan = Plan(60, 20, repeats) if quick else Plan(6000, LANES, repeats)
    logs = Path(tempfile.mkdtemp(prefix="callgate-bench-startup-"))
    compiled(ROOT, *(() if before is None else (before,)))
    out = {}
    for kind in brokers:
        print(f"   startup on {kind}", file=sys.stderr, flush=True)
        with broker(kind, logs) as bootstrap:
            out[kind] = asyncio.run(_on_broker(bootstrap, plan, logs, before))
    return {
        "description": __doc__.split("\n\n")[0],
        "calls": plan.calls,
        "fragments_per_call": FRAGMENTS,
        "calls_interleaved": plan.lanes,
        "first_share_of_records": FIRST_SHARE,
        "partitions": PARTITIONS,
        "repeats": repeats,
        "apache_group_initial_rebalance_delay_ms": APACHE_INITIAL_REBALANCE_DELAY_MS,
        "phases": {phase.name: phase.holds for phase in PHASES},
        "bytecode": "each checkout's packages compiled before the first spawn, as an install "
        "compiles them",
        "before": None if before is None else _checkout(before),
        "statistic": "median of repeats; ratio = median of per-repeat callgate s / pass-through s",
        "logs": str(logs),
        "brokers": out,
    }
