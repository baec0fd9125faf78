"""The settings: topics that would feed the gate its own output are refused at start."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.datafiles import SCHEMAS
from worker.errors import ConfigError
from worker.runtime.topics import changelog_topic, keys_topic, requests_topic
from worker.settings import load_settings

GROUP = "gate"
TOPICS = {"accepted": "ok", "rejected": "no", "incomplete": "partial"}


def settings_with(**topics: str) -> Any:
    return load_settings(
        kafka={"bootstrap_servers": ["k:9092"], "group_id": GROUP},
        topics={**TOPICS, **topics},
        schemas={"dir": SCHEMAS},
    )


@given(
    own=st.sampled_from(
        [
            *TOPICS.values(),
            requests_topic(GROUP),
            keys_topic(GROUP),
            changelog_topic(GROUP, "in"),
            changelog_topic(GROUP, "x" * 300),
        ]
    ),
    others=st.lists(st.from_regex(r"in[a-z]{0,5}", fullmatch=True), max_size=3),
)
def test_an_outcome_or_internal_topic_named_as_input_is_refused(
    own: str, others: list[str]
) -> None:
    with pytest.raises(ConfigError, match="would be judged again, for ever") as refused:
        settings_with(input=",".join([*others, own]))
    assert repr(own) in str(refused.value)
    assert "CALLGATE_" in str(refused.value)


def test_inputs_apart_from_the_outputs_are_taken() -> None:
    settings = settings_with(input="in,gate-input")
    assert settings.topics.input_topics == ["in", "gate-input"]
    # outcomes may share a topic (every event names its outcome): still never input
    shared = settings_with(input="in", accepted="all", rejected="all", incomplete="all")
    assert shared.topics.accepted == shared.topics.rejected == "all"
    with pytest.raises(ConfigError, match=r"input topics \['all'\]"):
        settings_with(input="in,all", accepted="all", rejected="all", incomplete="all")
