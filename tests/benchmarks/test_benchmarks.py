"""Smoke tests: each benchmark runs at a tiny size through `python -m benchmarks --quick` and
writes a results file of the documented shape, and the contenders agree on what they decide.
No timing is asserted: these machines are noisy, and a benchmark's figures belong in its
results file, not in a test. The benchmarks that need a broker or valgrind are integration
tests (the callgrind one starts Python under valgrind four times)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from benchmarks import e2e, e2e_profile, instructions, startup, topic_check, workload
from benchmarks.baseline import SeedGate, load_validators
from benchmarks.common import BENCH_SCHEMAS, ENGINES, SEED_SCHEMAS
from benchmarks.floors import BarePythonGate
from benchmarks.harness import Callgate, agreement, seed_verdicts, verdicts
from benchmarks.passthrough import Round, _settle
from tests.datafiles import REPO

ROOT = REPO


def _run(name: str, out: Path, *extra: str, timeout: float = 240) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--quick", "--out", str(out), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert document["benchmark"] == name
    assert document["command"].startswith(f"python -m benchmarks {name}")
    assert {"python", "cpus", "code", "orjson", "jsonschema_rs", "fastjsonschema"} <= set(
        document["environment"]
    )
    assert {"commit", "changed", "native"} <= set(document["environment"]["code"])
    assert document["native_build_changed_during_run"] is False
    return document


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0 and math.isfinite(value)


def test_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nope", "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown benchmark nope" in done.stderr


@pytest.mark.timeout(300)
def test_core_covers_both_schemas_both_chunk_counts_and_both_engines(tmp_path: Path) -> None:
    document = _run("core", tmp_path)
    rows = document["rows"]
    assert {(r["schema"], r["chunks_per_call"], r["mix"]) for r in rows} == {
        (schema, chunks, mix)
        for schema in ("small", "large")
        for chunks in (10, 100)
        for mix in ("valid", "mixed")
    }
    for row in rows:
        assert _positive(row["seed_calls_per_s"])
        assert _positive(row["envelope_parse_only_ratio"])
        assert _positive(row["assembly_only_ratio"])
        assert sum(row["seed_outcomes"].values()) == row["calls"]
        assert set(row["engines"]) == set(ENGINES)
        for engine in row["engines"].values():
            assert _positive(engine["calls_per_s"])
            assert _positive(engine["ratio_vs_seed"])
            assert _positive(engine["bare_python_gate_ratio"])
            assert _positive(engine["assembly_share"])
            assert isinstance(engine["meets_target"], bool)
            # every call got exactly one outcome, and the mix decided which
            assert sum(engine["outcomes"].values()) == row["calls"]
            if row["mix"] == "valid":
                assert engine["outcomes"] == {"accepted": row["calls"]}
            agreed = engine["agreement_with_seed"]
            assert agreed["agree"], agreed
            assert agreed["judged_by_both"] == row["calls"]


@pytest.mark.timeout(300)
def test_offline_runs_both_whole_processes_on_both_mixes_and_they_judge_alike(
    tmp_path: Path,
) -> None:
    """`callgate check` and the seed, each a process of its own, write one event per call of the
    same file and accept the same calls (the seed blind to duplicate keys)."""
    document = _run("offline", tmp_path)
    assert document["target"] == 4.0
    rows = document["rows"]
    assert {(row["mix"], row["chunks_per_call"]) for row in rows} == {
        ("valid", 10),
        ("mixed", 10),
    }
    for row in rows:
        assert row["records"] == row["calls"] * 10
        seed = row["seed"]
        for figure in ("wall_s", "cpu_s", "startup_s"):
            assert _positive(seed[figure]), figure
        assert sum(seed["outcomes"].values()) == row["calls"]
        assert set(row["engines"]) == set(ENGINES)
        for engine in row["engines"].values():
            for figure in ("wall_s", "cpu_s", "startup_s", "ratio_vs_seed", "cpu_ratio_vs_seed"):
                assert _positive(engine[figure]), figure
            assert isinstance(engine["meets_target"], bool)
            assert sum(engine["outcomes"].values()) == row["calls"]
            if row["mix"] == "valid":
                assert engine["outcomes"] == {"accepted": row["calls"]}
            else:
                assert {"schema_violation", "invalid_json", "duplicate_key"} <= set(
                    engine["outcomes"]
                )
            agreed = engine["agreement_with_seed"]
            assert agreed["agree"], agreed
            assert agreed["judged_by_both"] == row["calls"]


@pytest.mark.parametrize("label", ["small", "large"])
def test_the_seed_and_callgate_accept_the_same_calls(label: str) -> None:
    """On every kind of invalid call, the seed and callgate accept the same calls, but for the
    duplicate keys that only callgate can see (`json.loads` keeps the last value)."""
    directory = SEED_SCHEMAS if label == "small" else BENCH_SCHEMAS
    work = workload.calls(workload.SCHEMAS[label], 100, 0.5)
    records = workload.records(work, 10)
    seed = seed_verdicts(directory, records)
    defects = {call.call_id: call.defect for call in work}
    assert {"schema", "truncated", "duplicate_key"} <= set(defects.values())
    for engine in ENGINES:
        judged = verdicts(Callgate(directory, engine), records)
        result = agreement(judged, seed, defects)
        assert result["agree"], result
        assert result["accepted_by_seed_only_duplicate_key"] == sum(
            1 for d in defects.values() if d == "duplicate_key"
        )
        assert {judged[c] for c, d in defects.items() if d == "duplicate_key"} == {"duplicate_key"}


def test_the_bare_python_gate_accepts_what_the_seed_accepts() -> None:
    """A floor must do the work it stands for: every call decided, and the same calls accepted,
    with the same arguments, as the seed (both keep the last of duplicate keys)."""
    calls = workload.calls(workload.SMALL, 50, 0.2)
    records = workload.records(calls, 10)
    seed_events = SeedGate(load_validators(SEED_SCHEMAS)).events(records)
    seed_accepted = {
        e["call_id"]: e["arguments"] for e in seed_events if e["outcome"] == "accepted"
    }
    assert 40 <= len(seed_accepted) < len(calls)
    schema_file = SEED_SCHEMAS / "weather" / "get_weather.v1.schema.json"
    values = [record.value or b"" for record in records]
    for engine in ENGINES:
        events = [json.loads(e) for e in BarePythonGate(schema_file, engine).judge_all(values)]
        assert len(events) == len(calls)
        assert {e["call_id"]: e["arguments"] for e in events if e["accepted"]} == seed_accepted


@pytest.mark.timeout(300)
def test_memory_counts_bytes_per_open_call(tmp_path: Path) -> None:
    rows = _run("memory", tmp_path)["rows"]
    assert [row["open_calls"] for row in rows] == [100, 1_000]
    for row in rows:
        assert row["buffered_text_bytes"] == 64 * row["open_calls"]
        assert _positive(row["callgate_bytes_per_open_call"])
        assert _positive(row["seed_bytes_per_open_call"])
        assert row["target"] == 300
        assert isinstance(row["meets_target"], bool)
        if sys.platform == "linux":  # glibc's mallinfo2 sees the native heap
            assert row["c_heap_bytes"] > row["buffered_text_bytes"]


@pytest.mark.timeout(300)
def test_early_reports_unread_shares_and_the_cost_per_chunk(tmp_path: Path) -> None:
    rows = _run("early", tmp_path)["rows"]
    assert [(row["schema"], row["chunks_per_call"]) for row in rows] == [
        ("small", 10),
        ("small", 100),
        ("large", 10),
        ("large", 100),
    ]
    for row in rows:
        invalid = row["invalid"]
        assert sum(invalid["invalid_by_defect"].values()) == invalid["invalid_calls"]
        # the truncated and duplicate-key calls are never decided early (nothing proves them
        # wrong before their end); most schema violations of the small contract are
        assert set(invalid["decided_early_by_defect"]) <= {"schema"}
        assert 0 <= invalid["median_unread_share"] < 1
        if row["schema"] == "small":
            early = invalid["decided_early_by_defect"]["schema"]
            assert 2 * early >= invalid["invalid_by_defect"]["schema"]
            assert invalid["median_unread_share_of_early"] > 0
        valid = row["valid"]
        assert _positive(valid["processor_on_over_off"])
        assert _positive(valid["assembly_on_over_off"])


@pytest.mark.timeout(300)
def test_checkpoints_compare_none_delta_and_full(tmp_path: Path) -> None:
    rows = _run("checkpoints", tmp_path)["rows"]
    assert [row["calls_in_flight"] for row in rows] == [8, 1000]
    for row in rows:
        assert set(row["calls_per_s"]) == {"none", "delta", "full"}
        assert all(_positive(ratio) for ratio in row["throughput_vs_none"].values())
        sizes = row["bytes"]
        assert _positive(sizes["full_bytes_median"])
        assert _positive(sizes["delta_bytes_median"])
    # with 1,000 calls in flight, hundreds are open at every batch's end
    assert rows[1]["bytes"]["open_calls_median"] > 100


@pytest.mark.timeout(300)
def test_scaling_reports_every_dimension(tmp_path: Path) -> None:
    document = _run("scaling", tmp_path)
    sizes = [row["argument_bytes"] for row in document["argument_size"]]
    assert sizes == sorted(sizes)
    assert len(sizes) >= 2
    for row in document["argument_size"] + document["chunk_count"]:
        assert _positive(row["callgate_us_per_call"])
        assert _positive(row["seed_us_per_call"])
    assert [r["chunks_per_call"] for r in document["chunk_count"]] == [1, 10]
    load = document["schema_load"]
    assert load["schemas"] == 20
    for engine in ENGINES:
        assert _positive(load[engine]["seconds"])


@pytest.mark.timeout(300)
def test_observability_compares_metrics_on_and_off(tmp_path: Path) -> None:
    rows = _run("observability", tmp_path)["rows"]
    assert {(r["schema"], r["mix"]) for r in rows} == {
        (s, m) for s in ("small", "large") for m in ("valid", "mixed")
    }
    for row in rows:
        assert _positive(row["calls_per_s_metrics_on"])
        assert _positive(row["calls_per_s_metrics_off"])
        assert _positive(row["throughput_on_vs_off"])


@pytest.mark.timeout(300)
def test_profile_writes_the_profiles_of_each_row(tmp_path: Path) -> None:
    document = _run("profile", tmp_path)
    assert set(document["rows"]) == {"small-10", "small-100", "large-10"}
    for name, row in document["rows"].items():
        assert (tmp_path / f"profile-{name}.txt").read_text().strip()
        shares = row["pyinstrument"]["top_self"]
        assert shares
        assert all(0 <= entry["self_share"] <= 1 for entry in shares)
        perf = row["perf"]
        if perf is not None and "error" not in perf:  # perf may be absent or not allowed
            assert (tmp_path / f"profile-{name}-perf.txt").read_text().strip()
            assert perf["by_object"]


@pytest.mark.parametrize("contender", instructions.CONTENDERS)
def test_each_callgrind_contender_runs_its_calls(contender: str) -> None:
    """What a callgrind child runs, here without valgrind: each contender judges its calls."""
    run = instructions.child_run(contender, "small", 10, "mixed", 8)()
    assert run() in {8, 80}  # calls judged, or envelopes parsed (envelope_parse_only)


def test_the_pass_through_commits_only_past_acknowledged_rounds() -> None:
    """Offsets move past a round only once every batch of it and of every earlier round is
    acknowledged, in fetch order; a failed batch stops it before anything past it."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a, b, c = (loop.create_future() for _ in range(3))
        tp = TopicPartition("in", 0)
        first = Round([a, b], 4, {tp: 4})
        second = Round([c], 2, {tp: 6})
        pending = deque([first, second])
        acknowledged: dict[TopicPartition, int] = {}
        c.set_result(None)  # the later round first: nothing may move
        assert _settle(pending, acknowledged) == 6
        assert acknowledged == {}
        a.set_result(None)
        assert _settle(pending, acknowledged) == 6
        b.set_result(None)
        assert _settle(pending, acknowledged) == 0
        assert acknowledged == {tp: 6}
        failed = loop.create_future()
        failed.set_exception(RuntimeError("refused"))
        pending.append(Round([failed], 1, {tp: 7}))
        with pytest.raises(RuntimeError):
            _settle(pending, acknowledged)
        assert acknowledged == {tp: 6}

    asyncio.run(scenario())


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_instructions_counts_each_contender_under_callgrind(tmp_path: Path) -> None:
    (row,) = _run("instructions", tmp_path, timeout=380)["rows"]
    assert (row["schema"], row["chunks_per_call"], row["mix"]) == ("small", 10, "valid")
    counts = row["instructions_per_call"]
    assert set(counts) == set(instructions.QUICK_CONTENDERS)
    # a call is tens of thousands of instructions at the least: the difference of two runs
    # measured the calls, not noise around zero
    assert all(n > 10_000 for n in counts.values())
    assert row["ratio_vs_seed"]["callgate:jsonschema-rs"] == pytest.approx(
        counts["seed"] / counts["callgate:jsonschema-rs"], rel=0.01
    )
    assert row["target"] == 5.0


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_e2e_drains_through_every_contender_on_both_brokers_in_both_modes(tmp_path: Path) -> None:
    document = _run("e2e", tmp_path, timeout=580)
    assert set(document["brokers"]) == {"tansu", "apache"}
    assert document["deliveries"] == list(e2e.DELIVERIES)  # both, unless told
    # tansu has no transactions: the exactly_once pairing is skipped there, and said so
    tansu = document["brokers"]["tansu"]
    assert tansu[e2e.EXACTLY_ONCE] == {
        "delivery": e2e.EXACTLY_ONCE,
        "skipped": e2e.NO_TRANSACTIONS["tansu"],
    }
    (tansu_round,) = tansu["rounds"]
    assert e2e.EXACTLY_ONCE not in tansu_round
    for name, result in document["brokers"].items():
        (round_,) = result["rounds"]
        assert round_["consume_only"]["records_read"] == document["records"]
        for delivery in e2e.DELIVERIES if name == "apache" else (e2e.AT_LEAST_ONCE,):
            mode = round_[delivery]
            assert mode["passthrough"]["records_out"] == document["records"]
            assert mode["passthrough"]["copied_every_record"]
            for contender in e2e.WRITERS[delivery]:  # shadow mode changes no verdict
                check = mode[contender]["check"]
                assert check["calls"] == document["calls"]
                assert check["same_as_in_process"], check
                if delivery == e2e.EXACTLY_ONCE:  # read committed: one event a call
                    assert check["events"] == check["calls"], check
                # a quick drain may be shorter than the sampling period: no figure then
                cpu = mode[contender]["cpu"]
                assert cpu is None or 0 <= cpu["cpu_per_wall_s"] <= (os.cpu_count() or 1)
                broker_cpu = mode[contender]["broker_cpu_per_wall_s"]
                assert broker_cpu is None or 0 <= broker_cpu <= (os.cpu_count() or 1)
            figures = result[delivery]
            assert _positive(figures["share_of_passthrough"])
            assert figures["target_share"] == e2e.TARGET_SHARE[name]
            assert isinstance(figures["meets_cpu_target"], bool)
            for latency in (
                figures["latency_at_half_rate"],
                figures["passthrough_latency_at_the_same_rate"],
            ):
                assert latency["delivery"] == delivery
                assert latency["answered"] == latency["calls"] > 0
                assert latency["load_generator_max_behind_ms"] >= 0
                assert isinstance(latency["void"], bool)
                latencies = latency["from_last_chunk_acknowledged"]
                assert 0 < latencies["p50_ms"] <= latencies["p99_ms"] <= latencies["max_ms"]
        assert _positive(result[e2e.AT_LEAST_ONCE]["shadow_share_of_callgate"])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_e2e_profile_samples_both_contenders_while_they_drain(tmp_path: Path) -> None:
    document = _run("e2e_profile", tmp_path, timeout=280)
    assert document["broker"] == "apache"
    for kind in e2e_profile.CONTENDERS:
        figures = document[kind]
        assert all(_positive(rate) for rate in figures["records_per_s_by_round"])
        assert set(figures["samples"]) == {name for name, _ in e2e_profile.BUCKETS}
        assert sum(figures["samples"].values()) > 0
        folded = e2e_profile.read_folded(tmp_path / f"e2e-profile-{kind}.txt")
        assert 0 < sum(folded.values()) <= sum(figures["samples"].values())  # its top stacks
    # the pass-through never judges; what callgate judges is in its judge buckets only
    judged = [name for name, _ in e2e_profile.BUCKETS if name.startswith("judge")]
    assert not any(document["passthrough"]["samples"][name] for name in judged)


def test_e2e_profile_puts_each_sample_in_the_part_its_stack_names() -> None:
    loop = "run (asyncio/runners.py:190);BaseEventLoop._run_once (asyncio/base_events.py:1922)"
    round_ = f"{loop};Worker.step (worker/runtime/worker.py:386)"
    judge = f"{round_};Judge.round (worker/runtime/judging.py:70)"
    feed = f"{judge};Processor.feed (worker/core/processor.py:80)"
    cases = {
        f"{feed}": "judge: native reassembly",
        f"{feed};Processor.emit (worker/core/processor.py:93);Gate.judge (x.py:1)": (
            "judge: per call"
        ),
        f"{judge};Judge._feed (x.py:1);Metrics.observe (worker/metrics.py:298)": "judge: metrics",
        f"{judge};Partitions.checkpoint (worker/runtime/partitions.py:160)": "judge: checkpoints",
        f"{judge}": "judge: rest",
        f"{round_};AIOKafkaConsumer.getmany (aiokafka/consumer/consumer.py:1160)": "read",
        f"{loop};Outbox._sender (worker/runtime/outbox.py:305)": "write",
        f"{loop};EpollSelector.select (selectors.py:468)": "waiting",
        "<module> (worker/cli.py:1);_find_and_load (<frozen importlib._bootstrap>:1176)": (
            "start and stop"
        ),
        f"{loop};AIOKafkaConnection._read (aiokafka/conn.py:508)": "other",
    }
    for stack, bucket in cases.items():
        assert e2e_profile.bucket_of(stack.split(";")) == bucket, stack
    folded = Counter({f"{feed}": 300, f"{loop};EpollSelector.select (selectors.py:468)": 700})
    figures = e2e_profile.per_record(folded, records=1_000, rate_hz=500)
    # 300 samples at 500 per second over 1,000 records: 600 us a record
    assert figures["us_per_record"]["judge: native reassembly"] == 600.0
    assert figures["us_per_record_running"] == 600.0  # waiting is not running


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_topic_check_times_both_ways_of_checking_on_a_growing_cluster(tmp_path: Path) -> None:
    document = _run("topic_check", tmp_path, timeout=280)
    (row,) = document["rows"]
    assert row["topics_in_cluster"] >= 20
    assert set(row["contenders"]) == set(topic_check.CONTENDERS)
    for figures in row["contenders"].values():
        assert _positive(figures["wall_ms_per_check"])
        assert figures["cpu_ms_per_check"] >= 0
    assert _positive(row["wall_listing_over_by_name"])


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_startup_times_every_contender_from_its_spawn_on_both_brokers(tmp_path: Path) -> None:
    # the baseline is this same checkout: its worker starts as a contender of its own
    document = _run("startup", tmp_path, "--baseline", str(ROOT), timeout=580)
    assert set(document["brokers"]) == {"tansu", "apache"}
    assert document["before"]["root"] == str(ROOT)
    names = [phase.name for phase in startup.PHASES]
    for result in document["brokers"].values():
        for case in startup.CASES:
            (round_,) = result[case]["rounds"]
            assert set(round_) == {*startup.CONTENDERS, startup.BEFORE}
            for kind, figures in round_.items():
                assert _positive(figures["spawn_to_first_event_s"]), (case, kind)
                if kind in startup.WORKERS:  # its phases add up to its start
                    assert [p["phase"] for p in figures["phases"]] == names
                    assert sum(p["s"] for p in figures["phases"]) == pytest.approx(
                        figures["spawn_to_first_event_s"], abs=0.01
                    )
            assert _positive(result[case]["callgate_over_passthrough"])
            assert _positive(result[case]["callgate_over_callgate_before"])
        # the restart restored the calls the first run left open; the fresh start had none
        assert result["fresh"]["restored_frames"] == [0]
        assert result["restart"]["restored_frames"][0] > 0


def test_an_e2e_window_is_never_shorter_than_the_timestamps_resolution() -> None:
    """A quick run may write every event within one millisecond: its rate is still a number
    (a window of 0 made it None, and the share a TypeError), and no records is an error."""
    stamped = [SimpleNamespace(timestamp=t) for t in (7, 7, 7)]
    assert e2e._window(stamped) == e2e.TIMESTAMP_RESOLUTION_S
    assert e2e._window([*stamped, SimpleNamespace(timestamp=2007)]) == 2.0
    with pytest.raises(RuntimeError, match="no records written"):
        e2e._window([])


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_tracing_counts_its_cost_off_on_and_against_a_baseline(tmp_path: Path) -> None:
    # the baseline is this same checkout: its untraced rounds count what `off` counts. Six
    # interpreters start under valgrind: 8 minutes on this loaded 2-core machine
    body = _run("tracing", tmp_path, "--baseline", str(ROOT), timeout=1180)
    counts = body["instructions_per_call"]
    assert set(counts) == {"off", "on", "before"}
    assert all(n > 10_000 for n in counts.values())
    assert body["off_over_before"] == pytest.approx(1.0, abs=0.005)
    assert body["on_over_off"] > 1.0, "two spans a call cost something"
