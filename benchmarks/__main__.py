"""`python -m benchmarks [name ...]`: run benchmarks, write benchmarks/results/<name>.json.

Names: core, memory, checkpoints, e2e, instructions (the core ratios counted in CPU instructions
under callgrind; needs valgrind), scaling, observability, profile (text profiles of the core
path, written beside the results), json_parse (the strict parser against orjson and json),
topic_check (the worker's topic check against listing every topic, on Apache Kafka),
early (early verdicts: the share of invalid calls' streams left unread, the cost per chunk
on valid traffic against early verdicts off), e2e_profile (py-spy's samples of callgate and the
pass-through draining the e2e workload, per record and by part; needs py-spy and the right to
attach to a process), tracing (what tracing costs a round, off and on, in instructions;
`--baseline ROOT` counts another checkout's), startup (`callgate run`'s spawn to its first
event, a fresh group and a restart with state to restore, in phases, against the pass-through's;
`--broker` limits it to one broker, `--baseline ROOT` starts another checkout's worker too),
offline (`callgate check` as a whole process, start-up, reading, judging and writing, against
the seed's design as a whole process, on 50,000 small calls); none means core, memory,
checkpoints and e2e. `--quick` runs a benchmark at a tiny size (the smoke tests use it; its
figures mean nothing). `--broker` limits e2e and startup to one broker (and picks
e2e_profile's, Apache Kafka by default). `--delivery` picks e2e's delivery modes (at_least_once,
exactly_once against a transactional pass-through, or both, the default; tansu has no
transactions, so exactly_once is skipped there).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    checkpoints,
    core,
    e2e,
    e2e_profile,
    early,
    instructions,
    memory,
    observability,
    offline,
    profile,
    scaling,
    startup,
    topic_check,
    tracing,
)
from benchmarks.common import RESULTS, native_build, write_results


def _core(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return core.run(records=2_000, repeats=args.repeats or 1)
    return core.run(repeats=args.repeats or 5)


def _memory(args: argparse.Namespace) -> dict[str, Any]:
    return memory.run(counts=(100, 1_000) if args.quick else (1_000, 10_000, 100_000))


def _checkpoints(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return checkpoints.run(calls=600, repeats=args.repeats or 1)
    return checkpoints.run(repeats=args.repeats or 7)


#: `--delivery`: e2e's delivery modes
DELIVERY_CHOICES = {**{mode: (mode,) for mode in e2e.DELIVERIES}, "both": e2e.DELIVERIES}


def _e2e(args: argparse.Namespace) -> dict[str, Any]:
    brokers = e2e.BROKERS if args.broker is None else (args.broker,)
    deliveries = DELIVERY_CHOICES[args.delivery]
    if args.quick:
        return e2e.run(
            quick=True, repeats=args.repeats or 1, brokers=brokers, deliveries=deliveries
        )
    return e2e.run(repeats=args.repeats or 3, brokers=brokers, deliveries=deliveries)


def _e2e_profile(args: argparse.Namespace) -> dict[str, Any]:
    broker = args.broker or "apache"
    return e2e_profile.run(
        quick=args.quick,
        repeats=args.repeats or (1 if args.quick else 3),
        broker=broker,
        out=args.out,
    )


def _offline(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return offline.run(calls=200, repeats=args.repeats or 1)
    return offline.run(repeats=args.repeats or 3)


def _instructions(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return instructions.run(
            records=40, rows=(("small", 10, "valid"),), contenders=instructions.QUICK_CONTENDERS
        )
    return instructions.run()


def _scaling(args: argparse.Namespace) -> dict[str, Any]:
    return scaling.run(quick=args.quick, repeats=args.repeats or (1 if args.quick else 3))


def _observability(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return observability.run(calls=40, repeats=args.repeats or 1)
    return observability.run(repeats=args.repeats or 7)


def _profile(args: argparse.Namespace) -> dict[str, Any]:
    return profile.run(records=2_000 if args.quick else 200_000, out=args.out)


def _json_parse(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks import json_parse  # noqa: PLC0415 (another engineer's benchmark, standalone)

    return json_parse.run(repeats=args.repeats or (1 if args.quick else 9), quick=args.quick)


def _early(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return early.run(records=1_000, repeats=args.repeats or 1)
    return early.run(repeats=args.repeats or 7)


def _topic_check(args: argparse.Namespace) -> dict[str, Any]:
    return topic_check.run(quick=args.quick, repeats=args.repeats or (1 if args.quick else 3))


def _startup(args: argparse.Namespace) -> dict[str, Any]:
    brokers = e2e.BROKERS if args.broker is None else (args.broker,)
    return startup.run(
        quick=args.quick,
        repeats=args.repeats or (1 if args.quick else 3),
        brokers=brokers,
        before=args.baseline,
    )


def _tracing(args: argparse.Namespace) -> dict[str, Any]:
    return tracing.run(calls=80 if args.quick else tracing.CALLS, baseline=args.baseline)


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "core": _core,
    "memory": _memory,
    "checkpoints": _checkpoints,
    "e2e": _e2e,
    "e2e_profile": _e2e_profile,
    "instructions": _instructions,
    "offline": _offline,
    "scaling": _scaling,
    "observability": _observability,
    "profile": _profile,
    "json_parse": _json_parse,
    "topic_check": _topic_check,
    "tracing": _tracing,
    "early": _early,
    "startup": _startup,
}
DEFAULT = ("core", "memory", "checkpoints", "e2e")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name", help=", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--broker", choices=e2e.BROKERS, default=None, help="e2e on this one")
    parser.add_argument(
        "--delivery",
        choices=tuple(DELIVERY_CHOICES),
        default="both",
        help="e2e: callgate's delivery guarantee against the pass-through of the same mode "
        "(exactly_once: transactional; Apache Kafka only, skipped on tansu)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="tracing: another checkout whose untraced rounds are counted too; startup: "
        "another checkout's worker started too (callgate_before)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    for name in args.names or DEFAULT:
        print(f"== {name}", file=sys.stderr, flush=True)
        before = native_build()
        body = BENCHMARKS[name](args)
        # the figures of a run are of one build only: a rebuild during it spoils them
        after = native_build()
        if after != before:
            print(f"   the native build changed during {name}!", file=sys.stderr, flush=True)
        body["native_build_changed_during_run"] = after != before
        path = write_results(name, body, args.out)
        print(f"   wrote {path}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
