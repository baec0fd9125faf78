"""`callgate-demo`: the command line of the demo (`--repeat N`, `--settings FILE`).

Settings are loaded as for `callgate run` (the same `--settings` file and `CALLGATE_*`
environment). Exit status: 0 every outcome event arrived, 1 infrastructure failure (the broker
did not start, Kafka unreachable) or missing events, 2 bad settings or contracts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from callgate_demo.demo import run_demo
from worker import __version__
from worker.errors import CallgateError, ConfigError, SchemaLoadError
from worker.runtime.cli import load_and_log, settings_argument, settings_reference

PROG = "callgate-demo"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Without CALLGATE_KAFKA__BOOTSTRAP_SERVERS, start the embedded broker (tansu) on a "
            "free loopback port; create the topics, produce sample traffic in every supported "
            "format, run the worker on it and print a summary of the outcomes."
        ),
        epilog=settings_reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    settings_argument(parser)
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="send the sample traffic N times"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeat < 1:
        print(f"{PROG}: --repeat must be at least 1", file=sys.stderr)
        return 2
    try:
        return run_demo(load_and_log(args.settings), repeat=args.repeat)
    except (ConfigError, SchemaLoadError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except CallgateError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
