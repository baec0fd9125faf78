"""What a worker group needs of its cluster, from the settings: its topics, its subscription
and its privileges, and what a worker says when the cluster lacks one.

Pure: no client, no I/O. `callgate topics create|check` (`worker.runtime.topics_cli`) makes and
verifies the topics `plan` lays out; `callgate topics acls` prints the `grants`. A starting
worker finds the topics that `must_exist` and subscribes to the `subscription`; a refusal of
the cluster is said naming the grant it lacks (`refused`).

Topics. Every topic's `max.message.bytes` must take the largest record batch the worker may
write to it: the producer's batch (`CALLGATE_KAFKA__MAX_BATCH_BYTES`), or one record alone when
it is larger, whose value is bounded by the settings (an outcome event by
`CALLGATE_LIMITS__MAX_EVENT_BYTES`, a checkpoint part by
`CALLGATE_DELIVERY__CHECKPOINT_RECORD_BYTES`) and whose key, headers and framing by
`record_overhead`. The group's state topics are compacted (`worker.runtime.topics`).

Privileges. The least the worker's principal needs, per topic, group and transactional id, for
the delivery guarantee of the settings, with the reason for each. Read and Write imply Describe
in Kafka's authorizer, and so do Create and Alter; none is listed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aiokafka.errors import GroupAuthorizationFailedError, KafkaError

from worker.core.events import request_overhead_bytes
from worker.errors import BrokerError
from worker.runtime.topics import (
    TopicSpec,
    approvals_topic,
    changelog_topic,
    input_subscription,
    keys_topic,
    requests_topic,
)
from worker.settings import LimitSettings, Settings


class Role(StrEnum):
    INPUT = "input"
    OUTCOME = "outcome"
    CHANGELOG = "changelog"
    REQUESTS = "idempotency requests"
    KEYS = "idempotency keys"
    PENDING = "pending approval"
    APPROVALS = "approvals"


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """A topic the group needs, and how it must be made."""

    name: str
    role: Role
    #: partitions it must have at least (None: any; an outcome topic's count is the operator's)
    partitions: int | None
    compacted: bool
    #: the largest record batch the worker writes to it (None: the worker writes none)
    max_message_bytes: int | None

    @property
    def created_by_worker(self) -> bool:
        """The group's own topics: a worker makes them when missing; the others must exist."""
        return self.role in (
            Role.CHANGELOG,
            Role.REQUESTS,
            Role.KEYS,
            Role.PENDING,
            Role.APPROVALS,
        )

    def spec(self, partitions: int | None = None) -> TopicSpec:
        """The topic as it is made: `partitions` where the plan leaves the count open."""
        count = self.partitions or partitions
        if count is None:
            raise ValueError(f"the plan leaves the partitions of {self.name} open: give them")
        return TopicSpec(
            self.name,
            count,
            self.compacted,
            grows=self.role is Role.CHANGELOG,
            max_message_bytes=self.max_message_bytes,
        )


def record_overhead(limits: LimitSettings) -> int:
    """What a record batch of one record carries beyond its value's event, at most.

    An idempotency request's record holds, beside the event, its key and a header
    (`request_overhead_bytes`: the call's key in its principal's scope, which its record key
    repeats, the call id, the tool, the schema's id and version), measured with the writer at
    the identifiers' bound (`max_id_bytes`, which bounds a key from the envelope and from an
    argument alike); another record's key is one identifier, its headers (outcome, tool,
    schema version, a trace parent, which a request carries too) three and their names; the
    batch's header (61 bytes), the record's framing and the header names take under 512 bytes.
    """
    key_and_headers = 4 * limits.max_id_bytes
    return request_overhead_bytes(limits.max_id_bytes) + key_and_headers + 512


def event_batch(settings: Settings) -> int:
    """The largest record batch holding an outcome event (or a record of an executor: its
    result, its execution records, a record its handler emitted, each bounded alike)."""
    return max(
        settings.kafka.max_batch_bytes,
        settings.limits.max_event_bytes + record_overhead(settings.limits),
    )


def held_batch(settings: Settings) -> int:
    """The largest record batch of the approvals topic: a held call's record holds its pending
    event and a little more."""
    return max(
        settings.kafka.max_batch_bytes,
        settings.limits.max_event_bytes + 2 * record_overhead(settings.limits),
    )


def checkpoint_batch(settings: Settings) -> int:
    """The largest record batch of a changelog: a checkpoint part."""
    return max(
        settings.kafka.max_batch_bytes,
        settings.delivery.checkpoint_record_bytes + record_overhead(settings.limits),
    )


def largest_record_batch(settings: Settings) -> int:
    """The largest record batch the group (or its executor) writes to any topic: what its
    producers must let through (aiokafka's `max_request_size`)."""
    return max(event_batch(settings), held_batch(settings), checkpoint_batch(settings))


def plan(settings: Settings, input_partitions: dict[str, int]) -> list[TopicPlan]:
    """The topics of the group: the inputs named (with the partitions given for each), the
    outcome topics (and the shadow topic), each input's changelog (as many partitions), the
    idempotency topics, the pending-approval topic and its changelog."""
    group = settings.kafka.group_id
    batch = settings.kafka.max_batch_bytes
    event = event_batch(settings)
    checkpoint = checkpoint_batch(settings)
    topics = settings.topics
    plans = [
        TopicPlan(name, Role.INPUT, input_partitions.get(name), False, None)
        for name in topics.input_topics
    ]
    for name in dict.fromkeys(settings.written_topics):  # the shadow topic's flips are smaller
        plans.append(TopicPlan(name, Role.OUTCOME, None, False, event))
    for name in topics.input_topics:
        changelog = changelog_topic(group, name)
        plans.append(
            TopicPlan(changelog, Role.CHANGELOG, input_partitions.get(name), True, checkpoint)
        )
    partitions = settings.idempotency.partitions
    plans.append(TopicPlan(requests_topic(group), Role.REQUESTS, partitions, False, event))
    plans.append(TopicPlan(keys_topic(group), Role.KEYS, partitions, True, batch))
    approval = settings.approval.partitions
    pending = settings.topics.pending_approval
    plans.append(TopicPlan(pending, Role.PENDING, approval, False, event))
    plans.append(
        TopicPlan(approvals_topic(group), Role.APPROVALS, approval, True, held_batch(settings))
    )
    return plans


def stores(settings: Settings) -> list[TopicSpec]:
    """The idempotency and approval topics, as a starting worker makes them when they are
    missing: as `callgate topics create` makes them, `max.message.bytes` included."""
    roles = (Role.REQUESTS, Role.KEYS, Role.PENDING, Role.APPROVALS)
    return [p.spec() for p in plan(settings, {}) if p.role in roles]


@dataclass(frozen=True, slots=True)
class Grant:
    """Operations the worker's principal needs on one resource, and why."""

    resource: str  # "topic", "group" or "transactional-id"
    name: str
    prefixed: bool
    operations: tuple[str, ...]
    why: str


def grants(settings: Settings) -> list[Grant]:
    """The least privileges of the worker's principal under the settings' delivery guarantee."""
    group = settings.kafka.group_id
    topics = settings.topics
    found: list[Grant] = []
    if topics.input_pattern:
        found.append(
            Grant(
                "topic",
                f"{group}-",
                True,
                ("Read", "Write", "Create", "Alter", "DescribeConfigs"),
                "the group's own topics (a changelog is named after each topic the input "
                "pattern matches): read and write state, create it, add partitions to a "
                "changelog, check its cleanup.policy",
            )
        )
    else:
        for name in topics.input_topics:
            found.append(Grant("topic", name, False, ("Read",), "consume the input"))
        for name in topics.input_topics:
            found.append(
                Grant(
                    "topic",
                    changelog_topic(group, name),
                    False,
                    ("Read", "Write", "Create", "Alter", "DescribeConfigs"),
                    f"checkpoints of {name}'s open calls: restore, write, create when "
                    "missing, add partitions when the input grows, check cleanup.policy",
                )
            )
        for name, why in (
            (requests_topic(group), "keyed calls waiting for their key's owner"),
            (keys_topic(group), "the keys each owner remembers"),
            (approvals_topic(group), "the calls each approval owner holds and decided"),
        ):
            found.append(
                Grant(
                    "topic",
                    name,
                    False,
                    ("Read", "Write", "Create", "DescribeConfigs"),
                    f"{why}: read, write, create when missing, check cleanup.policy",
                )
            )
    found.append(
        Grant(
            "topic",
            topics.pending_approval,
            False,
            ("Read", "Write", "Create", "DescribeConfigs"),
            "calls pending approval and the decisions on them: write pending events, expire "
            "decisions and refusals, read decisions, create when missing, check cleanup.policy",
        )
    )
    for name in dict.fromkeys((topics.accepted, topics.rejected, topics.incomplete)):
        found.append(Grant("topic", name, False, ("Write",), "write outcome events"))
    if settings.shadow.topic is not None:
        why = "write the calls whose verdict the candidate contracts would change (shadow mode)"
        found.append(Grant("topic", settings.shadow.topic, False, ("Write",), why))
    found.append(
        Grant("group", group, False, ("Read",), "join the consumer group, commit its offsets")
    )
    if settings.delivery.guarantee == "exactly_once":
        prefix = settings.delivery.transactional_id_prefix or group
        found.append(
            Grant(
                "transactional-id",
                f"{prefix}-",
                True,
                ("Write",),
                "exactly_once: a transactional producer per owned partition, "
                f"{prefix}-<topic>-<partition>",
            )
        )
    return found


def must_exist(settings: Settings) -> list[str]:
    """The topics a worker finds before it starts: the outcome topics (the shadow topic too)
    and the inputs named (a pattern names none). A broker may acknowledge writes to a missing
    topic and lose them, and a consumer of a missing topic waits without a word."""
    return sorted({*settings.written_topics, *settings.topics.input_topics})


@dataclass(frozen=True, slots=True)
class Subscription:
    """What the group's consumer subscribes to: topic names, or (an input pattern) one regex."""

    topics: tuple[str, ...]
    pattern: str | None


def subscription(settings: Settings) -> Subscription:
    """The inputs, and the topics whose partitions the group owns (the requests topic, the
    pending-approval topic). An input pattern never matches an outcome topic or the group's
    own (`worker.runtime.topics.input_subscription`)."""
    group = settings.kafka.group_id
    topics = settings.topics
    owned = [requests_topic(group), topics.pending_approval]
    if topics.input_pattern:
        outcome_topics = frozenset(settings.written_topics)
        pattern = input_subscription(topics.input_pattern, group, outcome_topics, owned)
        return Subscription((), pattern)
    return Subscription((*topics.input_topics, *owned), None)


def missing_topics(missing: list[str], inputs: list[str]) -> BrokerError:
    """What a worker that finds its topics missing says: which, and how to make them."""
    roles = ", ".join(f"{t} (input)" if t in inputs else f"{t} (output)" for t in missing)
    return BrokerError(
        f"topics do not exist: {roles}. Create them with `callgate topics create` (the same "
        "settings; --input-partitions N and --output-partitions N size them; `callgate topics "
        "check` verifies them), or with your cluster's tools as `callgate topics check` lists"
    )


def not_authorized(settings: Settings, resource: str, name: str) -> BrokerError:
    """What a worker the cluster refuses says: the operations and the resource whose grant
    is missing (as `grants` states it), and where every grant is printed."""
    for grant in grants(settings):
        if grant.resource == resource and (
            name == grant.name or (grant.prefixed and name.startswith(grant.name))
        ):
            pattern = f" (prefix {grant.name})" if grant.prefixed else ""
            needed = f"{', '.join(grant.operations)} on {resource} {name}{pattern}"
            why = f" ({grant.why})"
            break
    else:
        needed, why = f"access to {resource} {name}", ""
    return BrokerError(
        f"not authorized: the worker's principal needs {needed}{why}; `callgate topics acls` "
        "prints every grant these settings need"
    )


def refused(settings: Settings, error: KafkaError) -> BrokerError:
    """`not_authorized` for what the cluster refused: the group, or the topics `error` names."""
    if isinstance(error, GroupAuthorizationFailedError):
        return not_authorized(settings, "group", settings.kafka.group_id)
    named = error.args[0] if error.args else ""
    topics = sorted(named) if isinstance(named, set | frozenset | list | tuple) else [named]
    return not_authorized(settings, "topic", ", ".join(str(t) for t in topics))


def acl_commands(
    settings: Settings, principal: str, *, command_config: str = "client.properties"
) -> list[str]:
    """`grants` as `kafka-acls.sh` commands, each after a comment saying why."""
    servers = ",".join(settings.kafka.bootstrap_servers) or "HOST:PORT"
    lines = [
        f"# callgate worker: group {settings.kafka.group_id}, "
        f"{settings.delivery.guarantee}; principal {principal}"
    ]
    for grant in grants(settings):
        words = [
            "kafka-acls.sh",
            "--bootstrap-server",
            servers,
            "--command-config",
            command_config,
            "--add",
            "--allow-principal",
            principal,
        ]
        for operation in grant.operations:
            words += ["--operation", operation]
        words += [f"--{grant.resource}", grant.name]
        if grant.prefixed:
            words += ["--resource-pattern-type", "prefixed"]
        lines += [f"# {grant.why}", " ".join(words)]
    if settings.topics.input_pattern:
        lines.append(
            f"# and Read on every topic the input pattern {settings.topics.input_pattern} "
            "matches: an ACL names a topic or a prefix, never a regex"
        )
    return lines
