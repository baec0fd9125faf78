"""What a group needs of its cluster: the topics' layout and the principal's privileges (pure).

The `max.message.bytes` planned for a topic is checked against the largest record batch the
worker can write there, built by aiokafka's own batch builder from the largest values and the
longest identifiers the settings allow (control characters included, which JSON escapes).
"""

from __future__ import annotations

import re

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from worker._native import AssembledCall
from worker.core.events import idempotency_request, record_headers, record_key, request_key
from worker.model import Outcome, SchemaRef, Verdict
from worker.runtime.provision import (
    Role,
    acl_commands,
    grants,
    must_exist,
    not_authorized,
    plan,
    refused,
    subscription,
)
from worker.runtime.topics import approvals_topic, changelog_topic, keys_topic, requests_topic
from worker.settings import Settings


def settings_with(**values: object) -> Settings:
    return Settings.model_validate(values)


def test_the_plan_names_every_topic_the_worker_reads_or_writes() -> None:
    conf = settings_with(
        kafka={"group_id": "gate"},
        topics={"input": "a,b", "accepted": "ok", "rejected": "no", "incomplete": "ok"},
        idempotency={"partitions": 4},
        approval={"partitions": 5},
    )
    plans = {p.name: p for p in plan(conf, {"a": 3})}
    assert list(plans) == [
        "a",
        "b",
        "ok",
        "no",
        changelog_topic("gate", "a"),
        changelog_topic("gate", "b"),
        requests_topic("gate"),
        keys_topic("gate"),
        "tool-calls.pending-approval",
        approvals_topic("gate"),
    ]
    assert plans[changelog_topic("gate", "a")].partitions == 3  # one per input partition
    assert plans[changelog_topic("gate", "b")].partitions is None  # b's count not known yet
    assert plans[requests_topic("gate")].partitions == plans[keys_topic("gate")].partitions == 4
    pending = plans["tool-calls.pending-approval"]
    assert pending.partitions == plans[approvals_topic("gate")].partitions == 5
    compacted = {name for name, p in plans.items() if p.compacted}
    assert compacted == {
        changelog_topic("gate", "a"),
        changelog_topic("gate", "b"),
        keys_topic("gate"),
        approvals_topic("gate"),
    }
    assert {p.role for p in plans.values() if p.created_by_worker} == {
        Role.CHANGELOG,
        Role.REQUESTS,
        Role.KEYS,
        Role.PENDING,
        Role.APPROVALS,
    }


def _batch_bytes(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    """The size of a record batch holding this one record, as the producer builds it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=2**62,
        producer_epoch=2**14,
        base_sequence=2**30,
        batch_size=2**31,
    )
    assert builder.append(0, timestamp=2**40, key=key, value=value, headers=headers) is not None
    return len(builder.build())


identifiers = st.text(
    alphabet=st.sampled_from(["\x00", "\x1f", '"', "\\", "a", "é", "\u2028"]), min_size=1
)


@settings(max_examples=30, deadline=None)
@given(
    max_id_bytes=st.sampled_from([16, 256, 4096]),
    extra_event_bytes=st.integers(0, 4),
    data=st.data(),
)
def test_max_message_bytes_takes_the_largest_batch_the_worker_writes(
    max_id_bytes: int, extra_event_bytes: int, data: st.DataObject
) -> None:
    conf = settings_with(
        limits={"max_id_bytes": max_id_bytes, "max_event_bytes": 500_000 * (1 + extra_event_bytes)}
    )
    limit = conf.limits

    def longest() -> str:
        text = data.draw(st.just("\x00") | identifiers)  # every byte escaped in six, or mixed
        while len(text.encode()) < limit.max_id_bytes:
            text += text
        cut = text.encode()[: limit.max_id_bytes].decode(errors="ignore")
        assert len(cut.encode()) <= limit.max_id_bytes
        return cut

    call = AssembledCall(
        longest(), longest(), longest(), b"", idempotency_key=longest(), principal=longest()
    )
    schema = SchemaRef(longest(), longest())
    verdict = Verdict(
        Outcome.ACCEPTED,
        schema=schema,
        arguments_json=b"{}",
        idempotency_key=call.idempotency_key,
        idempotency_digest=bytes(16),
    )
    event = bytes(limit.max_event_bytes)
    traceparent = ("traceparent", longest().encode())
    headers = [*record_headers("incomplete", call.tool, schema.version), traceparent]
    by_role = {p.role: p for p in plan(conf, {"in": 1})}
    outcome = _batch_bytes(record_key(call), event, headers)
    assert outcome <= by_role[Role.OUTCOME].max_message_bytes  # type: ignore[operator]
    request = idempotency_request(call, verdict, event)
    key = request_key(call, verdict).encode()  # the key in its principal's scope
    assert _batch_bytes(key, request, [traceparent]) <= by_role[Role.REQUESTS].max_message_bytes  # type: ignore[operator]
    checkpoint = bytes(conf.delivery.checkpoint_record_bytes)
    frame_headers = [
        ("frame-kind", b"delta"),
        ("frame-parts", b"999999"),
        ("frame-offset", b"9" * 20),
    ]
    checkpoint_batch = _batch_bytes(b"9" * 80, checkpoint, frame_headers)
    assert checkpoint_batch <= by_role[Role.CHANGELOG].max_message_bytes  # type: ignore[operator]
    for role in (Role.OUTCOME, Role.REQUESTS, Role.CHANGELOG, Role.KEYS):
        assert by_role[role].max_message_bytes >= conf.kafka.max_batch_bytes  # type: ignore[operator]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("inputs", ["model-output", "a,b", "^model\\..*"])
def test_grants_cover_every_resource_once_with_the_least_operations(
    guarantee: str, inputs: str
) -> None:
    conf = settings_with(
        kafka={"group_id": "gate"},
        topics={"input": inputs},
        delivery={"guarantee": guarantee, "transactional_id_prefix": "tx"},
    )
    found = grants(conf)
    keys = [(g.resource, g.name, g.prefixed) for g in found]
    assert len(keys) == len(set(keys))  # each resource once
    by = {(g.resource, g.name): g for g in found}
    assert by[("group", "gate")].operations == ("Read",)
    for outcome in ("tool-calls.validated", "tool-calls.rejected", "tool-calls.incomplete"):
        assert by[("topic", outcome)].operations == ("Write",)
    transactional = [g for g in found if g.resource == "transactional-id"]
    if guarantee == "exactly_once":
        assert [(g.name, g.prefixed, g.operations) for g in transactional] == [
            ("tx-", True, ("Write",))
        ]
    else:
        assert transactional == []
    for grant in found:  # Describe is implied by every other operation: never asked for
        assert "Describe" not in grant.operations
        assert grant.why
    if inputs.startswith("^"):
        (internal,) = [g for g in found if g.prefixed and g.resource == "topic"]
        assert internal.name == "gate-"
        assert "never a regex" in acl_commands(conf, "User:gate")[-1]
    else:
        for name in inputs.split(","):
            assert by[("topic", name)].operations == ("Read",)
            assert "Alter" in by[("topic", changelog_topic("gate", name))].operations
        for name in (requests_topic("gate"), keys_topic("gate")):
            assert set(by[("topic", name)].operations) == {
                "Read",
                "Write",
                "Create",
                "DescribeConfigs",
            }


def test_acl_commands_are_one_kafka_acls_call_per_grant() -> None:
    conf = settings_with(kafka={"bootstrap_servers": "k1:9093,k2:9093"})
    lines = acl_commands(conf, "User:gate", command_config="admin.properties")
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == len(grants(conf))
    for command in commands:
        assert command.startswith(
            "kafka-acls.sh --bootstrap-server k1:9093,k2:9093 --command-config admin.properties "
            "--add --allow-principal User:gate --operation "
        )


def test_the_shadow_topic_is_planned_and_granted_as_an_outcome_topic() -> None:
    conf = settings_with(topics={"input": "in"}, shadow={"schemas": "candidate", "topic": "flips"})
    (planned,) = [p for p in plan(conf, {}) if p.name == "flips"]
    (event,) = [p for p in plan(conf, {}) if p.name == conf.topics.accepted]
    assert (planned.role, planned.compacted, planned.max_message_bytes) == (
        Role.OUTCOME,
        False,
        event.max_message_bytes,
    )
    (grant,) = [g for g in grants(conf) if g.name == "flips"]
    assert grant.operations == ("Write",)
    assert all(p.name != "flips" for p in plan(settings_with(topics={"input": "in"}), {}))


def test_a_refusal_names_the_operations_and_the_resource_of_its_grant() -> None:
    conf = settings_with(
        kafka={"group_id": "gate"},
        topics={"input": "in", "accepted": "ok"},
        delivery={"guarantee": "exactly_once"},
    )
    said = {
        (resource, name): str(not_authorized(conf, resource, name))
        for resource, name in (
            ("topic", "in"),
            ("topic", "ok"),
            ("topic", changelog_topic("gate", "in")),
            ("group", "gate"),
            ("transactional-id", "gate-in-3"),
            ("topic", "elsewhere"),
        )
    }
    assert "needs Read on topic in (consume the input)" in said[("topic", "in")]
    assert "needs Write on topic ok (write outcome events)" in said[("topic", "ok")]
    assert (
        "needs Read, Write, Create, Alter, DescribeConfigs on topic gate-in-changelog"
        in (said[("topic", changelog_topic("gate", "in"))])
    )
    assert "needs Read on group gate" in said[("group", "gate")]
    assert (
        "needs Write on transactional-id gate-in-3 (prefix gate-)"
        in (said[("transactional-id", "gate-in-3")])
    )
    assert "needs access to topic elsewhere;" in said[("topic", "elsewhere")]
    assert all(
        text.endswith("`callgate topics acls` prints every grant these settings need")
        for text in said.values()
    )


def test_a_refusal_of_the_cluster_names_the_group_or_the_topics_it_names() -> None:
    conf = settings_with(kafka={"group_id": "gate"}, topics={"input": "in", "accepted": "ok"})
    assert str(refused(conf, GroupAuthorizationFailedError())) == str(
        not_authorized(conf, "group", "gate")
    )
    assert str(refused(conf, TopicAuthorizationFailedError({"ok"}))) == str(
        not_authorized(conf, "topic", "ok")
    )
    assert "needs access to topic in, ok;" in str(
        refused(conf, TopicAuthorizationFailedError({"ok", "in"}))
    )
    assert "needs Read on topic in " in str(refused(conf, TopicAuthorizationFailedError("in")))


def test_a_worker_needs_its_outcome_and_named_input_topics_and_reads_its_own() -> None:
    shadow = {"schemas": "candidate", "topic": "flips"}
    named = settings_with(
        kafka={"group_id": "gate"},
        topics={"input": "a,b", "accepted": "ok", "rejected": "no", "incomplete": "ok"},
        shadow=shadow,
    )
    pending = "tool-calls.pending-approval"
    assert must_exist(named) == ["a", "b", "flips", "no", "ok"]
    assert subscription(named).topics == ("a", "b", requests_topic("gate"), pending)
    assert subscription(named).pattern is None

    matching = settings_with(
        kafka={"group_id": "gate"},
        topics={"input": "^.*", "accepted": "ok", "rejected": "no", "incomplete": "ok"},
        shadow=shadow,
    )
    assert must_exist(matching) == ["flips", "no", "ok"]  # a pattern names no input
    wanted = subscription(matching)
    assert wanted.topics == ()
    assert wanted.pattern is not None
    read = {
        topic
        for topic in [
            "in",
            "ok",
            "no",
            "flips",
            pending,
            requests_topic("gate"),
            keys_topic("gate"),
        ]
        if re.match(wanted.pattern, topic)
    }
    assert read == {"in", pending, requests_topic("gate")}
