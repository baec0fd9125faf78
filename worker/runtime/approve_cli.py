"""`callgate approve EVENT_ID` / `callgate deny EVENT_ID`: a person's decision on a call pending
approval, bound to the arguments they were shown.

The command reads the pending-approval topic (`CALLGATE_TOPICS__PENDING_APPROVAL`) for the call's
`pending_approval` event (keyed by its event id), prints the call: its tool and contract,
principal, idempotency key, its arguments in full (an approver must see what they approve; they
are printed as JSON with every character that is not printable ASCII escaped, so no argument can
write to the terminal), and their fingerprint, which it computes again from the arguments shown
and refuses to go on with if it differs from the one the event states. It then writes the
decision (`worker.core.approval`: the published approval-decision, header `record:
approval-decision`) to the call's partition and says so; the worker that owns that partition
rules on it (a call approved reaches the validated topic once, one denied or expired ends in a
rejection, a decision refused is answered with a refusal record on the same topic).

It also prints what was written for the call before (decisions, refusals): a second decision on
a decided call is refused by the worker.

Exit status: 0 the decision was written; 1 no call pending approval has that event id, or its
event is inconsistent; 2 a setting is wrong or the cluster could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from worker.core.approval import (
    DECISION_RECORD,
    MAX_BY_CHARS,
    MAX_REASON_CHARS,
    PENDING_OUTCOME,
    RECORD_HEADER,
    Decision,
    decision_record,
    fingerprint,
)
from worker.errors import CallgateError, ConfigError
from worker.model import SchemaRef
from worker.runtime.cli import settings_argument
from worker.runtime.kafka import Kafka
from worker.runtime.kafka_options import producer_options
from worker.settings import Settings, load_settings

if TYPE_CHECKING:  # the published model is built when a decision is made, never for `run`
    from worker.published.model import PendingApproval

WRITTEN, NOT_PENDING, BAD_SETTINGS = 0, 1, 2
_EVENT_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class Found:
    """What the pending-approval topic holds of one call."""

    partition: int | None = None
    pending: PendingApproval | None = None
    #: decisions and refusals written for it after its pending event, as read
    later: list[dict[str, Any]] = field(default_factory=list)


async def find(kafka: Kafka, settings: Settings, event_id: str) -> Found:
    """The call's pending event and what was written for it, from the whole topic."""
    from worker.published.model import PendingApproval, parse_event  # noqa: PLC0415 (see above)

    topic = settings.topics.pending_approval
    if await kafka.missing_topics([topic]):
        raise ConfigError(f"the pending-approval topic {topic} does not exist")
    counts = await kafka.partition_counts([topic])
    logs = await kafka.read_to_end([(topic, p) for p in range(counts.get(topic, 0))])
    found = Found()
    key = event_id.encode()
    for (_, partition), records in sorted(logs.items()):
        for record in records:
            if record.key != key:
                continue
            headers = dict(record.headers or ())
            if headers.get("outcome") == PENDING_OUTCOME.encode():
                event = parse_event(record.value)
                if isinstance(event, PendingApproval):
                    found.partition, found.pending, found.later = partition, event, []
            elif found.pending is not None:
                try:
                    found.later.append(orjson.loads(record.value))
                except orjson.JSONDecodeError:
                    found.later.append({"unreadable": True})
    return found


def show(pending: PendingApproval) -> tuple[list[str], str]:
    """The lines that show a pending call, and the fingerprint of the arguments shown."""
    schema = pending.schema_ref
    computed = fingerprint(SchemaRef(schema.id, schema.version), pending.arguments)
    arguments = json.dumps(pending.arguments, indent=2, sort_keys=True, ensure_ascii=True)
    lines = [
        f"event        {pending.event_id}",
        f"call         {_safe(pending.call_id)} (stream {_safe(pending.stream_id)})",
        f"tool         {_safe(pending.tool or '')} ({_safe(schema.id)} v{_safe(schema.version)})",
        f"principal    {_safe(pending.principal) if pending.principal else '(none)'}",
        f"key          {_safe(pending.idempotency_key) if pending.idempotency_key else '(none)'}",
        "arguments",
        *(f"  {line}" for line in arguments.splitlines()),
        f"fingerprint  {computed}",
    ]
    return lines, computed


def _safe(text: str) -> str:
    """An identifier as it may be printed: non-printable characters escaped."""
    return json.dumps(text, ensure_ascii=True)[1:-1]


async def decide(args: argparse.Namespace, settings: Settings, decision: Decision) -> int:
    kafka = Kafka(settings)
    try:
        found = await find(kafka, settings, args.event_id)
    finally:
        await kafka.close()
    topic = settings.topics.pending_approval
    if found.pending is None or found.partition is None:
        print(
            f"callgate {decision.value}: no call pending approval on {topic} has event id "
            f"{args.event_id}",
            file=sys.stderr,
        )
        return NOT_PENDING
    lines, computed = show(found.pending)
    for line in lines:
        print(line)
    stated = found.pending.approval.fingerprint
    if computed != stated:
        print(
            f"callgate {decision.value}: the event states fingerprint {stated}, but its "
            f"arguments have {computed}: not deciding on a call whose record is inconsistent",
            file=sys.stderr,
        )
        return NOT_PENDING
    for earlier in found.later:
        what = earlier.get("decision", "?")
        refused = earlier.get("refused")
        note = f" (refused: {refused.get('code')})" if isinstance(refused, dict) else ""
        print(f"earlier      {what} by {_safe(str(earlier.get('by', '?')))}{note}")
    value = decision_record(args.event_id, computed, decision, args.by, args.reason)
    producer = AIOKafkaProducer(**producer_options(settings))
    await producer.start()
    try:
        await producer.send_and_wait(
            topic,
            value,
            key=args.event_id.encode(),
            partition=found.partition,
            headers=[(RECORD_HEADER, DECISION_RECORD.encode())],
        )
    finally:
        await producer.stop()
    past = {Decision.APPROVE: "approved", Decision.DENY: "denied"}[decision]
    goes = (
        f"its accepted event goes to {settings.topics.accepted}"
        if decision is Decision.APPROVE
        else f"its rejection approval_denied goes to {settings.topics.rejected}"
    )
    print(
        f"{past:<13}by {_safe(args.by)}: written to {topic}[{found.partition}]; the worker "
        f"owning it rules on it, and {goes}"
    )
    return WRITTEN


def _command(decision: Decision) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            settings = load_settings(args.settings)
            if not _EVENT_ID.fullmatch(args.event_id):
                raise ConfigError(f"an event id is 32 lowercase hex digits, not {args.event_id!r}")
            if not 0 < len(args.by) <= MAX_BY_CHARS:
                raise ConfigError(f"--by names who decides in 1 to {MAX_BY_CHARS} characters")
            if args.reason is not None and len(args.reason) > MAX_REASON_CHARS:
                raise ConfigError(f"--reason is at most {MAX_REASON_CHARS} characters")
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
            return asyncio.run(decide(args, settings, decision))
        except ConfigError as exc:
            print(f"callgate {decision.value}: {exc}", file=sys.stderr)
            return BAD_SETTINGS
        except (ValidationError, ValueError) as exc:
            print(
                f"callgate {decision.value}: the pending event cannot be read: {exc}",
                file=sys.stderr,
            )
            return NOT_PENDING
        except (CallgateError, KafkaError, OSError) as exc:
            print(
                f"callgate {decision.value}: cannot work with the cluster: {exc!r}", file=sys.stderr
            )
            return BAD_SETTINGS

    return run


def _default_by() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def add_approval_commands(subparsers: Any) -> None:
    for decision, verb in ((Decision.APPROVE, "approve"), (Decision.DENY, "deny")):
        parser = subparsers.add_parser(
            verb,
            help=f"{verb} a call pending approval: show its arguments, write the decision",
            description=f"Show the call pending approval EVENT_ID (its arguments in full and "
            f"their fingerprint) and write the decision to {verb} it, bound to that "
            "fingerprint, to the pending-approval topic.",
            epilog=f"exit status: {WRITTEN} the decision was written; {NOT_PENDING} no call "
            f"pending approval has that event id; {BAD_SETTINGS} a setting is wrong or the "
            "cluster could not be reached",
        )
        parser.add_argument("event_id", metavar="EVENT_ID", help="the pending event's event_id")
        parser.add_argument(
            "--by", default=_default_by(), help="who decides (default: the user's login name)"
        )
        parser.add_argument(
            "--reason", help="why, in the decider's words (never shown to the model)"
        )
        settings_argument(parser)
        parser.set_defaults(func=_command(decision))
