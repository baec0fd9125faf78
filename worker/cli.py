"""The `callgate` command line: `check` (offline), `schemas` (author tools), `run` (the worker)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from worker import __version__
from worker.adapters.decoder import ENVELOPE, formats
from worker.adapters.dialects import dialect_of, split_format
from worker.check import FAILED_ON, PASSED, main_check, parse_fail_on
from worker.compose import build_key_store, build_processor
from worker.errors import CallgateError, ConfigError, InputFormatError
from worker.runtime.cli import add_run_command
from worker.runtime.topics_cli import add_topics_command
from worker.schemas.cli import add_schemas_command
from worker.settings import load_settings


def _check(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {"schemas": {"dir": args.schemas}}
    if args.engine:
        overrides["schemas"] = {"dir": args.schemas, "engine": args.engine}
    settings = load_settings(args.settings, **overrides)
    fail_on = parse_fail_on(args.fail_on) if args.fail_on is not None else frozenset()
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--header takes NAME=VALUE, not {item!r}")
        headers[name.strip().lower()] = value
    processor = build_processor(settings)
    return main_check(
        processor,
        build_key_store(settings),
        path=args.input,
        fmt=args.format,
        stream_id=args.stream_id,
        headers=headers,
        max_feedback_bytes=settings.limits.max_feedback_bytes,
        fail_on=fail_on,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="callgate", description="The gate every model tool call passes before it runs."
    )
    parser.add_argument("--version", action="version", version=f"callgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check",
        help="run the whole chain offline on JSON lines (or recorded SSE), one event per call",
        description="Read chunk envelopes (or vendor events) and write one outcome event per "
        "call as JSON lines to stdout, a summary to stderr.",
        epilog=f"exit status: {PASSED} every call judged, none with an outcome --fail-on names; "
        f"{FAILED_ON} some call had such an outcome; 2 the input, a setting or a contract "
        "cannot be used (one message on stderr)",
    )
    check.add_argument("--schemas", type=Path, required=True, help="contract directory")
    check.add_argument("--engine", choices=["fastjsonschema", "jsonschema-rs"])
    check.add_argument(
        "--format",
        type=_content_format,
        metavar="FORMAT",
        help=f"the input's format, one of {', '.join(formats())}, with a dialect as the "
        "content-format header names it ('openai.chat; dialect=ollama'); default: told from "
        f"its first records ({ENVELOPE} when they are JSON that no vendor format's rule "
        "recognises)",
    )
    check.add_argument(
        "--fail-on",
        metavar="OUTCOMES",
        help="exit with status 1 when a call has one of these outcomes (comma-separated: "
        "rejected,incomplete), e.g. to gate a pipeline on recorded traffic",
    )
    check.add_argument("--stream-id", help="stream id for vendor formats (default: file name)")
    check.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Kafka header every input record carries (e.g. tool=weather.get_weather_data "
        "for --format mcp.result); repeatable",
    )
    check.add_argument("--settings", type=Path, help="JSON settings file")
    check.add_argument("input", nargs="?", default="-", help="input file, or - for stdin")
    check.set_defaults(func=_check)

    add_schemas_command(commands)
    add_run_command(commands)
    add_topics_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CallgateError as exc:
        print(f"callgate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _content_format(value: str) -> str:
    """`--format`: a format, and a dialect as the content-format header names it."""
    fmt, parameters = split_format(value)
    if fmt not in formats():
        raise argparse.ArgumentTypeError(f"{fmt!r} is no format; formats: {', '.join(formats())}")
    try:
        dialect_of(fmt, parameters)
    except InputFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value.strip()
