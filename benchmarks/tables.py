"""`python -m benchmarks.tables [DIR]`: the README's tables, in Markdown, from the results files.

Reads `<DIR>/<name>.json` (default `benchmarks/results/`) for each benchmark that has one and
prints its table, so the figures in `benchmarks/README.md` are the ones the run wrote.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import RESULTS
from benchmarks.e2e import TARGET_P99_MS, cpu_per_record
from benchmarks.e2e_profile import BUCKETS, NOT_RUNNING
from benchmarks.startup import PHASES

Table = list[str]


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _head(*names: str) -> Table:
    return [_row(*names), _row(*("---" for _ in names))]


def _met(flag: bool) -> str:
    return "yes" if flag else "**no**"


def core(doc: dict[str, Any]) -> Table:
    out = _head(
        "schema", "chunks", "mix", "seed calls/s", "fjs calls/s", "fjs ratio", "rs calls/s",
        "rs ratio", "target", "native assembly alone", "orjson per envelope alone",
        "bare Python gate fjs / rs", "assembly share of callgate (fjs / rs)",
    )  # fmt: skip
    for r in doc["rows"]:
        fjs, rs = r["engines"]["fastjsonschema"], r["engines"]["jsonschema-rs"]
        out.append(
            _row(
                r["schema"], r["chunks_per_call"], r["mix"], f"{r['seed_calls_per_s']:,}",
                f"{fjs['calls_per_s']:,}", f"**{fjs['ratio_vs_seed']}**",
                f"{rs['calls_per_s']:,}", f"**{rs['ratio_vs_seed']}**", f"{r['target']:g}",
                r["assembly_only_ratio"], r["envelope_parse_only_ratio"],
                f"{fjs['bare_python_gate_ratio']} / {rs['bare_python_gate_ratio']}",
                f"{fjs['assembly_share']:.0%} / {rs['assembly_share']:.0%}",
            )
        )  # fmt: skip
    return out


def instructions(doc: dict[str, Any]) -> Table:
    out = _head(
        "schema", "chunks", "seed instr/call", "callgate fjs", "ratio", "callgate rs", "ratio",
        "target", "native assembly alone", "orjson per envelope alone", "bare gate fjs / rs",
    )  # fmt: skip
    for r in doc["rows"]:
        n, q = r["instructions_per_call"], r["ratio_vs_seed"]
        out.append(
            _row(
                r["schema"], r["chunks_per_call"], f"{n['seed'] / 1000:,.0f}k",
                f"{n['callgate:fastjsonschema'] / 1000:,.0f}k",
                f"**{q['callgate:fastjsonschema']}**",
                f"{n['callgate:jsonschema-rs'] / 1000:,.0f}k", f"**{q['callgate:jsonschema-rs']}**",
                f"{r['target']:g}", q["assembly_only"], q["envelope_parse_only"],
                f"{q['bare:fastjsonschema']} / {q['bare:jsonschema-rs']}",
            )
        )  # fmt: skip
    return out


def memory(doc: dict[str, Any]) -> Table:
    out = _head(
        "open calls", "callgate bytes/open call", "of which Python", "seed bytes/open call",
        "ratio", "target", "met",
    )  # fmt: skip
    for r in doc["rows"]:
        out.append(
            _row(
                f"{r['open_calls']:,}", f"**{r['callgate_bytes_per_open_call']}**",
                r["python_bytes_per_open_call"], r["seed_bytes_per_open_call"],
                r["ratio_vs_seed"], f"≤ {r['target']}", _met(r["meets_target"]),
            )
        )  # fmt: skip
    return out


def checkpoints(doc: dict[str, Any]) -> Table:
    out = _head(
        "calls in flight", "open at a batch's end", "full bytes", "delta bytes", "delta / full",
        "us per delta / full", "delta / full time, share of the rest of the run",
        "throughput with a delta / a full one per batch",
    )  # fmt: skip
    for r in doc["rows"]:
        b, t = r["bytes"], r["throughput_vs_none"]
        us, share = r["checkpoint_us"], r["checkpoint_share_of_run"]
        out.append(
            _row(
                f"{r['calls_in_flight']:,}", f"{b['open_calls_median']:,.0f}",
                f"{b['full_bytes_median']:,}", f"{b['delta_bytes_median']:,}", b["delta_vs_full"],
                f"{us['delta']:.0f} / {us['full']:.0f}",
                f"**{share['delta']:.1%}** / {share['full']:.1%}", f"{t['delta']} / {t['full']}",
            )
        )  # fmt: skip
    return out


def _modes(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(broker, delivery, the broker's figures, the mode's figures) of an e2e results file."""
    return [
        (name, delivery, b, b[delivery])
        for name, b in doc["brokers"].items()
        for delivery in doc["deliveries"]
        if delivery in b
    ]


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def e2e(doc: dict[str, Any]) -> Table:
    out = _head(
        "broker", "delivery", "consume-only rec/s", "pass-through rec/s", "callgate rec/s",
        "callgate / pass-through", "target", "per round", "callgate / consume-only",
        "CPU per wall s: callgate (target 0.9) / pass-through",
        "machine busy cores (the broker's CPU per wall s)",
        "CPU us/record: callgate / pass-through (ratio)",
        "shadow mode rec/s", "shadow / callgate (per round)",
    )  # fmt: skip
    for name, delivery, b, m in _modes(doc):
        if "skipped" in m:
            out.append(_row(name, delivery, m["skipped"], *("" for _ in range(11))))
            continue
        rounds = ", ".join(f"{r[delivery]['share_of_passthrough']:.2f}" for r in b["rounds"])
        # from the rounds, so a file written before the summary had it reads the same
        per_record = cpu_per_record([r[delivery] for r in b["rounds"]])
        shadow = (
            (
                f"{m['callgate_shadow_records_per_s']:,}",
                f"**{m['shadow_share_of_callgate']:.0%}** ("
                + ", ".join(f"{r[delivery]['shadow_share_of_callgate']:.2f}" for r in b["rounds"])
                + ")",
            )
            if "shadow_share_of_callgate" in m
            else ("-", "-")
        )
        out.append(
            _row(
                name, delivery, f"{b['consume_only_records_per_s']:,}",
                f"{m['passthrough_records_per_s']:,}", f"{m['callgate_records_per_s']:,}",
                f"**{m['share_of_passthrough']:.0%}**", f"≥ {m['target_share']:.0%}", rounds,
                f"{m['share_of_consume_only']:.0%}",
                f"**{_cpu(m['callgate_cpu_per_wall_s'])}** / "
                f"{_cpu(m['passthrough_cpu_per_wall_s'])}",
                f"{_cpu(m['machine_busy_cores_callgate'])} "
                f"({_cpu(m.get('broker_cpu_per_wall_s_callgate'))}) / "
                f"{_cpu(m['machine_busy_cores_passthrough'])} "
                f"({_cpu(m.get('broker_cpu_per_wall_s_passthrough'))})",
                f"{_cpu(per_record['callgate_cpu_us_per_record'])} / "
                f"{_cpu(per_record['passthrough_cpu_us_per_record'])} "
                f"(**{_cpu(per_record['callgate_over_passthrough_cpu_per_record'])}**)",
                *shadow,
            )
        )  # fmt: skip
    return out


def e2e_profile(doc: dict[str, Any]) -> Table:
    """CPU microseconds per input record by part, the pass-through beside callgate."""
    floor, gate = doc["passthrough"], doc["callgate"]
    out = _head("part", "pass-through us/record", "callgate us/record", "callgate beyond")
    for part, _ in BUCKETS:
        if part in NOT_RUNNING:
            continue
        ours, theirs = gate["us_per_record"][part], floor["us_per_record"][part]
        out.append(_row(part, f"{theirs:.2f}", f"{ours:.2f}", f"{ours - theirs:+.2f}"))
    running = floor["us_per_record_running"], gate["us_per_record_running"]
    out.append(
        _row(
            "**running, in all**", f"**{running[0]:.2f}**", f"**{running[1]:.2f}**",
            f"**{running[1] - running[0]:+.2f}**",
        )
    )  # fmt: skip
    return out


def latency(doc: dict[str, Any]) -> Table:
    out = _head(
        "broker", "delivery", "rate (share of callgate's max)", "contender", "achieved rec/s",
        "p50 / p90 / **p99** / max ms", "topics in the cluster", "target p99",
    )  # fmt: skip
    for name, delivery, _, m in _modes(doc):
        for point in m.get("latency_by_rate", []):
            rate = point["callgate"]["target_records_per_s"]
            share = point["fraction_of_callgate_max"]
            for kind, run in point.items():
                if kind == "fraction_of_callgate_max":
                    continue
                f = run["from_last_chunk_acknowledged"]
                achieved = f"{run['achieved_records_per_s']:,}" + (
                    f" (void: fell {run['load_generator_max_behind_ms']:,.0f} ms behind)"
                    if run["void"]
                    else ""
                )
                out.append(
                    _row(
                        name, delivery, f"{rate:,} ({share:.0%})", kind, achieved,
                        f"{f['p50_ms']:.0f} / {f['p90_ms']:.0f} / **{f['p99_ms']:.0f}** / "
                        f"{f['max_ms']:.0f}",
                        run["topics_in_cluster"], f"≤ {TARGET_P99_MS:g}",
                    )
                )  # fmt: skip
    return out


def scaling(doc: dict[str, Any]) -> Table:
    out = _head("arguments", "chunks", "callgate us/call", "seed us/call", "ratio vs seed")
    for r in doc["argument_size"] + doc["chunk_count"]:
        out.append(
            _row(
                f"{r['argument_bytes']:,} B", r["chunks_per_call"], r["callgate_us_per_call"],
                r["seed_us_per_call"], r["ratio_vs_seed"],
            )
        )  # fmt: skip
    load = doc["schema_load"]
    out.append("")
    out += _head("loader", "seconds", "ms/schema", "ratio vs seed")
    out.append(_row(f"seed: {load['schemas']} Draft202012Validators", load["seed_s"], "", 1))
    for engine in ("jsonschema-rs", "fastjsonschema"):
        e = load[engine]
        out.append(
            _row(f"SchemaRegistry.load, {engine}", e["seconds"], e["ms_per_schema"],
                 e["ratio_vs_seed"])
        )  # fmt: skip
    return out


def observability(doc: dict[str, Any]) -> Table:
    out = _head("schema", "mix", "calls/s off", "calls/s on", "on / off", "metrics us/call",
                "metrics share of the core")  # fmt: skip
    for r in doc["rows"]:
        out.append(
            _row(
                r["schema"], r["mix"], f"{r['calls_per_s_metrics_off']:,}",
                f"{r['calls_per_s_metrics_on']:,}", r["throughput_on_vs_off"],
                r["metrics_alone_us_per_call"], f"**{r['metrics_share_of_core']:.1%}**",
            )
        )  # fmt: skip
    return out


def startup(doc: dict[str, Any]) -> Table:
    """A column per broker and case: each phase's median seconds, callgate's (and, with a
    checkout before a change, that checkout's first); then the totals and the ratios."""
    columns = [(b, case) for b in doc["brokers"] for case in ("fresh", "restart")]
    summaries = [doc["brokers"][b][case] for b, case in columns]
    before = doc.get("before") is not None

    def cell(summary: dict[str, Any], name: str) -> str:
        after = summary["callgate_phases_median_s"][name]
        if not before:
            return f"{after:.3f}"
        return f"{summary['callgate_before_phases_median_s'][name]:.3f} / {after:.3f}"

    out = _head("phase", *(f"{b} {case}" for b, case in columns))
    for name in (phase.name for phase in PHASES):
        out.append(_row(name, *(cell(s, name) for s in summaries)))
    totals = [f"**{s['callgate_s']:.3f}**" for s in summaries]
    if before:
        totals = [
            f"{s['callgate_before_s']:.3f} / {t}" for s, t in zip(summaries, totals, strict=True)
        ]
    out.append(_row("**callgate, spawn to first event**", *totals))
    out.append(_row("pass-through, spawn to first event", *(s["passthrough_s"] for s in summaries)))
    out.append(
        _row("callgate / pass-through", *(s["callgate_over_passthrough"] for s in summaries))
    )
    if before:
        out.append(
            _row("callgate / before", *(s["callgate_over_callgate_before"] for s in summaries))
        )
    return out


TABLES: dict[str, Callable[[dict[str, Any]], Table]] = {
    "core": core,
    "instructions": instructions,
    "memory": memory,
    "checkpoints": checkpoints,
    "e2e": e2e,
    "latency": latency,
    "e2e_profile": e2e_profile,
    "scaling": scaling,
    "observability": observability,
    "startup": startup,
}


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else RESULTS
    for name, table in TABLES.items():
        path = directory / f"{'e2e' if name == 'latency' else name}.json"
        if not path.is_file():
            continue
        doc = orjson.loads(path.read_bytes())
        print(f"### {name} ({doc['command']}, {doc['when']}, {doc['environment'].get('code')})\n")
        print("\n".join(table(doc)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
