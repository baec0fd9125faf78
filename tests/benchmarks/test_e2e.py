"""The e2e benchmark's pure parts: how each contender of a delivery mode is started, a mode's
figures over its rounds against the targets, and the tables made of them (the runs themselves
are in test_benchmarks' integration test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from benchmarks import e2e, tables

TOPICS = {"bootstrap": "127.0.0.1:9092", "group": "g", "source": "in", "target": "out"}


def test_exactly_once_runs_the_transactional_pass_through_and_callgate_under_it(
    tmp_path: Path,
) -> None:
    for delivery in e2e.DELIVERIES:
        command, env = e2e._contender("passthrough", delivery, logs=tmp_path, **TOPICS)
        assert command[1:3] == ["-m", "benchmarks.passthrough"]
        assert ("--transactional" in command) == (delivery == e2e.EXACTLY_ONCE)
        for kind in ("callgate", e2e.SHADOW, *e2e.VARIANTS):
            command, env = e2e._contender(kind, delivery, logs=tmp_path, **TOPICS)
            assert command[1:] == ["-m", "worker", "run"]
            assert env["CALLGATE_DELIVERY__GUARANTEE"] == delivery
            assert env["CALLGATE_KAFKA__GROUP_ID"] == "g"
            assert ("CALLGATE_SHADOW__SCHEMAS" in env) == (kind == e2e.SHADOW)
            if kind in e2e.VARIANTS:
                assert e2e.VARIANTS[kind].items() <= env.items()
    # each mode's drains have groups and topics of their own
    assert e2e._label("callgate", e2e.AT_LEAST_ONCE) != e2e._label("callgate", e2e.EXACTLY_ONCE)


def _writer(rate: int, cpu: float | None) -> dict[str, Any]:
    figures = None if cpu is None else {"cpu_per_wall_s": cpu, "machine_busy_cores": 1.9}
    return {
        "records_per_s": rate,
        "cpu": figures,
        "broker_cpu_per_wall_s": None if cpu is None else 0.7,
    }


rates = st.integers(1, 10**6)
cpus = st.none() | st.floats(0.0, 2.0)
writers = st.tuples(rates, cpus)


@given(
    broker=st.sampled_from(e2e.BROKERS),
    delivery=st.sampled_from(e2e.DELIVERIES),
    rounds=st.lists(st.tuples(rates, writers, writers, rates), min_size=1, max_size=5),
)
def test_a_mode_s_figures_are_medians_of_its_rounds_against_the_broker_s_targets(
    broker: str, delivery: str, rounds: list[tuple[int, tuple[int, Any], tuple[int, Any], int]]
) -> None:
    built = []
    for consume, (through, through_cpu), (gate, gate_cpu), shadow in rounds:
        mode: dict[str, Any] = {
            "passthrough": _writer(through, through_cpu),
            "callgate": _writer(gate, gate_cpu),
            "share_of_passthrough": round(gate / through, 3),
            "share_of_consume_only": round(gate / consume, 3),
        }
        if e2e.SHADOW in e2e.WRITERS[delivery]:
            mode[e2e.SHADOW] = _writer(shadow, None)
            mode["shadow_share_of_callgate"] = round(shadow / gate, 3)
        built.append({"consume_only": {"records_per_s": consume}, delivery: mode})
    figures = e2e.summary(broker, delivery, built)
    shares = sorted(r[delivery]["share_of_passthrough"] for r in built)
    assert min(shares) <= figures["share_of_passthrough"] <= max(shares)
    assert figures["target_share"] == e2e.TARGET_SHARE[broker]
    assert figures["meets_share_target"] == (
        figures["share_of_passthrough"] >= e2e.TARGET_SHARE[broker] - 5e-4
    )
    measured = [c for _, _, (_, c), _ in rounds if c is not None]
    if measured:
        assert min(measured) - 5e-4 <= figures["callgate_cpu_per_wall_s"] <= max(measured) + 5e-4
        assert figures["meets_cpu_target"] == (
            figures["callgate_cpu_per_wall_s"] >= e2e.TARGET_CPU_PER_WALL - 5e-4
        )
    else:  # no window was long enough to sample: no figure, and no target met
        assert figures["callgate_cpu_per_wall_s"] is None
        assert figures["meets_cpu_target"] is False
    assert ("shadow_share_of_callgate" in figures) == (delivery == e2e.AT_LEAST_ONCE)
    per_record = [
        (gate_cpu / gate * 1e6, through_cpu / through * 1e6)
        for _, (through, through_cpu), (gate, gate_cpu), _ in rounds
        if gate_cpu is not None and through_cpu is not None and through_cpu > 0
    ]
    ratio = figures["callgate_over_passthrough_cpu_per_record"]
    if per_record:
        ratios = [g / f for g, f in per_record]
        assert min(ratios) - 5e-3 <= ratio <= max(ratios) + 5e-3
    else:
        assert ratio is None
    broker_cpu = figures["broker_cpu_per_wall_s_callgate"]
    assert broker_cpu == (0.7 if measured else None)
    assert figures["passthrough"] == (
        "transactional" if delivery == e2e.EXACTLY_ONCE else "acknowledged"
    )


def _latency(delivery: str, p99: float, *, void: bool) -> dict[str, Any]:
    return {
        "delivery": delivery,
        "target_records_per_s": 1000,
        "achieved_records_per_s": 900 if void else 1000,
        "load_generator_max_behind_ms": 150.0 if void else 2.0,
        "void": void,
        "topics_in_cluster": 5,
        "from_last_chunk_acknowledged": {
            "p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": p99, "max_ms": p99 + 1,
        },
    }  # fmt: skip


def test_the_tables_show_each_mode_its_cpu_and_a_skipped_pairing() -> None:
    rounds = [
        {
            "consume_only": {"records_per_s": 400},
            mode: {
                "passthrough": _writer(200, 0.8),
                "callgate": _writer(120, 0.95),
                "share_of_passthrough": 0.6,
                "share_of_consume_only": 0.3,
                **(
                    {e2e.SHADOW: _writer(90, 0.9), "shadow_share_of_callgate": 0.75}
                    if mode == e2e.AT_LEAST_ONCE
                    else {}
                ),
            },
        }
        for mode in e2e.DELIVERIES
    ]
    merged = [{**rounds[0], **rounds[1]}]
    apache: dict[str, Any] = {"rounds": merged, "consume_only_records_per_s": 400}
    for mode in e2e.DELIVERIES:
        apache[mode] = {
            **e2e.summary("apache", mode, merged),
            "latency_by_rate": [
                {
                    "fraction_of_callgate_max": e2e.HALF,
                    "passthrough": _latency(mode, 9.0, void=True),
                    "callgate": _latency(mode, 30.0, void=False),
                }
            ],
        }
    tansu = {
        "rounds": [{"consume_only": {"records_per_s": 1}, **rounds[0]}],
        "consume_only_records_per_s": 1,
        e2e.AT_LEAST_ONCE: e2e.summary("tansu", e2e.AT_LEAST_ONCE, [{**rounds[0]}]),
        e2e.EXACTLY_ONCE: {"skipped": e2e.NO_TRANSACTIONS["tansu"]},
    }
    doc = {"deliveries": list(e2e.DELIVERIES), "brokers": {"tansu": tansu, "apache": apache}}
    rows = tables.e2e(doc)[2:]
    assert len(rows) == 4
    skipped = next(row for row in rows if "skipped" in row)
    assert skipped.startswith("| tansu | exactly_once | skipped: tansu")
    apache_rows = [row for row in rows if row.startswith("| apache")]
    # 0.95 s of CPU a second at 120 records/s, 0.8 at 200: 7,917 and 4,000 us a record
    assert all(
        "**0.95** / 0.80 | 1.90 (0.70) / 1.90 (0.70) | 7916.67 / 4000.00 (**1.98**)" in row
        for row in apache_rows
    )
    assert "≥ 75%" in apache_rows[0]
    latency = tables.latency(doc)[2:]
    assert len(latency) == 4
    assert all("(void: fell 150 ms behind)" in row for row in latency if "passthrough" in row)
    assert all("**30**" in row for row in latency if "callgate" in row)


@given(
    rate=st.floats(1.0, 1e6),
    achieved_share=st.floats(0.0, 1.2),
    behind_s=st.floats(0.0, 10.0),
)
def test_a_latency_run_is_void_when_its_load_generator_fell_behind(
    rate: float, achieved_share: float, behind_s: float
) -> None:
    void = e2e.fell_behind(rate, rate * achieved_share, behind_s)
    on_schedule = behind_s <= e2e.MAX_BEHIND_S and achieved_share >= e2e.KEPT_RATE
    assert void == (not on_schedule) or abs(achieved_share - e2e.KEPT_RATE) < 1e-9
