"""`callgate topics create|check|acls`: a group's topics made and verified, its privileges printed.

- `create` makes every topic of `worker.runtime.provision.plan` that is missing, with its
  partitions, replicas (`CALLGATE_TOPICS__REPLICATION_FACTOR`), `cleanup.policy` and
  `max.message.bytes`, then checks them all; an input named in the settings and missing is made
  with `--input-partitions`, the outcome topics with `--output-partitions`. An input pattern
  names no topic: the changelogs of the topics it matches are made by the workers.
- `check` verifies, without changing anything, every topic the settings need: present; as many
  partitions as the worker needs (a changelog as many as its input, the idempotency keys as many
  as their requests, the approvals as many as the pending-approval topic); replicas; compacted
  where it holds state and never where a key may repeat (a compacted outcome, requests or
  pending-approval topic would drop an event or a call sharing its key); a `max.message.bytes`
  that takes the largest batch the worker writes there.
- `acls` prints the least privileges of the worker's principal as `kafka-acls.sh` commands.

Exit status: 0 every topic serves; 1 a topic is missing or cannot serve (each named, with what
is wrong), or the cluster could not be reached; 2 a setting is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from worker.errors import CallgateError, ConfigError, SchemaLoadError
from worker.runtime.cli import settings_argument
from worker.runtime.kafka import Kafka
from worker.runtime.provision import Role, TopicPlan, acl_commands, plan
from worker.runtime.topics import TopicLayout, state_policy_problem
from worker.settings import Settings, load_settings

SERVES, CANNOT_SERVE, BAD_SETTINGS = 0, 1, 2
DEFAULT_INPUT_PARTITIONS = 6


@dataclass
class TopicState:
    """One planned topic as the cluster has it, and what keeps it from serving."""

    plan: TopicPlan
    layout: TopicLayout | None = None
    config: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        status = "ok" if not self.problems else "PROBLEM"
        if self.layout is None:
            shown = "missing"
        else:
            shown = f"{self.layout.partitions} partitions, {self.layout.replication} replicas"
            for key in ("cleanup.policy", "max.message.bytes"):
                if key in self.config:
                    shown += f", {key}={self.config[key]}"
        text = f"{status:<8} {self.plan.name}  ({self.plan.role}: {shown})"
        return "\n".join([text, *(f"         - {problem}" for problem in self.problems)])


def _judge(state: TopicState, settings: Settings, plans: dict[Role, list[TopicState]]) -> None:
    """Fill in `state.problems`."""
    wanted, layout = state.plan, state.layout
    if layout is None:
        made_by = (
            "the first worker makes it, or `callgate topics create` now"
            if wanted.created_by_worker
            else "`callgate topics create` makes it"
        )
        state.problems.append(f"missing: {made_by}")
        return
    if wanted.partitions is not None and layout.partitions < wanted.partitions:
        why = {
            Role.CHANGELOG: "one per input partition",
            Role.INPUT: "as --input-partitions asks",
            Role.PENDING: "CALLGATE_APPROVAL__PARTITIONS",
            Role.APPROVALS: "CALLGATE_APPROVAL__PARTITIONS",
        }.get(wanted.role, "CALLGATE_IDEMPOTENCY__PARTITIONS")
        state.problems.append(f"{layout.partitions} partitions; needs {wanted.partitions} ({why})")
    if wanted.role is Role.KEYS:
        requests = [s.layout for s in plans[Role.REQUESTS] if s.layout is not None]
        if requests and layout.partitions < requests[0].partitions:
            state.problems.append(
                f"{layout.partitions} partitions, fewer than the idempotency requests' "
                f"{requests[0].partitions}: each requests partition keeps its keys in the "
                "partition of the same number"
            )
    if wanted.role is Role.APPROVALS:
        pending = [s.layout for s in plans[Role.PENDING] if s.layout is not None]
        if pending and layout.partitions < pending[0].partitions:
            state.problems.append(
                f"{layout.partitions} partitions, fewer than the pending-approval topic's "
                f"{pending[0].partitions}: each of its partitions keeps its calls in the "
                "partition of the same number"
            )
    replicas = settings.topics.replication_factor
    if wanted.role is not Role.INPUT and layout.replication < replicas:
        state.problems.append(
            f"{layout.replication} replicas; CALLGATE_TOPICS__REPLICATION_FACTOR asks {replicas}"
        )
    config = state.config
    if wanted.compacted:
        problem = state_policy_problem(config)
        if problem:
            state.problems.append(problem)
    elif wanted.role is not Role.INPUT and "compact" in config.get("cleanup.policy", ""):
        state.problems.append(
            f"cleanup.policy={config['cleanup.policy']}: compaction keeps one record per key, "
            "and records of this topic may share a key (a call id, an idempotency key, an "
            "event id): it "
            "must be delete"
        )
    limit = config.get("max.message.bytes")
    if (
        wanted.max_message_bytes is not None
        and limit is not None
        and int(limit) < wanted.max_message_bytes
    ):
        state.problems.append(
            f"max.message.bytes={limit}; the worker may write batches of "
            f"{wanted.max_message_bytes} bytes here (CALLGATE_LIMITS__MAX_EVENT_BYTES, "
            "CALLGATE_DELIVERY__CHECKPOINT_RECORD_BYTES, CALLGATE_KAFKA__MAX_BATCH_BYTES)"
        )


async def inspect(kafka: Kafka, settings: Settings) -> list[TopicState]:
    """Every topic the settings need, as the cluster has it, judged."""
    plans = plan(settings, {})
    layouts = await kafka.describe(p.name for p in plans)
    inputs = {
        p.name: layouts[p.name].partitions
        for p in plans
        if p.role is Role.INPUT and p.name in layouts
    }
    plans = plan(settings, inputs)
    present = [p.name for p in plans if p.name in layouts and p.role is not Role.INPUT]
    configs = await kafka.topic_configs(present)
    states = [TopicState(p, layouts.get(p.name), configs.get(p.name, {})) for p in plans]
    by_role: dict[Role, list[TopicState]] = {role: [] for role in Role}
    for state in states:
        by_role[state.plan.role].append(state)
    for state in states:
        _judge(state, settings, by_role)
    return states


async def create(
    kafka: Kafka, settings: Settings, input_partitions: int, output_partitions: int | None
) -> list[str]:
    """Make every planned topic that is missing; what was made, one line each."""
    plans = plan(settings, {})
    layouts = await kafka.describe(p.name for p in plans)
    inputs = {
        p.name: layouts[p.name].partitions if p.name in layouts else input_partitions
        for p in plans
        if p.role is Role.INPUT
    }
    outcomes = output_partitions or max(inputs.values(), default=input_partitions)
    specs = [p.spec(outcomes) for p in plan(settings, inputs) if p.name not in layouts]
    await kafka.ensure_topics(specs)
    made = [
        f"created  {spec.name}  ({spec.partitions} partitions, "
        f"{settings.topics.replication_factor} replicas, "
        + ", ".join(f"{key}={value}" for key, value in spec.configs().items())
        + ")"
        for spec in specs
    ]
    if settings.topics.input_pattern:
        made.append(
            f"note     the input is a pattern ({settings.topics.input_pattern}): the workers "
            "make each matching topic's changelog when they are first assigned it"
        )
    return made


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    kafka = Kafka(settings)
    try:
        if args.topics_command == "create":
            for line in await create(
                kafka, settings, args.input_partitions, args.output_partitions
            ):
                print(line)
        states = await inspect(kafka, settings)
    finally:
        await kafka.close()
    for state in states:
        print(state.line())
    failing = [state.plan.name for state in states if state.problems]
    if failing:
        print(f"{len(failing)} of {len(states)} topics cannot serve: {', '.join(failing)}")
        return CANNOT_SERVE
    print(f"all {len(states)} topics serve group {settings.kafka.group_id}")
    return SERVES


def _topics_command(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.settings)
        if args.topics_command == "acls":
            principal = args.principal or (
                f"User:{settings.kafka.sasl_username}" if settings.kafka.sasl_username else None
            )
            if principal is None:
                raise ConfigError(
                    "name the worker's principal with --principal (no "
                    "CALLGATE_KAFKA__SASL_USERNAME to take it from)"
                )
            for line in acl_commands(settings, principal, command_config=args.command_config):
                print(line)
            return SERVES
        # one line says what failed; aiokafka's own log of each attempt would only repeat it
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        return asyncio.run(_run(args, settings))
    except (ConfigError, SchemaLoadError) as exc:
        print(f"callgate topics: {exc}", file=sys.stderr)
        return BAD_SETTINGS
    except (CallgateError, KafkaError, OSError) as exc:
        print(f"callgate topics: cannot work with the cluster: {exc!r}", file=sys.stderr)
        return CANNOT_SERVE


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"a partition count is a whole number from 1, not {text!r}"
        )
    return int(text)


def add_topics_command(subparsers: Any) -> None:
    """Add `topics` with its `create`, `check` and `acls` sub-commands."""
    topics = subparsers.add_parser(
        "topics",
        help="create or check the topics the settings need; print the ACLs the worker needs",
        description=__doc__.split("\n\n", 1)[1].split("\n\nExit status")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    epilog = (
        f"exit status: {SERVES} every topic serves; {CANNOT_SERVE} a topic is missing or cannot "
        f"serve, or the cluster cannot be reached; {BAD_SETTINGS} a setting is wrong"
    )
    create_parser = commands.add_parser(
        "create", help="make the missing topics, then check them all", epilog=epilog
    )
    create_parser.add_argument(
        "--input-partitions",
        type=_positive,
        default=DEFAULT_INPUT_PARTITIONS,
        metavar="N",
        help="partitions of an input topic made here (they bound the useful workers; "
        f"default {DEFAULT_INPUT_PARTITIONS})",
    )
    create_parser.add_argument(
        "--output-partitions",
        type=_positive,
        metavar="N",
        help="partitions of an outcome topic made here (default: as many as the input's)",
    )
    check_parser = commands.add_parser(
        "check", help="verify every topic the settings need, changing nothing", epilog=epilog
    )
    acls_parser = commands.add_parser(
        "acls", help="print the worker's least privileges as kafka-acls.sh commands"
    )
    acls_parser.add_argument(
        "--principal",
        metavar="PRINCIPAL",
        help="the worker's principal (default: User:<CALLGATE_KAFKA__SASL_USERNAME>)",
    )
    acls_parser.add_argument(
        "--command-config",
        default="client.properties",
        metavar="FILE",
        help="the admin client's properties file the commands name",
    )
    for parser in (create_parser, check_parser, acls_parser):
        settings_argument(parser)
        parser.set_defaults(func=_topics_command)
