"""The `run` subcommand: arguments, settings loaded once, exit status.

`add_run_command(subparsers)` is all the top-level command line needs. `callgate run --help`
lists every setting with its environment name, generated from the `Settings` model so the list
cannot drift from the code. Exit status: 0 done, 1 infrastructure failure, 2 bad settings or
contracts (one clear message, no traceback). `settings_argument` and `load_and_log` are the same
for any command that runs the worker (the demo's, in `callgate_demo`, too).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from worker import logs
from worker.compose import log_span_ids
from worker.errors import CallgateError, ConfigError, SchemaLoadError
from worker.settings import Settings, load_settings, setting_fields


def settings_reference() -> str:
    """One line per setting: its environment name, default and description."""
    lines = ["settings (environment variables; a --settings JSON file sets the same fields):"]
    for env, info in setting_fields():
        default: Any = info.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(str(item) for item in default)
        shown = "" if default is None else str(default)
        text = f"  {env}={shown}"
        if info.description:
            text = f"{text:<58} {info.description}"
        lines.append(text)
    return "\n".join(lines)


def add_run_command(subparsers: Any) -> None:
    """Add `run` to the top-level parser's subcommands."""
    run = subparsers.add_parser(
        "run",
        help="consume model output topics, validate every tool call, produce outcome events",
        description="Run the worker: a Kafka consumer group on the input topics.",
        epilog=settings_reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settings_argument(run)
    run.set_defaults(func=run_command)


def settings_argument(parser: argparse.ArgumentParser) -> None:
    """`--settings FILE`, the JSON settings file that environment variables override."""
    parser.add_argument(
        "--settings",
        type=Path,
        metavar="FILE",
        help="JSON settings file (environment variables override it)",
    )


def load_and_log(settings_file: Path | None) -> Settings:
    """The settings, loaded once, and logging to stderr at their level, in their format."""
    settings = load_settings(settings_file)
    logs.configure(settings.log_level, settings.log.format, span_ids=log_span_ids(settings))
    return settings


def run_command(args: argparse.Namespace) -> int:
    # the worker's modules load only for `run`: the other commands start without them
    from worker.runtime.serve import serve  # noqa: PLC0415

    try:
        started = time.perf_counter()
        settings = load_and_log(args.settings)
        return serve(settings, settings_ms=(time.perf_counter() - started) * 1000)
    except (ConfigError, SchemaLoadError) as exc:
        print(f"callgate run: {exc}", file=sys.stderr)
        return 2
    except CallgateError as exc:
        print(f"callgate run: {exc}", file=sys.stderr)
        return 1
