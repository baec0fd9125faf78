"""Smoke tests: each benchmark runs at a tiny size through `python -m benchmarks --quick` and
writes a results file of the documented shape. No timing is asserted: these machines are noisy,
and a benchmark's figures belong in its results file, not in a test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import workload
from benchmarks.baseline import SeedGate, load_validators
from benchmarks.common import SEED_SCHEMAS
from benchmarks.floors import BarePythonGate
from tests.datafiles import REPO

ROOT = REPO


def _run(name: str, out: Path, timeout: float = 240) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--quick", "--out", str(out)],
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
    assert {"python", "cpus", "orjson", "jsonschema_rs", "fastjsonschema"} <= set(
        document["environment"]
    )
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
def test_core_covers_both_schemas_every_mix_and_both_engines(tmp_path: Path) -> None:
    document = _run("core", tmp_path)
    rows = document["rows"]
    assert {(r["schema"], r["mix"]) for r in rows} == {
        (schema, mix) for schema in ("small", "large") for mix in ("valid", "mixed", "invalid")
    }
    for row in rows:
        assert _positive(row["seed_calls_per_s"])
        assert _positive(row["ceiling_ratio_envelope_parse_only"])
        assert set(row["engines"]) == {"fastjsonschema", "jsonschema-rs"}
        for engine in row["engines"].values():
            assert _positive(engine["calls_per_s"])
            assert _positive(engine["ratio_vs_seed"])
            assert _positive(engine["bare_python_gate_ratio"])
            assert isinstance(engine["meets_target"], bool)
            # every call got exactly one outcome, and the mix decided which
            assert sum(engine["outcomes"].values()) == row["calls"]
            if row["mix"] == "valid":
                assert engine["outcomes"] == {"accepted": row["calls"]}
            if row["mix"] == "invalid":
                assert "accepted" not in engine["outcomes"]
                assert {"schema_violation", "invalid_json", "duplicate_key"} <= set(
                    engine["outcomes"]
                )


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
def test_scaling_reports_every_dimension(tmp_path: Path) -> None:
    document = _run("scaling", tmp_path)
    sizes = [row["argument_bytes"] for row in document["argument_size"]]
    assert sizes == sorted(sizes)
    assert len(sizes) >= 2
    for row in document["argument_size"] + document["chunk_count"]:
        assert _positive(row["callgate_us_per_call"])
        assert _positive(row["seed_us_per_call"])
    assert [r["chunks_per_call"] for r in document["chunk_count"]] == [1, 10]
    for row in document["memory_open_calls"]:
        assert row["buffered_text_bytes"] == 64 * row["open_calls"]
        assert _positive(row["callgate_bytes_per_open_call"])
    load = document["schema_load"]
    assert load["schemas"] == 20
    for engine in ("fastjsonschema", "jsonschema-rs"):
        assert _positive(load[engine]["seconds"])


def test_profile_writes_a_text_profile_per_schema(tmp_path: Path) -> None:
    document = _run("profile", tmp_path)
    for label in ("small", "large"):
        profile = document["profiles"][label]
        assert (tmp_path / f"profile-{label}.txt").read_text().strip()
        assert profile["top_self"]
        assert all(0 <= entry["self_share"] <= 1 for entry in profile["top_self"])


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_e2e_drains_through_passthrough_and_callgate(tmp_path: Path) -> None:
    document = _run("e2e", tmp_path, timeout=380)
    (round_,) = document["rounds"]
    assert round_["passthrough"]["records_out"] == round_["passthrough"]["records_in"]
    assert round_["callgate"]["records_out"] == document["calls_per_round"]
    assert _positive(document["share_of_passthrough"])
    latency = document["latency_at_half_rate"]
    assert latency["answered"] == latency["calls"] > 0
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]


def test_the_bare_python_gate_accepts_what_the_seed_accepts() -> None:
    """A floor must do the work it stands for: every call decided, and the same calls accepted,
    with the same arguments, as the seed (both keep the last of duplicate keys)."""
    calls = workload.calls(workload.SMALL, 50, 0.2)
    records = workload.records(calls, 10)
    seed = SeedGate(load_validators(SEED_SCHEMAS))
    seed_events = [json.loads(e) for r in records if (e := seed.feed(r)) is not None]
    seed_accepted = {
        e["call_id"]: e["arguments"] for e in seed_events if e["outcome"] == "accepted"
    }
    assert 40 <= len(seed_accepted) < len(calls)
    schema_file = SEED_SCHEMAS / "weather" / "get_weather.v1.schema.json"
    values = [record.value or b"" for record in records]
    for engine in ("fastjsonschema", "jsonschema-rs"):
        events = [json.loads(e) for e in BarePythonGate(schema_file, engine).judge_all(values)]
        assert len(events) == len(calls)
        assert {e["call_id"]: e["arguments"] for e in events if e["accepted"]} == seed_accepted


@pytest.mark.timeout(400)
def test_instructions_counts_each_contender_under_callgrind(tmp_path: Path) -> None:
    (row,) = _run("instructions", tmp_path, timeout=380)["rows"]
    assert (row["schema"], row["mix"]) == ("small", "valid")
    counts = row["instructions_per_call"]
    assert set(counts) == {"seed", "callgate:jsonschema-rs"}
    # a call is tens of thousands of instructions at the least: the difference of two runs
    # measured the calls, not noise around zero
    assert all(n > 10_000 for n in counts.values())
    assert row["ratio_vs_seed"]["callgate:jsonschema-rs"] == pytest.approx(
        counts["seed"] / counts["callgate:jsonschema-rs"], rel=0.01
    )
    assert row["targets"] == {"callgate:jsonschema-rs": 20.0}
