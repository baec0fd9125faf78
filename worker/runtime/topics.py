"""The topics a worker group uses: given ones, and the internal ones named after the group.

- input topics (names or a regex), and the three outcome topics, from the settings;
- per input topic, its changelog: `<group>-<input>-changelog`, compacted, with as many
  partitions as the input (partition N holds input partition N's checkpoints);
- `<group>-idempotency-requests`: accepted calls waiting for their key's owner, keyed by the
  idempotency key; and `<group>-idempotency-keys`, compacted, co-partitioned with it: what each
  owner remembers.

A derived name longer than Kafka allows (249 characters) keeps its head and gets a digest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

MAX_TOPIC_NAME = 249


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic the worker needs: created if missing, checked if present."""

    name: str
    partitions: int
    compacted: bool


def _bounded(name: str) -> str:
    if len(name) <= MAX_TOPIC_NAME:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{name[: MAX_TOPIC_NAME - 17]}-{digest}"


def changelog_topic(group_id: str, input_topic: str) -> str:
    return _bounded(f"{group_id}-{input_topic}-changelog")


def requests_topic(group_id: str) -> str:
    return _bounded(f"{group_id}-idempotency-requests")


def keys_topic(group_id: str) -> str:
    return _bounded(f"{group_id}-idempotency-keys")


def is_internal(group_id: str, topic: str) -> bool:
    """Whether a topic is one of the group's own (never an input, even if a regex matches)."""
    return topic.startswith(f"{group_id}-") and (
        topic.endswith("-changelog") or topic in (requests_topic(group_id), keys_topic(group_id))
    )
