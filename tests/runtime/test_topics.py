"""The topics a group uses: the internal ones' names, and the input subscription that never
reads an outcome topic or the group's own (read back, each event would be judged again)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from worker.core.events import MAX_TOPIC_BYTES
from worker.runtime.topics import (
    approvals_topic,
    changelog_topic,
    input_subscription,
    keys_topic,
    requests_topic,
)

GROUPS = st.from_regex(r"[A-Za-z0-9._-]{1,100}", fullmatch=True)
TOPICS = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True)
OUTCOMES = ("tool-calls.validated", "tool-calls.rejected", "tool-calls.incomplete")
PENDING = "tool-calls.pending-approval"


def subscribed(pattern: str, group: str) -> re.Pattern[str]:
    # the consumer matches each topic of the cluster with `re.match`, as here
    return re.compile(
        input_subscription(pattern, group, OUTCOMES, [requests_topic(group), PENDING])
    )


@given(group=GROUPS, topic=TOPICS)
def test_internal_names_are_kafka_topic_names_and_stay_apart(group: str, topic: str) -> None:
    names = [
        changelog_topic(group, topic),
        requests_topic(group),
        keys_topic(group),
        approvals_topic(group),
    ]
    assert all(0 < len(name) <= MAX_TOPIC_BYTES for name in names)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in names)
    assert len(set(names)) == 4
    assert changelog_topic(group, topic) != changelog_topic(group, topic + "x")


def is_own(group: str, topic: str) -> bool:
    """The spec: an outcome topic, the group's keys, or a changelog of the group (named in full,
    or bounded: 249 characters ending in a dash and 16 hex digits)."""
    changelog = topic.startswith(f"{group}-") and (
        topic.endswith("-changelog")
        or (len(topic) == MAX_TOPIC_BYTES and re.fullmatch(r".*-[0-9a-f]{16}", topic) is not None)
    )
    return topic in (*OUTCOMES, keys_topic(group), approvals_topic(group)) or changelog


@given(group=GROUPS, topic=TOPICS)
def test_a_pattern_matching_everything_reads_inputs_and_the_requests_only(
    group: str, topic: str
) -> None:
    everything = subscribed("^.*", group)
    for name in (
        changelog_topic(group, topic),
        keys_topic(group),
        approvals_topic(group),
        *OUTCOMES,
    ):
        assert is_own(group, name)
        assert not everything.match(name), name
    assert everything.match(requests_topic(group))
    assert everything.match(PENDING)
    assert bool(everything.match(topic)) is (
        topic in (requests_topic(group), PENDING) or not is_own(group, topic)
    )


@given(group=GROUPS, topic=TOPICS)
def test_a_pattern_reads_what_it_matches_and_nothing_more(group: str, topic: str) -> None:
    exactly = subscribed(f"^{re.escape(topic)}$", group)
    owned = (requests_topic(group), PENDING)
    assert bool(exactly.match(topic)) is (topic in owned or not is_own(group, topic))
    assert not exactly.match(topic + "x") or topic + "x" in owned
    assert exactly.match(requests_topic(group))
    assert exactly.match(PENDING)
