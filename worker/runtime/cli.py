"""The `run` and `demo` subcommands: arguments, settings loaded once, exit status.

`add_run_commands(subparsers)` is all the top-level command line needs. `callgate run --help`
lists every setting with its environment name, generated from the `Settings` model so the list
cannot drift from the code. Exit status: 0 done, 1 infrastructure failure, 2 bad settings or
contracts (one clear message, no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from worker.errors import BrokerStartError, CallgateError, ConfigError, SchemaLoadError
from worker.runtime.demo import run_demo
from worker.runtime.runner import serve
from worker.settings import Settings, load_settings

ENV_PREFIX = "CALLGATE_"


def settings_reference() -> str:
    """One line per setting: its environment name, default and description."""
    lines = ["settings (environment variables; a --settings JSON file sets the same fields):"]
    lines.extend(_describe(Settings, ENV_PREFIX))
    return "\n".join(lines)


def _describe(model: type[BaseModel], prefix: str) -> list[str]:
    lines: list[str] = []
    for name, info in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.extend(_describe(annotation, env + "__"))
            continue
        default: Any = info.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(str(item) for item in default)
        shown = "" if default is None else str(default)
        text = f"  {env}={shown}"
        if info.description:
            text = f"{text:<58} {info.description}"
        lines.append(text)
    return lines


def add_run_commands(subparsers: Any) -> None:
    """Add `run` and `demo` to the top-level parser's subcommands."""
    run = subparsers.add_parser(
        "run",
        help="consume model output topics, validate every tool call, produce outcome events",
        description="Run the worker: a Kafka consumer group on the input topics.",
        epilog=settings_reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _settings_argument(run)
    run.set_defaults(func=run_command)

    demo = subparsers.add_parser(
        "demo",
        help="start an embedded broker, send sample traffic through the worker, show the outcomes",
        description=(
            "Without CALLGATE_KAFKA__BOOTSTRAP_SERVERS, start the embedded broker (tansu) on a "
            "free loopback port; create the topics, produce sample traffic in every supported "
            "format, run the worker on it and print a summary of the outcomes."
        ),
        epilog=settings_reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _settings_argument(demo)
    demo.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="send the sample traffic N times"
    )
    demo.set_defaults(func=demo_command)


def _settings_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        type=Path,
        metavar="FILE",
        help="JSON settings file (environment variables override it)",
    )


def _load(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.settings)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return settings


def run_command(args: argparse.Namespace) -> int:
    try:
        return serve(_load(args))
    except (ConfigError, SchemaLoadError) as exc:
        print(f"callgate run: {exc}", file=sys.stderr)
        return 2
    except CallgateError as exc:
        print(f"callgate run: {exc}", file=sys.stderr)
        return 1


def demo_command(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        print("callgate demo: --repeat must be at least 1", file=sys.stderr)
        return 2
    try:
        return run_demo(_load(args), repeat=args.repeat)
    except (ConfigError, SchemaLoadError) as exc:
        print(f"callgate demo: {exc}", file=sys.stderr)
        return 2
    except (BrokerStartError, CallgateError) as exc:
        print(f"callgate demo: {exc}", file=sys.stderr)
        return 1
