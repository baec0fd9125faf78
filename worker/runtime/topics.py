"""The topics a worker group uses: given ones, and the internal ones named after the group.

- input topics (names or a regex), and the three outcome topics, from the settings;
- per input topic, its changelog: `<group>-<input>-changelog`, compacted, with as many
  partitions as the input (partition N holds input partition N's checkpoints);
- `<group>-idempotency-requests`: accepted calls waiting for their key's owner, keyed by the
  idempotency key; and `<group>-idempotency-keys`, compacted, co-partitioned with it: what each
  owner remembers.
- the pending-approval topic (named in the settings: people write their decisions to it), keyed
  by event id, read by the group like the requests; and `<group>-approvals`, compacted,
  co-partitioned with it: the calls each owner holds and decided.

A derived name longer than Kafka allows (249 characters) keeps its head and gets a digest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from worker.core.events import MAX_TOPIC_BYTES
from worker.errors import StateError

_TOPIC_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TOPIC_BYTES}}}")


def legal_topic_name(name: object) -> bool:
    """Whether `name` is a topic name Kafka takes (ASCII letters, digits, `.`, `_`, `-`)."""
    return isinstance(name, str) and name not in (".", "..") and bool(_TOPIC_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic the worker needs: created if missing, checked if present."""

    name: str
    partitions: int
    compacted: bool
    #: partitions are added when it has too few (a changelog follows its input's growth; a
    #: keyed topic never grows: its partition count routes the keys)
    grows: bool = False
    #: the `max.message.bytes` it is made with (None: the cluster's default)
    max_message_bytes: int | None = None

    def configs(self) -> dict[str, str]:
        """The topic configuration it is made with."""
        configs = {"cleanup.policy": "compact" if self.compacted else "delete"}
        if self.max_message_bytes is not None:
            configs["max.message.bytes"] = str(self.max_message_bytes)
        return configs


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What the cluster says of a topic: its partitions, and the replicas of each (the fewest
    any partition has); none while its partitions have no leader yet."""

    partitions: int
    replication: int


def state_policy_problem(config: Mapping[str, str]) -> str | None:
    """What is wrong with a state topic's configuration (None: nothing). It holds state that
    deletion by age would lose: it must be compacted, and may also delete only with a
    retention of -1. A configuration that does not say is taken as it is."""
    policy, retention = config.get("cleanup.policy"), config.get("retention.ms")
    if policy is None:
        return None
    policies = {part.strip() for part in policy.split(",")}
    if "compact" in policies and ("delete" not in policies or retention == "-1"):
        return None
    return (
        f"has cleanup.policy={policy} (retention.ms={retention}); it holds state that "
        "deletion by age would lose: it must be compact (or compact,delete with retention.ms=-1)"
    )


def _bounded(name: str) -> str:
    if len(name) <= MAX_TOPIC_BYTES:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{name[: MAX_TOPIC_BYTES - 17]}-{digest}"


def changelog_topic(group_id: str, input_topic: str) -> str:
    return _bounded(f"{group_id}-{input_topic}-changelog")


def requests_topic(group_id: str) -> str:
    return _bounded(f"{group_id}-idempotency-requests")


def keys_topic(group_id: str) -> str:
    return _bounded(f"{group_id}-idempotency-keys")


def approvals_topic(group_id: str) -> str:
    return _bounded(f"{group_id}-approvals")


def never_input(group_id: str, outcome_topics: Iterable[str]) -> str:
    """A regex of the topics that are never input: the outcome topics and the group's own
    (read back, each event would be judged again and make another, for ever)."""
    group = re.escape(f"{group_id}-")
    # a changelog's name, or its bounded form (head, dash, 16 hex digits, 249 in all)
    head = MAX_TOPIC_BYTES - len(f"{group_id}-") - 17
    changelog = f"{group}.*-changelog" + (f"|{group}.{{{head}}}-[0-9a-f]{{16}}" if head > 0 else "")
    exact = [
        *outcome_topics,
        requests_topic(group_id),
        keys_topic(group_id),
        approvals_topic(group_id),
    ]
    return "|".join([*(re.escape(topic) for topic in sorted(exact)), changelog])


def input_subscription(
    pattern: str, group_id: str, outcome_topics: Iterable[str], owned: Iterable[str]
) -> str:
    """The group consumer's subscription for an input pattern: the topics it matches but those
    `never_input` (`outcome_topics` among them), and the topics whose partitions the group owns
    (`owned`: the requests topic, the pending-approval topic)."""
    owned = list(owned)
    never = never_input(group_id, [*outcome_topics, *owned])
    exact = "|".join(f"^{re.escape(topic)}$" for topic in owned)
    return f"^(?!(?:{never})$)(?:{pattern})|{exact}"


def state_topics_deleted(topics: Iterable[str]) -> StateError:
    """The error of a worker that finds state topics of its group deleted while it runs."""
    return StateError(
        f"internal topics deleted: {', '.join(sorted(topics))}; the state they held (the "
        "checkpoints of open calls, the idempotency keys remembered) went with them. A restart "
        "creates them again and goes on from the committed offsets: calls open then are judged "
        "incomplete, and a call repeating a key remembered there may be accepted again"
    )
