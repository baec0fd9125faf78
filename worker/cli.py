"""The `callgate` command line: `check` (offline), `replay` (candidate contracts on recorded
traffic), `schemas` (author tools), `run` (the worker), `topics`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from worker import __version__
from worker.adapters.decoder import ENVELOPE, formats
from worker.adapters.dialects import dialect_of, split_format
from worker.check import (
    FAILED_ON,
    PASSED,
    feed_input,
    input_topic,
    main_check,
    open_input,
    parse_fail_on,
)
from worker.compose import build_key_store, build_processor
from worker.errors import CallgateError, ConfigError, InputFormatError
from worker.replay import EXAMPLES, FLIPS_OVER, NO_FLIPS_OVER, Replay, exit_status, parse_time
from worker.runtime.approve_cli import add_approval_commands
from worker.runtime.cli import add_run_command
from worker.runtime.topics_cli import add_topics_command
from worker.schemas.cli import add_schemas_command
from worker.settings import load_settings


def _headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--header takes NAME=VALUE, not {item!r}")
        headers[name.strip().lower()] = value
    return headers


def _check(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {"schemas": {"dir": args.schemas}}
    if args.engine:
        overrides["schemas"] = {"dir": args.schemas, "engine": args.engine}
    settings = load_settings(args.settings, **overrides)
    fail_on = parse_fail_on(args.fail_on) if args.fail_on is not None else frozenset()
    headers = _headers(args.header)
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


def _replay(args: argparse.Namespace) -> int:
    schemas: dict[str, object] = {}
    if args.baseline is not None:
        schemas["dir"] = args.baseline
    if args.engine:
        schemas["engine"] = args.engine
    overrides: dict[str, object] = {"schemas": schemas} if schemas else {}
    if args.bootstrap:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap}
    settings = load_settings(args.settings, **overrides)
    if bool(args.inputs) == bool(args.topic):
        raise ConfigError("replay reads input files or --topic, one of the two")
    ranged = (args.partition, args.since, args.until, args.from_offset, args.to_offset)
    if args.inputs and any(value not in (None, []) for value in ranged):
        raise ConfigError(
            "--partition, --since, --until, --from-offset and --to-offset need --topic"
        )
    if args.topic and (args.format or args.header or args.stream_id):
        raise ConfigError("--format, --header and --stream-id are for input files")
    _each_its_own_partition(args.inputs)
    if args.since is not None and args.from_offset is not None:
        raise ConfigError("the range starts at --since or at --from-offset, not both")
    if args.until is not None and args.to_offset is not None:
        raise ConfigError("the range ends at --until or at --to-offset, not both")
    processor = build_processor(settings, candidate=args.schemas, early=False)
    assert processor.shadow is not None
    replay = Replay(
        build_key_store(settings),
        build_key_store(settings),
        (processor.gate.registry, processor.shadow.registry),
        settings.limits.max_feedback_bytes,
        args.examples,
    )
    if args.inputs:
        headers = _headers(args.header)
        for path in args.inputs:
            with open_input(path, args.format, headers, command="replay") as (stream, fmt):
                for emissions in feed_input(
                    processor,
                    stream,
                    name=path,
                    fmt=fmt,
                    stream_id=args.stream_id,
                    headers=headers,
                ):
                    replay.add(emissions)
        read = ", ".join(args.inputs)
    else:
        from worker.runtime.history import Bound, Span, read_range  # noqa: PLC0415 (only --topic reads Kafka)

        start = Bound(args.from_offset, _time(args.since, "--since"))
        end = Bound(args.to_offset, _time(args.until, "--until"))
        spans: list[Span] = read_range(
            settings,
            args.topic,
            partitions=args.partition or (),
            start=start,
            end=end,
            feed=lambda topic, partition, records: replay.add(
                processor.feed(topic, partition, records)
            ),
        )
        replay.add(processor.flush())
        read = "; ".join(str(span) for span in spans)
    report = replay.report(
        baseline=str(settings.schemas.dir), candidate=str(args.schemas), source=read
    )
    if args.json:
        sys.stdout.buffer.write(report.encode() + b"\n")
    else:
        print(report.table())
    return exit_status(report, args.fail_on_flips)


def _each_its_own_partition(inputs: Sequence[str]) -> None:
    """Refuse inputs that would be read as one partition (one file named twice, or names alike
    in all a topic name keeps): the second's records would be taken for the first's, read
    again, and its calls lost."""
    read: dict[str, str] = {}
    for path in inputs:
        topic = input_topic(path)
        if topic in read:
            raise ConfigError(
                f"{read[topic]} and {path} would be read as one partition (their names are "
                "alike in the bytes a topic name keeps): name each input once"
            )
        read[topic] = path


def _time(text: str | None, option: str) -> int | None:
    return parse_time(text, option) if text is not None else None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a whole number of 0 or more, not {text!r}")
    return int(text)


def _add_replay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = commands.add_parser(
        "replay",
        help="judge recorded traffic under candidate contracts and the current ones; count "
        "what would change, per tool and version",
        description="Judge every call of input files (as check reads them) or of a range of a "
        "Kafka topic under two contract sets, and report the calls whose verdict would change "
        "(flips), per tool and schema version, with a few sanitized examples of each kind.",
        epilog=f"exit status: {NO_FLIPS_OVER} no more flips than --fail-on-flips allows (or no "
        f"--fail-on-flips); {FLIPS_OVER} more; 2 an input, the cluster, a setting or a "
        "contract cannot be used (one message on stderr)",
    )
    replay.add_argument(
        "--schemas", type=Path, required=True, metavar="CANDIDATE", help="candidate contracts"
    )
    replay.add_argument(
        "--baseline",
        type=Path,
        metavar="CURRENT",
        help="current contracts (default: the settings' CALLGATE_SCHEMAS__DIR)",
    )
    replay.add_argument("--engine", choices=["fastjsonschema", "jsonschema-rs"])
    replay.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    replay.add_argument(
        "--fail-on-flips",
        type=_count,
        metavar="N",
        help=f"exit with status {FLIPS_OVER} when more than N calls flip (0: any flip)",
    )
    replay.add_argument(
        "--examples",
        type=_count,
        default=EXAMPLES,
        metavar="N",
        help=f"flips shown per kind (default {EXAMPLES})",
    )
    replay.add_argument("--settings", type=Path, help="JSON settings file")
    files = replay.add_argument_group("input files (as callgate check reads them)")
    files.add_argument("inputs", nargs="*", metavar="FILE", help="input files, or - for stdin")
    files.add_argument(
        "--format",
        type=_content_format,
        metavar="FORMAT",
        help="the inputs' format, as for check (default: told from their first records)",
    )
    files.add_argument("--stream-id", help="stream id for vendor formats (default: file name)")
    files.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="as for check"
    )
    kafka = replay.add_argument_group(
        "a Kafka topic (read-only: no group, nothing committed, read_committed)"
    )
    kafka.add_argument("--topic", action="append", default=[], help="input topic; repeatable")
    kafka.add_argument(
        "--bootstrap",
        metavar="HOST:PORT,...",
        help="the cluster (default: the settings' CALLGATE_KAFKA__BOOTSTRAP_SERVERS)",
    )
    kafka.add_argument(
        "--partition", type=_count, action="append", default=[], help="only this partition"
    )
    kafka.add_argument(
        "--since",
        metavar="TIME",
        help="from the first record at or after TIME (ISO 8601, UTC unless it says; or epoch ms)",
    )
    kafka.add_argument("--until", metavar="TIME", help="up to the first record at or after TIME")
    kafka.add_argument("--from-offset", type=_count, metavar="N", help="start at offset N")
    kafka.add_argument("--to-offset", type=_count, metavar="N", help="stop before offset N")
    replay.set_defaults(func=_replay)


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

    _add_replay(commands)
    add_schemas_command(commands)
    add_run_command(commands)
    add_topics_command(commands)
    add_approval_commands(commands)
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
